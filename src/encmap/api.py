"""The public API: each name ``import encmap`` promises (``docs/api.md``), and the module defining it.

``encmap.<name>`` resolves through this table on first use (``encmap.__getattr__``), so the
modules behind a name can move without breaking a user's import. It lives apart from
``encmap/__init__.py``, which every pipeline job runs: a new API name changes no stage's code
digest, and so reruns nothing.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

#: public name -> the module defining it
API = {
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


def resolve(name: str) -> Any:
    """The object ``encmap.<name>`` stands for (its module imported now)."""
    return getattr(import_module(API[name]), name)
