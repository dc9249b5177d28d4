"""encmap: a map of sentence encoders from PIP matrices and quantum relative entropy.

The public API (``docs/api.md``): the maths on your own embedding matrices, importable from here
and kept here when modules move.

>>> import numpy as np, encmap
>>> E = np.random.default_rng(0).normal(size=(100, 16))   # 100 sentences, width 16
>>> encmap.qre_features(E).shape
(100,)
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("encmap")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"

#: public name -> the module defining it. Imported on first use, so ``import encmap`` (which every
#: pipeline job and the command line do) does not load scipy and the maths it does not need.
_API = {
    "factor_pip": "encmap.qre.spectrum",
    "Spectrum": "encmap.qre.spectrum",
    "qre_features": "encmap.qre.features",
    "qre_to_base": "encmap.qre.features",
    "pairwise_qre": "encmap.qre.pairwise",
    "pairwise_qre_matrix": "encmap.qre.pairwise",
    "cka": "encmap.similarity.cka",
    "linear_cka": "encmap.similarity.cka",
    "EncmapError": "encmap.validation",
}
__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name in _API:
        value = getattr(import_module(_API[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'encmap' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
