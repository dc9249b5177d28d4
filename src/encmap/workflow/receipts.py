"""Receipts: a job's own word that it wrote its outputs, the only evidence that a job made a file.

Snakemake calls a job finished when a dry run plans it, ``--touch`` stamps it, a scheduler reports
it COMPLETED or its outputs merely exist; none of that shows the job wrote them (a SLURM job that
wrote nothing, a stage-out step that copied old files back, a restored backup). So each job, in its
own process, as its last step (``scripts/_job.py``: :func:`write`), hashes what it wrote and leaves
one receipt per output under :data:`RECEIPTS`: the output's files with their device, inode, size,
time, sha256 and md5, and the code files that changed since the job's process loaded its code.
The process that scheduled the job takes the receipt (:func:`take`) only if every file still has
that device, inode, size, time and change time (DVC's own key, and stricter; Snakemake's own touch
of the outputs a job wrote moves the receipt's time with it: :func:`follow`) and removes it;
whoever reads receipts removes the old ones of an output before its job is submitted (:func:`clear`),
so a receipt found after the job is that job's. No receipt, no ``made``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..io import atomic_write_text, file_sha256_md5

RECEIPTS = Path(".snakemake") / "encmap" / "receipts"
#: Where the code a job runs lives (relative to the workflow root): what :func:`code_stats` watches.
CODE_PLACES = ("src", "scripts", "rules", "requirements", "Snakefile")


def _name(path: str) -> str:
    return hashlib.sha256(os.path.normpath(path).encode()).hexdigest()[:40] + ".json"


def output_files(p: Path) -> list[Path]:
    """The files an output ``p`` holds: itself, or a directory's files but Snakemake's timestamp,
    in the order of their relative paths as text (the order of a directory's digest)."""
    if p.is_dir():
        return sorted((f for f in p.rglob("*") if f.is_file() and f.name != ".snakemake_timestamp"),
                      key=lambda f: _rel(p, f))
    return [p] if p.is_file() else []


def _rel(out: Path, f: Path) -> str:
    """A file's name within output ``out`` ("" for the output itself)."""
    return "" if f == out else str(f.relative_to(out))


def stat_key(st: os.stat_result) -> list[int]:
    """What identifies a file's version without reading it: device, inode, size, modification time,
    and the change time, which no one can set (an edit in place with its time set back changes it)."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def code_stats(root: Path) -> dict[str, tuple[int, int]]:
    """Size and time of every code file under ``root`` (:data:`CODE_PLACES`), by relative path:
    taken when a process loads its code, compared when its job ends (a few milliseconds)."""
    out = {}
    for place in CODE_PLACES:
        top = os.path.join(root, place)
        walk = [(os.path.dirname(top), [], [place])] if os.path.isfile(top) else os.walk(top)
        for dirpath, dirnames, filenames in walk:
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in filenames:
                if name.endswith((".pyc", ".sha256")):
                    continue
                f = os.path.join(dirpath, name)
                try:
                    st = os.stat(f)
                except OSError:
                    continue
                out[os.path.relpath(f, root)] = (st.st_size, st.st_mtime_ns)
    return out


def write(root: Path, outputs, loaded: dict[str, tuple[int, int]]) -> None:
    """The job's receipts: one per output in ``outputs`` (paths relative to ``root``), written after
    every output is complete. ``loaded``: :func:`code_stats` as the job's process loaded its code."""
    now = code_stats(root)
    changed = sorted(f for f in set(loaded) | set(now) if loaded.get(f) != now.get(f))
    (root / RECEIPTS).mkdir(parents=True, exist_ok=True)
    for out in map(os.path.normpath, map(str, outputs)):
        files = {}
        for f in output_files(root / out):
            st = f.stat()
            sha, md5 = file_sha256_md5(f)
            if stat_key(f.stat()) != stat_key(st):  # written to while read (not by this job): no word on it
                files = None
                break
            files[_rel(root / out, f)] = [*stat_key(st), sha, md5]
        if files is None:
            continue
        atomic_write_text(root / RECEIPTS / _name(out), json.dumps(
            {"path": out, "dir": (root / out).is_dir(), "files": files, "code_changed": changed}))


def clear(root: Path, outputs) -> None:
    """Remove the receipts of ``outputs``: one found later is a later job's."""
    for out in outputs:
        (root / RECEIPTS / _name(str(out))).unlink(missing_ok=True)


def take(root: Path, out: str, remove: bool = True) -> tuple[dict | None, str | None]:
    """The receipt of output ``out`` if its files are still those its job wrote, else (None, why).

    Returns ``(receipt, None)``, the receipt removed (``remove``), or ``(None, reason)``.
    """
    out = os.path.normpath(out)
    f = root / RECEIPTS / _name(out)
    try:
        receipt = json.loads(f.read_text(encoding="utf-8"))
        files = receipt["files"]
        assert receipt["path"] == out and isinstance(files, dict)
    except FileNotFoundError:
        return None, "its job left no receipt (it did not write it: a scheduler, a dry or touch run, a copy)"
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        return None, f"its job's receipt {f} is unreadable"
    finally:
        if remove:
            f.unlink(missing_ok=True)
    now = {_rel(root / out, g): g for g in output_files(root / out)}
    if set(now) != set(files):
        return None, "its files are not those its job wrote"
    for rel, g in now.items():
        try:
            if stat_key(g.stat()) != files[rel][:5]:
                return None, f"{g.relative_to(root)} was replaced or changed since its job wrote it"
        except OSError:
            return None, f"{g.relative_to(root)} vanished"
    return receipt, None


def follow(root: Path, out: str, before: list[int]) -> None:
    """Snakemake has just touched output file ``out`` (as it does to every output a job wrote): if the
    file was still the one its receipt names (``before``: its :func:`stat_key` then), the receipt
    follows the new time. Anything else that changes a file voids its receipt."""
    f = root / RECEIPTS / _name(out)
    try:
        receipt = json.loads(f.read_text(encoding="utf-8"))
        entry = receipt["files"][""]
        if entry[:5] != before:
            return
        entry[:5] = stat_key((root / out).stat())
    except (OSError, ValueError, KeyError, TypeError):
        return
    atomic_write_text(f, json.dumps(receipt))


def digest_of(receipt: dict) -> str:
    """The output's content digest as :func:`encmap.workflow.made.digest` takes it from the files."""
    files = receipt["files"]
    if not receipt["dir"]:
        return files[""][5]
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0")
        h.update(files[rel][5].encode())
    return "dir:" + h.hexdigest()


def missing(root: Path, outputs) -> list[str]:
    """``encmap stage``: each of ``outputs`` no job of the call just made wrote, with why (receipts
    taken and removed)."""
    out = []
    for o in outputs:
        receipt, why = take(root, str(o))
        if receipt is None:
            out.append(f"{os.path.normpath(str(o))}: {why}")
    return out
