from _log import to_log

from encmap.pipeline.embed import embed_step

to_log(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
embed_step(s.wildcards.model, dict(s.params.spec), s.input[0], s.output[0], s.params.device, threads=s.threads,
           degenerate=s.params.degenerate)
