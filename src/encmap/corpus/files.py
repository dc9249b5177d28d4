"""Sentences a user supplies: a local file (.txt, .jsonl, .csv) or a Hugging Face dataset id."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Iterator

from ..validation import EncmapError
from .candidates import INSTALL_HINT, Candidate


def read_user_file(name: str, path: str | None, text_field: str = "text") -> Iterator[Candidate]:
    """A user's .txt (one sentence a line), .jsonl (field ``text_field``) or .csv file."""
    if not path:
        raise EncmapError(f"source {name!r}: kind 'file' needs a 'path'")
    p = Path(path)
    if not p.exists():
        raise EncmapError(f"source {name!r}: file {p} not found")
    data = p.read_bytes()
    lines = data.split(b"\n")
    for i, raw in enumerate(lines, start=1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise EncmapError(f"source {name!r}: {p} line {i} is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    text = data.decode("utf-8")
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise EncmapError(f"source {name!r}: {p} line {i} is not JSON: {e.msg}") from None
            if not isinstance(rec, dict) or text_field not in rec:
                raise EncmapError(f"source {name!r}: {p} line {i} has no field {text_field!r}")
            yield Candidate(str(rec[text_field]), name, str(rec.get("genre", name)), f"{p.name}:{i}")
    elif suffix == ".csv":
        reader = csv.DictReader(text.splitlines())
        if reader.fieldnames is None or text_field not in reader.fieldnames:
            raise EncmapError(f"source {name!r}: {p} has no column {text_field!r} (columns: {reader.fieldnames})")
        for i, rec in enumerate(reader, start=2):
            yield Candidate(rec[text_field], name, rec.get("genre") or name, f"{p.name}:{i}")
    else:
        for i, line in enumerate(text.splitlines(), start=1):
            yield Candidate(line.strip(), name, name, f"{p.name}:{i}")


def read_hf_dataset(name: str, dataset: str | None, split: str = "train", text_field: str = "text",
                    revision: str | None = None) -> Iterator[Candidate]:
    """Sentences from a Hugging Face dataset id (online, or from the local HF cache)."""
    if not dataset:
        raise EncmapError(f"source {name!r}: kind 'hf-dataset' needs 'dataset'")
    try:
        import datasets
    except ImportError:
        raise EncmapError(f"source {name!r}: kind 'hf-dataset' needs the datasets library: {INSTALL_HINT['hf-dataset']}") from None
    ds = datasets.load_dataset(dataset, split=split, revision=revision)
    if text_field not in ds.column_names:
        raise EncmapError(f"source {name!r}: dataset {dataset} has no column {text_field!r} ({ds.column_names})")
    for i, text in enumerate(ds[text_field]):
        yield Candidate(str(text), name, dataset, f"{dataset}:{split}:{i}")
