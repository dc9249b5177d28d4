from _job import finish_job, start_job

from encmap.pipeline.curate import curate_step

start_job(snakemake)  # noqa: F821 (snakemake is injected)
o = snakemake.output  # noqa: F821
curate_step(snakemake.params.sentences, o.txt, o.manifest, o.sha, o.sources)  # noqa: F821
finish_job(snakemake)  # noqa: F821
