"""The catalogue: catalogue entries from mteb's installed registry, and published MTEB scores as targets."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from encmap.downstream.mteb_results import published_scores
from encmap.encoders.catalogue import catalogue, model_id, registry_records
from encmap.encoders.variants import expand_encoders
from encmap.io import write_h5
from encmap.validation import EncmapError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def registry():
    return registry_records()


@pytest.fixture(scope="module")
def metas():
    import mteb

    return mteb.get_model_metas()


def test_the_whole_catalogue_validates_and_is_stable(registry, tmp_path):
    """Every entry of the default catalogue (all open dense text encoders with a faithful route)
    passes `encmap check`, and two builds give the same entries and encoder list."""
    import subprocess
    import sys

    entries, left = catalogue(registry)
    again, _ = catalogue(registry_records())
    assert entries == again and len(entries) > 300
    assert list(expand_encoders(entries)) == [f"{m}__out" for m in sorted(entries)]
    params = yaml.safe_load((REPO / "params.yaml").read_text()) | {"models": entries}
    params["similarity"]["subset"] |= {"encoders": [], "groups": ["outputs"]}  # the default names default encoders
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    r = subprocess.run([sys.executable, "-m", "encmap.cli", "--params", str(tmp_path / "params.yaml"), "check"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and f"valid, {len(entries)} encoders" in r.stdout, r.stdout + r.stderr
    # Never a route encmap cannot run faithfully; every entry pinned and explicit.
    assert not {"not text-only", "closed weights (API only)", "not a dense encoder (cross-encoder)",
                "not a dense encoder (sparse)", "not a dense encoder (late-interaction)"} - set(left)
    by_name = {r["name"]: r for r in registry}
    for e in entries.values():
        r = by_name[e["meta"]["mteb_name"]]
        assert r["open_weights"] and r["model_type"] == ["dense"] and r["modalities"] == ["text"]
        assert not r["trust_remote_code"] and not e["trust_remote_code"]
    # Lineage from the registry's adapted_from: a parent on the map by its model id, else its hub name.
    derived = {k: e["meta"]["derived_from"] for k, e in entries.items() if e["meta"]["derived_from"]}
    assert len(derived) > 50
    for k, d in derived.items():
        parent = by_name[entries[k]["meta"]["mteb_name"]]["adapted_from"]
        assert d["relation"] == "adapted"
        assert d["model"] == (model_id(parent) if model_id(parent) in entries else parent)
    assert any(d["model"] in entries for d in derived.values())
    for e in entries.values():
        assert e["revision"] and e["source"].startswith("hub:") and e["meta"]["mteb_revision"] == e["revision"]
        assert e["dtype"] == ("bfloat16" if (e["meta"]["parameters"] or 0) >= 1e9 else "float32")


def test_filters_give_exactly_the_records_that_satisfy_them(registry, metas):
    """100 M - 400 M parameters and English only, checked against mteb's own records by hand."""
    entries, _ = catalogue(registry, min_params=1e8, max_params=4e8, english_only=True)
    expected = set()
    for m in metas:
        loader = getattr(m.loader, "__name__", None)
        remote = '"trust_remote_code": true' in json.dumps(m.loader_kwargs or {}, default=str)
        langs = {x.split("-")[0] for x in (m.languages or [])}
        if (m.open_weights and list(m.modalities or []) == ["text"] and list(m.model_type or []) == ["dense"]
                and loader in ("SentenceTransformerEncoderWrapper", "InstructSentenceTransformerModel",
                               "sentence_transformers_loader", "instruct_loader", "q3e_instruct_loader")
                and m.revision and not remote and m.n_parameters is not None and 1e8 <= m.n_parameters <= 4e8
                and langs == {"eng"}):
            expected.add(m.name)
    assert {e["meta"]["mteb_name"] for e in entries.values()} == expected and len(expected) > 20
    assert all(e["meta"]["language_scope"] == "english" for e in entries.values())


def test_remote_code_models_are_left_out_unless_allowed(registry):
    remote = sorted(r["name"] for r in registry if r["trust_remote_code"] and r["open_weights"]
                    and r["modalities"] == ["text"] and r["model_type"] == ["dense"]
                    and r["loader"] == "SentenceTransformerEncoderWrapper")
    assert remote
    name = remote[0]
    pattern = "^" + name.replace(".", r"\.") + "$"
    entries, left = catalogue(registry, name_pattern=pattern)
    assert entries == {} and left == {"needs trust_remote_code": 1}
    entries, left = catalogue(registry, name_pattern=pattern, trust_remote_code=True)
    (entry,) = entries.values()
    assert entry["trust_remote_code"] is True and entry["meta"]["mteb_name"] == name and not left


def test_prompt_choice_is_written_in_the_entry(registry):
    """E5 documents 'passage: ' for documents: --prompt document writes it, none writes ''."""
    pattern = "^intfloat/multilingual-e5-small$"
    bare, _ = catalogue(registry, name_pattern=pattern)
    doc, _ = catalogue(registry, name_pattern=pattern, prompt="document")
    (b,), (d,) = bare.values(), doc.values()
    assert (b["prompt"], b["meta"]["prompt"]) == ("", "none")
    assert (d["prompt"], d["meta"]["prompt"]) == ("passage: ", "document")


def write_result(root: Path, model: str, revision: str, task: str, subsets: list[tuple[str, list[str], float]]):
    """One result file in MTEB's layout: results/<org__model>/<revision>/<Task>.json."""
    d = root / "results" / model.replace("/", "__") / revision
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{task}.json").write_text(json.dumps({
        "dataset_revision": "0", "task_name": task, "mteb_version": "1.38.0", "evaluation_time": 1.0,
        "kg_co2_emissions": None,
        "scores": {"test": [{"main_score": s, "hf_subset": h, "languages": langs} for h, langs, s in subsets]}}))


TASKS = ["Banking77Classification", "KinNewsClassification", "STS12"]


def test_published_scores_read_into_exactly_the_expected_table(tmp_path):
    """Two models, three tasks, one missing score (a has no Banking77), two subsets of one task
    (KinNews: the mean over them), and a second revision of b that the pinned revision excludes.
    Under the MTEB(eng, v1) benchmark only its subsets count ('en' of AmazonCounterfactual); under
    a task list a result lacking some of the task's subsets is incomplete: no score."""
    en, de, kin = ["eng-Latn"], ["deu-Latn"], ["kin-Latn"]
    write_result(tmp_path, "org/a", "r1", "STS12", [("default", en, 0.7)])
    write_result(tmp_path, "org/a", "r1", "KinNewsClassification",
                 [("kinnews_cleaned", kin, 0.6), ("kirnews_cleaned", ["run-Latn"], 0.9)])
    write_result(tmp_path, "org/a", "r1", "AmazonCounterfactualClassification", [("en", en, 0.6), ("de", de, 0.8)])
    write_result(tmp_path, "org/b", "r2", "STS12", [("default", en, 0.5)])
    write_result(tmp_path, "org/b", "r2", "Banking77Classification", [("default", en, 0.9)])
    write_result(tmp_path, "org/b", "r3", "STS12", [("default", en, 0.1)])
    models = {"a__out": ("org/a", "r1"), "b__out": ("org/b", "r2")}
    pub = published_scores(models, results=str(tmp_path), benchmark=None, tasks=TASKS, split="test")
    assert pub.tasks == TASKS
    assert pub.scores == {"a__out": {"STS12": 0.7, "KinNewsClassification": pytest.approx(0.75)},
                          "b__out": {"STS12": 0.5, "Banking77Classification": 0.9}}
    assert pub.sources["b__out"].scored == {"STS12": "r2", "Banking77Classification": "r2"}  # pinned r2, not r3
    pub = published_scores(models, results=str(tmp_path), benchmark="MTEB(eng, v1)", tasks=[], split="test")
    assert len(pub.tasks) == 56 and pub.scores["a__out"]["AmazonCounterfactualClassification"] == pytest.approx(0.6)
    pub = published_scores(models, results=str(tmp_path), benchmark=None,
                           tasks=["AmazonCounterfactualClassification"], split="test")
    assert pub.scores["a__out"] == {}  # en and de of its four subsets: incomplete
    assert pub.sources["a__out"].missing["AmazonCounterfactualClassification"].endswith(
        "subset missing: split 'test' has no hf_subset 'en-ext', 'ja'")
    with pytest.raises(EncmapError, match="no 'results' folder"):
        published_scores(models, results=str(tmp_path / "results/org__a"), benchmark=None, tasks=TASKS, split="test")


def test_the_regression_takes_published_scores_as_targets(tmp_path):
    """Eight catalogue models on a fake map: their output encoders get the published scores, the
    layer variants none; a task with scores for only two models is left out, named."""
    from test_regress import OUTS, PARAMS, records

    from encmap.pipeline.regress import regress_step

    rng = np.random.default_rng(0)
    m = 16
    groups = [f"m{i // 2}" for i in range(m)]
    recs = records(m, groups)
    for i, r in enumerate(recs):  # even rows: the model's output; odd rows: a layer variant
        r["id"] = f"{groups[i]}__out" if i % 2 == 0 else f"{groups[i]}__l01-mean"
        r["pooling"], r["dim"], r["layer"] = ("output", None, None) if i % 2 == 0 else ("mean", None, 1)
        r["meta"] |= {"mteb_name": f"org/{groups[i]}", "mteb_revision": "r"}
    F = rng.standard_normal((m, 30))
    write_h5(tmp_path / "qre.h5", {"features": F, "encoder_ids": np.array([r["id"] for r in recs], dtype=object),
                                   "encoders": np.array([json.dumps(r) for r in recs], dtype=object)},
             {"sentences_sha256": "x", "eps": 1e-6, "direction": "forward", "m": m})
    for k in range(8):
        write_result(tmp_path, f"org/m{k}", "r", "STS12", [("default", ["eng-Latn"], float(np.tanh(F[2 * k, 0])))])
        if k < 2:
            write_result(tmp_path, f"org/m{k}", "r", "Banking77Classification", [("default", ["eng-Latn"], 0.5)])
    out = {k: str(tmp_path / "out" / f"{k}.x") for k in OUTS}
    params = PARAMS | {"mteb": {"results": str(tmp_path), "benchmark": None, "tasks": TASKS, "split": "test", "bare_only": False}}
    regress_step(str(tmp_path / "qre.h5"), [], out, regress=params)
    table = Path(out["table"]).read_text()
    assert "mteb:STS12" in table and "Banking77" not in table
    rows = [line.split(",") for line in table.splitlines()[1:] if line.startswith("mteb:STS12,grouped,qre,")]
    assert rows and all(r[4] == "8" for r in rows)  # n: the 8 output encoders, not the layer variants
    metrics = json.loads(Path(out["metrics"]).read_text())
    assert metrics["tasks"] == 1 and metrics["tasks_with_too_few_scores"] == 2


def test_catalogue_command_writes_a_configfile_or_replaces_the_models(tmp_path, capsys):
    from encmap.cli import main

    params = tmp_path / "params.yaml"
    params.write_text((REPO / "params.yaml").read_text())
    pick = ["--max-params", "2e8", "--limit", "40"]  # 40 models: enough for the default perplexity
    assert main(["--params", str(params), "catalogue", *pick, "--out", str(tmp_path / "catalogue.yaml")]) == 0
    entries = yaml.safe_load((tmp_path / "catalogue.yaml").read_text())
    assert list(entries) == ["models"] and len(entries["models"]) == 40
    assert "left out" in capsys.readouterr().out
    before = params.read_text()
    assert main(["--params", str(params), "catalogue", *pick, "--append", "--replace"]) == 0
    cap = capsys.readouterr()
    assert "backend:" not in cap.out  # the entries go into the file, not to the terminal
    after = params.read_text()
    assert yaml.safe_load(after)["models"] == entries["models"]
    # The default stitch subset named default encoders: now the named groups pick the new models.
    assert yaml.safe_load(after)["similarity"]["subset"] | {"neighbours": 0} == {
        "groups": ["outputs", "middle", "classical", "controls"], "encoders": [], "neighbours": 0}
    assert "similarity.subset named 9 encoders of the replaced models" in cap.err
    assert after.splitlines()[:3] == before.splitlines()[:3]  # the file's own comments are kept
    assert main(["--params", str(params), "catalogue", *pick, "--append"]) != 0
    assert "already in its 'models:' block" in capsys.readouterr().err


def test_the_architecture_comes_from_a_cached_checkpoint_config(tmp_path, monkeypatch):
    """Where the checkpoint's config.json (at the pinned revision) is in the Hugging Face cache,
    its model_type is the entry's architecture and decides the pooling (last for decoders)."""
    import encmap.encoders.catalogue as cat

    name = "intfloat/multilingual-e5-small"
    rev = next(r["revision"] for r in registry_records() if r["name"] == name)
    snap = tmp_path / "hub" / f"models--{name.replace('/', '--')}" / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (tmp_path / "hub" / f"models--{name.replace('/', '--')}" / "refs").mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    entries, _ = cat.catalogue(cat.registry_records(), name_pattern=f"^{name}$")
    (e,) = entries.values()
    assert e["meta"]["architecture"] == "qwen3" and e["pooling"] == ["last"]


def test_how_mteb_scored_each_model_is_in_its_entry(registry):
    """From the registry: E5 with its query/passage prefixes, gte-Qwen2 with task instructions,
    all-MiniLM-L6-v2 on bare texts; the prompt the map uses is recorded beside it."""
    names = {"intfloat/multilingual-e5-small": "prompts", "Alibaba-NLP/gte-Qwen2-1.5B-instruct": "instructions",
             "sentence-transformers/all-MiniLM-L6-v2": "none"}
    entries, _ = catalogue(registry, name_pattern="^(" + "|".join(map(re.escape, names)) + ")$",
                           trust_remote_code=True)
    got = {e["meta"]["mteb_name"]: (e["meta"]["mteb_scored_with"], e["meta"]["prompt"]) for e in entries.values()}
    assert got == {n: (w, "none") for n, w in names.items()}


def test_embeddinggemma_is_no_decoder_by_its_name(registry):
    """embeddinggemma is Gemma 3 trained bidirectionally: the name rule called it a decoder."""
    entries, _ = catalogue(registry, name_pattern=r"^google/embeddinggemma-300m$|^BAAI/bge-multilingual-gemma2$")
    arch = {e["meta"]["mteb_name"]: (e["meta"]["architecture"], e["pooling"]) for e in entries.values()}
    assert arch["google/embeddinggemma-300m"] == ("unknown", ["mean"])
    assert arch["BAAI/bge-multilingual-gemma2"] == ("decoder", ["last"])  # a Gemma 2 decoder stays one


def test_registry_metadata_contradicted_by_the_results_is_not_copied(registry):
    """Real model_meta.json files (tests/data/mteb-results): gte-Qwen2-1.5B-instruct's registry
    width 8960 against 1536, GritLM-8x7B's width and parameters, gte-small-zh's width; the entry
    writes null there and records every source. all-MiniLM-L6-v2 agrees and keeps its figures."""
    from encmap.downstream.mteb_results import model_metas
    from encmap.encoders.catalogue import check_metadata, same_count

    data = REPO / "tests/data/mteb-results"
    names = ["Alibaba-NLP/gte-Qwen2-1.5B-instruct", "GritLM/GritLM-8x7B", "thenlper/gte-small-zh",
             "sentence-transformers/all-MiniLM-L6-v2"]
    entries, _ = catalogue(registry, name_pattern="^(" + "|".join(map(re.escape, names)) + ")$",
                           trust_remote_code=True)
    assert len(entries) == 4
    conflicts = check_metadata(entries, model_metas(data, names))
    by = {entries[k]["meta"]["mteb_name"]: v for k, v in conflicts.items()}
    raw = json.loads((data / "results/Alibaba-NLP__gte-Qwen2-1.5B-instruct/external/model_meta.json").read_text())
    assert by["Alibaba-NLP/gte-Qwen2-1.5B-instruct"]["width"] == {
        "mteb registry": 8960, "results/Alibaba-NLP__gte-Qwen2-1.5B-instruct/external/model_meta.json": raw["embed_dim"]}
    assert set(by["GritLM/GritLM-8x7B"]) == {"width", "parameters"} and set(by["thenlper/gte-small-zh"]) == {"width"}
    assert "sentence-transformers/all-MiniLM-L6-v2" not in by
    for k, e in entries.items():
        if k in conflicts:
            assert all(e["meta"][f] is None for f in conflicts[k]) and e["meta"]["metadata_conflicts"] == conflicts[k]
        else:
            assert e["meta"]["width"] == 384 and "metadata_conflicts" not in e["meta"]
    # Counts that round to each other, or differ by counting conventions, are one model; halves are not.
    assert same_count(1_889_792, 2_000_000) and same_count(30_258_688, 30_300_000) and same_count(100, 104)
    assert not same_count(1_543_268_864, 1_780_000_000) and not same_count(57_920_000_000, 46_702_792_704)
