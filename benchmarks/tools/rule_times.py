"""Job time per rule from Snakemake's own logs, one column per log: where two runs of a pipeline
(``command1_side_by_side.sh``) differ.

Each job's time is from its start stamp to its ``Finished jobid`` stamp (Snakemake stamps to the
second), summed over the rule's jobs: wall time, so jobs that ran side by side each count whole.

    python benchmarks/tools/rule_times.py RUN_A/.snakemake/log/X.snakemake.log RUN_B/.snakemake/log/Y.snakemake.log
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from datetime import datetime

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
RULE = re.compile(r"^(?:local)?rule (\w+):$")
JOBID = re.compile(r"^\s+jobid: (\d+)$")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)")


def rule_seconds(lines) -> dict[str, float]:
    """Seconds per rule, summed over its finished jobs, from a Snakemake (>= 8) log's lines."""
    stamp = pending = None
    started: dict[str, tuple[str, datetime]] = {}
    seconds: dict[str, float] = defaultdict(float)
    for line in lines:
        line = line.rstrip("\n")
        if m := STAMP.match(line):
            stamp = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif m := RULE.match(line):
            pending = (m.group(1), stamp)
        elif (m := JOBID.match(line)) and pending:
            started[m.group(1)], pending = pending, None
        elif (m := FINISHED.match(line)) and m.group(1) in started:
            rule, t0 = started.pop(m.group(1))
            seconds[rule] += (stamp - t0).total_seconds()
    return dict(seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+")
    args = ap.parse_args()
    runs = []
    for path in args.logs:
        with open(path) as f:
            runs.append(rule_seconds(f))
    rules = sorted(set().union(*runs), key=lambda r: (-runs[0].get(r, 0), r))
    print(f"{'rule':12s}" + "".join(f"{i:>10d}" for i in range(1, len(runs) + 1)) + "  (s; columns: the logs in order)")
    for r in rules:
        print(f"{r:12s}" + "".join(f"{run.get(r, 0):10.0f}" for run in runs))
    print(f"{'total':12s}" + "".join(f"{sum(run.values()):10.0f}" for run in runs))


if __name__ == "__main__":
    main()
