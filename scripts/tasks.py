from _log import to_log

from encmap.pipeline.tasks import tasks_step

to_log(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
tasks_step(s.params.evaluate, s.input[0], s.output[0])
