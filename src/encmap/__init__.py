"""encmap: a map of sentence encoders from PIP matrices and quantum relative entropy.

The public API (``docs/api.md``, the table in :mod:`encmap.api`): the maths on your own embedding
matrices, importable from here and kept here when modules move.

>>> import numpy as np, encmap
>>> E = np.random.default_rng(0).normal(size=(100, 16))   # 100 sentences, width 16
>>> encmap.qre_features(E).shape
(100,)
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("encmap")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"


def __getattr__(name: str):
    # Imported on first use: `import encmap` (every pipeline job and the command line) loads no
    # maths it does not need, and the API's table is no part of any stage's code.
    from .api import API, resolve

    if name == "__all__":
        return sorted(API)
    if name in API:
        value = resolve(name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'encmap' has no attribute {name!r}")


def __dir__() -> list[str]:
    from .api import API

    return sorted(set(globals()) | set(API))
