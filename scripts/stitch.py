from _job import finish_job, start_job

from encmap.pipeline.stitch import stitch_step

start_job(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
stitch_step(s.input.features, list(s.input.embeddings), dict(s.output.items()), subset=s.params.subset,
            stitch=s.params.stitch, threads=s.threads, code=s.params.code)
finish_job(snakemake)  # noqa: F821
