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


def test_a_write_removes_what_a_killed_write_of_the_same_file_left(tmp_path):
    """Old: `.<encoder>.h5.*.tmp` of a SIGKILLed job survived every rerun (only swap_dir cleared)."""
    left = [tmp_path / ".e.h5.k3x9a1.tmp", tmp_path / ".e.h5.u.tmp"]  # a killed write; a spill directory
    left[0].write_bytes(b"half an HDF5 file")
    (left[1]).mkdir()
    (left[1] / "0.npy").write_bytes(b"x")
    others = [tmp_path / ".f.h5.k3x9a1.tmp", tmp_path / ".e.h5x.abc.tmp", tmp_path / "e.h5.notes.tmp"]
    for f in others:  # another file's temporaries, and names that only look alike
        f.write_text("keep")
    atomic_write_text(tmp_path / "e.h5", "new\n")
    assert not [f for f in left if f.exists()]
    assert all(f.read_text() == "keep" for f in others)
    assert (tmp_path / "e.h5").read_text() == "new\n"


def test_the_curated_set_is_verified_against_its_checksum_and_n(tmp_path):
    """Old: a sentence file cut to 150 lines after curation was embedded as it was, exit 0."""
    from encmap.corpus.curation import CuratedSet, write_curated
    from encmap.io import read_curated

    txt, manifest, sha = tmp_path / "s.txt", tmp_path / "s.manifest.tsv", tmp_path / "s.sha256"
    cs = CuratedSet([f"Sentence number {i} is here." for i in range(300)],
                    [{"id": f"s{i:05d}", "source": "x", "genre": "g", "document": "d"} for i in range(300)])
    write_curated(cs, txt, manifest, sha)
    sentences, digest = read_curated(txt, 300)
    assert len(sentences) == 300 and digest == cs.sha256() == file_sha256(txt)
    with pytest.raises(EncmapError, match=r"s\.txt: 300 sentences, but params say sentences\.n = 150; rerun curate"):
        read_curated(txt, 150)
    txt.write_text("".join(cs.text().splitlines(keepends=True)[:150]), encoding="utf-8")  # cut after curation
    with pytest.raises(EncmapError, match=r"s\.txt: changed after curation \(its sha256 .* is not the .* in s\.sha256\)"):
        read_curated(txt, 300)
    sha.unlink()
    with pytest.raises(EncmapError, match=r"s\.txt: no checksum s\.sha256 beside it"):
        read_curated(txt)


def test_a_job_never_replaces_an_output_written_after_it_started(tmp_path):
    """Old: a job orphaned by a killed Snakemake renamed its outputs over those of the newer run."""
    import os
    import time

    from encmap.io import set_job_start

    older, newer = tmp_path / "older.csv", tmp_path / "newer.csv"
    older.write_text("from a run before this job\n")
    os.utime(older, ns=(time.time_ns() - 10**9,) * 2)
    d = tmp_path / "model"
    d.mkdir()
    set_job_start(time.time_ns())
    try:
        newer.write_text("written by a newer run while this job ran\n")
        atomic_write_text(older, "this job's\n")  # replacing an older output is the normal case
        assert older.read_text() == "this job's\n"
        with pytest.raises(EncmapError, match=r"newer\.csv: written by another run after this job started"):
            atomic_write_text(newer, "this job's, late\n")
        assert newer.read_text() == "written by a newer run while this job ran\n"
        (d / "a.txt").write_text("newer")
        with pytest.raises(EncmapError, match=r"model: written by another run after this job started"):
            swap_dir(d, lambda t: (t / "b.txt").write_text("late"))
        assert [p.name for p in d.iterdir()] == ["a.txt"]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "newer.csv", "older.csv"]  # no temp left
    finally:
        set_job_start(None)


def test_a_saved_figure_has_the_bytes_of_matplotlibs_own_tight_layout_and_savefig(tmp_path):
    """save_figure drops the layout engine that tight_layout leaves behind (each savefig then lays
    the figure out once less): the bytes are those of matplotlib's own tight_layout + savefig."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from encmap.io import save_figure

    def figure():
        plt.rcParams["svg.hashsalt"] = "test"
        fig, axes = plt.subplots(2, 3, figsize=(7, 4))
        rng = np.random.default_rng(0)
        for i, ax in enumerate(axes.flat):
            ax.scatter(rng.standard_normal(20), rng.standard_normal(20), label=f"set {i}")
            ax.set_title(f"panel {i}: a longer title", fontsize=9)
            ax.set_ylabel("predicted")
            ax.legend(fontsize=6, loc="best")
        return fig

    save_figure(figure(), tmp_path / "ours.png", tmp_path / "ours.svg")
    fig = figure()
    fig.tight_layout()
    fig.savefig(tmp_path / "ref.png", format="png", metadata={"Software": None})
    fig.savefig(tmp_path / "ref.svg", format="svg", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    for ext in ("png", "svg"):
        assert (tmp_path / f"ours.{ext}").read_bytes() == (tmp_path / f"ref.{ext}").read_bytes(), ext


def test_gensims_bundled_data_is_found_without_importing_gensim():
    """The jobs that read gensim's bundled files (the Wikipedia sample, the Lee corpora) find them
    and its version without ``import gensim`` (~1.2 s of CPU): the same folder and version as the
    imported package's, in a fresh interpreter."""
    import subprocess
    import sys

    code = ("import sys; from encmap.io import gensim_test_data, gensim_version\n"
            "p, v = gensim_test_data('test'), gensim_version()\n"
            "assert 'gensim' not in sys.modules, 'imported'\n"
            "import gensim, pathlib\n"
            "assert p == pathlib.Path(gensim.__file__).parent / 'test' / 'test_data' and p.is_dir(), p\n"
            "assert v == gensim.__version__, (v, gensim.__version__)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "1e999", "9" * 5000, "86401"])
def test_a_bad_pause_before_rename_is_refused_naming_the_variable_and_keeps_the_file(tmp_path, monkeypatch, value):
    """Old: ENCMAP_PAUSE_BEFORE_RENAME (the tests' aid for killing a job mid-write) went through float()
    and time.sleep(): raw ValueError ('could not convert', 'sleep length must be non-negative') or
    OverflowError ('timestamp too large') after the work was done."""
    from encmap.io import PAUSE_ENV

    import encmap.io

    slept = []
    monkeypatch.setattr(encmap.io.time, "sleep", slept.append)  # a day's pause (old) must not hang the test
    target = tmp_path / "out.txt"
    target.write_text("old")
    monkeypatch.setenv(PAUSE_ENV, value)
    with pytest.raises(EncmapError, match=rf"^ENCMAP_PAUSE_BEFORE_RENAME='.*: expected seconds from 0 to 86400"):
        atomic_write_text(target, "new")
    with pytest.raises(EncmapError, match="ENCMAP_PAUSE_BEFORE_RENAME"):
        swap_dir(tmp_path / "d", lambda d: (d / "f").write_text("x"))
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    assert slept == []
    monkeypatch.setenv(PAUSE_ENV, " 2.5 ")
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and slept == [2.5]
