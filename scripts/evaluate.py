from _job import finish_job, start_job

from encmap.pipeline.evaluate import evaluate_step

start_job(snakemake)  # noqa: F821 (snakemake is injected)
s = snakemake  # noqa: F821
evaluate_step(s.wildcards.model, dict(s.params.spec), s.input.tasks, s.input.sentences, s.output[0],
              evaluate=s.params.evaluate, device=s.params.evaluate["device"], threads=s.threads,
              degenerate=s.params.degenerate, n=s.params.n, forward=dict(s.params.forward))
finish_job(snakemake)  # noqa: F821
