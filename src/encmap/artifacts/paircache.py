"""Reusing pair results across runs: only pairs that involve a changed encoder are recomputed.

A pair stage stores, beside its results, one fingerprint per encoder (the sha256 of the artifact
the encoder's numbers came from) and a *key*: a hash of the stage's code digest (every file it
runs, the one answer to which code changes a result) and of the params that change them. On the next run a pair's stored result is reused only if
the key is the same and both encoders' fingerprints are; everything else is recomputed. The
stored file is the stage's own output (a Snakemake ``update()`` output, a DVC ``persist``
output), read before it is atomically replaced, so a pulled result seeds the next run too.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..io import file_sha256, read_h5


def fingerprints(files: Sequence[str | Path]) -> list[str]:
    """sha256 of each file's bytes."""
    return [file_sha256(f) for f in files]


def code_key(code: str, params: Any) -> str:
    """sha256 over the stage's code (``code``: the hash of its code digest, which covers every file
    the stage runs: :func:`encmap.workflow.deps.code_key`) and the JSON of ``params``."""
    h = hashlib.sha256(code.encode() + b"\0")
    h.update(json.dumps(params, sort_keys=True, default=str).encode())
    return h.hexdigest()


def content_checksum(datasets: dict[str, Any], key: str) -> str:
    """sha256 over a pair file's datasets (names, dtypes, shapes, values) and its reuse key.

    Stored in the file (``checksum``) and checked before any stored pair is reused: an edited
    value (the file is still valid HDF5, or JSON) is found and nothing of the file is reused.
    """
    h = hashlib.sha256(key.encode() + b"\0")
    for name in sorted(datasets):
        a = np.asarray(datasets[name])
        h.update(f"{name}\0{a.shape}\0".encode())
        if a.dtype.kind in "OUS":
            h.update("\0".join(map(str, a.ravel().tolist())).encode())
        else:
            h.update(np.ascontiguousarray(a, dtype=np.float64 if a.dtype.kind == "f" else a.dtype).tobytes())
    return h.hexdigest()


def reuse_index(prev_ids: Sequence[str], prev_fps: Sequence[str], ids: Sequence[str], fps: Sequence[str]) -> np.ndarray:
    """For each current encoder, its row in the stored results if its fingerprint is unchanged, else -1.

    Returns
    -------
    ndarray, shape (len(ids),), int
    """
    old = {(e, f): i for i, (e, f) in enumerate(zip(prev_ids, prev_fps))}
    return np.array([old.get((e, f), -1) for e, f in zip(ids, fps)], dtype=np.int64)


def previous_matrices(path: str | Path, names: Sequence[str], key: str) -> tuple[list[str], list[str], dict] | None:
    """The stored ids, fingerprints and matrices of a pair stage's last output, if reusable.

    None (and a line on stderr saying why) when the file is missing, unreadable, from other code
    or params (another key), lacks a matrix, or does not match its own checksum (edited).
    """
    p = Path(path)
    if not p.exists():
        return None
    try:
        data, attrs = read_h5(p, ["encoder_ids", "fingerprints", *names])
    except ValueError as e:
        print(f"not reusing stored pairs: {e}", file=sys.stderr)
        return None
    if attrs.get("key") != key:
        print(f"not reusing {p}: computed by other code or params", file=sys.stderr)
        return None
    if attrs.get("checksum") != content_checksum(data, key):
        print(f"not reusing {p}: its contents do not match their checksum (edited after it was written?); "
              "recomputing every pair", file=sys.stderr)
        return None
    return [str(x) for x in data["encoder_ids"]], [str(x) for x in data["fingerprints"]], \
        {k: data[k] for k in names}


def reuse_pairs(idx: np.ndarray, wanted: np.ndarray, stored: dict[str, np.ndarray] | None) -> tuple[np.ndarray, dict]:
    """Split the wanted pairs into reused ones and ones to compute.

    Parameters
    ----------
    idx : (m,) rows in the stored matrices (:func:`reuse_index`), -1 = changed or new
    wanted : bool (m, m), symmetric: the pairs this run needs
    stored : name -> stored (m_old, m_old) matrix (NaN where never computed), or None

    Returns
    -------
    todo : bool (m, m), upper triangle: wanted pairs that have no stored value
    filled : name -> (m, m) matrix with the stored values of the reused pairs, NaN elsewhere
    """
    m = len(idx)
    wanted = np.triu(np.asarray(wanted, bool), 1)
    filled: dict[str, np.ndarray] = {}
    have = np.zeros((m, m), bool)
    if stored:
        ok = idx >= 0
        both = np.ix_(ok, ok)
        rows = idx[ok]
        for name, M in stored.items():
            F = np.full((m, m), np.nan)
            F[both] = M[np.ix_(rows, rows)]
            filled[name] = F
        have = np.all([~np.isnan(F) for F in filled.values()], axis=0) & np.outer(ok, ok)
        # QRE is directed: a pair counts as stored only if both directions are.
        have &= have.T
    return wanted & ~have, filled
