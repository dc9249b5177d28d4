from _job import finish_job, start_job

from encmap.pipeline.embed import embed_step

start_job(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
embed_step(s.wildcards.model, dict(s.params.spec), s.input[0], s.output[0], s.params.device, threads=s.threads,
           degenerate=s.params.degenerate, n=s.params.n, on_error=s.params.on_error,
           forward=dict(s.params.forward))
finish_job(snakemake)  # noqa: F821
