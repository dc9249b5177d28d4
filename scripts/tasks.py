from _job import finish_job, start_job

from encmap.pipeline.tasks import tasks_step

start_job(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
tasks_step(s.params.evaluate, s.input[0], s.output[0], n=s.params.n)
finish_job(snakemake)  # noqa: F821
