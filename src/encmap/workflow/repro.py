"""``encmap repro``, ``encmap stage``, ``encmap record``: DVC decides what is stale; Snakemake runs it.

Every DVC stage's command is ``encmap stage``: it reads its stage from ``DVC_STAGE`` (``embed@<model>``
for a per-model stage), validates params.yaml and runs the stage's Snakemake targets
(:func:`encmap.workflow.stages.stage_job`) with ``--force`` (DVC decided they must run),
``--allowed-rules`` its rule and ``--rerun-incomplete``. No params value ever reaches a shell.

``dvc repro`` starts a Snakemake per stale stage, each building the whole DAG (at 1,101 models,
~4,400 processes of ~2.4 s before any compute). ``encmap repro`` updates DVC's bookkeeping stages
(code digests, params slices), reads DVC's decision once (``Repo.status``, DVC's graph), runs the
same stage jobs batched into one Snakemake call per batch (its options an allow-list; the SLURM
profile passes), and records in ``dvc.lock``, as ``dvc commit`` would, the stages whose every target
a job of that call wrote and still holds (:mod:`.made`). As in ``dvc repro``, a stage stale only
because an upstream output is about to be remade is decided again once it exists, so an output
remade byte for byte stops the cascade.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .deps import BOOKKEEPING, CODE_STAGE, digest_path, write_digests, write_slices
from .jobs import UNDER_DVC
from . import receipts
from .made import KEY, SESSION, SESSION_ENV, Basis, connect, digest, file_key, forget, made_rows, still_made
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
    """``encmap repro``'s Snakemake calls, each in a child process that records what its jobs made.

    The first child starts at once (:func:`.snakemake_call.serve`): it imports Snakemake and judges
    the options and profiles while this process imports DVC, sends its verdict (:meth:`verdict`:
    nothing is read or changed before it), then waits to run the first call (Snakemake imported once
    per call: ~1.5 s of CPU less). A later call's child checks the profiles as it starts.
    """

    def __init__(self, root: Path, args: list[str], dry_run: bool = False):
        # The call's ledger rows carry this process's session: it alone hands their md5s to DVC.
        self.root, self.args, self.env = root, args, os.environ | {UNDER_DVC: "1", SESSION_ENV: SESSION}
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

    def run(self, argv: list[str]) -> int:
        """One Snakemake call of command line ``argv`` (what its jobs made goes to the ledger); its exit status."""
        # The target list outgrows the kernel's argument limit (~50,000 per-encoder files at the
        # catalogue's scale): Snakemake's own command line is handed over in a file.
        (self.root / ".dvc" / "tmp").mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".json", dir=self.root / ".dvc" / "tmp", delete=False) as f:
            json.dump(argv, f)
        try:
            proc, self.first = self.first, None
            if proc is not None:
                try:
                    proc.stdin.write(json.dumps({"argv_file": f.name}).encode() + b"\n")
                    proc.stdin.close()
                except BrokenPipeError:  # it ended: its exit status says so
                    pass
            else:
                proc = subprocess.Popen([sys.executable, "-m", "encmap.workflow.snakemake_call", f.name],
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
    receipts.clear(root, job.targets)  # a receipt found after the call is its jobs' word
    rc = run_snakemake(snakemake_argv([job], []))
    if rc == 0 and (unmade := receipts.missing(root, job.targets)):
        # Snakemake's word that a job finished is not that it wrote (a SLURM job that wrote nothing,
        # a stage-out copy of the old files): DVC must not record this stage.
        for line in unmade[:20]:
            log(f"encmap stage {name}: not made: {line}")
        log(f"encmap stage {name}: Snakemake exited 0, but {len(unmade)} of its outputs were not written by "
            "a job of this call; the stage is not recorded (run it again)")
        return 1
    return rc


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


def prime_dvc(repo, con: sqlite3.Connection) -> None:
    """Hand DVC the md5 this process took of each file (its job's receipt, checked against the file,
    or its own read: rows of :data:`.made.SESSION`), while the file keeps the inode, size and time it
    was hashed at, as DVC keys its own state: DVC reads none of them again (1.1 GB on the default
    run). A row at rest from another process (forged, or stale) is never handed over, and where DVC's
    own state holds another md5 for the file as it is, DVC's stands: DVC then hashes what it must,
    and nothing enters its cache under a name its bytes do not hash to."""
    from dvc_data.hashfile.hash_info import HashInfo

    known, infos = {}, {}
    rows = con.execute(f"SELECT path, {KEY}, md5 FROM files WHERE md5 IS NOT NULL AND session = ?", (SESSION,))
    for rel, *then, md5 in rows:
        with contextlib.suppress(OSError):
            st = os.stat(path := os.path.join(repo.root_dir, rel))
            if file_key(st) == tuple(then):
                known[path] = md5
                infos[path] = repo.fs.info(path)
    for path, _meta, hash_info in repo.state.get_many(list(known), repo.fs, infos):
        if hash_info is not None and hash_info.value != known[path]:
            del known[path]  # DVC's own hash of this very file disagrees: DVC's stands
    repo.state.save_many([(path, HashInfo("md5", md5), infos[path]) for path, md5 in known.items()], repo.fs)


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
    """Record saved ``stages`` in their ``dvc.lock``, one atomic write per file, in DVC's own
    serialisation and YAML dumper (the bytes of ``Lockfile.dump_stages``). DVC re-reads a lock with
    ruamel's pure-Python round-trip parser (~9 s for 1,101 models' 2.5 MB) to keep comments; a lock
    holds none, so the C parser reads it here."""
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


def _run(repo, root: Path, stages: list, params: dict, per_model: dict[tuple[str, str], list[str]],
         snakemake_args: list[str], calls: SnakemakeCalls, log) -> tuple[list, set[str], int]:
    """One Snakemake call for ``stages``; save the completed ones (:func:`_save`).

    A stage has completed when a job of this call ran and wrote each of its targets, still holding
    what it wrote (:func:`.made.still_made`), whatever the exit status says: a failed job whose
    ``update()`` output Snakemake put back, or one that wrote nothing, made nothing. ``per_model``:
    :func:`_per_model_targets`. Returns the completed stages, the outputs changed, the exit status.
    """
    jobs = [stage_job(s.addressing, params, per_model) for s in stages]
    for j in jobs:
        _prune(root, params, j, per_model.get(j.prune) if j.prune else None, log)
    forget(root, [t for j in jobs for t in j.targets])
    rc = calls.run(snakemake_argv(jobs, ["--rerun-triggers", *RERUN_TRIGGERS, *snakemake_args]))
    done = [s for s, ok in zip(stages, still_made(root, [list(j.targets) for j in jobs])) if ok]
    with contextlib.closing(connect(root)) as con:
        prime_dvc(repo, con)
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

    A batch: the stages that must run whatever runs above them (own params, code or outputs changed,
    never recorded) with those above them that must run too (a fresh map: one call). A stage stale
    only because one above will remake an input is decided again, as ``dvc repro`` does, once that
    one has run; a stage below an output that changed must run.

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
            _index_read_once(repo)
            yield repo
    except DvcException as e:
        raise EncmapError(f"{command}: {type(e).__name__}: {dvc_message(e)}") from None
    finally:
        repo.close()


def _index_read_once(repo) -> None:
    """DVC asks git whether it tracks each output DVC saves (to refuse one it does), and scmrepo reads
    git's whole index per question: outputs × entries (0.9 s of the default run's recording, minutes
    at 1,101 models). Read once here: the index holds still while DVC's lock is held (DVC stages its
    files as the session ends). Tracked: the path, or a folder holding an entry (scmrepo's test)."""
    from dvc.scm import NoSCM

    if not isinstance(scm := repo.scm, NoSCM):
        files = {p.decode() for p in scm.dulwich.repo.open_index()}
        folders = {f.rsplit("/", i)[0] for f in files for i in range(1, f.count("/") + 1)}
        scm.is_tracked = lambda path: (rel := os.path.relpath(path, scm.root_dir).replace(os.sep, "/")) in \
            files or rel in folders


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
            got, changed, rc = _run(repo, root, pl.ordered(batch), params, per_model, args, calls, log)
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


def _why_not(root: Path, stage: str, outs: list[str], made: dict, basis: Basis, model: str | None,
             digest_of) -> str | None:
    """Why the DVC outputs ``outs`` of ``stage`` (its outs, metrics and plots: what DVC would record)
    cannot be shown made from the current code, params and inputs, or None. A directory output
    that no job made whole must hold only files that jobs made (per-encoder files). ``digest_of``:
    a path's :func:`.made.digest`, each taken once per recording (many stages read the same inputs)."""
    code, params = basis.code(stage), basis.params(stage, model)
    owners = []
    for out in map(os.path.normpath, outs):
        if out in made or not (root / out).is_dir():
            owners.append(out)
            continue
        inside = sorted(str(p.relative_to(root)) for p in (root / out).rglob("*")
                        if p.is_file() and not p.name.startswith("."))
        if not inside:
            return f"{out}: empty, no job of a Snakemake run made it"
        owners += inside
    for owner in owners:
        if owner not in made:
            return f"{owner}: no job of a Snakemake run made it"
        rec = made[owner]
        if rec["digest"] is None or digest_of(owner) != rec["digest"]:
            return f"{owner}: changed since its job wrote it"
        if rec["code"] != code:
            return f"{owner}: made by other code than the stage's now"
        if rec["params"] != params:
            return f"{owner}: made with other params than params.yaml's now"
        for path, was in json.loads(rec["inputs"]).items():
            if digest_of(path) != was:
                return f"{owner}: its input {path} changed since"
    return None


def record(root: str | Path = ".", log=print, quiet: bool = False) -> int:
    """``encmap record`` (module docstring): 0; the stages not shown made are listed, stale for ``encmap repro``.
    ``quiet``: nothing said when DVC calls no stage stale (a plain run's end)."""
    import networkx as nx

    from ..params import load_params
    from .layout import stale_files

    t0 = time.perf_counter()
    root = Path(root).resolve()
    params = load_params(root / "params.yaml")
    with dvc_session(root, "encmap record") as repo, contextlib.closing(connect(root)) as con:
        prime_dvc(repo, con)
        for name in BOOKKEEPING:
            _bookkeep(root, name, params)
        pl = plan(repo)
        saved = pl.ordered(pl.bookkeeping)
        _save(saved)
        made = {row[0]: dict(zip(("digest", "stage", "code", "params", "inputs"), row[1:]))
                for row in con.execute("SELECT path, digest, stage, code, params, inputs FROM made")}
        basis = Basis(root, params)
        digest_of = functools.cache(lambda path: digest(con, root, path))
        per_model = _per_model_targets(params["models"])
        recorded, left = [], {}
        for s in pl.ordered(pl.stale):
            above = [u for u in nx.descendants(pl.graph, s) & pl.stale if u not in recorded]
            if above:
                left[s.addressing] = f"a stage above it is not recorded ({above[0].addressing})"
                continue
            job = stage_job(s.addressing, params, per_model)
            model = s.addressing.split("@", 1)[1] if "@" in s.addressing else None
            why = _why_not(root, job.rule, [str(o.def_path) for o in s.outs], made, basis, model, digest_of)
            if why is None and job.prune is not None:
                extra = stale_files(params["models"], job.prune[0], job.prune[1], root,
                                    paths=per_model.get(job.prune))
                if extra:
                    why = f"{extra[0].relative_to(root)}: no encoder of params makes it (encmap repro removes it)"
            if why is None:
                recorded.append(s)
            else:
                left[s.addressing] = why
        _save(recorded)
        _write_locks(repo, saved + recorded, log)
    if quiet and not pl.stale:
        return 0
    log(f"encmap record: {len(recorded)} of {len(pl.stale)} stale stages recorded in dvc.lock as made "
        f"({time.perf_counter() - t0:.1f} s)")
    for name, why in left.items():
        log(f"  still stale: {name}: {why}")
    if left:
        log("encmap record: `encmap repro` (or `dvc repro`) makes what is still stale")
    return 0


def record_run(root: Path) -> None:
    """A plain run's end in a project with DVC (``.dvc``): :func:`record`, also when the run had
    nothing to do, so that its last lines name each stage DVC still calls stale and why (say, a
    source file edited that the run's targets do not read). Command 1 is then known to DVC without a
    step to remember; a failure is named, fails no run."""
    if not (root / ".dvc").is_dir():
        return
    try:
        record(root, quiet=not made_rows())
    except Exception as e:  # noqa: BLE001 (the run itself succeeded or failed on its own)
        print(f"encmap: this run was not recorded in dvc.lock ({type(e).__name__}: {e}); `encmap record` "
              "records it", file=sys.stderr)
