from _job import finish_job, start_job

from encmap.pipeline.regress import regress_step

start_job(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
regress_step(s.input.features, list(s.input.evals), dict(s.output.items()), regress=s.params.regress,
             pairwise=s.input.pairwise, jobs=s.threads)
finish_job(snakemake)  # noqa: F821
