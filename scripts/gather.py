from _job import finish_job, start_job

from encmap.pipeline.gather import gather_step

start_job(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
gather_step(list(s.input), s.output.features, s.output.metrics, s.output.failures, meta=dict(s.params.meta))
finish_job(snakemake)  # noqa: F821
