"""The ``sentences.sources`` entries of params.yaml: reading each, and listing the files it reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from ..io import file_sha256, gensim_version
from ..validation import EncmapError
from .brown import read_brown
from .candidates import BROWN_DIR, WORDNET_DIR, Candidate
from .files import read_hf_dataset, read_user_file
from .wikipedia import gensim_wiki_path, read_gensim_wiki
from .wordnet import read_wordnet


def read_source(spec: dict[str, Any]) -> Iterator[Candidate]:
    """Dispatch one ``sentences.sources`` entry of params.yaml to its reader."""
    kind, name = spec["kind"], spec["name"]
    if kind == "gensim-wiki":
        return read_gensim_wiki(name, spec["path"])
    if kind == "wordnet":
        return read_wordnet(name, spec["path"])
    if kind == "brown":
        return read_brown(name, spec["path"])
    if kind == "file":
        return read_user_file(name, spec["path"], spec["text_field"])
    if kind == "hf-dataset":
        return read_hf_dataset(name, spec["dataset"], spec["split"], spec["text_field"], spec["revision"])
    raise EncmapError(f"source {name!r}: unknown kind {kind!r}")


def source_files(spec: dict[str, Any]) -> list[tuple[str, Path]]:
    """The local files a source reads, each with a machine-independent label.

    Labels are paths as params.yaml writes them (gensim's bundled sample: ``gensim==<version>:``
    and its name), so the listing is the same on every machine that has the same bytes. A hub
    dataset reads no local file (it is named by id and revision).
    """
    kind = spec["kind"]
    if kind == "gensim-wiki":
        if spec["path"]:
            return [(spec["path"], Path(spec["path"]))]
        p = gensim_wiki_path()
        return [(f"gensim=={gensim_version()}:{p.name}", p)]
    if kind in ("wordnet", "brown"):
        label = spec["path"] or (WORDNET_DIR if kind == "wordnet" else BROWN_DIR)
        root = Path(label)
        if kind == "wordnet":
            names = [f"data.{pos}" for pos in ("noun", "verb", "adj", "adv")]
        else:
            cats = (root / "cats.txt").read_text(encoding="utf-8").splitlines()
            names = ["cats.txt"] + [line.split()[0] for line in cats if line.strip()]
        return [(f"{label}/{f}", root / f) for f in names]
    if kind == "file":
        return [(spec["path"], Path(spec["path"]))]
    return []


def source_files_tsv(sources: list[dict[str, Any]]) -> str:
    """TSV (source, kind, file or dataset id, sha256) of everything the sources read."""
    rows = ["source\tkind\tfile\tsha256"]
    for spec in sources:
        if spec["kind"] == "hf-dataset":
            rows.append(f"{spec['name']}\thf-dataset\t{spec['dataset']}@{spec['revision']}:{spec['split']}\t-")
        for label, f in source_files(spec):
            rows.append(f"{spec['name']}\t{spec['kind']}\t{label}\t{file_sha256(f)}")
    return "\n".join(rows) + "\n"
