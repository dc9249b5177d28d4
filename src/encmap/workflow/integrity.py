"""Artifacts changed behind the pipeline's back: the Snakemake route's counterpart of DVC's hashes.

Snakemake decides what to rerun by modification times, and a directory output by its
``.snakemake_timestamp``: a truncated embeddings file, a matrix of the wrong shape or a NaN
written into one, or an edited pair file, left it saying "Nothing to be done" while the damage
surfaced later in another stage, blaming another file. DVC notices, because it hashes.

So encmap's ledger (:mod:`.made`, table ``files``) keeps every file under ``data/`` and
``results/``: size, modification time and sha256, recorded as each job finishes (its outputs) and
when a run ends (:func:`record`: the rest). When the next run starts (:func:`verify`, from
``rules/common.smk``), a file whose size or time changed is hashed again: the same content (a
``dvc checkout``, ``snakemake --touch``) only refreshes its entry; other content, or a file gone
from a directory output, is damage: reported naming the file, noted beside the good entry, and its
output handed to Snakemake as ``--forcerun`` (its job and those after it run again, whatever the
targets). Nothing is moved or deleted; the mark stays until the job has rewritten the output (a
failed run or a dry run leaves it). Under DVC both steps stand aside: DVC hashes every output.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from contextlib import closing
from pathlib import Path
from typing import Iterable

from .deps import DIGESTS, SLICES
from .jobs import REFUSED_LOG, UNDER_DVC
from .made import (KEY, LEDGER, connect, file_key, ledger_unusable, mark_damaged,  # noqa: F401 (LEDGER: theirs)
                   remember, without_ledger)
from ..io import file_sha256
from ..validation import EncmapError

#: Where the pipeline's artifacts live (relative to the workflow root).
TRACKED = ("data", "results")
#: Workflows whose run ended through ``onsuccess`` / ``onerror`` (by id).
_ENDED: set[int] = set()
#: Why a file a reader of a failed job refused is made again.
REFUSED = "refused by a reader of the last run and unchanged since"
#: Not Snakemake's: the code digests and params slices, written by DVC's bookkeeping stages alone
#: (``encmap.workflow.deps``).
NOT_TRACKED = (DIGESTS, SLICES)


def _files(root: Path) -> dict[str, os.stat_result]:
    """Every artifact file below the tracked folders, by path relative to ``root``."""
    out = {}
    for top in TRACKED:
        for dirpath, dirnames, filenames in os.walk(root / top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")
                           and str((Path(dirpath) / d).relative_to(root)) not in NOT_TRACKED]
            for name in filenames:
                if name.startswith("."):  # temporary files, Snakemake's timestamps, DVC's .gitignore
                    continue
                p = Path(dirpath) / name
                out[str(p.relative_to(root))] = p.stat()
    return out


def _owner(rel: str, dir_outputs: Iterable[str]) -> str:
    """The output a file belongs to: its directory output, or the file itself."""
    for d in dir_outputs:
        if rel.startswith(d.rstrip("/") + "/"):
            return d.rstrip("/")
    return rel


def verify(root: str | Path = ".", dir_outputs: Iterable[str] = (), dry_run: bool = False) -> tuple[list[str], list[str]]:
    """Find artifacts whose content changed (or that vanished from a directory output) since
    encmap recorded them.

    Parameters
    ----------
    root : the workflow root
    dir_outputs : the directory outputs (relative paths, e.g. ``results/embeddings/<model>``):
        damage to a file inside one reruns the job that writes the whole directory.
    dry_run : only report: the ledger is left exactly as it is.

    Returns
    -------
    messages : list of str
        One per damaged file, naming it.
    rerun : list of str
        The outputs whose jobs must run again (files or directory outputs), sorted.
    """
    root = Path(root)
    dir_outputs = list(dir_outputs)
    found = _files(root)
    messages: list[str] = []
    rerun: set[str] = set()
    with closing(connect(root)) as con, con:
        if not dry_run:
            _take_refused(root, con)
        known = {p: (key, sha) for p, *key, sha in con.execute(f"SELECT path, {KEY}, sha256 FROM files")}
        marked = {p: (sha, why) for p, sha, why in con.execute("SELECT path, sha256, why FROM damaged")}
        for rel, (key, sha) in known.items():
            st = found.get(rel)
            owner = _owner(rel, dir_outputs)
            if st is None:
                if owner != rel and (root / owner).is_dir():  # a file gone from a directory output
                    messages.append(f"{rel}: missing from {owner}, which encmap writes whole; its job reruns")
                    rerun.add(owner)
                elif not dry_run:  # gone with its output (a dropped variant, a model out of params)
                    con.execute("DELETE FROM files WHERE path = ?", (rel,))
                    con.execute("DELETE FROM damaged WHERE path = ?", (rel,))
                continue
            if file_key(st) == tuple(key) and rel not in marked:
                continue
            now = file_sha256(root / rel)
            bad, why = marked.get(rel, (None, None))
            if bad == now:  # marked when last seen (a reader refused it, no job wrote it): still the same
                messages.append(f"{rel}: {why or REFUSED}; its job reruns ({owner})")
                rerun.add(owner)
                continue
            if now == sha:  # same bytes, new time: a checkout, a copy, `snakemake --touch`
                if not dry_run:
                    _rekey(con, rel, st)
                continue
            why = f"changed since encmap wrote it (sha256 {now[:12]}…, was {sha[:12]}…)"
            messages.append(f"{rel}: {why}; its job reruns ({owner})")
            rerun.add(owner)
            if not dry_run:
                mark_damaged(con, rel, now, why)
        if not dry_run:
            for rel, st in found.items():
                if rel not in known:  # never recorded (a fresh clone, a first run): as it is
                    remember(con, root, rel, st)
    return messages, sorted(rerun)


def record(root: str | Path = ".") -> None:
    """Record every artifact as it is now, as a run ends: its jobs' outputs are in already (their
    receipts, :mod:`.made`); a file never seen is taken as it is; a known file whose content changed
    with no job's word for it (a `--touch` run over a damaged file, a copy put in its place) keeps
    its good entry and is marked, so that the next run makes it again. A file marked damaged that
    still holds the damaged content keeps its mark."""
    root = Path(root)
    found = _files(root)
    with closing(connect(root)) as con, con:
        _take_refused(root, con)
        marked = dict(con.execute("SELECT path, sha256 FROM damaged"))
        known = {p: (tuple(key), sha) for p, *key, sha in con.execute(f"SELECT path, {KEY}, sha256 FROM files")}
        con.executemany("DELETE FROM files WHERE path = ?", [(p,) for p in known if p not in found])
        for rel, st in found.items():
            was = known.get(rel)
            if was is None:
                remember(con, root, rel, st)
            elif was[0] != file_key(st) or rel in marked:
                now = file_sha256(root / rel)
                if marked.get(rel) == now:  # still what was marked (refused, or no job's word for it)
                    continue
                if now == was[1]:  # the same bytes: a new time or copy
                    _rekey(con, rel, st)
                else:
                    mark_damaged(con, rel, now, "changed with no job's word for it (a `--touch` run or a copy put "
                                                "over it), not taken as good")


def _rekey(con: sqlite3.Connection, rel: str, st: os.stat_result) -> None:
    """File ``rel`` holds the bytes the ledger knows under a new key (a checkout, a copy, a touch)."""
    con.execute(f"UPDATE files SET ({KEY}) = (?, ?, ?, ?) WHERE path = ?", (*file_key(st), rel))
    con.execute("DELETE FROM damaged WHERE path = ?", (rel,))


def _take_refused(root: Path, con: sqlite3.Connection) -> None:
    """Mark what failed jobs' readers refused (:attr:`encmap.validation.EncmapError.refused`, noted in
    :data:`encmap.workflow.jobs.REFUSED_LOG`) as damaged with its current content, so that no later
    :func:`record` or :func:`verify` takes it for good: the next run reruns its jobs. Clears the note."""
    log = root / REFUSED_LOG
    if not log.exists():
        return
    root = root.resolve()
    for line in filter(None, log.read_text(encoding="utf-8").splitlines()):
        p = Path(line) if Path(line).is_absolute() else root / line
        try:
            rel = str(p.resolve().relative_to(root))
        except ValueError:
            continue
        if rel.split(os.sep, 1)[0] in TRACKED and p.is_file():
            mark_damaged(con, rel, file_sha256(p), REFUSED)
    log.unlink()


def _flag(argv: list[str], long: tuple[str, ...], short: str) -> bool:
    return any(a in long or (a.startswith("-") and not a.startswith("--") and short in a[1:] and a[1:].isalpha())
               for a in argv[1:])


def active(workflow) -> bool:
    """Whether the ledger applies: Snakemake's main process, not under DVC (which hashes itself).

    Under DVC: a stage's command (``dvc repro`` sets ``DVC_STAGE``) or ``encmap repro``'s batch.
    """
    return not (os.environ.get("DVC_STAGE") or os.environ.get(UNDER_DVC)) and workflow.is_main_process


def for_snakemake(workflow, dir_outputs: Iterable[str], argv: list[str] | None = None) -> None:
    """``rules/common.smk``, before the DAG is built: report damaged artifacts and rerun their jobs.

    Their outputs join Snakemake's ``--forcerun`` (which also makes them targets of this run). A
    dry run (``-n``) lists those jobs too, and changes nothing (the ledger included); ``--touch``
    re-stamps every output: the damage is reported and stays marked (:func:`record`). The executor
    (which knows both) is not set up yet when the Snakefile is read: the flags come from Snakemake's
    command line. A ledger that cannot be used is named; the run goes on without the check.
    """
    argv = sys.argv if argv is None else argv
    if not active(workflow):
        return
    _said_at_the_end(workflow)
    touch = _flag(argv, ("--touch",), "t")
    dry = touch or _flag(argv, ("--dry-run", "--dryrun"), "n")
    try:
        messages, rerun = verify(Path(workflow.basedir), dir_outputs, dry_run=dry)
    except EncmapError as e:
        without_ledger(Path(workflow.basedir), e)
        return
    for message in messages:
        print(f"encmap: {message}" + (" (touch run: not taken as good; a run reruns it)" if touch else
                                      " (dry run: nothing changed; a run reruns it)" if dry else ""), file=sys.stderr)
    if rerun and not touch:  # a dry run too: it lists the jobs a run would rerun (nothing on disk changes)
        force_rerun(workflow, rerun)


def _said_at_the_end(workflow) -> None:
    """A run that had nothing to do ends before Snakemake's ``onsuccess``: it still says, in a DVC
    project, which stages DVC calls stale and why (:func:`.repro.record_run`)."""
    from .repro import record_run

    execute = workflow.execute

    def execute_then_say(*args, **kwargs):
        ran = execute(*args, **kwargs)
        root = Path(workflow.basedir)
        if id(workflow) not in _ENDED and not (workflow.dryrun or workflow.touch or ledger_unusable(root)):
            record_run(root)
        return ran

    workflow.execute = execute_then_say


def force_rerun(workflow, outputs: Iterable[str]) -> None:
    """Add ``outputs`` to Snakemake's ``--forcerun`` for the DAG this workflow builds.

    The DAG settings do not exist yet while the Snakefile is read (Snakemake sets them after
    parsing): they are amended where Snakemake reads them, in ``Workflow._prepare_dag``.
    """
    prepare = workflow._prepare_dag
    outputs = frozenset(outputs)

    def _prepare_dag(*args, **kwargs):
        settings = workflow.dag_settings
        settings.forcerun = frozenset(settings.forcerun) | outputs
        return prepare(*args, **kwargs)

    workflow._prepare_dag = _prepare_dag


def record_for_snakemake(workflow, argv: list[str] | None = None) -> None:
    """``onsuccess`` / ``onerror``: record the artifacts as the run leaves them (not in a dry run),
    and in a project with DVC what its jobs made in ``dvc.lock`` (:func:`.repro.record_run`). A
    ledger that cannot be used is named; the run's own outcome stands."""
    from .repro import record_run

    argv = sys.argv if argv is None else argv
    _ENDED.add(id(workflow))
    root = Path(workflow.basedir)
    if active(workflow) and not _flag(argv, ("--dry-run", "--dryrun"), "n") and not ledger_unusable(root):
        try:
            record(root)
        except EncmapError as e:
            without_ledger(root, e)
            return
        record_run(root)
