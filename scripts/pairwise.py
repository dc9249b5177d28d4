from _job import finish_job, start_job

from encmap.pipeline.pairwise import pairwise_step

start_job(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
pairwise_step(s.input.features, list(s.input.pips), s.output.qre, s.output.cka, s.output.timing, eps=s.params.eps,
              device=s.params.device, block_columns=s.params.block_columns, threads=s.threads, code=s.params.code)
finish_job(snakemake)  # noqa: F821
