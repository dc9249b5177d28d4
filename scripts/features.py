from _log import to_log

from encmap.pipeline.features import features_step

to_log(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
features_step(s.input[0], s.output[0], direction=s.params.direction, eps=s.params.eps, threads=s.threads)
