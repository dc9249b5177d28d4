from _log import to_log

from encmap.pipeline.similarity import compare_step

to_log(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
compare_step(s.input.features, s.input.pairwise, s.input.cka, s.input.rbf, s.input.stitches, dict(s.output.items()))
