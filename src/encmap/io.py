"""Artifact I/O: atomic writes that reproduce byte for byte, file hashes, the curated sentence file.

HDF5 files are written with ``track_times=False`` (else identical reruns differ and DVC sees a
change), into a temporary file beside the target that is renamed over it only when complete,
so a failed job leaves no partial artifact. Tracked files are only ever opened read-only
(opening a hard-linked DVC cache file with ``r+``/``a`` would corrupt the cache).
"""

from __future__ import annotations

import csv
import glob
import hashlib
import io
import json
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import h5py
import numpy as np

from .validation import EncmapError, shown

#: Seconds to wait, complete temporary file in place, before renaming it over the target: lets
#: a test kill a job mid-write deterministically. Unset in normal use.
PAUSE_ENV = "ENCMAP_PAUSE_BEFORE_RENAME"
#: The longest pause :data:`PAUSE_ENV` may ask for, in seconds (a day; ``time.sleep`` overflows
#: past ~9e9 s).
MAX_PAUSE_S = 86_400.0


def _pause_before_rename() -> None:
    """The testing aid's pause (:data:`PAUSE_ENV`): seconds in [0, :data:`MAX_PAUSE_S`], else an
    error naming the variable (not the raw ValueError or OverflowError of ``float``/``time.sleep``)."""
    raw = os.environ.get(PAUSE_ENV, "").strip()
    if not raw:
        return
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0.0 <= seconds <= MAX_PAUSE_S:  # NaN and inf fail too
        raise EncmapError(f"{PAUSE_ENV}={shown(raw)}: expected seconds from 0 to {MAX_PAUSE_S:.0f} (a testing aid "
                          "that holds each finished file before its rename; unset it)")
    time.sleep(seconds)


#: When the current job started (ns since the epoch), if it is a job that may outlive its
#: Snakemake (a ``script:`` job); None in library use. See :func:`set_job_start`.
_job_started_ns: int | None = None


#: The Wikipedia dump sample inside gensim's wheel (the probe set's ``wiki`` source; training text).
GENSIM_WIKI_SAMPLE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


def gensim_test_data(needed_by: str) -> Path:
    """gensim's bundled ``test/test_data`` folder (the Wikipedia sample, the Lee corpora, the
    polarity sentences), read offline by the probe set, two tasks and the training text.
    ``needed_by`` names who asks, for the error when gensim is not installed.

    The package is found, not imported: ``import gensim`` costs ~1.2 s of CPU (scipy.stats,
    its corpora) in every job that only reads these files."""
    import importlib.util

    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise EncmapError(f"{needed_by} needs gensim: pip install gensim (its wheel ships the Wikipedia sample "
                          "and the Lee corpora)")
    return Path(spec.submodule_search_locations[0]) / "test" / "test_data"


def gensim_version() -> str:
    """The installed gensim's version, read from its metadata (no import)."""
    from importlib.metadata import version

    return version("gensim")


def set_job_start(ns: int | None) -> None:
    """From now on, refuse to replace an output that was written after ``ns`` (a newer run's).

    A job orphaned by a killed Snakemake would otherwise rename its outputs over those of the
    run that started after it, e.g. coordinates of the old seed beside a model of the new one.
    """
    global _job_started_ns
    _job_started_ns = ns


def _refuse_newer(target: Path) -> None:
    if _job_started_ns is not None and target.exists() and target.stat().st_mtime_ns > _job_started_ns:
        raise EncmapError(f"{target}: written by another run after this job started; not replacing it with this "
                          "job's result (was the Snakemake that started this job killed?)")


def _remove_stale_temporaries(target: Path) -> None:
    """Remove ``.<name>.*.tmp`` beside ``target``: what a killed job left while writing it.

    One job writes a given artifact (Snakemake's rule), so a temporary of the same name is
    never another live writer's.
    """
    for stale in target.parent.glob(f".{glob.escape(target.name)}.*.tmp"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path``, renamed over it when the block completes (removed if it fails).

    Temporary names end in ``.tmp`` (ignored by git and DVC). A job killed mid-write leaves one
    behind; the next write of the same path removes it.
    """
    target = Path(path)
    if target.is_dir():
        raise EncmapError(f"{target} is a directory; name the file to write (e.g. {target / 'out'})")
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)
        _pause_before_rename()  # testing aid: hold the finished temporary file in place
        _refuse_newer(target)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def replace_shared_text(path: str | Path, text: str) -> None:
    """Write UTF-8 text to ``path`` via a temporary file of its own and a rename, for a file that
    several processes share (a cache, a ledger): unlike :func:`atomic_path`, another writer's
    temporary is never removed, the file is no job's output (no check of its age), and the
    testing pause does not apply."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write UTF-8 text to ``path`` via a temporary file and rename."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path, fix: str = "") -> Any:
    """A JSON file's content; a syntax error names the file and line, then ``fix`` (what to do)."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise EncmapError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})" + (f"; {fix}" if fix else "")) from None


def csv_cell(v: Any) -> str:
    """A CSV cell: floats in shortest round-trip form (the file reproduces float64 exactly), None empty."""
    if v is None:
        return ""
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    return str(v)


def csv_table(rows: list[dict[str, Any]], fields: list[str]) -> str:
    """CSV text of ``rows`` (dicts) with columns ``fields``, formatted by :func:`csv_cell`."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(fields)
    for r in rows:
        w.writerow([csv_cell(r.get(f)) for f in fields])
    return buf.getvalue()


def write_h5(path: str | Path, datasets: dict[str, np.ndarray], attrs: dict[str, Any]) -> None:
    """Write datasets and attributes to a new HDF5 file, reproducibly and atomically.

    Parameters
    ----------
    datasets : dict of name -> ndarray
    attrs : dict of name -> str | number | dict (dicts are stored as JSON strings)
    """
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w", track_order=True, libver=("earliest", "v110")) as f:
            for k in sorted(attrs):
                v = attrs[k]
                f.attrs[k] = json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) or v is None else v
            for name, arr in datasets.items():
                arr = np.asarray(arr)
                if arr.dtype.kind in "OU":
                    f.create_dataset(name, data=arr.astype(object), dtype=h5py.string_dtype(), track_times=False)
                else:
                    f.create_dataset(name, data=arr, track_times=False)


def h5_datasets(path: str | Path) -> list[str]:
    """Names of an HDF5 file's datasets (read-only; errors name the file)."""
    p = Path(path)
    if not p.exists():
        raise EncmapError(f"{p}: file not found")
    try:
        with h5py.File(p, "r") as f:
            return list(f.keys())
    except OSError as e:
        raise EncmapError(f"{p}: not a readable HDF5 file ({e})") from None


def read_h5(path: str | Path, names: list[str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read datasets (all, or ``names``) and attributes from an HDF5 file, read-only."""
    p = Path(path)
    if not p.exists():
        raise EncmapError(f"{p}: file not found")
    try:
        with h5py.File(p, "r") as f:
            keys = list(f.keys()) if names is None else names
            missing = [k for k in keys if k not in f]
            if missing:
                raise EncmapError(f"{p}: no dataset {missing[0]!r} (has {list(f.keys())})")
            data = {}
            for k in keys:
                v = f[k][()]
                if f[k].dtype.kind == "O":
                    v = np.array([x.decode() if isinstance(x, bytes) else x for x in v], dtype=object)
                data[k] = v
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
    except OSError as e:
        raise EncmapError(f"{p}: not a readable HDF5 file ({e})") from None
    return data, attrs


def swap_dir(out: str | Path, write) -> None:
    """Fill a temporary sibling directory with ``write(tmp)``, then swap it in for ``out``.

    Temporary names end in ``.tmp`` (ignored by git and DVC). A job killed mid-write leaves
    one behind; the next run of the same step removes it.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(out)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    old = None
    try:
        write(tmp)
        tmp.chmod(0o755)  # mkdtemp makes 0700
        _pause_before_rename()  # testing aid: hold the finished temporary directory in place
        _refuse_newer(out)
        if out.exists():  # two renames, not a delete then a rename: the old one is never gone early
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old.", suffix=".tmp"))
            out.rename(old / out.name)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def save_figure(fig, png: str | Path, svg: str | Path) -> None:
    """Write a matplotlib figure as PNG and SVG without timestamps, atomically, and close it.

    No dates in the metadata (and a fixed ``svg.hashsalt``, set by the caller's style), so the
    same figure gives the same bytes and DVC sees no change on a rerun.
    """
    import matplotlib.pyplot as plt

    fig.tight_layout()
    # tight_layout leaves a placeholder layout engine behind, which makes every savefig lay the
    # whole figure out once more before drawing it (a third of this function's time); the layout
    # is final here, so the engine goes (the same bytes).
    fig.set_layout_engine(None)
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    with atomic_path(svg) as tmp:
        fig.savefig(tmp, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)


def rounded(obj: Any, digits: int = 6) -> Any:
    """Metrics rounded for reading (NaN becomes null, which JSON can hold)."""
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, float):
        return None if not np.isfinite(obj) else round(obj, digits)
    return obj


def update_sha256(h: "hashlib._Hash", path: str | Path) -> None:
    """Feed a file into a running sha256, 1 MiB at a time."""
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)


def file_sha256(path: str | Path) -> str:
    """sha256 of one file's bytes."""
    h = hashlib.sha256()
    update_sha256(h, path)
    return h.hexdigest()


def file_sha256_md5(path: str | Path) -> tuple[str, str]:
    """sha256 and md5 of one file's bytes, read once: the md5 is the hash DVC records for it (DVC 3's
    ``md5``: the bytes as they are), so a file the pipeline hashed need not be read again by DVC."""
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), md5.hexdigest()


def read_sentences(path: str | Path) -> list[str]:
    """Read a curated sentence file (one sentence a line, UTF-8)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise EncmapError(f"{p}: not valid UTF-8 ({e.reason})") from None
    return text.splitlines()


def read_curated(path: str | Path, n: int | None = None) -> tuple[list[str], str]:
    """The curated sentence set and its sha256, verified against what curation wrote.

    ``data/sentences/<set>.txt`` must match the checksum ``<set>.sha256`` that curation wrote
    beside it and, when given, hold ``n`` sentences (params ``sentences.n``). Old: a file cut or
    edited after curation was embedded as it was, every stage rebuilt on it, without a word.

    Returns
    -------
    sentences : list of str
    sha256 : str
    """
    p = Path(path)
    sha_file = p.with_suffix(".sha256")
    if not sha_file.is_file():
        raise EncmapError(f"{p}: no checksum {sha_file.name} beside it (curation writes both); rerun curate")
    expected = sha_file.read_text(encoding="utf-8").split()[0]
    actual = file_sha256(p)
    if actual != expected:
        raise EncmapError(f"{p}: changed after curation (its sha256 {actual[:12]}… is not the {expected[:12]}… "
                          f"in {sha_file.name}); rerun curate (snakemake --forcerun curate, or dvc repro curate)")
    sentences = read_sentences(p)
    if n is not None and len(sentences) != n:
        raise EncmapError(f"{p}: {len(sentences)} sentences, but params say sentences.n = {n}; rerun curate")
    return sentences, actual


def read_utf8_or_cp1252(f: Path) -> str:
    """UTF-8, else Windows-1252: gensim's older test files are the latter (0xa3 pound, 0x97 dash)."""
    raw = f.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        try:
            return raw.decode("cp1252")
        except UnicodeDecodeError as e:
            raise EncmapError(f"{f}: neither UTF-8 nor Windows-1252 ({e.reason} at byte {e.start})") from None
