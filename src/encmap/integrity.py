"""Artifacts changed behind the pipeline's back: the Snakemake route's counterpart of DVC's hashes.

Snakemake decides what to rerun by modification times, and a directory output by its
``.snakemake_timestamp``: a truncated embeddings file, a matrix of the wrong shape or a NaN
written into one, or an edited pair file, left it saying "Nothing to be done" while the damage
surfaced later in another stage, blaming another file. DVC notices, because it hashes.

So encmap keeps a ledger (``.snakemake/encmap/ledger.sqlite``, local like Snakemake's own
metadata) of every file under ``data/`` and ``results/``: size, modification time and sha256,
recorded when a run ends (:func:`record`). When the next run starts (:func:`verify`, from
``rules/common.smk``), a file whose size or time changed is hashed again: the same content (a
``dvc checkout``, ``snakemake --touch``) only refreshes its entry; other content, or a recorded
file that is gone, is damage. Damage is reported naming the file, and the damaged output (the file, or the directory
output holding it) is moved aside into ``.snakemake/encmap/damaged/<time>/``, kept as evidence:
``rule all`` requests every artifact, so Snakemake must make it again, and the jobs after it
follow. A changed modification time would not do: Snakemake 9 compares small inputs by checksum,
and does not remake a missing intermediate file when the files after it are up to date.

Only stat calls when nothing changed; only changed files are hashed. Under DVC (``DVC_STAGE`` is
set) both steps stand aside: DVC hashes every output itself.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from contextlib import closing
from pathlib import Path
from typing import Iterable

from .deps import DIGESTS, SLICES
from .io import file_sha256

#: Set by ``encmap repro`` for the Snakemake calls it makes: DVC records what they write.
UNDER_DVC = "ENCMAP_UNDER_DVC"

LEDGER = ".snakemake/encmap/ledger.sqlite"
#: Where the pipeline's artifacts live (relative to the workflow root).
TRACKED = ("data", "results")
#: Not Snakemake's: the code digests and params slices, written by DVC's bookkeeping stages alone
#: (``encmap.deps``).
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


def _connect(root: Path) -> sqlite3.Connection:
    db = root / LEDGER
    db.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(db, timeout=60)
    con.execute("CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, "
                "sha256 TEXT)")
    return con


def _owner(rel: str, dir_outputs: Iterable[str]) -> str:
    """The output a file belongs to: its directory output, or the file itself."""
    for d in dir_outputs:
        if rel.startswith(d.rstrip("/") + "/"):
            return d.rstrip("/")
    return rel


def _move_aside(root: Path, owner: str, aside: Path | None) -> str:
    """Move a damaged output out of the way (so Snakemake makes it again); say where it went."""
    p = root / owner
    if aside is None or not p.exists():
        return f"its job reruns once {owner} is made again"
    target = aside / owner
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(p, target)
    return f"moved {owner} aside to {target.relative_to(root)}; its job reruns"


def verify(root: str | Path = ".", dir_outputs: Iterable[str] = (), move: bool = True) -> list[str]:
    """Find artifacts whose content changed (or that vanished) since encmap recorded them.

    Parameters
    ----------
    root : the workflow root
    dir_outputs : the directory outputs (relative paths, e.g. ``results/embeddings/<model>``):
        damage to a file inside one reruns the job that writes the whole directory.
    move : move damaged outputs aside (False: only report them, e.g. in a dry run)

    Returns
    -------
    list of str
        One message per damaged file. Files without an entry (never recorded: a fresh clone, a
        first run) are recorded as they are.
    """
    import time

    root = Path(root)
    dir_outputs = list(dir_outputs)
    aside = root / LEDGER.rsplit("/", 1)[0] / "damaged" / time.strftime("%Y%m%dT%H%M%S") if move else None
    found = _files(root)
    damaged: list[str] = []
    with closing(_connect(root)) as con, con:
        known = {p: (size, mtime, sha) for p, size, mtime, sha in con.execute("SELECT * FROM files")}
        for rel, (size, mtime, sha) in known.items():
            st = found.get(rel)
            if st is None:
                owner = _owner(rel, dir_outputs)
                if owner != rel and (root / owner).is_dir():  # a file gone from a directory output
                    damaged.append(f"{rel}: missing from {owner}, which encmap writes whole; "
                                   + _move_aside(root, owner, aside))
                con.execute("DELETE FROM files WHERE path = ?", (rel,))
                continue
            if (st.st_size, st.st_mtime_ns) == (size, mtime) or not (root / rel).exists():  # (moved aside)
                continue
            now = file_sha256(root / rel)
            if now == sha:  # same bytes, new time: a checkout, a copy, `snakemake --touch`
                con.execute("UPDATE files SET size = ?, mtime_ns = ? WHERE path = ?", (st.st_size, st.st_mtime_ns, rel))
                continue
            owner = _owner(rel, dir_outputs)
            damaged.append(f"{rel}: changed since encmap wrote it (sha256 {now[:12]}…, was {sha[:12]}…); "
                           + _move_aside(root, owner, aside))
            con.execute("DELETE FROM files WHERE path = ?", (rel,))
        for rel, st in found.items():
            if rel not in known and (root / rel).exists():  # (not moved aside above)
                con.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?)",
                            (rel, st.st_size, st.st_mtime_ns, file_sha256(root / rel)))
    return damaged


def record(root: str | Path = ".") -> None:
    """Record every artifact as it is now (hashing only new or changed files): a run's outputs."""
    root = Path(root)
    found = _files(root)
    with closing(_connect(root)) as con, con:
        known = {p: (size, mtime) for p, size, mtime, _ in con.execute("SELECT * FROM files")}
        for rel in set(known) - set(found):
            con.execute("DELETE FROM files WHERE path = ?", (rel,))
        for rel, st in found.items():
            if known.get(rel) != (st.st_size, st.st_mtime_ns):
                con.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?)",
                            (rel, st.st_size, st.st_mtime_ns, file_sha256(root / rel)))


def _flag(argv: list[str], long: tuple[str, ...], short: str) -> bool:
    return any(a in long or (a.startswith("-") and not a.startswith("--") and short in a[1:] and a[1:].isalpha())
               for a in argv[1:])


def active(workflow) -> bool:
    """Whether the ledger applies: Snakemake's main process, not under DVC (which hashes itself).

    Under DVC: a stage's command (``dvc repro`` sets ``DVC_STAGE``) or ``encmap repro``'s batch.
    """
    return not (os.environ.get("DVC_STAGE") or os.environ.get(UNDER_DVC)) and workflow.is_main_process


def for_snakemake(workflow, dir_outputs: Iterable[str], argv: list[str] | None = None) -> None:
    """``rules/common.smk``, before the DAG is built: report damaged artifacts and move them aside.

    A dry run (``-n``) only reports; ``--touch`` re-stamps every output and is left alone. The
    executor (which knows both) is not set up yet when the Snakefile is read: the flags come from
    Snakemake's command line.
    """
    argv = sys.argv if argv is None else argv
    if not active(workflow) or _flag(argv, ("--touch",), "t"):
        return
    dry = _flag(argv, ("--dry-run", "--dryrun"), "n")
    for message in verify(Path(workflow.basedir), dir_outputs, move=not dry):
        print(f"encmap: {message}" + (" (dry run: nothing moved)" if dry else ""), file=sys.stderr)


def record_for_snakemake(workflow, argv: list[str] | None = None) -> None:
    """``onsuccess`` / ``onerror``: record the artifacts as the run leaves them (not in a dry run)."""
    argv = sys.argv if argv is None else argv
    if active(workflow) and not _flag(argv, ("--dry-run", "--dryrun"), "n"):
        record(Path(workflow.basedir))
