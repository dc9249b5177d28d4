"""What a plain ``snakemake`` run made, and from what: so that DVC can record it (``encmap record``).

The main command is ``snakemake --cores all``; sharing (``dvc push``) and experiments
(``dvc exp run -S``) need ``dvc.lock``. ``dvc commit`` would record whatever is on disk, stale
or not. Instead every Snakemake run keeps, per output, what its job was made from when the job
finished (:func:`record_made`, from ``rules/common.smk``): the output's content digest, the
digest of the code its stage runs, its params slice and the content digest of every input the
job read, in ``.snakemake/encmap/made.sqlite`` (local, like Snakemake's own metadata).

``encmap record`` (:func:`record`) writes the code digests and params slices as DVC's
bookkeeping stages do, then records in ``dvc.lock``, as ``dvc commit`` would, each stale stage
whose every output was made by a job of the current code, params slice and inputs and still holds
what that job wrote, with every stage above it up to date or recorded. Nothing is inferred from
file times. Every other stale stage stays stale and is named with the reason. No job runs.

Plumbing: never what a result is (that is the steps'), only whether a file is one.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path


MADE = ".snakemake/encmap/made.sqlite"


def _sha(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def _connect(root: Path) -> sqlite3.Connection:
    db = root / MADE
    db.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(db, timeout=60)
    con.execute("CREATE TABLE IF NOT EXISTS made (path TEXT PRIMARY KEY, digest TEXT, stage TEXT, code TEXT, "
                "params TEXT, inputs TEXT)")
    return con


class Basis:
    """What a job of a stage is made from, computed once per process per stage and model: the
    sha256 of its code digest text and of its params slice."""

    def __init__(self, root: Path, config: dict):
        self.root, self.config = root, config
        self._code: dict[str, str] = {}
        self._slices: dict[str, str] | None = None

    def code(self, stage: str) -> str:
        from .deps import stage_digest

        if stage not in self._code:
            self._code[stage] = _sha(stage_digest(self.root, stage))
        return self._code[stage]

    def params(self, stage: str, model: str | None) -> str | None:
        from .deps import STAGE_PARAMS, param_slices, per_model, slice_path

        if stage not in STAGE_PARAMS:
            return None
        if self._slices is None:
            self._slices = param_slices(self.config)
        return _sha(self._slices.get(slice_path(stage, model) if per_model(stage) else slice_path(stage)))


def record_made(workflow) -> None:
    """``rules/common.smk``: every job Snakemake declares finished (outputs checked) records its
    outputs' digests and what it was made from (:data:`MADE`). Not under DVC, which records itself."""
    from snakemake.dag import DAG

    from .integrity import UNDER_DVC
    from .snakemake_call import content_digest
    from .stages import STAGES

    if os.environ.get("DVC_STAGE") or os.environ.get(UNDER_DVC):
        return
    finish = DAG.finish
    if getattr(finish, "_encmap_made", None) is not None:
        finish = finish._encmap_made  # a second workflow in this process: wrap the original once
    root = Path(workflow.basedir)
    basis = Basis(root, workflow.config)
    seen: dict[str, tuple] = {}  # path -> (stat key, digest) of what this process hashed

    def digest(path) -> str | None:
        # Within one run, a file this process hashed (an output it just checked, an input another job
        # read) is not read again while its size, time and inode stay: a pair stage reads every PIP.
        p = os.path.normpath(str(path))
        try:
            st = os.stat(p)
            key = (st.st_size, st.st_mtime_ns, st.st_ino, os.path.isdir(p))
        except OSError:
            return None
        if key[3] or p not in seen or seen[p][0] != key:  # directories: always (their files may change)
            seen[p] = (key, content_digest(p))
        return seen[p][1]

    async def recording_finish(self, job, *args, **kwargs):
        rows = []
        for j in (list(job) if job.is_group() else [job]):
            stage = j.rule.name
            if stage not in STAGES:
                continue
            model = j.wildcards.get("model") if hasattr(j.wildcards, "get") else None
            inputs = {os.path.normpath(str(f)): digest(f) for f in j.input}
            code, params = basis.code(stage), basis.params(stage, model)
            for out in j.output:
                seen.pop(os.path.normpath(str(out)), None)  # just written: hashed afresh
                rows.append((os.path.normpath(str(out)), digest(out), stage, code, params,
                             json.dumps(inputs, sort_keys=True)))
        if rows:
            with closing(_connect(root)) as con, con:
                con.executemany("INSERT OR REPLACE INTO made VALUES (?, ?, ?, ?, ?, ?)", rows)
        return await finish(self, job, *args, **kwargs)

    recording_finish._encmap_made = finish
    DAG.finish = recording_finish


def _why_not(root: Path, stage: str, outs: list[str], made: dict, basis: Basis, model: str | None,
             digests: dict) -> str | None:
    """Why the DVC outputs ``outs`` of ``stage`` (its outs, metrics and plots: what DVC would record)
    cannot be shown made from the current code, params and inputs, or None. A directory output
    that no job made whole must hold only files that jobs made (per-encoder files)."""
    from .snakemake_call import content_digest

    def now(path: str) -> str | None:
        if path not in digests:
            digests[path] = content_digest(root / path)
        return digests[path]

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
        if rec["digest"] is None or now(owner) != rec["digest"]:
            return f"{owner}: changed since its job wrote it"
        if rec["code"] != code:
            return f"{owner}: made by other code than the stage's now"
        if rec["params"] != params:
            return f"{owner}: made with other params than params.yaml's now"
        for path, digest in json.loads(rec["inputs"]).items():
            if now(path) != digest:
                return f"{owner}: its input {path} changed since"
    return None


def record(root: str | Path = ".", log=print) -> int:
    """``encmap record``: record in ``dvc.lock`` what a plain Snakemake run made (module docstring).

    Returns 0 (the stages it could not show made are listed, and stay stale for ``encmap repro``).
    """
    import networkx as nx

    from ..params import load_params
    from .deps import BOOKKEEPING
    from .layout import stale_files
    from .repro import _bookkeep, _per_model_targets, _save, _write_locks, dvc_session, plan
    from .stages import stage_job

    t0 = time.perf_counter()
    root = Path(root).resolve()
    params = load_params(root / "params.yaml")
    with dvc_session(root, "encmap record") as repo:
        for name in BOOKKEEPING:
            _bookkeep(root, name, params)
        pl = plan(repo)
        saved = pl.ordered(pl.bookkeeping)
        _save(saved)
        made = {}
        if (root / MADE).exists():
            with closing(_connect(root)) as con:
                for path, digest, stage, code, prm, inputs in con.execute("SELECT * FROM made"):
                    made[path] = {"digest": digest, "stage": stage, "code": code, "params": prm, "inputs": inputs}
        basis, digests = Basis(root, params), {}
        per_model = _per_model_targets(params["models"])
        recorded, left = [], {}
        for s in pl.ordered(pl.stale):
            above = [u for u in nx.descendants(pl.graph, s) & pl.stale if u not in recorded]
            if above:
                left[s.addressing] = f"a stage above it is not recorded ({above[0].addressing})"
                continue
            job = stage_job(s.addressing, params, per_model)
            model = s.addressing.split("@", 1)[1] if "@" in s.addressing else None
            why = _why_not(root, job.rule, [str(o.def_path) for o in s.outs], made, basis, model, digests)
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
    log(f"encmap record: {len(recorded)} of {len(pl.stale)} stale stages recorded in dvc.lock as made "
        f"({time.perf_counter() - t0:.1f} s)")
    for name, why in left.items():
        log(f"  still stale: {name}: {why}")
    if left:
        log("encmap record: `encmap repro` (or `dvc repro`) makes what is still stale")
    return 0
