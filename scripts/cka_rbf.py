from _job import finish_job, start_job

from encmap.pipeline.cka_rbf import cka_rbf_step

start_job(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
cka_rbf_step(s.input.features, list(s.input.embeddings), dict(s.output.items()), subset=s.params.subset,
             rbf=s.params.rbf, threads=s.threads, code=s.params.code)
finish_job(snakemake)  # noqa: F821
