"""Every reader checks that an artifact is the encoder it is read for.

Old: after `cp results/embeddings/gauss/gauss__out.h5 results/embeddings/glove/glove__out.h5`
and a rerun, qre.h5 listed gauss__out twice and glove__out not at all, with exit 0.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.fake_run import fake_run

from encmap.artifacts.embeddings import read_embeddings
from encmap.artifacts.features import read_feature_matrix
from encmap.artifacts.pip import load_spectrum
from encmap.io import write_h5
from encmap.pipeline.gather import gather_step
from encmap.pipeline.pip import pip_step
from encmap.downstream.prediction import read_eval_scores
from encmap.validation import EncmapError

PIP = dict(tol=1e-12, dense_max_n=0, center=False, normalize_rows=False)


@pytest.fixture
def run(tmp_path) -> dict:
    return fake_run(tmp_path, m=6)


def emb(run: dict, model: str) -> Path:
    return next(Path(d) for d in run["embeddings"] if Path(d).name == model)


def test_pip_refuses_another_encoders_embeddings(run, tmp_path):
    shutil.copy(emb(run, "m1") / "m1__1.h5", emb(run, "m2") / "m2__2.h5")
    with pytest.raises(EncmapError, match=r"m2/m2__2\.h5: holds the embeddings of encoder 'm1__1' of model 'm1', "
                                          r"but is read as encoder 'm2__2' of model 'm2' \(copied or renamed by hand\?\)"):
        pip_step(str(emb(run, "m2")), "m2__2", str(tmp_path / "out.h5"), **PIP)
    assert not (tmp_path / "out.h5").exists()


def test_reading_a_pip_checks_the_pip_and_its_embeddings(run):
    pips = {Path(p).stem: Path(p) for p in run["pips"]}
    renamed = pips["m0__3"].parent / "m0__0.h5"  # another encoder of the same model
    shutil.copy(pips["m0__3"], renamed)
    with pytest.raises(EncmapError, match=r"m0__0\.h5: holds the PIP of encoder 'm0__3'"):
        load_spectrum(renamed)
    # The PIP is right but its embeddings file was swapped for another encoder's same bytes? The
    # sha256 catches changed bytes; an identical copy of another encoder is caught by its id.
    shutil.copy(emb(run, "m1") / "m1__1.h5", emb(run, "m1") / "m1__4.h5")
    with pytest.raises(EncmapError, match=r"m1__4\.h5: (holds the embeddings of encoder 'm1__1'|was factored from other)"):
        load_spectrum(pips["m1__4"])


def test_gather_refuses_another_encoders_features_and_duplicates(run, tmp_path):
    feats = []
    for i in range(3):
        f = tmp_path / f"features/m{i}/m{i}__{i}.h5"
        write_h5(f, {"features": [0.1, 0.2, 0.3], "profile": [-1.0, -2.0], "head": [-1.0, -3.0]},
                 {"encoder_id": f"m{i}__{i}", "model": f"m{i}", "sentences_sha256": "a", "entropy": 1.0,
                  "log_rank": 0.5, "log_scale": 0.0,
                                                     "direction": "forward", "eps": 1e-6, "qre_to_base": 0.0, "d": 2,
                                                     "degenerate": "", "encoder": json.dumps(
                                                         {"id": f"m{i}__{i}", "model": f"m{i}", "layer": None,
                                                          "pooling": "output", "dim": None, "spec": {}})})
        feats.append(str(f))
    meta = {f"m{i}": {"family": f"f{i}"} for i in range(3)}
    gather_step(feats, str(tmp_path / "qre.h5"), meta=meta)
    fm = read_feature_matrix(tmp_path / "qre.h5")
    assert fm["ids"] == ["m0__0", "m1__1", "m2__2"]
    assert [r["meta"] for r in fm["records"]] == [meta["m0"], meta["m1"], meta["m2"]]  # from params, not the files
    with pytest.raises(EncmapError, match=r"m2__2\.h5: model 'm2' has no meta .* is it still in params.yaml"):
        gather_step(feats, str(tmp_path / "qre1.h5"), meta={"m0": {}, "m1": {}})
    shutil.copy(feats[0], feats[2])  # m0__0's file in m2__2's place
    with pytest.raises(EncmapError, match=r"m2__2\.h5: holds the features of encoder 'm0__0' of model 'm0'"):
        gather_step(feats, str(tmp_path / "qre2.h5"), meta=meta)
    shutil.copy(feats[1], feats[2])
    with pytest.raises(EncmapError, match="gathered twice"):
        gather_step(feats[:2] + [feats[1]], str(tmp_path / "qre3.h5"), meta=meta)
    assert not any((tmp_path / f).exists() for f in ("qre1.h5", "qre2.h5", "qre3.h5"))


def test_subset_embeddings_and_scores_are_checked_by_id(run, tmp_path):
    fm = read_feature_matrix(run["features"])
    records = {r["id"]: r for r in fm["records"]}
    shutil.copy(emb(run, "m2") / "m2__5.h5", emb(run, "m2") / "m2__2.h5")
    with pytest.raises(EncmapError, match=r"m2__2\.h5: holds the embeddings of encoder 'm2__5'"):
        read_embeddings(run["embeddings"], ["m2__2"], records, "a" * 64, 30)
    d = tmp_path / "eval/m0"
    d.mkdir(parents=True)
    (d / "m0__0.json").write_text(json.dumps({"encoder_id": "m0__3", "model": "m0", "sentences_sha256": "a",
                                              "tasks": {"t": {"main_score": 0.5}}}))
    with pytest.raises(EncmapError, match=r"m0__0\.json: holds the scores of encoder 'm0__3'"):
        read_eval_scores([str(d)], "a")


def test_a_failing_model_stops_naming_it_or_is_recorded(tmp_path):
    from encmap.artifacts.failures import failed_attrs, read_failure, run_model, write_failure

    def broken():
        raise OSError("no file named model.safetensors")

    with pytest.raises(EncmapError, match=r"model 'm': embed failed: OSError: no file named model.safetensors "
                                          r"\(set embed.on_error: skip"):
        run_model("m", "embed", "stop", broken)
    assert run_model("m", "embed", "skip", broken) == "OSError: no file named model.safetensors"
    assert run_model("m", "embed", "skip", lambda: 3) == 3
    write_failure(tmp_path / "m", "m", "embed", "OSError: x", {"m__out": {"id": "m__out"}}, "abc", 5)
    record = read_failure(tmp_path / "m")
    assert record["stage"] == "embed" and failed_attrs(record, "m__out")["failed"] == {"stage": "embed",
                                                                                       "error": "OSError: x"}
    with pytest.raises(EncmapError, match="not among the encoders of failed model 'm'"):
        failed_attrs(record, "m__l01-mean")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "failed.json").write_text((tmp_path / "m" / "failed.json").read_text())
    with pytest.raises(EncmapError, match="the failure record of model 'm', read as model 'other'"):
        read_failure(tmp_path / "other")
    assert read_failure(tmp_path) is None
