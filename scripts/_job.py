"""What every script job does first and last. First: stderr to the rule's log file; a `script:` job
(its own process) also stops if its Snakemake dies and never replaces a newer run's outputs. Last:
the job's receipts, its own word that it wrote its outputs (encmap.workflow.receipts)."""

import sys
from pathlib import Path

#: The workflow's root (this file is its scripts/_job.py): where the code a job runs lives.
ROOT = Path(__file__).resolve().parent.parent


def start_job(snakemake) -> None:
    from encmap.workflow.jobs import code_loaded

    code_loaded(ROOT)  # a script job's process has just loaded its code (in-process: Snakemake's did)
    # In-process jobs (encmap.workflow.jobs.in_process) run in Snakemake's own threads: their stderr is
    # routed per thread already, and they die with it.
    if getattr(snakemake, "in_process", False):
        return
    if snakemake.log:
        sys.stderr = open(snakemake.log[0], "w", buffering=1)
    from encmap.workflow.jobs import guard_script_job

    guard_script_job()


def finish_job(snakemake) -> None:
    from encmap.workflow.jobs import write_receipts

    write_receipts(ROOT, snakemake.output)
