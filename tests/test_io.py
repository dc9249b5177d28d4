"""Artifact I/O: reproducible, atomic HDF5 and text writes, directory swaps, file hashes."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from encmap.io import atomic_write_text, file_sha256, read_h5, read_sentences, swap_dir, write_h5
from encmap.validation import EncmapError


def test_h5_is_reproducible_and_atomic(tmp_path):
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    for f in (a, b):
        write_h5(f, {"x": np.arange(6.0).reshape(2, 3)}, {"spec": {"k": 1}, "n": 2})
    assert a.read_bytes() == b.read_bytes()
    data, attrs = read_h5(a)
    assert json.loads(attrs["spec"]) == {"k": 1} and data["x"].shape == (2, 3)

    with pytest.raises(Exception):
        write_h5(tmp_path / "c.h5", {"x": np.array([object()], dtype=object)}, {})
    assert not (tmp_path / "c.h5").exists() and not list(tmp_path.glob(".c.h5*"))
    with pytest.raises(EncmapError, match="no dataset 'y'"):
        read_h5(a, ["y"])


def test_file_sha256_equals_hashlib_on_a_file_larger_than_a_read(tmp_path):
    f = tmp_path / "big.bin"
    data = np.random.default_rng(0).bytes(3 * (1 << 20) + 17)  # 3 MiB + 17 bytes: several 1 MiB reads
    f.write_bytes(data)
    assert file_sha256(f) == hashlib.sha256(data).hexdigest()


def test_read_sentences_one_a_line_and_refuses_invalid_utf8(tmp_path):
    f = tmp_path / "s.txt"
    f.write_text("First sentence.\nSecond, with ünïcode.\n", encoding="utf-8")
    assert read_sentences(f) == ["First sentence.", "Second, with ünïcode."]
    f.write_bytes(b"Fine.\nBad \xff byte.\n")
    with pytest.raises(EncmapError, match=r"s\.txt: not valid UTF-8"):
        read_sentences(f)


def test_swap_dir_replaces_whole_or_leaves_the_old_directory(tmp_path):
    out = tmp_path / "model"
    swap_dir(out, lambda d: [(d / f"{e}.txt").write_text(e) for e in ("a", "b")])
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt"]

    def fail(d):
        (d / "c.txt").write_text("c")
        raise RuntimeError("job killed")

    with pytest.raises(RuntimeError):
        swap_dir(out, fail)
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt"]  # untouched
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary directory left
    swap_dir(out, lambda d: (d / "c.txt").write_text("c"))  # a dropped variant's file goes with the swap
    assert [p.name for p in out.iterdir()] == ["c.txt"]


def test_atomic_text_write_leaves_no_partial_file(tmp_path):
    f = tmp_path / "a.json"
    atomic_write_text(f, "old\n")
    with pytest.raises(TypeError):
        atomic_write_text(f, None)  # fails inside the write
    assert f.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["a.json"]
