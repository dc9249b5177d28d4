"""Send a script's stderr (progress bars, warnings, tracebacks) to the rule's log file."""

import sys


def to_log(snakemake) -> None:
    # In-process jobs (encmap.jobs.in_process) have their stderr routed per thread already.
    if snakemake.log and not getattr(snakemake, "in_process", False):
        sys.stderr = open(snakemake.log[0], "w", buffering=1)
