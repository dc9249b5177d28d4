from _log import to_log

from encmap.pipeline.curate import curate_step

to_log(snakemake)  # noqa: F821 (snakemake is injected)
o = snakemake.output  # noqa: F821
curate_step(snakemake.params.sentences, o.txt, o.manifest, o.sha, o.sources)  # noqa: F821
