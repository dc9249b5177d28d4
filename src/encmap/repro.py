"""``encmap repro``: DVC decides what is stale, per model; one Snakemake call runs all of it.

``dvc repro`` runs each stale stage's command in turn, and each command is a Snakemake process
that builds the whole DAG: at 1,101 models, ~4,400 processes of ~2.4 s each before any compute,
and DVC rewrites ``dvc.lock`` after every stage. This brings DVC's bookkeeping stages (code
digests, params slices) up to date, reads DVC's decision (``Repo.status``: the stages whose deps
or outs changed; DVC's graph for what follows them), runs the *same* stage commands batched into
one Snakemake call per batch (their targets, ``--force``, ``--allowed-rules`` their rules; the
SLURM profile or ``SNAKEMAKE_PROFILE`` passes through), and records the stages that completed in
``dvc.lock`` at once, as ``dvc commit`` would. ``dvc repro``, ``dvc exp run -S``,
``dvc push/pull`` keep working on the same files.

Each stage's command in ``dvc.yaml`` is the source of what it runs; a command of any other form
is an error naming the stage (``dvc repro <stage>`` still runs it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .deps import BOOKKEEPING, CODE_STAGE, digest_path, write_digests, write_slices
from .integrity import UNDER_DVC
from .validation import EncmapError

_CMD = re.compile(r"^(?:encmap prune (?P<kind>\w+) (?P<model>\S+) && )?snakemake --cores all --nolock --force "
                  r"(?P<targets>.+?) --allowed-rules (?P<rule>\w+)$")
_TARGETS = re.compile(r"^\$\(encmap targets (?P<kind>\w+) (?P<model>\S+)\)$")
#: Snakemake's own staleness must add nothing to DVC's decision: of its rerun triggers, only a
#: changed set of input files (which params already changed for DVC) stays on.
RERUN_TRIGGERS = ("input",)


@dataclass(frozen=True)
class StageJob:
    """What one DVC stage's command runs: Snakemake targets of one rule, after an optional prune."""

    stage: str
    rule: str
    targets: tuple[str, ...]
    prune: tuple[str, str] | None = None  # (layout kind, model id) for `encmap prune`


def stage_job(stage: str, cmd: str, per_model: dict[tuple[str, str], list[str]]) -> StageJob:
    """Parse DVC stage ``stage``'s resolved command.

    Parameters
    ----------
    per_model : dict
        ``(layout kind, model id) -> per-encoder targets`` (what ``encmap targets`` prints).
    """
    m = _CMD.match(cmd.strip())
    if m is None:
        raise EncmapError(f"stage {stage}: its command is no `[encmap prune ... &&] snakemake --cores all --nolock "
                          f"--force TARGETS --allowed-rules RULE` call, so encmap repro cannot batch it (run "
                          f"`dvc repro {stage}`): {cmd!r}")
    t = _TARGETS.match(m["targets"])
    if t is not None:
        if (t["kind"], t["model"]) not in per_model:
            raise EncmapError(f"stage {stage}: `encmap targets {t['kind']} {t['model']}`: no such model in params")
        targets = tuple(per_model[t["kind"], t["model"]])
    else:
        targets = tuple(m["targets"].split())
    return StageJob(stage, m["rule"], targets, (m["kind"], m["model"]) if m["kind"] else None)


def _per_model_targets(models: dict[str, dict]) -> dict[tuple[str, str], list[str]]:
    """``(kind, model) -> targets`` for every per-encoder layout kind, encoders expanded once."""
    from .encoders.variants import expand_encoders
    from .layout import LAYOUT

    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for e, v in sorted(expand_encoders(models).items()):
        for kind, pattern in LAYOUT.items():
            out[kind, v.model].append(pattern.format(model=v.model, encoder=e))
    for kind in LAYOUT:  # a model without encoders still has (empty) targets
        for m in models:
            out.setdefault((kind, m), [])
    return out


@dataclass
class Plan:
    """DVC's decision: the stale stages within the scope, with DVC's graph to order them."""

    graph: object
    scope: set
    stale: set
    order: list  # the scope in the order dvc repro runs it (post-order, upstream first)
    bookkeeping: set = field(default_factory=set)  # stale bookkeeping stages (rerun before the plan)

    def downstream(self, stages) -> set:
        """Stages of the scope downstream of ``stages`` (bookkeeping and frozen ones left out)."""
        import networkx as nx

        below = {a for s in stages for a in nx.ancestors(self.graph, s)} & self.scope
        return {s for s in below if s.addressing not in BOOKKEEPING and not s.frozen}

    def frontier(self, stale: set) -> set:
        """Stale stages with no stale stage upstream: their inputs are final."""
        import networkx as nx

        return {s for s in stale if not nx.descendants(self.graph, s) & stale}

    def ordered(self, stages) -> list:
        """``stages`` in the order ``dvc repro`` runs them (so DVC's .gitignore files list the
        outputs in the same order and the directories that hold them hash alike)."""
        stages = set(stages)
        return [s for s in self.order if s in stages]


def plan(repo, targets: list[str] | None = None, would_change: set[str] | None = None) -> Plan:
    """Read DVC's decision: the stale stages (:class:`Plan`), from one ``dvc status``.

    ``targets``: stage names as ``dvc repro`` takes them (a ``foreach`` group or ``name@key``);
    only they and their upstream stages are considered. DVC's bookkeeping stages (``code``,
    ``params``) are rerun before (:func:`repro`: their outputs already current) and listed apart,
    to be recorded; for a dry run, ``would_change`` names the digests and slices they would rewrite.
    """
    import networkx as nx

    graph = repo.index.graph  # edges: a stage -> the stages it depends on
    by_name = {s.addressing: s for s in graph.nodes}
    scope = set(by_name.values())
    if targets:
        chosen = {s for t in targets for s in repo.stage.collect(t)}
        scope = chosen | {d for s in chosen for d in nx.descendants(graph, s)}
    stale = {by_name[name] for name in repo.status(targets=targets or None, with_deps=bool(targets))} & scope
    if would_change:
        stale |= {s for s in scope if any(str(d.def_path) in would_change for d in s.deps)}
    return Plan(graph, scope, {s for s in stale if s.addressing not in BOOKKEEPING and not s.frozen},
                list(nx.dfs_postorder_nodes(graph.subgraph(scope))),
                {s for s in stale if s.addressing in BOOKKEEPING})


def _rewritten(path: Path, since: float) -> bool:
    """Whether Snakemake (re)wrote target ``path`` after ``since`` (a directory: its timestamp marker)."""
    if path.is_dir():
        marker = path / ".snakemake_timestamp"
        path = marker if marker.exists() else path
    return path.exists() and path.stat().st_mtime >= since


def _hashes(stage) -> list:
    return [(str(o), o.hash_info.value if o.hash_info else None) for o in stage.outs]


def _save(stages: list) -> list:
    """Hash and cache ``stages``' outputs as ``dvc commit -f`` would (the files stay as Snakemake
    wrote them, times too); the stages whose outputs changed. :func:`_write_locks` records them."""
    before = {s: _hashes(s) for s in stages}
    for s in stages:
        s.save()
        s.commit(relink=False)
    return [s for s in stages if _hashes(s) != before[s]]


def _write_locks(repo, stages: list, log) -> None:
    """Record saved ``stages`` in their ``dvc.lock``, one atomic write per file, as DVC's
    ``Lockfile.dump_stages`` writes it (same serialisation, same YAML dumper: same bytes).

    DVC re-reads the lock with ruamel's round-trip parser to keep comments, pure Python and
    ~9 s for the 2.5 MB lock of 1,101 models; a lock holds none, so the C parser reads it here.
    """
    from dvc.stage.serialize import to_lockfile
    from dvc.utils.serialize import dumps_yaml, parse_yaml

    from .io import atomic_write_text

    by_lock = defaultdict(list)
    for s in stages:
        by_lock[s.dvcfile._lockfile.path].append(s)
    for path, group in by_lock.items():
        lock = group[0].dvcfile._lockfile
        data = parse_yaml(Path(path).read_text(encoding="utf-8"), path) if Path(path).exists() else {}
        if not data:
            data["schema"] = "2.0"
        data["stages"] = data.get("stages", {})
        new = {k: v for s in group for k, v in to_lockfile(s).items()}
        if all(data["stages"].get(k) == v for k, v in new.items()):
            continue
        data["stages"].update(new)
        atomic_write_text(path, dumps_yaml(data))
        repo.scm_context.track_file(lock.relpath)
        log(f"Updating lock file '{lock.relpath}'")


def _bookkeep(root: Path, stage: str, params: dict, dry_run: bool = False) -> set[str]:
    """Run bookkeeping stage ``stage``'s command in-process (``encmap deps --digest`` or ``encmap
    params-slices``); the files it changed (``dry_run``: would change)."""
    if stage == CODE_STAGE:
        return {digest_path(s) for s in write_digests(root, dry_run)}
    return set(write_slices(root, params, dry_run))


def _run(root: Path, stages: list, params: dict, per_model: dict[tuple[str, str], list[str]],
         snakemake_args: list[str], log) -> tuple[list, list, int]:
    """One Snakemake call for ``stages``; save the completed ones (:func:`_save`).

    ``per_model``: :func:`_per_model_targets` of the params. Returns the completed stages, those
    whose outputs changed, and Snakemake's exit status.
    """
    from .layout import stale_files

    jobs = [stage_job(s.addressing, s.cmd, per_model) for s in stages]
    for j in jobs:
        if j.prune is not None:
            for f in stale_files(params["models"], j.prune[0], j.prune[1], root, paths=per_model[j.prune]):
                f.unlink()
                log(f"removed {f} (no encoder of params makes it)")
    argv = [t for j in jobs for t in j.targets] + [
        "--cores", "all", "--nolock", "--force", "--allowed-rules", *sorted({j.rule for j in jobs}),
        "--rerun-triggers", *RERUN_TRIGGERS, *snakemake_args]
    started = time.time() - 1  # file times may be coarser than the clock
    # The target list outgrows the kernel's argument limit (~50,000 per-encoder files at the
    # zoo's scale): Snakemake's own command line is handed over in a file.
    (root / ".dvc" / "tmp").mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=root / ".dvc" / "tmp", delete=False) as f:
        json.dump(argv, f)
    try:
        rc = subprocess.run([sys.executable, "-c", "import json, sys; from snakemake.cli import main; "
                             "main(json.load(open(sys.argv[1])))", f.name], cwd=root,
                            env=os.environ | {UNDER_DVC: "1"}).returncode
    finally:
        os.unlink(f.name)
    done = [s for s, j in zip(stages, jobs) if rc == 0 or all(_rewritten(root / t, started) for t in j.targets)]
    return done, _save(done), rc


def repro(root: str | Path = ".", targets: list[str] | None = None, snakemake_args: list[str] | None = None,
          dry_run: bool = False, log=print) -> int:
    """Bring the stale stages up to date, Snakemake running each batch in one call; record them in ``dvc.lock``.

    Batches: the stale stages whose inputs are final (the frontier) run first; a stage
    downstream of one whose outputs changed becomes stale. When everything downstream of the
    frontier is stale already, all stale stages run in one call (a fresh map: one call; a
    changed seed: that model's embed and evaluate, then the rest); otherwise the frontier runs
    alone and what it changed decides what follows (a curated file rebuilt byte for byte after
    a comment edit reruns nothing more). Within a batch a stage runs when one above it in the
    batch reran, even if that one's outputs come out unchanged (``dvc repro`` would skip it; it
    is rare and costs only that rerun).

    Parameters
    ----------
    root : path
        The DVC project (``dvc.yaml``, ``params.yaml``).
    targets : list of str, optional
        Stages to bring up to date with their upstream stages (default: every stage).
    snakemake_args : list of str, optional
        Passed on to Snakemake (``--profile profiles/slurm``, ``--cores 8``, ``--keep-going``).
    dry_run : bool
        Only list the stale stages (the second batch at its largest).

    Returns
    -------
    int
        0 when every stage completed, 1 otherwise (the completed ones are recorded in dvc.lock).
    """
    from dvc.repo import Repo, lock_repo

    from .params import load_params

    root = Path(root).resolve()
    repo = Repo(str(root))
    try:
        # One lock for the whole run: DVC's index is built once and no other dvc command interleaves.
        # DVC's git context: dvc.lock and the .gitignore files it writes are staged under
        # core.autostage, or their `git add` is printed, as dvc repro does.
        with lock_repo(repo), repo.scm_context():
            t0 = time.perf_counter()
            params = load_params(root / "params.yaml")  # validated: a refused value stops here
            # The digests and slices decide which stages a change touches: written first (only
            # the files whose text changed), then one `dvc status` sees their effect.
            would_change: set[str] = set()
            for name in BOOKKEEPING:
                would_change |= _bookkeep(root, name, params, dry_run)
            pl = plan(repo, targets, would_change if dry_run else None)
            first = pl.frontier(pl.stale)
            after = (pl.stale - first) | pl.downstream(pl.stale)
            log(f"encmap repro: {len(first)} stale stages to run first, at most {len(after)} after them "
                f"(DVC status and graph, {time.perf_counter() - t0:.1f} s)")
            if dry_run:
                for s in pl.ordered(first | after):
                    log(f"  {s.addressing}" + ("" if s in first else "  (after)"))
                return 0
            for s in pl.ordered(pl.bookkeeping):
                log(f"encmap repro: stage {s.addressing} rerun")
            saved = pl.ordered(pl.bookkeeping)
            _save(saved)
            args = list(snakemake_args or [])
            per_model = _per_model_targets(params["models"])  # the encoders expanded once per run
            stale, done, tried, rc = set(pl.stale), [], set(), 0
            try:
                while stale and rc == 0:
                    # Run the frontier alone when what follows depends on whether its outputs change;
                    # when everything below it is stale already, run all that is stale in one call.
                    front = pl.frontier(stale)
                    batch = stale if pl.downstream(front) <= stale else front
                    tried |= batch
                    got, changed, rc = _run(root, pl.ordered(batch), params, per_model, args, log)
                    done += got
                    names = ", ".join(s.addressing for s in pl.ordered(got)[:12])
                    log(f"encmap repro: ran {len(got)} of {len(batch)} stages ({names}"
                        f"{', ...' if len(got) > 12 else ''}); {len(changed)} changed their outputs")
                    stale = ((stale - batch) | pl.downstream(changed)) - set(done)
            finally:  # what completed is recorded, also when interrupted
                _write_locks(repo, saved + done, log)
            log(f"encmap repro: {len(done)} stages recorded in dvc.lock")
            if rc != 0:
                left = [s.addressing for s in pl.ordered((tried | stale) - set(done))]
                log(f"encmap repro: Snakemake failed (exit {rc}); not run or not recorded: {', '.join(left[:20])}"
                    + (f" and {len(left) - 20} more" if len(left) > 20 else ""))
                return 1
            return 0
    finally:
        repo.close()
