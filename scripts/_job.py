"""What every script job does first: stderr to the rule's log file; a `script:` job (its own
process) also stops if its Snakemake dies and never replaces a newer run's outputs."""

import sys


def start_job(snakemake) -> None:
    # In-process jobs (encmap.workflow.jobs.in_process) run in Snakemake's own threads: their stderr is
    # routed per thread already, and they die with it.
    if getattr(snakemake, "in_process", False):
        return
    if snakemake.log:
        sys.stderr = open(snakemake.log[0], "w", buffering=1)
    from encmap.workflow.jobs import guard_script_job

    guard_script_job()
