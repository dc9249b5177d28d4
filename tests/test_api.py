"""The public API: what docs/api.md names imports from the top-level package, and its examples run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import encmap

API_DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def _doc() -> str:
    return API_DOC.read_text()


def test_the_page_names_exactly_the_top_level_api():
    named = set(re.findall(r"^\| `encmap\.(\w+)", _doc(), flags=re.M))
    assert named == set(encmap.__all__)
    for name in named:
        assert getattr(encmap, name) is not None
        assert name in dir(encmap)


def test_every_example_runs_and_imports_nothing_below_the_top_level(capsys):
    blocks = re.findall(r"```python\n(.*?)```", _doc(), flags=re.S)
    assert len(blocks) >= 5
    code = "\n".join(blocks)
    assert not re.search(r"(from|import) encmap\.", code)  # only the promised paths
    namespace: dict = {}
    exec(compile(code, str(API_DOC), "exec"), namespace)
    out = capsys.readouterr().out
    assert "pairwise QRE needs the same sentences: n = 500 vs n = 100" in out
    M = namespace["M"]
    assert M.shape == (3, 3) and np.isfinite(M).all()


def test_the_api_agrees_with_its_independent_dense_references():
    # the dense O(n³) textbook formulas (eigendecompositions of the n x n matrices), not the same code
    from encmap.qre.reference import dense_pairwise_qre, dense_qre_features

    rng = np.random.default_rng(1)
    E, F = rng.normal(size=(60, 5)), rng.normal(size=(60, 7))
    np.testing.assert_allclose(encmap.qre_features(E, eps=1e-3), dense_qre_features(E, eps=1e-3), atol=1e-10)
    assert np.isclose(encmap.pairwise_qre(E, F, eps=1e-3), dense_pairwise_qre(E, F, eps=1e-3), atol=1e-9)


def test_import_encmap_stays_light():
    # every pipeline job and the command line import encmap: the maths loads on first use only
    code = "import sys, encmap; print('scipy' in sys.modules, 'encmap.qre.features' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
