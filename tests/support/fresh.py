"""The same code in fresh interpreters with different hash seeds: a determinism check that two calls
in one process cannot make (a set's order, a ``hash()``-seeded choice, a cache filled by the first
call all look deterministic inside one process)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def fresh_digests(code: str, seeds: tuple[str, ...] = ("1", "2"), env: dict | None = None) -> list[str]:
    """Run ``code`` once per ``PYTHONHASHSEED`` in ``seeds``, each in a new interpreter (``tests/``
    on ``sys.path``); each run's last printed line (a digest the code prints), in seed order."""
    out = []
    for seed in seeds:
        p = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
                            + textwrap.dedent(code)],
                           env=os.environ | (env or {}) | {"PYTHONHASHSEED": seed}, capture_output=True, text=True)
        if p.returncode != 0:
            raise AssertionError(f"fresh process (PYTHONHASHSEED={seed}) failed:\n{p.stderr[-4000:]}")
        out.append(p.stdout.strip().splitlines()[-1])
    return out


def array_digest(*arrays) -> str:
    """sha256 of arrays' dtypes, shapes and bytes."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()
