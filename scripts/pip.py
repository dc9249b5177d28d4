from _job import finish_job, start_job

from encmap.pipeline.pip import pip_step

start_job(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
pip_step(s.input[0], s.wildcards.encoder, s.output[0], tol=s.params.tol, dense_max_n=s.params.dense_max_n,
         center=s.params.center, normalize_rows=s.params.normalize_rows, threads=s.threads)
finish_job(snakemake)  # noqa: F821
