"""A served model can change under the same name, and an encoder of its old and new vectors would be
neither: each run that sends anything checks that the model still answers as it first did.

The embeddings of :data:`PROBES` are fetched fresh with every such run, fingerprinted (sha256 of the
unit vectors rounded to :data:`FINGERPRINT_DIGITS` decimals) and compared with the first ones seen
for the same (endpoint, model, revision, dimensions) (:func:`check_drift`): a cosine distance above
:data:`DRIFT_TOL` on any probe is reported plainly (the vectors decide, not the hash: rounding
boundaries flip under a server's own float noise). The backend refuses a changed model whose old
vectors the cache holds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ...validation import EncmapError
from ..checkpoints import cache_dir
from .cache import endpoint

log = logging.getLogger(__name__)

#: Fixed probe sentences whose embeddings fingerprint the served model.
PROBES = ("The cat sat on the mat.",
          "Interest rates rose again in the third quarter.",
          "She played the violin at her grandmother's funeral.",
          "Photosynthesis converts light energy into chemical energy.",
          "The match was cancelled because of heavy rain.",
          "A quick brown fox jumps over the lazy dog.",
          "He could not remember where he had parked the car.",
          "The committee approved the new budget on Tuesday.")
#: Decimals of the unit probe vectors hashed into the fingerprint.
FINGERPRINT_DIGITS = 3
#: Largest cosine distance between a probe's embeddings that is not drift (a server's float noise
#: is ~1e-7; a changed model moves probes by far more than 1e-4).
DRIFT_TOL = 1e-4


def fingerprint(E: np.ndarray) -> str:
    """sha256 of the unit rows of E rounded to :data:`FINGERPRINT_DIGITS` decimals."""
    U = E / np.linalg.norm(E, axis=1, keepdims=True)
    R = np.round(U.astype(np.float64), FINGERPRINT_DIGITS) + 0.0  # + 0.0: -0.0 and 0.0 hash alike
    return hashlib.sha256(R.tobytes()).hexdigest()


def check_drift(model: str, spec: dict, probes: np.ndarray, path: Path | None = None) -> dict:
    """Compare the probes' embeddings (len(PROBES), d) with the first ones seen for the same
    (model, revision, dimensions) and record them if they are the first; report drift plainly.

    Returns
    -------
    dict
        ``fingerprint``, ``first_seen`` and, when the served model changed, ``drift`` (the largest
        cosine distance, the fingerprint first seen): for the provenance.
    """
    path = Path(path) if path else cache_dir() / "api" / "fingerprints.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    name = json.dumps([endpoint(spec), spec["model"], spec["revision"], spec["dimensions"]])
    fp = fingerprint(probes)
    from filelock import FileLock

    with FileLock(str(path) + ".lock"):
        try:
            seen = json.loads(path.read_text()) if path.is_file() else {}
        except (ValueError, OSError) as e:
            raise EncmapError(f"{path}: the drift probes' first answers cannot be read ({e}); move it aside (drift "
                              "is then measured from this run's answers)") from None
        first = seen.get(name)
        if first is None:
            seen[name] = {"fingerprint": fp, "first_seen": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          "probes": np.asarray(probes, dtype=np.float64).tolist()}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(seen))
            os.replace(tmp, path)
            return {"fingerprint": fp, "first_seen": seen[name]["first_seen"]}
    old = np.asarray(first["probes"])
    out = {"fingerprint": fp, "first_seen": first["first_seen"]}
    if old.shape != probes.shape:
        distance = 1.0
    else:
        cos = np.sum(old * probes, axis=1) / (np.linalg.norm(old, axis=1) * np.linalg.norm(probes, axis=1))
        distance = float(np.max(1.0 - cos))
    if distance > DRIFT_TOL:
        out["drift"] = {"max_cosine_distance": distance, "first_fingerprint": first["fingerprint"]}
        log.warning("model %r: the endpoint's model %r (revision %r) now answers differently than when first seen on "
                    "%s (probe cosine distance up to %.3g, fingerprint %s... was %s...): the served model changed "
                    "under the same name. Its cached vectors are the old model's: set a new revision to recompute "
                    "them.", model, spec["model"], spec["revision"], first["first_seen"], distance, fp[:12],
                    first["fingerprint"][:12])
    return out
