"""Reading stored factored PIPs (``results/pip/<model>/<encoder>.h5``) back into spectra."""

from __future__ import annotations

from pathlib import Path

from ..io import read_h5


def load_spectrum(path: str | Path):
    """Read a stored factored PIP back into a :class:`~encmap.spectrum.Spectrum`."""
    from ..spectrum import spectrum_from_arrays

    data, attrs = read_h5(path, ["U", "lam"])
    return spectrum_from_arrays(data["U"], data["lam"], attrs["trace"]), attrs
