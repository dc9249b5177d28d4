"""The ledger: what each Snakemake job made and from what, and the digest of every artifact.

One SQLite file, ``.snakemake/encmap/ledger.sqlite`` (local, like Snakemake's own metadata), that
every reader uses: a plain run's integrity check (:mod:`.integrity`: tables ``files``, the inode,
size, time, change time and sha256 of every artifact, and ``damaged``), ``encmap record`` and ``encmap
repro`` (``made``). A file is hashed once: its sha256 is the ledger's while its inode, size, time and
change time are (:func:`digest`: DVC's own key and the time no one can set), and so is the md5 of
the same read, which DVC need not take again in the process that took it (:func:`.repro.prime_dvc`;
``session``).

``made`` has a row per output a job wrote, on that job's own word only: the receipt its process left
as its last step (:mod:`.receipts`), taken as Snakemake declares the job finished and only while each
file is still the one the job hashed (:func:`record_made`). The row holds the output's digest and
what the job was made from as it started: its stage's code digest (none if a code file of the stage
changed between then and the job's end, or since its process loaded its code: an in-process job runs
the modules Snakemake's process loaded), its params slice and the digest of every input it read
(its Snakemake inputs and the files params name for its stage, as DVC hashes them: curate's
corpora, the tasks' data). A dry run, the touch executor, a scheduler that ran nothing, a stage-out
copy or a restored backup leave no receipt and make nothing: such an output is named as the run
goes and made again by the next run (``damaged``).

``encmap record`` (:func:`.repro.record`; a plain run's end in a DVC project) writes the code
digests and params slices as DVC's bookkeeping stages do, then records in ``dvc.lock``, as ``dvc
commit`` would, each stale stage whose every output a job made from the current code, params slice
and inputs and still holds, every stage above it up to date or recorded; every other stays stale,
named with the reason. ``encmap repro`` records a stage whose every target its call made (:func:`still_made`).
A ledger that cannot be opened or written is named with what to do (:func:`ledger_error`): a run
goes on without it, a command stops.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sqlite3
import sys
from contextlib import closing
from pathlib import Path

from ..io import file_sha256, file_sha256_md5
from ..validation import EncmapError
from . import receipts

LEDGER = ".snakemake/encmap/ledger.sqlite"
#: How long a process waits for another's hold on the ledger (a write takes milliseconds).
WAIT_S = 60
#: Each table's columns; a ledger of before lacks the ones :data:`_ADDED` adds.
_TABLES = {
    "files": "path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, sha256 TEXT, md5 TEXT, ino INTEGER, session TEXT, "
             "ctime_ns INTEGER",
    "damaged": "path TEXT PRIMARY KEY, sha256 TEXT, why TEXT",
    "made": "path TEXT PRIMARY KEY, digest TEXT, stage TEXT, code TEXT, params TEXT, inputs TEXT",
}
_ADDED = {"files": ("md5 TEXT", "ino INTEGER", "session TEXT", "ctime_ns INTEGER"), "damaged": ("why TEXT",)}
#: The process that hashes a file (or takes its job's receipt) tags its row with its session: only
#: that process hands the md5 to DVC (a row at rest, forged or stale, never is). ``encmap repro`` gives
#: its Snakemake call its own (:data:`SESSION_ENV`).
SESSION_ENV = "ENCMAP_LEDGER_SESSION"
SESSION = os.environ.get(SESSION_ENV) or secrets.token_hex(16)
#: The basis of each workflow recorded for (by id); jobs submitted, not finished; rows this process
#: wrote; a ledger problem already named in this process (a run goes on without the ledger).
_BASES, _STARTED, _ROWS, _BROKEN = {}, {}, [0], {}


def file_key(st: os.stat_result) -> tuple[int, int, int, int]:
    """The ledger's key of a file's version, as its columns (size, mtime_ns, ino, ctime_ns): DVC's
    (inode, size, time) and the change time, which no one can set."""
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns


#: The ledger's columns that :func:`file_key` fills, in its order.
KEY = "size, mtime_ns, ino, ctime_ns"


def _sha(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def ledger_error(db: Path, e: Exception) -> EncmapError:
    """A ledger that cannot be used, named with what to do (never sqlite3's traceback)."""
    text = str(e)
    for side in (Path(f"{db}-wal"), Path(f"{db}-journal"), Path(f"{db}-shm")):
        if side.exists() and not side.is_file():
            return EncmapError(f"{db}: the ledger cannot be opened: {side} is in the way (not a file): remove it")
    if "locked" in text or "busy" in text:
        return EncmapError(f"{db}: the ledger is locked by another process of this project (a snakemake, "
                           "encmap record or encmap repro still running); run this again once it has ended")
    if "readonly" in text or "read-only" in text or "unable to open" in text or isinstance(e, OSError):
        return EncmapError(f"{db}: the ledger cannot be written ({text}); make it and {db.parent} writable, "
                           "or remove the folder (what it recorded is then forgotten)")
    return EncmapError(f"{db}: the ledger cannot be used ({type(e).__name__}: {text}); remove it "
                       "(what it recorded is then forgotten)")


def connect(root: Path) -> sqlite3.Connection:
    """The ledger at ``root``, created if absent. One that is no database (damaged, a folder) or of
    another schema is named in one line on stderr and set aside (``.damaged``); a fresh one starts,
    what it knew forgotten (nothing shown made, damage looked for from the files as they are). One
    that cannot be opened or written (locked, read-only, a folder beside it): :func:`ledger_error`."""
    db = root / LEDGER
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        try:
            return _open(db)
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError) and not str(e).startswith("another schema"):
                raise
            aside = db.with_name(db.name + ".damaged")
            shutil.rmtree(aside) if aside.is_dir() else aside.unlink(missing_ok=True)
            os.replace(db, aside)
            print(f"encmap: {db}: not a readable ledger ({e}); set aside as {aside.name}, a fresh one started "
                  "(what it recorded is forgotten)", file=sys.stderr)
        return _open(db)
    except (sqlite3.Error, OSError) as e:
        raise ledger_error(db, e) from None


def _open(db: Path) -> sqlite3.Connection:
    if db.is_dir():
        raise sqlite3.DatabaseError("a folder, not a file")
    con = sqlite3.connect(db, timeout=WAIT_S)
    try:
        con.executescript("".join(f"CREATE TABLE IF NOT EXISTS {t} ({cols});" for t, cols in _TABLES.items()))
        for table, cols in _TABLES.items():
            have = [row[1] for row in con.execute(f"PRAGMA table_info({table})")]
            for column in (c for c in _ADDED.get(table, ()) if c.split()[0] not in have):  # a ledger of before
                con.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
                have.append(column.split()[0])
            if sorted(have) != sorted(c.split()[0] for c in cols.split(", ")):
                raise sqlite3.DatabaseError(f"another schema: table {table} has columns {', '.join(have)}")
    except BaseException:
        con.close()
        raise
    return con


def digest(con: sqlite3.Connection, root: Path, path: str, keep: bool = False) -> str | None:
    """The content digest of ``path`` (relative to ``root``, or absolute): a file's sha256, a folder's
    over its files' names and sha256 (:func:`.receipts.output_files`), or None. A file's is the
    ledger's while its inode, size and time are; ``keep``: the files hashed are recorded."""
    p = root / path
    if p.is_dir():
        h = hashlib.sha256()
        for f in receipts.output_files(p):
            h.update(str(f.relative_to(p)).encode() + b"\0")
            h.update(digest(con, root, os.path.join(path, f.relative_to(p)), keep).encode())
        return "dir:" + h.hexdigest()
    try:
        st = p.stat()
    except OSError:
        return None
    row = con.execute(f"SELECT {KEY}, sha256 FROM files WHERE path = ?", (path,)).fetchone()
    if row is not None and row[:4] == file_key(st):
        return row[4]
    return remember(con, root, path, st) if keep else file_sha256(p)


def remember(con: sqlite3.Connection, root: Path, path: str, st: os.stat_result | None = None) -> str:
    """Hash file ``path`` (relative to ``root``; ``st``: its stat before the read) into the ledger; its sha256."""
    st = st or (root / path).stat()
    sha, md5 = file_sha256_md5(root / path)
    _keep(con, path, file_key(st), sha, md5)
    return sha


def _keep(con: sqlite3.Connection, path: str, key: tuple, sha: str, md5: str) -> None:
    con.execute(f"INSERT OR REPLACE INTO files (path, {KEY}, sha256, md5, session) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (path, *key, sha, md5, SESSION))


def mark_damaged(con: sqlite3.Connection, path: str, sha: str, why: str | None = None) -> None:
    """Note ``path``'s current content as not good (``why``: said when the next run reruns its job)."""
    con.execute("INSERT OR REPLACE INTO damaged (path, sha256, why) VALUES (?, ?, ?)", (path, sha, why))


class Basis:
    """What a job of a stage is made from: the sha256 of its code digest text (taken afresh when a
    code file's size or time changed) and of its params slice."""

    def __init__(self, root: Path, config: dict):
        self.root, self.config = root, config
        self._code: dict[str, tuple] = {}  # stage -> (files, their stat keys, digest)
        self._slices: dict[str, str] | None = None

    def _stats(self, files) -> tuple | None:
        try:
            return tuple((st.st_size, st.st_mtime_ns) for st in (os.stat(self.root / f) for f in files))
        except OSError:
            return None

    def code(self, stage: str) -> str:
        from .deps import stage_digest

        files, then, sha = self._code.get(stage, ((), None, None))
        if sha is None or then is None or self._stats(files) != then:
            text = stage_digest(self.root, stage)
            files = [line.split("  ", 1)[1] for line in text.splitlines()[1:]]  # <sha256>  <path>
            self._code[stage] = (files, self._stats(files), _sha(text))
        return self._code[stage][2]

    def code_ran(self, stage: str, code: str, changed: list[str]) -> str | None:
        """``code`` (the digest taken as a job of ``stage`` started) if that is the code the job ran:
        none of the stage's files changed since (now, or by the job's receipt: ``changed``, the code
        files that changed since its process loaded its code); else None."""
        files, then, sha = self._code.get(stage, ((), None, None))
        if sha != code or set(files) & set(changed) or self._stats(files) != then:
            return None
        return code

    def params(self, stage: str, model: str | None) -> str | None:
        from .deps import STAGE_PARAMS, param_slices, per_model, slice_path

        if stage not in STAGE_PARAMS:
            return None
        if self._slices is None:
            self._slices = param_slices(self.config)
        return _sha(self._slices.get(slice_path(stage, model) if per_model(stage) else slice_path(stage)))


def without_ledger(root: Path, error: EncmapError) -> None:
    """A run goes on without a ledger it cannot use: the problem said once, and nothing in this
    process waits for it again (a locked ledger costs one wait, not one per hook)."""
    db = str(root / LEDGER)
    if db not in _BROKEN:
        _BROKEN[db] = error
        print(f"encmap: {error}; this run goes on without it: no damage check, and what it makes is not "
              "recorded as made (`encmap record` names it stale)", file=sys.stderr)


def ledger_unusable(root: Path) -> bool:
    """Whether this process found the ledger at ``root`` unusable (:func:`without_ledger`)."""
    return str(root / LEDGER) in _BROKEN


def record_made(workflow) -> None:
    """``rules/common.smk``: a job whose receipts say it wrote its outputs gets ``made`` rows (module
    docstring) as Snakemake declares it finished, in Snakemake's main process, not under ``dvc repro``."""
    from snakemake.dag import DAG
    from snakemake.scheduling.job_scheduler import JobScheduler

    if os.environ.get("DVC_STAGE") or not workflow.is_main_process:
        return
    _BASES[id(workflow)] = Basis(Path(workflow.basedir), workflow.config)
    if getattr(DAG.finish, "_encmap_made", False):  # the hooks: once per process
        return
    finish, submit = DAG.finish, JobScheduler.run

    def recording(wf) -> Basis | None:
        basis = None if wf.dryrun or wf.touch else _BASES.get(id(wf))
        return None if basis is None or ledger_unusable(basis.root) else basis

    def members(job) -> list:
        return list(job) if job.is_group() else [job]

    def recording_submit(self, jobs, *args, **kwargs):
        from .stages import SOURCE_STAMPS, STAGES

        basis = recording(self.workflow)
        if basis is not None:
            try:
                with closing(connect(root := basis.root)) as con:
                    for j in (j for job in jobs for j in members(job) if j.rule.name in STAGES):
                        stage = j.rule.name
                        model = j.wildcards.get("model") if hasattr(j.wildcards, "get") else None
                        read = {os.path.normpath(f) for f in [*map(str, j.input), *STAGES[stage].sources(basis.config)]
                                if not os.path.normpath(f).startswith(SOURCE_STAMPS)}  # the sources stand for it
                        outs = [os.path.normpath(str(o)) for o in j.output]
                        receipts.clear(root, outs)  # a receipt found when it finishes is this job's
                        _STARTED[j] = (stage, basis.code(stage), basis.params(stage, model),
                                       json.dumps({f: digest(con, root, f) for f in read}, sort_keys=True), outs)
            except EncmapError as e:
                without_ledger(basis.root, e)
        return submit(self, jobs, *args, **kwargs)

    async def recording_finish(self, job, *args, **kwargs):
        basis = recording(self.workflow)
        started = [(j, _STARTED.pop(j)) for j in members(job) if j in _STARTED]
        if basis is not None and started:
            try:
                _take_receipts(basis, started)
            except EncmapError as e:
                without_ledger(basis.root, e)
        return await finish(self, job, *args, **kwargs)

    recording_finish._encmap_made = recording_submit._encmap_made = True
    DAG.finish, JobScheduler.run = recording_finish, recording_submit


def _take_receipts(basis: Basis, started: list) -> None:
    """``made`` rows for the outputs whose job's receipt holds (:func:`.receipts.take`); each other
    output is named and marked for the next run to make again."""
    root = basis.root
    try:
        with closing(connect(root)) as con, con:
            for job, (stage, code, params, inputs, outs) in started:
                for out in outs:
                    receipt, why = receipts.take(root, out)
                    if receipt is None:
                        _not_made(con, root, stage, out, why)
                        continue
                    for rel, (_dev, ino, size, mtime, ctime, sha, md5) in receipt["files"].items():
                        path = os.path.normpath(os.path.join(out, rel))
                        _keep(con, path, (size, mtime, ino, ctime), sha, md5)
                        con.execute("DELETE FROM damaged WHERE path = ?", (path,))  # its job's word stands
                    con.execute("INSERT OR REPLACE INTO made (path, digest, stage, code, params, inputs) "
                                "VALUES (?, ?, ?, ?, ?, ?)", (out, receipts.digest_of(receipt), stage,
                                                              basis.code_ran(stage, code, receipt["code_changed"]),
                                                              params, inputs))
            _ROWS[0] += con.total_changes
    except sqlite3.Error as e:
        raise ledger_error(root / LEDGER, e) from None


def _not_made(con: sqlite3.Connection, root: Path, stage: str, out: str, why: str) -> None:
    """Snakemake calls a job of ``stage`` finished, but its output ``out`` has no word of it: said,
    and its files marked so that the next run makes it again (a plain run would say "Nothing to be done")."""
    print(f"encmap: {out}: Snakemake reports its {stage} job done, but {why}: not recorded as made; the next "
          "run makes it again", file=sys.stderr)
    con.execute("DELETE FROM made WHERE path = ?", (out,))
    for f in receipts.output_files(root / out):
        rel = str(f.relative_to(root))
        mark_damaged(con, rel, file_sha256(f), f"its last {stage} job finished without writing it ({why})")


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
