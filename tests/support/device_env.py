"""The lent GPU machine's Python, imitated here: a virtual environment that holds only torch,
transformers, sentence-transformers, h5py, scipy, scikit-learn, pytest and what they require (no
snakemake, dvc, openTSNE, mteb, openai, jsonschema...), linked from this environment's installed
files. What is carried to that machine is proven to run there before a minute of its time is spent."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

#: What the device's Python has (the device tool's notes), by distribution name.
DEVICE_DISTRIBUTIONS = ("torch", "transformers", "sentence-transformers", "h5py", "scipy", "scikit-learn", "pytest")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def device_distributions(roots=DEVICE_DISTRIBUTIONS) -> dict[str, md.Distribution]:
    """The roots and everything they require (extras left out), as installed here."""
    seen: dict[str, md.Distribution] = {}
    stack = list(roots)
    while stack:
        name = _norm(stack.pop())
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[name] = dist
        stack += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in dist.requires or [] if "extra ==" not in r]
    return seen


def bare_python(folder: Path) -> Path:
    """A venv in ``folder`` whose site-packages links every top-level file of
    :func:`device_distributions` (modules, compiled libraries, their .dist-info) and nothing else.
    Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    py = folder / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    here = Path(sysconfig.get_paths()["purelib"])
    for dist in device_distributions().values():
        for f in dist.files or []:
            top = Path(f).parts[0]
            src = here / top
            if top != ".." and src.exists() and not (site / top).exists():
                (site / top).symlink_to(src)
    return py
