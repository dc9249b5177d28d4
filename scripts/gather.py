from _log import to_log

from encmap.pipeline.gather import gather_step

to_log(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
gather_step(list(s.input), s.output.features, s.output.metrics)
