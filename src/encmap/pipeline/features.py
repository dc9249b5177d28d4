"""Step of rule ``features``: one encoder's QRE features w.r.t. the unit base encoder."""

from __future__ import annotations

from pathlib import Path

from threadpoolctl import threadpool_limits

from .. import __version__
from ..artifacts.embeddings import CARRIED, check_is_encoder
from ..artifacts.pip import load_spectrum
from ..io import read_h5, write_h5
from ..qre.features import encoder_features


def features_step(pip_file: str, out: str, *, direction: str, eps: float, threads: int | None = None) -> None:
    """QRE features (n,) of one encoder from its stored factored PIP, with its spectrum's summaries
    (datasets ``profile`` (16,) and ``head`` (32,), attributes ``entropy``, ``log_rank`` and
    ``log_scale``); a
    placeholder for a failed model."""
    _, attrs = read_h5(pip_file, [])
    if attrs.get("failed"):  # the model failed under embed.on_error: skip
        check_is_encoder(pip_file, attrs, Path(pip_file).stem, "PIP", Path(pip_file).parent.name)
        write_h5(out, {}, {k: attrs[k] for k in (*CARRIED, "failed", "encmap_version")})
        return
    with threadpool_limits(threads):
        spec, attrs = load_spectrum(pip_file)  # derives U from the embeddings: part of the job's work
        f = encoder_features(spec, direction=direction, eps=eps)
    write_h5(out, {"features": f["features"], "profile": f["profile"], "head": f["head"]},
             {k: attrs.get(k, "") for k in CARRIED} | {
                 "d": int(attrs["d"]), "direction": direction, "eps": eps, "qre_to_base": f["qre_to_base"],
                 "entropy": f["entropy"], "log_rank": f["log_rank"], "log_scale": f["log_scale"],
                 "encmap_version": __version__})
