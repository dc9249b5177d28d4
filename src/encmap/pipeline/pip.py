"""Step of rule ``pip``: one encoder's exact factored PIP (``results/pip/<model>/<encoder>.h5``)."""

from __future__ import annotations

from pathlib import Path

from threadpoolctl import threadpool_limits

from .. import __version__
from ..artifacts.embeddings import CARRIED, check_is_encoder, encoder_file
from ..artifacts.failures import failed_attrs, read_failure
from ..artifacts.pip import write_pip
from ..io import read_h5, write_h5
from ..qre.spectrum import encoder_pip


def pip_step(emb_dir: str, encoder: str, out: str, *, tol: float, dense_max_n: int, center: bool,
             normalize_rows: bool, threads: int | None = None) -> None:
    """Factored PIP (λ, trace, rank; V when it fits) of one encoder's embeddings ``<emb_dir>/<encoder>.h5``.

    The format (U derived on read from the embeddings) is :mod:`encmap.artifacts.pip`'s.
    """
    failure = read_failure(emb_dir)
    if failure is not None:  # the model failed under embed.on_error: skip: a placeholder stands for it
        write_h5(out, {}, failed_attrs(failure, encoder) | {"encmap_version": __version__})
        return
    f = encoder_file(emb_dir, encoder, "embeddings")
    data, attrs = read_h5(f, ["embeddings"])
    check_is_encoder(f, attrs, encoder, "embeddings", Path(emb_dir).name)
    name = f"encoder {encoder!r} ({f})"
    with threadpool_limits(threads):  # the job's share of cores when jobs run side by side
        spec, E = encoder_pip(data["embeddings"], tol=tol, center=center, normalize_rows=normalize_rows, name=name)
    write_pip(out, spec, f, dense=E.shape[0] <= dense_max_n, attrs={k: attrs.get(k, "") for k in CARRIED} | {
        "tol": tol, "center": center, "normalize_rows": normalize_rows, "encmap_version": __version__})
