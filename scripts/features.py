from _job import finish_job, start_job

from encmap.pipeline.features import features_step

start_job(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
features_step(s.input[0], s.output[0], direction=s.params.direction, eps=s.params.eps, threads=s.threads)
finish_job(snakemake)  # noqa: F821
