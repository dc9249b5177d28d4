"""A fake run: random embeddings of a few made-up models turned into the artifacts the map and
pair steps read (embeddings files, PIPs, the feature matrix), through the real maths."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

META = {"family": "f", "architecture": "a", "parameters": 10, "languages": ["en"], "objective": "o", "kind": "pretrained"}


def record(i: int, model: str, layer: int | None, pooling: str, kind: str = "pretrained", **meta) -> dict:
    return {"id": f"{model}__{i}", "model": model, "layer": layer, "pooling": pooling, "dim": None, "d": 8,
            "meta": META | {"kind": kind} | meta}


def fake_run(root: Path, m: int = 8, n: int = 30, sha: str = "a" * 64) -> dict:
    """A run's embeddings, PIPs and gathered features, built from random embeddings through the real maths."""
    from encmap.io import write_h5
    from encmap.pipeline.pip import pip_step
    from encmap.qre.features import qre_features, qre_to_base
    from encmap.qre.spectrum import factor_pip

    rng = np.random.default_rng(0)
    F, ids, recs, pips = [], [], [], []
    for i in range(m):
        rec = record(i, f"m{i % 3}", i % 2, "mean", kind="control" if i == 0 else "pretrained")
        E = rng.normal(size=(n, 4 + i)).astype(np.float32).astype(np.float64)  # as stored
        s = factor_pip(E)
        emb_dir = root / f"results/embeddings/{rec['model']}"
        write_h5(emb_dir / f"{rec['id']}.h5", {"embeddings": E.astype(np.float32)},
                 {"sentences_sha256": sha, "encoder_id": rec["id"], "model": rec["model"], "n": n})
        pip = root / f"results/pip/{rec['model']}/{rec['id']}.h5"
        pip_step(str(emb_dir), rec["id"], str(pip), tol=1e-12, dense_max_n=0, center=False, normalize_rows=False)
        F.append(qre_features(s))
        ids.append(rec["id"])
        recs.append(json.dumps(rec))
        pips.append(str(pip))
        _ = qre_to_base(s)
    write_h5(root / "results/features/qre.h5",
             {"features": np.vstack(F), "encoder_ids": np.array(ids, dtype=object),
              "encoders": np.array(recs, dtype=object), "qre_to_base": np.zeros(m)},
             {"sentences_sha256": sha, "direction": "forward", "eps": 1e-6, "n": n, "m": m})
    return {"features": str(root / "results/features/qre.h5"), "pips": pips,
            "embeddings": sorted(str(p) for p in (root / "results/embeddings").iterdir())}


def leave_off(run: dict, failed: dict | None = None, dropped: dict | None = None) -> None:
    """Mark encoders that gather left off the fake run's matrix: ``failed`` (encoder -> failure record,
    as a model failed under on_error: skip leaves) and ``dropped`` (encoder -> why it is degenerate)."""
    from encmap.io import read_h5, write_h5

    data, attrs = read_h5(run["features"])
    write_h5(run["features"], data, attrs | {"failed": failed or {}, "dropped": dropped or {}})
