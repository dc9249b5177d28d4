"""The stored PIP artifact (``results/pip/<model>/<encoder>.h5``): writing it, reading it back.

The artifact is an exact factored form that costs at most :data:`BASIS_BUDGET` of the
embeddings' bytes: the spectrum λ (r,) and tr M, plus the right singular vectors V (d x r,
float64) when they fit the budget (8 d r ≤ 0.1 · 4 n d, i.e. r ≤ n / 20). U (n x r, float64,
twice the bytes of the float32 embeddings when r = d) is never stored; it is derived on read
from the encoder's embeddings file, which the artifact names (relative path) and pins (sha256):
U = E V diag(σ)⁻¹ with V, else the same thin SVD that made the artifact, checked against the
stored rank and λ. PIP files written before this format (they store U itself, no ``basis``) are still read as they are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..io import file_sha256, read_h5, write_h5
from ..validation import EncmapError
from .embeddings import check_is_encoder

#: The stored PIP may cost at most this fraction of the embeddings' bytes.
BASIS_BUDGET = 0.10
#: How closely a re-derived spectrum must reproduce the stored λ (same SVD, maybe other BLAS threads).
LAM_RTOL = 1e-8


def stores_basis(n: int, d: int, r: int) -> bool:
    """Whether V (d x r, float64) fits :data:`BASIS_BUDGET` of the embeddings (n x d, float32)."""
    return 8 * d * r <= BASIS_BUDGET * 4 * n * d


def as_stored(spec, E: np.ndarray):
    """``spec`` (from :func:`~encmap.qre.spectrum.factor_pip` of E (n, d)) exactly as :func:`load_spectrum`
    will give it back from the artifact :func:`write_pip` writes: U = E V / σ when V is stored."""
    from ..qre.spectrum import spectrum_from_right_vectors

    n, r = spec.U.shape
    if stores_basis(n, E.shape[1], r):
        return spectrum_from_right_vectors(E, spec.V, spec.lam, spec.trace)
    return spec


def write_pip(out: str | Path, spec, emb_file: str | Path, *, dense: bool, attrs: dict[str, Any]) -> None:
    """Write the PIP artifact of ``spec`` (a :class:`~encmap.qre.spectrum.Spectrum` with V) for ``emb_file``."""
    n, r = spec.U.shape
    d = spec.V.shape[0]
    ds: dict[str, Any] = {"lam": spec.lam}
    basis = "V" if stores_basis(n, d, r) else "svd"
    if basis == "V":
        ds["V"] = spec.V
    if dense:
        ds["pip"] = spec.dense_pip()
    write_h5(out, ds, attrs | {
        "n": n, "d": d, "rank": spec.rank, "trace": spec.trace, "basis": basis,
        "embeddings": os.path.relpath(Path(emb_file).resolve(), Path(out).resolve().parent),
        "embeddings_sha256": file_sha256(emb_file),
        "note": "rho = U diag(lam) U^T, PIP = trace * rho, of the embeddings file (after center / normalize_rows); "
                "U = E V diag(sqrt(trace lam))^-1 (basis V) or from E's thin SVD (basis svd)",
    })


@dataclass(frozen=True)
class PipSource:
    """A stored PIP as read and checked, before U (n, r) is derived (:func:`read_pip_source`).

    ``A`` (n, d) float64: the embeddings exactly as factored; ``V`` (d, r): the stored right
    singular vectors, U = A V diag(σ)⁻¹ with σ² = λ tr M; no ``V``: U is A's leading r left
    singular vectors, which must give back the stored λ (:meth:`check_spectrum`). ``U``: the
    earlier format, U itself. :meth:`spectrum` derives U here (NumPy); the pairwise step on a
    GPU derives it there (:mod:`encmap.similarity.blocks`), from the same fields.
    """

    lam: np.ndarray
    trace: float
    name: str
    A: np.ndarray | None = None
    V: np.ndarray | None = None
    tol: float | None = None
    U: np.ndarray | None = None

    @property
    def n(self) -> int:
        return int((self.U if self.U is not None else self.A).shape[0])

    def check_spectrum(self, s2: np.ndarray) -> None:
        """Refuse a re-derived SVD (squared singular values ``s2``, descending) whose rank at the
        stored tolerance or whose λ differ from the stored ones (beyond :data:`LAM_RTOL`)."""
        r = self.lam.shape[0]
        rank = int(np.count_nonzero(s2 > self.tol * s2[0])) if s2.size and s2[0] > 0 else 0
        if rank != r or not np.allclose(s2[:r] / s2[:r].sum(), self.lam, rtol=LAM_RTOL, atol=0):
            raise EncmapError(f"{self.name}: the SVD of its embeddings gives rank {rank} and another spectrum than "
                              f"the stored rank {r}; rerun its pip stage")

    def spectrum(self):
        """The :class:`~encmap.qre.spectrum.Spectrum` with U derived on the CPU."""
        from ..qre.spectrum import factor_pip, spectrum_from_arrays, spectrum_from_right_vectors

        if self.U is not None:
            return spectrum_from_arrays(self.U, self.lam, self.trace)
        if self.V is not None:
            return spectrum_from_right_vectors(self.A, self.V, self.lam, self.trace)
        spec = factor_pip(self.A, tol=self.tol, name=self.name)
        self.check_spectrum(spec.lam * spec.trace)
        return spectrum_from_arrays(spec.U, self.lam, self.trace)


def read_pip_source(path: str | Path) -> tuple[PipSource, dict[str, Any]]:
    """Read a stored PIP artifact and what U is derived from, checked (its embeddings file
    present, of the pinned sha256, of the same encoder); U itself is not derived here.

    Returns
    -------
    PipSource, dict
        The arrays, and the artifact's attributes.
    """
    from ..qre.spectrum import prepare_embeddings

    path = Path(path)
    _, attrs = read_h5(path, [])
    check_is_encoder(path, attrs, path.stem, "PIP", path.parent.name)
    if "basis" not in attrs:  # the earlier format: U stored
        data, attrs = read_h5(path, ["U", "lam"])
        return PipSource(lam=data["lam"], trace=float(attrs["trace"]), name=str(path), U=data["U"]), attrs
    data, _ = read_h5(path, ["lam", "V"] if attrs["basis"] == "V" else ["lam"])
    emb = path.parent / attrs["embeddings"]
    name = f"encoder {attrs.get('encoder_id', path.stem)!r} ({emb})"
    if not emb.is_file():
        raise EncmapError(f"{path}: its embeddings file {emb} is missing (the PIP artifact derives U from it); "
                          "rerun or pull the embed stage of this model")
    if file_sha256(emb) != attrs["embeddings_sha256"]:
        raise EncmapError(f"{path}: was factored from other embeddings than {emb} holds now (sha256 differs); "
                          f"rerun the pip stage of {name}", refused=[path])
    E, eattrs = read_h5(emb, ["embeddings"])
    check_is_encoder(emb, eattrs, path.stem, "embeddings", path.parent.name)
    A = prepare_embeddings(E["embeddings"], center=bool(attrs["center"]), normalize_rows=bool(attrs["normalize_rows"]),
                           name=name)
    return PipSource(lam=data["lam"], trace=float(attrs["trace"]), name=f"{path}: {name}", A=A,
                     V=data["V"] if attrs["basis"] == "V" else None, tol=float(attrs["tol"])), attrs


def load_spectrum(path: str | Path):
    """Read a stored PIP artifact back into a :class:`~encmap.qre.spectrum.Spectrum` (U derived) and its attributes."""
    source, attrs = read_pip_source(path)
    return source.spectrum(), attrs
