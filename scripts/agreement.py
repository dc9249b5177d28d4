from _job import finish_job, start_job

from encmap.pipeline.agreement import agreement_step

start_job(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
agreement_step(s.input.features, s.input.pairwise, s.input.cka, s.input.rbf, s.input.stitches, dict(s.output.items()))
finish_job(snakemake)  # noqa: F821
