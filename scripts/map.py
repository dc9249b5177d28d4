from _job import finish_job, start_job

from encmap.pipeline.map import map_step

start_job(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
map_step(s.input.features, s.input.pairwise, dict(s.output.items()), params=s.params.map,
         predictions=s.input.predictions, predictor=s.params.predictor)
finish_job(snakemake)  # noqa: F821
