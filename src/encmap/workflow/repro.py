"""``encmap repro`` and ``encmap stage``: DVC decides what is stale, per model; Snakemake runs it.

Every DVC stage's command is ``encmap stage``: it reads which stage it is from ``DVC_STAGE`` (set
by DVC for every stage command; ``embed@<model>`` for a per-model stage), validates params.yaml,
and runs that stage's Snakemake targets (:func:`encmap.workflow.stages.stage_job`, from the stage
registry) with ``--force`` (DVC has decided
they must run), ``--allowed-rules`` its rule and ``--rerun-incomplete`` (a killed run's markers
never block the next one). No params value is ever put into a shell command: DVC interpolates
none into ``encmap stage``, and the targets are computed from validated params.

``dvc repro`` runs each stale stage's command in turn, and each command is a Snakemake process
that builds the whole DAG: at 1,101 models, ~4,400 processes of ~2.4 s each before any compute,
and DVC rewrites ``dvc.lock`` after every stage. ``encmap repro`` brings DVC's bookkeeping stages
(code digests, params slices) up to date, reads DVC's decision (``Repo.status``; DVC's graph for
what follows), runs the *same* stage jobs batched into one Snakemake call per batch (the SLURM
profile or ``SNAKEMAKE_PROFILE`` passes through; the options it passes are an allow-list), and
records in ``dvc.lock``, as ``dvc commit`` would, the stages for whose every target Snakemake
declared a job of that call finished, the target still holding what the job wrote
(:mod:`.snakemake_call`). It skips what ``dvc repro`` skips: a stage
that is stale only because an upstream output is about to be remade is decided again once that
output exists, so an output remade byte for byte stops the cascade. ``dvc repro``, ``dvc exp run
-S``, ``dvc push/pull`` keep working on the same files.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .deps import BOOKKEEPING, CODE_STAGE, digest_path, write_digests, write_slices
from .integrity import UNDER_DVC
from .snakemake_call import finished_outputs, made
from .stages import StageJob, stage_job
from ..validation import EncmapError

#: Snakemake's own staleness must add nothing to DVC's decision: of its rerun triggers, only a
#: changed set of input files (which params already changed for DVC) stays on.
RERUN_TRIGGERS = ("input",)
#: What every stage's Snakemake call gets: DVC decided the targets must run (``--force``); its
#: directory lock would outlive a killed run (DVC locks what it writes); a killed run's
#: incomplete-output markers are remade rather than refused.
SNAKEMAKE_ARGS = ("--cores", "all", "--nolock", "--force", "--rerun-incomplete")

def _prune(root: Path, params: dict, job: StageJob, paths: list[str] | None, log) -> None:
    from .layout import stale_files

    if job.prune is not None:
        for f in stale_files(params["models"], job.prune[0], job.prune[1], root, paths=paths):
            f.unlink()
            log(f"removed {f} (no encoder of params makes it)")


def snakemake_argv(jobs: list[StageJob], extra: list[str]) -> list[str]:
    """Snakemake's command line making ``jobs``' targets (their rules only)."""
    return [t for j in jobs for t in j.targets] + [*SNAKEMAKE_ARGS, "--allowed-rules",
                                                  *sorted({j.rule for j in jobs}), *extra]


class SnakemakeCalls:
    """``encmap repro``'s Snakemake calls, each in a child process that records the jobs it finished.

    The first child starts at once (:func:`.snakemake_call.serve`): it imports Snakemake and judges
    the user's options and profiles while this process imports DVC, sends its verdict back
    (:meth:`verdict`: nothing is read or changed before it), then waits to run the first call.
    Snakemake is thus imported once per call, by the process that runs it (this process imported
    it too, to judge the options: ~1.5 s of CPU per call); a later call (a run of several batches)
    starts a child of its own, which checks the profiles again as it starts. A dry run makes no
    call and judges the options here. Where nothing turns out stale, the first child was started
    for nothing (~0.5 s of CPU more than judging here).
    """

    def __init__(self, root: Path, args: list[str], dry_run: bool = False):
        self.root, self.args, self.env = root, args, os.environ | {UNDER_DVC: "1"}
        self.first = self._verdict = None
        if dry_run:  # no call: the options are judged here (verdict)
            return
        r, w = os.pipe()
        try:
            self.first = subprocess.Popen(
                [sys.executable, "-m", "encmap.workflow.snakemake_call", "--serve", str(w), json.dumps(args)],
                cwd=root, env=self.env, stdin=subprocess.PIPE, pass_fds=(w,))
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        self._verdict = os.fdopen(r, encoding="utf-8")

    def verdict(self) -> None:
        """Wait for the first child's judgement of the options; raise its refusal."""
        if self._verdict is None:
            from .snakemake_call import check_args, check_profiles

            check_args(self.args)
            check_profiles(self.args, self.root)
            return
        with self._verdict as f:
            text = f.read()
        if not text:  # it ended before judging
            raise EncmapError(f"encmap repro: Snakemake's process ended before it read the options "
                              f"(exit {self.first.wait()})")
        refused = json.loads(text)["refused"]
        if refused:
            self.first.wait()
            raise EncmapError(refused)

    def run(self, argv: list[str], ledger: Path) -> int:
        """One Snakemake call of command line ``argv``, its finished jobs appended to ``ledger``; its exit status."""
        # The target list outgrows the kernel's argument limit (~50,000 per-encoder files at the
        # catalogue's scale): Snakemake's own command line is handed over in a file.
        (self.root / ".dvc" / "tmp").mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".json", dir=self.root / ".dvc" / "tmp", delete=False) as f:
            json.dump(argv, f)
        try:
            proc, self.first = self.first, None
            if proc is not None:
                try:
                    proc.stdin.write(json.dumps({"argv_file": f.name, "ledger": str(ledger)}).encode() + b"\n")
                    proc.stdin.close()
                except BrokenPipeError:  # it ended: its exit status says so
                    pass
            else:
                proc = subprocess.Popen([sys.executable, "-m", "encmap.workflow.snakemake_call", f.name, str(ledger)],
                                        cwd=self.root, env=self.env)
            with proc:  # as subprocess.run waits (a Ctrl-C reaches Snakemake too, which stops its jobs)
                try:
                    return proc.wait()
                except BaseException:
                    proc.kill()
                    raise
        finally:
            os.unlink(f.name)

    def close(self) -> None:
        """End the first child if no call used it (a dry run, nothing stale, an error)."""
        if self._verdict is not None and not self._verdict.closed:
            self._verdict.close()
        if self.first is not None:
            with contextlib.suppress(BrokenPipeError):
                self.first.stdin.close()
            self.first.wait()
            self.first = None


def run_stage(root: str | Path = ".", name: str | None = None, log=print) -> int:
    """``encmap stage [NAME]``: the command of every DVC stage (``NAME`` default: ``$DVC_STAGE``).
    Snakemake runs in this process: a second interpreter per stage cost ~0.2 s of CPU, and DVC
    then kills Snakemake itself when it stops a stage."""
    from ..params import parse_yaml_file
    from .config import validate_once
    from .snakemake_call import run_snakemake

    root = Path(root).resolve()
    name = name or os.environ.get("DVC_STAGE")
    if not name:
        raise EncmapError("encmap stage: name a stage (DVC names it in DVC_STAGE when it runs a stage's command)")
    path = root / "params.yaml"
    if not path.exists():
        raise EncmapError(f"{path}: params file not found")
    params = parse_yaml_file(path)
    validate_once(params, str(path))  # a refused value stops here, before any job
    job = stage_job(name.rsplit(":", 1)[-1], params)  # a stage of another dvc.yaml: <path>:<name>
    _prune(root, params, job, None, log)
    os.chdir(root)
    return run_snakemake(snakemake_argv([job], []))


def _per_model_targets(models: dict[str, dict]) -> dict[tuple[str, str], list[str]]:
    """``(kind, model) -> targets`` for every per-encoder layout kind, encoders expanded once."""
    from ..encoders.variants import expand_encoders
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


def _hashes(stage) -> list:
    return [(str(o.def_path), o.hash_info.value if o.hash_info else None) for o in stage.outs]


def _save(stages: list) -> set[str]:
    """Hash and cache ``stages``' outputs as ``dvc commit -f`` would (the files stay as Snakemake
    wrote them, times too); the output paths whose content changed. :func:`_write_locks` records them."""
    before = {s: dict(_hashes(s)) for s in stages}
    for s in stages:
        s.save()
        s.commit(relink=False)
    return {path.rstrip("/") for s in stages for path, h in _hashes(s) if before[s].get(path) != h}


def _write_locks(repo, stages: list, log) -> None:
    """Record saved ``stages`` in their ``dvc.lock``, one atomic write per file, as DVC's
    ``Lockfile.dump_stages`` writes it (same serialisation, same YAML dumper: same bytes).

    DVC re-reads the lock with ruamel's round-trip parser to keep comments, pure Python and
    ~9 s for the 2.5 MB lock of 1,101 models; a lock holds none, so the C parser reads it here.
    """
    from dvc.stage.serialize import to_lockfile
    from dvc.utils.serialize import dumps_yaml, parse_yaml

    from ..io import atomic_write_text

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
         snakemake_args: list[str], calls: SnakemakeCalls, log) -> tuple[list, set[str], int]:
    """One Snakemake call for ``stages``; save the completed ones (:func:`_save`).

    A stage has completed when Snakemake declared finished, in this call, a job for every one of
    its targets, and each target still holds what that job wrote (:func:`.snakemake_call.made`),
    whatever the exit status says: a failed job whose ``update()`` output Snakemake put back
    made nothing. ``per_model``: :func:`_per_model_targets` of the params. Returns the completed
    stages, the output paths whose content changed, and Snakemake's exit status.
    """
    jobs = [stage_job(s.addressing, params, per_model) for s in stages]
    for j in jobs:
        _prune(root, params, j, per_model.get(j.prune) if j.prune else None, log)
    (root / ".dvc" / "tmp").mkdir(parents=True, exist_ok=True)
    fd, ledger = tempfile.mkstemp(suffix=".finished.jsonl", dir=root / ".dvc" / "tmp")
    os.close(fd)
    try:
        rc = calls.run(snakemake_argv(jobs, ["--rerun-triggers", *RERUN_TRIGGERS, *snakemake_args]), Path(ledger))
        finished, now = finished_outputs(ledger), {}
    finally:
        os.unlink(ledger)
    done = [s for s, j in zip(stages, jobs) if made(root, j.targets, finished, now)]
    return done, _save(done), rc


def _children(pl: "Plan", paths: set[str]) -> set:
    """Stages of the scope with a dependency among ``paths`` (or inside or around one of them)."""
    if not paths:
        return set()
    out = set()
    for s in pl.scope:
        if s.addressing in BOOKKEEPING or s.frozen:
            continue
        for d in s.deps:
            dp = str(d.def_path).rstrip("/")
            if any(dp == p or dp.startswith(p + "/") or p.startswith(dp + "/") for p in paths):
                out.add(s)
                break
    return out


def _stale_on_its_own(stage, made: set[str]) -> bool:
    """Whether ``stage`` must run whatever the stale stages above it make: its command, an output,
    or a dependency that none of them makes changed (or one never recorded)."""
    if stage.changed_stage() or stage.changed_outs():
        return True
    for d in stage.deps:
        dp = str(d.def_path).rstrip("/")
        if d.hash_info and any(dp == p or dp.startswith(p + "/") or p.startswith(dp + "/") for p in made):
            continue  # about to be remade: decided again once it is
        if d.status():
            return True
    return False


def repro(root: str | Path = ".", targets: list[str] | None = None, snakemake_args: list[str] | None = None,
          dry_run: bool = False, log=print) -> int:
    """Bring the stale stages up to date, Snakemake running each batch in one call; record them in ``dvc.lock``.

    Batches: every stage that must run whatever runs above it (its own params, code or outputs
    changed, or never recorded) runs in one call with the stages above it that must run too (a
    fresh map: one call). A stage that is stale only because a stale stage above it will remake
    one of its inputs is decided again, as ``dvc repro`` decides it, once that stage has run:
    an input remade byte for byte leaves it up to date. A stage below an output that changed
    must run.

    Parameters
    ----------
    root : path
        The DVC project (``dvc.yaml``, ``params.yaml``).
    targets : list of str, optional
        Stages to bring up to date with their upstream stages (default: every stage).
    snakemake_args : list of str, optional
        Passed on to Snakemake (``--profile profiles/slurm``, ``--cores 8``, ``--keep-going``):
        only options that cannot change which jobs run, what they compute or with which config
        (:data:`.snakemake_call.ALLOWED`, read by Snakemake's own parser); any other is refused.
    dry_run : bool
        Only list the stale stages.

    Returns
    -------
    int
        0 when every stage completed, 1 otherwise (the completed ones are recorded in dvc.lock).
    """
    args = list(snakemake_args or [])
    root = Path(root).resolve()
    if not root.is_dir():
        raise EncmapError(f"encmap repro: {root}: no such directory")
    # An allow-list, read by Snakemake's own parser in the child that will run the first call: nothing
    # that changes what runs passes (SnakemakeCalls.verdict), and nothing is read or written before.
    calls = SnakemakeCalls(root, args, dry_run)
    try:
        from ..params import load_params

        with dvc_session(root, "encmap repro", before=calls.verdict) as repo:
            return _repro(repo, root, targets, args, dry_run, log, load_params, calls)
    finally:
        calls.close()


@contextlib.contextmanager
def dvc_session(root: Path, command: str, before=None):
    """DVC's repository at ``root``, locked for the whole command (DVC's index built once, no other
    dvc command interleaving), in DVC's git context (dvc.lock and the .gitignore files it writes are
    staged under core.autostage, or their `git add` is printed, as dvc repro does). DVC's errors
    become messages naming ``command``: another dvc holds the lock, an unknown stage, an output a
    stage did not make. ``before``: called once DVC is imported, before the repository is opened."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo, lock_repo

    if before is not None:
        before()
    try:
        repo = Repo(str(root))
    except DvcException as e:
        raise EncmapError(f"{command}: {root}: {e}") from None
    try:
        with lock_repo(repo), repo.scm_context():
            yield repo
    except DvcException as e:
        raise EncmapError(f"{command}: {type(e).__name__}: {dvc_message(e)}") from None
    finally:
        repo.close()


def dvc_message(error: Exception) -> str:
    """DVC's message, each line once: its rwlock error names a blocking process once per path it holds."""
    seen: set[str] = set()
    lines = []
    for line in str(error).splitlines():
        if line.strip() and line in seen:
            continue
        seen.add(line)
        lines.append(line)
    return "\n".join(lines)


def _repro(repo, root: Path, targets, args: list[str], dry_run: bool, log, load_params,
           calls: SnakemakeCalls) -> int:
    import networkx as nx

    t0 = time.perf_counter()
    params = load_params(root / "params.yaml")  # validated: a refused value stops here
    from ..params import check_mteb_targets

    check_mteb_targets(params, str(root / "params.yaml"))
    # The digests and slices decide which stages a change touches: written first (only
    # the files whose text changed), then one `dvc status` sees their effect.
    would_change: set[str] = set()
    for name in BOOKKEEPING:
        would_change |= _bookkeep(root, name, params, dry_run)
    pl = plan(repo, targets, would_change if dry_run else None)
    log(f"encmap repro: {len(pl.stale)} stale stages, at most {len(pl.downstream(pl.stale) - pl.stale)} more "
        f"below them (DVC status and graph, {time.perf_counter() - t0:.1f} s)")
    if dry_run:
        first = pl.frontier(pl.stale)
        for s in pl.ordered(pl.stale | pl.downstream(pl.stale)):
            log(f"  {s.addressing}" + ("" if s in first else "  (after)"))
        return 0
    for s in pl.ordered(pl.bookkeeping):
        log(f"encmap repro: stage {s.addressing} rerun")
    saved = pl.ordered(pl.bookkeeping)
    _save(saved)
    per_model = _per_model_targets(params["models"])  # the encoders expanded once per run
    # Pending: the stale stages and every stage below one (which may become stale once it ran).
    pending = set(pl.stale) | pl.downstream(pl.stale)

    def made_above(s) -> set[str]:
        above = nx.descendants(pl.graph, s) & pending
        return {str(o.def_path).rstrip("/") for u in above for o in u.outs}

    must = {s for s in pl.stale if _stale_on_its_own(s, made_above(s))}
    done, rc = [], 0
    try:
        while pending and rc == 0:
            # A stage with nothing pending above it any more is decided as DVC decides it.
            for s in pl.ordered(pending - must):
                if not nx.descendants(pl.graph, s) & pending:
                    (must.add if s.changed() else pending.discard)(s)
            # One call: every stage that must run and has nothing above it that may still change.
            batch = {s for s in pending if s in must and nx.descendants(pl.graph, s) & pending <= must}
            if not batch:
                continue
            got, changed, rc = _run(root, pl.ordered(batch), params, per_model, args, calls, log)
            done += got
            names = ", ".join(s.addressing for s in pl.ordered(got)[:12])
            log(f"encmap repro: ran {len(got)} of {len(batch)} stages ({names}{', ...' if len(got) > 12 else ''}); "
                f"{len(changed)} outputs changed")
            if rc == 0 and len(got) < len(batch):
                missing = [s.addressing for s in pl.ordered(batch - set(got))]
                log(f"encmap repro: Snakemake exited 0 but did not write every output of {', '.join(missing[:10])}")
                rc = 1
            pending -= set(got)
            # Directly below an output that changed, a stage must run (DVC: its dependency changed).
            must |= _children(pl, changed) & pending
    finally:  # what completed is recorded, also when interrupted
        _write_locks(repo, saved + done, log)
    log(f"encmap repro: {len(done)} stages recorded in dvc.lock")
    if rc != 0:
        left = [s.addressing for s in pl.ordered(pending - set(done))]
        log(f"encmap repro: Snakemake failed (exit {rc}); not run or not recorded: {', '.join(left[:20])}"
            + (f" and {len(left) - 20} more" if len(left) > 20 else ""))
        return 1
    return 0
