"""The ledger: what each Snakemake job made and from what, and the digest of every artifact.

One SQLite file, ``.snakemake/encmap/ledger.sqlite`` (local, like Snakemake's own metadata), that
every reader uses: a plain run's integrity check (:mod:`.integrity`: tables ``files``, size, time
and sha256 of every artifact, and ``damaged``), ``encmap record`` and ``encmap repro`` (``made``).
A file is hashed once: its sha256 is the ledger's while its size and time are (:func:`digest`), and
so is its md5 from the same read, which DVC then need not take (:func:`.repro.prime_dvc`).

``made`` has a row per output a job ran and wrote (:func:`record_made`): its digest when the job
finished, and what the job was made from as it started: its stage's code digest, params slice and
the digest of every input it read (its Snakemake inputs and the files params name for its stage,
as DVC hashes them: curate's corpora, the tasks' data). A dry run, the touch executor and a job
that wrote nothing (a remote job whose ``update()`` outputs are the last run's files) make none.

``encmap record`` (:func:`.repro.record`; a plain run's end in a DVC project) writes the code
digests and params slices as DVC's bookkeeping stages do, then records in ``dvc.lock``, as ``dvc
commit`` would, each stale stage whose every output a job made from the current code, params slice
and inputs and still holds, every stage above it up to date or recorded; every other stays stale,
named with the reason. ``encmap repro`` records a stage whose every target its call made (:func:`still_made`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import sys
from contextlib import closing
from pathlib import Path

from ..io import file_sha256, file_sha256_md5

LEDGER = ".snakemake/encmap/ledger.sqlite"
_SCHEMA = """CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, sha256 TEXT,
md5 TEXT, ino INTEGER);
CREATE TABLE IF NOT EXISTS damaged (path TEXT PRIMARY KEY, sha256 TEXT);
CREATE TABLE IF NOT EXISTS made (path TEXT PRIMARY KEY, digest TEXT, stage TEXT, code TEXT, params TEXT,
inputs TEXT);"""
#: The basis of each workflow recorded for (by id); jobs submitted, not finished; rows this process wrote.
_BASES, _STARTED, _ROWS = {}, {}, [0]


def _sha(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def connect(root: Path) -> sqlite3.Connection:
    """The ledger at ``root``, created if absent. One that is no database (damaged, a folder) is named
    in one line on stderr and set aside (``.damaged``); a fresh one starts, what it knew forgotten
    (nothing shown made, damage looked for from the files as they are): no run breaks."""
    db = root / LEDGER
    db.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _open(db)
    except sqlite3.DatabaseError as e:
        if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
            raise
        aside = db.with_name(db.name + ".damaged")
        shutil.rmtree(aside) if aside.is_dir() else aside.unlink(missing_ok=True)
        os.replace(db, aside)
        print(f"encmap: {db}: not a readable ledger ({e}); set aside as {aside.name}, a fresh one started "
              "(what it recorded is forgotten)", file=sys.stderr)
    return _open(db)


def _open(db: Path) -> sqlite3.Connection:
    con = sqlite3.connect(db, timeout=60)
    con.executescript(_SCHEMA)
    have = {row[1] for row in con.execute("PRAGMA table_info(files)")}
    for column in (c for c in ("md5 TEXT", "ino INTEGER") if c.split()[0] not in have):  # a ledger of before
        con.execute(f"ALTER TABLE files ADD COLUMN {column}")
    return con


def digest(con: sqlite3.Connection, root: Path, path: str, keep: bool = False) -> str | None:
    """The content digest of ``path`` (relative to ``root``, or absolute): a file's sha256, a folder's
    over its files' names and sha256 (but ``.snakemake_timestamp``), or None. A file's is the ledger's
    while its size and time are; ``keep``: the files hashed are recorded (outputs a job just wrote)."""
    p = root / path
    if p.is_dir():
        h = hashlib.sha256()
        for f in sorted(f for f in p.rglob("*") if f.is_file() and f.name != ".snakemake_timestamp"):
            h.update(str(f.relative_to(p)).encode() + b"\0")
            h.update(digest(con, root, os.path.join(path, f.relative_to(p)), keep).encode())
        return "dir:" + h.hexdigest()
    try:
        st = p.stat()
    except OSError:
        return None
    row = con.execute("SELECT size, mtime_ns, sha256 FROM files WHERE path = ?", (path,)).fetchone()
    if row is not None and row[:2] == (st.st_size, st.st_mtime_ns):
        return row[2]
    return remember(con, root, path, st) if keep else file_sha256(p)


def remember(con: sqlite3.Connection, root: Path, path: str, st: os.stat_result | None = None) -> str:
    """Hash file ``path`` (relative to ``root``; ``st``: its stat before the read) into the ledger; its sha256."""
    st = st or (root / path).stat()
    sha, md5 = file_sha256_md5(root / path)
    con.execute("INSERT OR REPLACE INTO files (path, size, mtime_ns, sha256, md5, ino) VALUES (?, ?, ?, ?, ?, ?)",
                (path, st.st_size, st.st_mtime_ns, sha, md5, st.st_ino))
    return sha


def _files(path: Path) -> frozenset | None:
    """The files ``path`` holds as (name, device, inode, size), or None. encmap's steps write each
    artifact as a new file renamed into place: a file with its inode and size from before a job was
    not written by it (Snakemake's touch of a finished job's outputs changes only their times)."""
    def key(f: Path, name: str) -> tuple:
        st = f.stat()
        return name, st.st_dev, st.st_ino, st.st_size

    try:
        if path.is_dir():
            return frozenset(key(f, str(f.relative_to(path))) for f in path.rglob("*")
                             if f.is_file() and not f.name.startswith("."))
        return frozenset([key(path, "")]) if path.exists() else None
    except OSError:
        return None


class Basis:
    """What a job of a stage is made from: the sha256 of its code digest text (taken afresh when a
    code file's size or time changed) and of its params slice."""

    def __init__(self, root: Path, config: dict):
        self.root, self.config = root, config
        self._code: dict[str, tuple] = {}  # stage -> (files, their stat keys, digest)
        self._slices: dict[str, str] | None = None

    def code(self, stage: str) -> str:
        from .deps import stage_digest

        def stats(files) -> tuple | None:
            try:
                return tuple((st.st_size, st.st_mtime_ns) for st in (os.stat(self.root / f) for f in files))
            except OSError:
                return None

        files, then, sha = self._code.get(stage, ((), None, None))
        if sha is None or then is None or stats(files) != then:
            text = stage_digest(self.root, stage)
            files = [line.split("  ", 1)[1] for line in text.splitlines()[1:]]  # <sha256>  <path>
            self._code[stage] = (files, stats(files), _sha(text))
        return self._code[stage][2]

    def params(self, stage: str, model: str | None) -> str | None:
        from .deps import STAGE_PARAMS, param_slices, per_model, slice_path

        if stage not in STAGE_PARAMS:
            return None
        if self._slices is None:
            self._slices = param_slices(self.config)
        return _sha(self._slices.get(slice_path(stage, model) if per_model(stage) else slice_path(stage)))


def record_made(workflow) -> None:
    """``rules/common.smk``: a job that ran and wrote its outputs gets ``made`` rows (module docstring)
    as Snakemake declares it finished, in Snakemake's main process, not under ``dvc repro``."""
    from snakemake.dag import DAG
    from snakemake.scheduling.job_scheduler import JobScheduler

    if os.environ.get("DVC_STAGE") or not workflow.is_main_process:
        return
    _BASES[id(workflow)] = Basis(Path(workflow.basedir), workflow.config)
    if getattr(DAG.finish, "_encmap_made", False):  # the hooks: once per process
        return
    finish, submit = DAG.finish, JobScheduler.run

    def recording(wf) -> Basis | None:
        return None if wf.dryrun or wf.touch else _BASES.get(id(wf))

    def members(job) -> list:
        return list(job) if job.is_group() else [job]

    def recording_submit(self, jobs, *args, **kwargs):
        from .stages import STAGES

        basis = recording(self.workflow)
        if basis is not None:
            with closing(connect(root := basis.root)) as con:
                for j in (j for job in jobs for j in members(job) if j.rule.name in STAGES):
                    stage = j.rule.name
                    model = j.wildcards.get("model") if hasattr(j.wildcards, "get") else None
                    read = {os.path.normpath(f) for f in [*map(str, j.input), *STAGES[stage].sources(basis.config)]}
                    _STARTED[j] = (stage, basis.code(stage), basis.params(stage, model),
                                   json.dumps({f: digest(con, root, f) for f in read}, sort_keys=True),
                                   {os.path.normpath(str(o)): _files(root / str(o)) for o in j.output})
        return submit(self, jobs, *args, **kwargs)

    async def recording_finish(self, job, *args, **kwargs):
        basis = recording(self.workflow)
        started = [_STARTED.pop(j) for j in members(job) if j in _STARTED]
        if basis is not None and started:
            with closing(connect(basis.root)) as con, con:
                con.executemany("INSERT OR REPLACE INTO made VALUES (?, ?, ?, ?, ?, ?)", [
                    (out, digest(con, basis.root, out, keep=True), stage, code, params, inputs)
                    for stage, code, params, inputs, before in started for out, was in before.items()
                    # still the file(s) of before the job: it wrote nothing there
                    if was is None or _files(basis.root / out) != was])
                _ROWS[0] += con.total_changes
        return await finish(self, job, *args, **kwargs)

    recording_finish._encmap_made = recording_submit._encmap_made = True
    DAG.finish, JobScheduler.run = recording_finish, recording_submit


def made_rows() -> int:
    """How many ``made`` rows the jobs of this process wrote."""
    return _ROWS[0]


def forget(root: Path, paths: list[str]) -> None:
    """Delete the ``made`` rows of ``paths`` (``encmap repro``, before a call: those after it are its)."""
    with closing(connect(root)) as con, con:
        con.executemany("DELETE FROM made WHERE path = ?", [(os.path.normpath(p),) for p in paths])


def still_made(root: Path, groups: list[list[str]]) -> list[bool]:
    """Per group of paths: whether a job made each (a ``made`` row) and it still holds what it wrote."""
    with closing(connect(root)) as con:
        found = dict(con.execute("SELECT path, digest FROM made"))
        return [all(found.get(p) is not None and digest(con, root, p) == found[p] for p in map(os.path.normpath, g))
                for g in groups]
