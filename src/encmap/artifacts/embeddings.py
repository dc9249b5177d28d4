"""Per-encoder embeddings files (``results/embeddings/<model>/<encoder>.h5``) and what they carry."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..io import file_sha256, read_h5
from ..validation import EncmapError

#: Attributes that follow an encoder from its embeddings through every per-encoder artifact.
CARRIED = ("encoder_id", "encoder", "model", "sentences_sha256", "degenerate")


def encoder_file(indir: str | Path, encoder: str, what: str) -> Path:
    """``<indir>/<encoder>.h5``, or an error naming the file, the encoder and the step to rerun."""
    f = Path(indir) / f"{encoder}.h5"
    if not f.is_file():
        raise EncmapError(f"{f}: no {what} for encoder {encoder!r}; rerun the step that makes {indir}")
    return f


def check_is_encoder(path: str | Path, attrs: dict, encoder: str, what: str, model: str | None = None) -> None:
    """Refuse a per-encoder artifact that holds another encoder than the one it is read for.

    A file's name says which encoder it is read as; the attributes its step wrote say which
    encoder (and model) it holds. They differ when a file was copied or renamed by hand, and the
    map would then show one encoder twice and another not at all.
    """
    stored = attrs.get("encoder_id")
    if stored != encoder or (model is not None and attrs.get("model") != model):
        holds = f"encoder {stored!r}" + (f" of model {attrs.get('model')!r}" if model is not None else "")
        raise EncmapError(f"{path}: holds the {what} of {holds}, but is read as encoder {encoder!r}"
                          + (f" of model {model!r}" if model is not None else "")
                          + " (copied or renamed by hand?); delete it and rerun the stage that makes it",
                          refused=[path])


def stale_sentences(path: str | Path, what: str, encoder: str) -> EncmapError:
    """The error for an artifact made from another sentence set than the map's."""
    return EncmapError(f"{path}: encoder {encoder!r}: {what} made from another sentence set than the map's "
                       "(sha256 differs); rerun the stale stages", refused=[path])


def read_embeddings(emb_dirs: list[str], ids: list[str], records: dict[str, dict], sha: str,
                     n: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """Embeddings (float64) and their files' fingerprints, checked against the map's sentence set."""
    dirs = {Path(d).name: d for d in emb_dirs}
    out, files = {}, []
    for e in ids:
        model = records[e]["model"]
        if model not in dirs:
            raise EncmapError(f"encoder {e!r}: no embeddings directory of model {model!r} among the inputs")
        f = encoder_file(dirs[model], e, "embeddings")
        data, attrs = read_h5(f, ["embeddings"])
        check_is_encoder(f, attrs, e, "embeddings", model)
        if attrs["sentences_sha256"] != sha:
            raise stale_sentences(str(f), "embeddings", e)
        if data["embeddings"].shape[0] != n:
            raise EncmapError(f"{f}: {data['embeddings'].shape[0]} rows for encoder {e!r}, the map has n = {n}")
        out[e] = np.asarray(data["embeddings"], dtype=np.float64)
        files.append(str(f))
    return out, [file_sha256(f) for f in files]
