"""benchmarks/tools/rule_times.py sums each rule's job times from a Snakemake log."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Lines in the format of Snakemake 9.27's log (taken from a command 1 run, times and ids changed): two embed
# jobs side by side, then pip across midnight, then a job that never finished.
LOG = """Select jobs to execute...
Execute 2 jobs...
[Fri Nov 27 18:28:33 2026]
localrule embed:
    output: results/embeddings/a
    jobid: 4
    reason: Missing output files: results/embeddings/a
[Fri Nov 27 18:28:35 2026]
rule embed:
    output: results/embeddings/b
    jobid: 7
Shell command: None
[Fri Nov 27 18:29:03 2026]
Finished jobid: 7 (Rule: embed)
1 of 3 steps (33%) done
[Fri Nov 27 18:30:33 2026]
Finished jobid: 4 (Rule: embed)
[Fri Nov 27 18:30:34 2026]
localrule pip:
    jobid: 9
[Sat Nov 28 00:00:04 2026]
Finished jobid: 9 (Rule: pip)
[Sat Nov 28 00:00:05 2026]
localrule map:
    jobid: 11
"""


def test_each_rule_sums_its_finished_jobs_start_to_finish():
    spec = importlib.util.spec_from_file_location("rule_times", REPO / "benchmarks/tools/rule_times.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # embed: 28 s (jobid 7) + 120 s (jobid 4); pip across midnight: 5 h 29 min 30 s; map never finished.
    assert mod.rule_seconds(LOG.splitlines(True)) == {"embed": 148.0, "pip": 19770.0}
