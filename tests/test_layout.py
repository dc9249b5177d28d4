"""What the tree and the docs say of each other: each benchmark lies in the folder of its kind and
stands behind a figure, a doc or a test; every benchmark path the docs, tests and scripts name
exists; every link to a heading in README.md and docs/ lands on one (GitHub's anchors)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
#: benchmarks/: the benchmarks behind a figure of results.md (bench_*.py); gpu/: the device pack;
#: tools/: the developer's instruments.
KINDS = ("gpu", "tools")


def _docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _text(paths) -> str:
    return "\n".join(p.read_text() for p in paths)


def test_each_benchmark_is_in_the_folder_of_its_kind_and_stands_behind_something():
    loose = sorted(p.name for p in BENCH.iterdir() if p.name != "__pycache__" and p.name not in KINDS)
    assert all(re.fullmatch(r"bench_\w+\.py", n) for n in loose), loose  # the claims' benchmarks, by name
    figures = _text([REPO / "docs/results.md", REPO / "docs/results-history.md"])
    docs, tests = _text(_docs()), _text((REPO / "tests").glob("test_*.py"))
    for name in loose:  # a claim's benchmark is cited where its figure is
        assert name in figures or f"benchmarks/{name}" in tests, f"benchmarks/{name}: cited by no figure"
    for kind in KINDS:  # the pack and the tools in a doc or a test
        for p in sorted((BENCH / kind).glob("*.*")):
            assert p.name in docs or f"benchmarks/{kind}/{p.name}" in tests, f"benchmarks/{kind}/{p.name}: cited nowhere"


def test_every_benchmark_path_named_exists_here_or_in_the_gpu_pack():
    # The pack (gpu_pack.sh) puts its scripts in its own benchmarks/: commands run there name them so.
    pack = set(re.findall(r"benchmarks/gpu/(\S+)", "\n".join(
        line for line in (BENCH / "gpu/gpu_pack.sh").read_text().splitlines() if '"$tmp/benchmarks/"' in line)))
    assert {"bench_gpu.py", "gpu_probe.py", "gpu_workflow.py"} <= pack
    # The history quotes each command as it was run, before the folders. src/ is not read: a byte
    # changed there changes the code digest of the stages that run it, so its comments follow later.
    named = [p for p in _docs() if p.name != "results-history.md"]
    named += [*(REPO / "tests").rglob("*.py"), *BENCH.rglob("*.*"), REPO / ".gitignore"]
    missing = []
    for f in named:
        for path in re.findall(r"(?<![\w/.$-])benchmarks/[\w./-]*\w(?![\w<])", f.read_text()):  # not bench_<what>
            if not (REPO / path).exists() and path.removeprefix("benchmarks/") not in pack:
                missing.append(f"{f.relative_to(REPO)}: {path}")
    assert missing == []


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens; -1, -2 on repeats."""
    seen: Counter = Counter()
    out, fence = set(), False
    for line in path.read_text().splitlines():
        fence ^= line.startswith("```")
        m = None if fence else re.match(r"#{1,6} (.*)$", line)
        if m:
            a = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(f"{a}-{seen[a]}" if seen[a] else a)
            seen[a] += 1
    return out


def test_every_link_to_a_heading_lands_on_one():
    broken = []
    for f in _docs():
        for target, anchor in re.findall(r"\]\(([^)\s#]*)#([^)\s]+)\)", f.read_text()):
            t = f.parent / target if target else f
            if not t.is_file() or anchor not in _anchors(t):
                broken.append(f"{f.relative_to(REPO)}: {target}#{anchor}")
    assert broken == []
