from _log import to_log

from encmap.pipeline.mapping import pairwise_step

to_log(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
pairwise_step(s.input.features, list(s.input.pips), s.output.qre, s.output.timing, eps=s.params.eps, threads=s.threads)
