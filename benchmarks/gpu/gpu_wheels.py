"""Snakemake's wheels for a lent GPU machine whose Python lacks it (no network there).

``download DEST``: Snakemake and every distribution it requires, at the versions installed here
(the lock's, requirements/lock.txt), as wheels from the package index into DEST (a cache kept
between packs): pure-Python wheels once, compiled ones for this Python and for the card's
(CPython 3.12, the device tool's notes). PuLP is left out: only Snakemake's ILP scheduler imports
it (a 16 MB wheel of solver binaries), and the pack runs ``--scheduler greedy``.

``unpack WHEELS SITE``: on the machine, every wheel of a distribution that its Python does not
already have, for this interpreter's tags, unzipped into SITE (put SITE on PYTHONPATH): no pip
needed, and the machine's own packages are kept where it has them.

    python benchmarks/gpu/gpu_wheels.py download .gpu-wheels
    python wheels/gpu_wheels.py unpack wheels /tmp/site      # there
"""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
import zipfile
from pathlib import Path

#: Roots of what is carried, and what is left out of their requirements (see the docstring).
ROOTS = ("snakemake",)
LEFT_OUT = ("pulp",)
#: The card's Python (KINDS.md: Python 3.12.3) and manylinux tags its wheels may carry.
CARD_PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots=ROOTS) -> dict[str, str]:
    """Name -> version of the roots and everything they require here (extras left out)."""
    seen: dict[str, str] = {}
    stack = list(roots)
    while stack:
        name = norm(stack.pop())
        if name in seen or name in LEFT_OUT:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[name] = dist.version
        stack += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in dist.requires or [] if "extra ==" not in r]
    return seen


def compiled(name: str) -> bool:
    return any(str(f).endswith((".so", ".pyd")) for f in md.distribution(name).files or [])


def from_installed(name: str, dest: Path) -> Path:
    """A wheel of ``name`` made from its files as installed here (its RECORD; scripts and caches
    left out): exactly what unpacking its published wheel gave this Python. Tagged for any Python
    when it is pure, else for this interpreter alone."""
    from packaging.tags import sys_tags

    dist = md.distribution(name)
    tag = "py3-none-any" if not compiled(name) else str(next(iter(sys_tags())))
    whl = dest / f"{name.replace('-', '_')}-{dist.version}-{tag}.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for f in dist.files or []:
            path = Path(dist.locate_file(f))
            if f.parts[0] != ".." and "__pycache__" not in f.parts and path.is_file():
                z.write(path, str(f))
    return whl


def download(dest: Path) -> list[Path]:
    """The wheels of :func:`closure` in ``dest``: made from the installed files for this Python
    (every one: no network), and the compiled ones for the card's Python from the package index."""
    dest.mkdir(parents=True, exist_ok=True)
    for name, version in sorted(closure().items()):
        from_installed(name, dest)
        if compiled(name) and not list(dest.glob(f"{name.replace('-', '_')}-{version}-cp{CARD_PYTHON.replace('.', '')}*")):
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dest),
                   f"{name}=={version}", "--python-version", CARD_PYTHON, "--implementation", "cp"]
            subprocess.run(cmd + [x for p in PLATFORMS for x in ("--platform", p)], check=True)
    return sorted(dest.glob("*.whl"))


def unpack(wheels: Path, site: Path) -> list[str]:
    """Unzip into ``site`` every wheel in ``wheels`` that this interpreter can use and whose
    distribution it lacks. Returns the distributions unpacked."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    ok = set(sys_tags())
    site.mkdir(parents=True, exist_ok=True)
    done = []
    for whl in sorted(wheels.glob("*.whl")):
        name, version, _, tags = parse_wheel_filename(whl.name)
        if not tags & ok or name in done:
            continue
        try:
            md.distribution(name)
            continue  # the machine's own
        except md.PackageNotFoundError:
            pass
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)
        done.append(str(name))
    return done


if __name__ == "__main__":
    verb, *args = sys.argv[1:]
    if verb == "download":
        files = download(Path(args[0]))
        print(f"gpu_wheels: {len(files)} wheels, {sum(f.stat().st_size for f in files) / 2**20:.1f} MiB in {args[0]}")
    elif verb == "unpack":
        print("gpu_wheels: unpacked", " ".join(unpack(Path(args[0]), Path(args[1]))))
    else:
        raise SystemExit(__doc__)
