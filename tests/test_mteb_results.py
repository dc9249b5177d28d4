"""MTEB's published results read right: real files from MTEB's results repository (tests/data/
mteb-results, CC0, see its README), each expected value read by hand from the raw JSON here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from encmap.downstream.mteb_results import benchmark_tasks, published_scores, rank, score_file, Candidate
from encmap.validation import EncmapError

DATA = Path(__file__).parent / "data" / "mteb-results"
RESULTS = DATA / "results"
GTR = RESULTS / "sentence-transformers__gtr-t5-base"
POTION = RESULTS / "minishlab__potion-base-8M"
MPNET = RESULTS / "sentence-transformers__all-mpnet-base-v2"
MPNET_PINNED = "9a3225965996d404b775526de6dbfe85d3368642"  # mteb's registry revision of all-mpnet-base-v2
MINILM = RESULTS / "sentence-transformers__all-MiniLM-L6-v2"


def raw(path: Path) -> dict:
    return json.loads(path.read_text())


def main_of(path: Path, split: str, subset: str) -> float:
    """A new-format file's main score of one subset, read straight from the JSON."""
    (entry,) = [e for e in raw(path)["scores"][split] if e["hf_subset"] == subset]
    return entry["main_score"]


def read(models: dict, results: Path = DATA, tasks: list[str] | None = None, split: str | None = None,
         benchmark: str | None = "MTEB(eng, v1)"):
    return published_scores(models, results=results, benchmark=benchmark, tasks=tasks or [], split=split)


@pytest.fixture(scope="module")
def eng():
    return {t.metadata.name: t for t in benchmark_tasks("MTEB(eng, v1)", [])}


# ---------------------------------------------------------------------------------- old formats


def test_old_t5_files_are_scored_where_the_main_score_is_derivable(eng):
    """gtr-t5-base's mteb 0.0.2 files (the crash: main_score None stopped the whole regression).
    Its pinned folder holds only model_meta.json and hides nothing."""
    pub = read({"gtr__out": ("sentence-transformers/gtr-t5-base", None)})
    old = GTR / "no_revision_available"
    got = pub.scores["gtr__out"]
    assert got["STS12"] == raw(old / "STS12.json")["test"]["cos_sim"]["spearman"]  # main: cosine_spearman
    assert got["TwitterURLCorpus"] == raw(old / "TwitterURLCorpus.json")["test"]["max"]["ap"]  # main: max_ap
    src = pub.sources["gtr__out"]
    assert src.scored == {"STS12": "no_revision_available", "TwitterURLCorpus": "no_revision_available"}
    # Reranking: the old evaluator's MAP is not today's map_at_1000. Left out, said so, with its path.
    assert "AskUbuntuDupQuestions" not in got
    assert src.missing["AskUbuntuDupQuestions"].startswith("every file left out: no_revision_available: main score "
                                                           "not derivable: map_at_1000")
    (left,) = src.left_out
    assert left["path"] == str(old / "AskUbuntuDupQuestions.json") and "'map'" in left["reason"]
    assert src.missing["STS13"] == "no result file: in none of the revision folders"
    assert src.folders == {"7027e9594267928589816394bdd295273ddc0739": 0, "no_revision_available": 3}


def test_max_ap_is_derived_from_four_similarity_functions_and_not_from_one(tmp_path, eng):
    """An old pair-classification file without its `max` block: max_ap is the best of the four
    APs, which the old evaluator's own `max.ap` confirms; with cos_sim.ap alone it is not derivable."""
    data = raw(GTR / "no_revision_available/TwitterURLCorpus.json")
    expected = data["test"].pop("max")["ap"]
    f = tmp_path / "TwitterURLCorpus.json"
    f.write_text(json.dumps(data))
    score, version = score_file(f, eng["TwitterURLCorpus"])
    assert score == expected == max(data["test"][k]["ap"] for k in ("cos_sim", "dot", "euclidean", "manhattan"))
    from encmap.downstream.mteb_results import Unscorable

    with pytest.raises(Unscorable, match=r"max_ap is the best AP over cosine_ap, manhattan_ap, euclidean_ap, "
                                         r"dot_ap; the file gives cosine_ap$"):
        score_file(RESULTS / "openai__text-embedding-3-small/1/TwitterURLCorpus.json", eng["TwitterURLCorpus"])


# ---------------------------------------------------------------------------------- folders


def test_every_revision_folder_is_read_and_the_pinned_one_first(eng):
    """potion-base-8M: 2 tasks in a pinned folder, 2 in `external` (mteb's join_revisions kept one
    folder's tasks: model_results[0]); all-mpnet-base-v2: the registry's pinned folder plus another
    pinned hash (a pinned folder holding a few files hid the other)."""
    pub = read({"potion__out": ("minishlab/potion-base-8M", None),
                "mpnet__out": ("sentence-transformers/all-mpnet-base-v2", None)})
    dc = POTION / "dcbec7aa2d52fc76754ac6291803feedd8c619ce"
    assert pub.scores["potion__out"] == {
        "AmazonCounterfactualClassification": main_of(dc / "AmazonCounterfactualClassification.json", "test", "en"),
        "MSMARCO": main_of(dc / "MSMARCO.json", "dev", "default"),  # its evaluation split, not test (0.34981)
        "STS12": main_of(POTION / "external/STS12.json", "test", "default"),
        "CQADupstackRetrieval": main_of(POTION / "external/CQADupstackRetrieval.json", "test", "default"),
    }
    assert pub.scores["potion__out"]["MSMARCO"] == 0.15788
    assert pub.sources["potion__out"].scored["STS12"] == "external"
    mp = pub.scores["mpnet__out"]
    assert mp["STSBenchmark"] == main_of(MPNET / "84f2bcc00d77236f9e89c8a360a00fb1139bf47d/STSBenchmark.json",
                                         "test", "default")
    assert mp["MSMARCO"] == main_of(MPNET / MPNET_PINNED / "MSMARCO.json", "dev", "default")
    src = pub.sources["mpnet__out"]
    assert src.revision == MPNET_PINNED and src.scored["MSMARCO"] == MPNET_PINNED
    # AmazonReviewsClassification was run on de only: MTEB(eng, v1) needs en.
    assert src.missing["AmazonReviewsClassification"] == (
        f"every file left out: {MPNET_PINNED}: subset missing: split 'test' has no hf_subset 'en'")


def mteb_join(results: Path, name: str, tasks: list) -> dict[str, str]:
    """mteb's own choice: the revision each task comes from after BenchmarkResults.join_revisions."""
    import mteb

    loaded = mteb.ResultCache(cache_path=results).load_results(models=[name], tasks=tasks, require_model_meta=False)
    return {tr.task_name: mr.model_revision for mr in loaded.join_revisions().model_results for tr in mr.task_results}


def test_mtebs_own_join_loses_a_folder_and_names_the_same_winner(tmp_path, eng):
    """The case behind the workaround: mteb's join_revisions returns one ModelResult per revision,
    so model_results[0] held 2 of potion's 4 tasks. Where every candidate is scorable, the rule
    here picks the folder join_revisions picks, pinned revision first."""
    tasks = [eng[t] for t in ("AmazonCounterfactualClassification", "MSMARCO", "STS12", "CQADupstackRetrieval")]
    chosen = mteb_join(DATA, "minishlab/potion-base-8M", tasks)
    assert len(set(chosen.values())) == 2 and len(chosen) == 4  # two ModelResults: [0] holds two tasks
    pub = read({"p__out": ("minishlab/potion-base-8M", None)})
    assert pub.sources["p__out"].scored == chosen
    # STS12 in three folders at three scores: the pinned one wins in both; without it, mteb's order
    # (a stated mteb version, a named revision) picks the same folder in both.
    pinned, other = "bf8b056651a2c21b8d2565580b8569da283cab23", "dcbec7aa2d52fc76754ac6291803feedd8c619ce"
    shutil.copytree(POTION, tmp_path / "results" / POTION.name)
    sts = raw(POTION / "external/STS12.json")
    for folder, score, version in ((pinned, 0.61, "1.20.0"), (other, 0.62, "1.30.0")):
        sts |= {"mteb_version": version, "scores": {"test": [{**sts["scores"]["test"][0], "main_score": score}]}}
        (tmp_path / "results" / POTION.name / folder / "STS12.json").write_text(json.dumps(sts))
    for drop_pinned in (False, True):
        if drop_pinned:
            (tmp_path / "results" / POTION.name / pinned / "STS12.json").unlink()
        theirs = mteb_join(tmp_path, "minishlab/potion-base-8M", [eng["STS12"]])["STS12"]
        ours = read({"p__out": ("minishlab/potion-base-8M", None)}, results=tmp_path, tasks=["STS12"], benchmark=None)
        assert ours.sources["p__out"].scored["STS12"] == theirs == (other if drop_pinned else pinned)
        assert ours.scores["p__out"]["STS12"] == (0.62 if drop_pinned else 0.61)
    # Where mteb's choice cannot be scored, the next scorable folder is used (mteb shows a blank).
    cands = [Candidate(pinned, Path("a"), None, None, "subset missing: ..."), Candidate("external", Path("b"), 0.5)]
    assert [c.folder for c in rank(cands, pinned, pinned)] == ["external"]


def test_only_the_benchmarks_subsets_count_unless_tasks_are_named(eng):
    """bge-m3's AmazonCounterfactualClassification has en, en-ext, de, ja: MTEB(eng, v1) uses en
    (0.7563; encmap mteb-scores averaged all four: 0.7466); a task named alone takes every subset
    of its evaluation splits (validation and test, as mteb defines the task outside the benchmark)."""
    f = RESULTS / "BAAI__bge-m3/5617a9f61b028005a4858fdac845db406aefb181/AmazonCounterfactualClassification.json"
    models = {"m3__out": ("BAAI/bge-m3", None)}
    assert read(models).scores["m3__out"]["AmazonCounterfactualClassification"] == main_of(f, "test", "en")
    assert round(main_of(f, "test", "en"), 4) == 0.7563
    every = read(models, tasks=["AmazonCounterfactualClassification"], benchmark=None).scores["m3__out"]
    eight = [e["main_score"] for sp in ("validation", "test") for e in raw(f)["scores"][sp]]
    assert len(eight) == 8 and every["AmazonCounterfactualClassification"] == pytest.approx(np.mean(eight), abs=1e-15)


def test_a_named_split_replaces_each_tasks_own(eng):
    models = {"potion__out": ("minishlab/potion-base-8M", None), "mpnet__out": ("sentence-transformers/all-mpnet-base-v2", None)}
    pub = read(models, split="test")
    assert pub.scores["potion__out"]["MSMARCO"] == 0.34981  # what split: test used to give
    ms = MPNET / MPNET_PINNED / "MSMARCO.json"
    assert pub.scores["mpnet__out"]["MSMARCO"] == main_of(ms, "test", "default") != main_of(ms, "dev", "default")
    pub = read(models, split="dev", tasks=["STSBenchmark"], benchmark=None)
    assert pub.scores["mpnet__out"] == {}
    assert pub.sources["mpnet__out"].missing["STSBenchmark"].endswith("split missing: no 'dev' split (the file has "
                                                                      "['test'])")


def test_an_empty_revision_folder_and_a_model_without_results(tmp_path):
    """all-MiniLM-L6-v2 with an empty second folder: encmap mteb-scores refused it ('expected one
    revision folder'). A model with no folder at all is missing, every task with the reason."""
    shutil.copytree(MINILM, tmp_path / "results" / MINILM.name)
    (tmp_path / "results" / MINILM.name / "0000000000000000000000000000000000000000").mkdir()
    pub = read({"minilm__out": ("sentence-transformers/all-MiniLM-L6-v2", None), "x__out": ("org/nothing", None)},
               results=tmp_path)
    assert pub.scores["minilm__out"] == {"STS12": main_of(MINILM / "8b3219a92973c328a8e22fadcfa821b5dc75636a/STS12.json",
                                                          "test", "default")}
    assert pub.sources["minilm__out"].folders["0000000000000000000000000000000000000000"] == 0
    assert pub.scores["x__out"] == {} and set(pub.sources["x__out"].missing.values()) == {
        "no results: no revision folder for this model"}
    # The repository root or its results folder: both are the same results.
    assert read({"minilm__out": ("sentence-transformers/all-MiniLM-L6-v2", None)}, results=tmp_path / "results").scores \
        == {"minilm__out": pub.scores["minilm__out"]}
    with pytest.raises(EncmapError, match="no 'results' folder in it and no <org__model> folders"):
        read({}, results=tmp_path / "results" / MINILM.name)


# ---------------------------------------------------------------------------------- hostile files


def hostile(task: str, main_score=None, twice: bool = False, name: str | None = None) -> str:
    """A real file (all-MiniLM-L6-v2's STS12) turned into a bad one for ``task``."""
    d = raw(MINILM / "8b3219a92973c328a8e22fadcfa821b5dc75636a/STS12.json")
    d["task_name"] = name or task
    entry = d["scores"]["test"][0]
    if main_score is not None:
        entry["main_score"] = main_score
    if twice:
        d["scores"]["test"].append({**entry, "main_score": 0.7})
    return json.dumps(d)


HOSTILE = {  # task file -> (its content, the reason it is left out)
    "STS13": (hostile("STS13", 57.3), "out of range: main_score 57.3"),
    "STS14": (hostile("STS14", twice=True), "repeated subset: hf_subset 'default' appears 2 times"),
    "STS15": (hostile("STS15", name="STS12"), "task name mismatch: the file says task_name 'STS12'"),
    "STS16": ('{"task_name": "STS16", "scores": {"test": [', "malformed JSON: Expecting value at line 1"),
    "STSBenchmark": (hostile("STSBenchmark", "0.8"), "not a number: main_score '0.8'"),
    "SICK-R": ("[" * 100_000 + "]" * 100_000, "malformed JSON: nested deeper"),
    "BIOSSES": (hostile("BIOSSES", float("nan")), "not finite: main_score nan"),
}


def test_bad_files_beside_real_ones_are_left_out_with_path_and_reason(tmp_path):
    """Each used to be taken as is (57.3, the mean of two 'default' rows, a second row for STS12)
    or to end in a traceback that named no file (JSONDecodeError, TypeError, RecursionError)."""
    shutil.copytree(MINILM, tmp_path / "results" / MINILM.name)
    folder = tmp_path / "results" / MINILM.name / "8b3219a92973c328a8e22fadcfa821b5dc75636a"
    for task, (text, _) in HOSTILE.items():
        (folder / f"{task}.json").write_text(text)
    pub = read({"minilm__out": ("sentence-transformers/all-MiniLM-L6-v2", None)}, results=tmp_path)
    good = main_of(MINILM / "8b3219a92973c328a8e22fadcfa821b5dc75636a/STS12.json", "test", "default")
    assert pub.scores["minilm__out"] == {"STS12": good}  # the real file beside them still counts
    reasons = {Path(r["path"]).stem: r["reason"] for r in pub.sources["minilm__out"].left_out}
    assert set(reasons) == set(HOSTILE)
    for task, (_, why) in HOSTILE.items():
        assert reasons[task].startswith(why), (task, reasons[task])
    counts = pub.counts()
    assert counts["files_left_out"] == 7 and counts["left_out_by_reason"]["malformed JSON"] == 2
    assert "7 files left out" in pub.summary()


def test_mteb_scores_and_the_regress_stage_give_identical_tables(tmp_path, capsys):
    """The one reader behind both: the regress stage's mteb_scores.csv is the table encmap
    mteb-scores writes for the same models, results and options; a models CSV that maps an
    encoder twice is refused (it kept the last row)."""
    from test_regress import OUTS, PARAMS, records

    from encmap.cli import main
    from encmap.io import write_h5
    from encmap.pipeline.regress import regress_step

    names = {"gtr": "sentence-transformers/gtr-t5-base", "potion": "minishlab/potion-base-8M",
             "mpnet": "sentence-transformers/all-mpnet-base-v2", "m3": "BAAI/bge-m3",
             "minilm": "sentence-transformers/all-MiniLM-L6-v2", "te3": "openai/text-embedding-3-small"}
    groups = [g for g in names for _ in range(2)]
    recs = records(len(groups), groups)
    for i, r in enumerate(recs):
        r["id"] = f"{groups[i]}__out" if i % 2 == 0 else f"{groups[i]}__l01-mean"
        r["pooling"], r["dim"], r["layer"] = ("output", None, None) if i % 2 == 0 else ("mean", None, 1)
        r["meta"] |= {"mteb_name": names[groups[i]], "mteb_revision": None}
    F = np.random.default_rng(0).standard_normal((len(recs), 30))
    write_h5(tmp_path / "qre.h5", {"features": F, "encoder_ids": np.array([r["id"] for r in recs], dtype=object),
                                   "encoders": np.array([json.dumps(r) for r in recs], dtype=object)},
             {"sentences_sha256": "x", "eps": 1e-6, "direction": "forward", "m": len(recs)})
    out = {k: str(tmp_path / "out" / f"{k}.x") for k in OUTS}
    params = PARAMS | {"mteb": {"results": str(DATA), "benchmark": "MTEB(eng, v1)", "tasks": [], "split": None,
                                "bare_only": False}}
    regress_step(str(tmp_path / "qre.h5"), [], out, regress=params)
    models = tmp_path / "models.csv"
    models.write_text("encoder,mteb_model,revision\n" + "".join(f"{g}__out,{n},\n" for g, n in names.items()))
    cli = tmp_path / "cli.csv"
    assert main(["mteb-scores", str(DATA), "--models", str(models), "--out", str(cli),
                 "--sources", str(tmp_path / "sources.json")]) == 0
    assert Path(out["mteb_scores"]).read_text() == cli.read_text()
    assert json.loads(Path(out["mteb_sources"]).read_text()) == json.loads((tmp_path / "sources.json").read_text())
    assert len(cli.read_text().splitlines()) == 1 + 2 + 4 + 2 + 1 + 1  # gtr, potion, mpnet, m3, minilm; te3 none
    metrics = json.loads(Path(out["metrics"]).read_text())
    assert metrics["mteb_scores"] == 10 and metrics["mteb_files_left_out"] == 3
    assert "published MTEB scores: 10 (model, task) scores for 5 of 6 models" in capsys.readouterr().err
    # Old (issue 41): --out a directory ended in "[Errno 16] Device or resource busy" naming a temp file.
    assert main(["mteb-scores", str(DATA), "--models", str(models), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} is a directory; name the file to write" in err and "Errno" not in err, err
    models.write_text("encoder,mteb_model\ngtr__out,sentence-transformers/gtr-t5-base\ngtr__out,BAAI/bge-m3\n")
    assert main(["mteb-scores", str(DATA), "--models", str(models)]) == 2
    assert "line 3: encoder 'gtr__out' is mapped twice (lines 2 and 3)" in capsys.readouterr().err


def test_bare_only_keeps_the_models_mteb_scored_on_bare_texts():
    from encmap.downstream.mteb_results import mteb_models

    recs = [{"id": f"{k}__out", "pooling": "output", "dim": None,
             "meta": {"mteb_name": f"org/{k}", "mteb_revision": None} | ({"mteb_scored_with": k} if k != "old" else {})}
            for k in ("none", "prompts", "instructions", "old")]
    assert sorted(mteb_models(recs)) == ["instructions__out", "none__out", "old__out", "prompts__out"]
    assert mteb_models(recs, bare_only=True) == {"none__out": ("org/none", None)}  # an entry that does not say: out


@pytest.mark.parametrize("change, why", [
    ({"benchmark": "MTEB(nope, v9)", "tasks": ["STSBenchmark"]}, "regress.mteb.benchmark: unknown MTEB benchmark 'MTEB(nope, v9)'"),
    ({"tasks": ["STSBenchmark", "NoSuchTask"]}, "regress.mteb.tasks: unknown MTEB task 'NoSuchTask'"),
    ({"split": "bogus"}, "regress.mteb.split: 'bogus' is not an evaluation split of any selected task (they use dev, test)"),
    ({"results": "MISSING"}, "regress.mteb.results: .*MISSING does not exist"),
    ({"results": "FILE"}, "regress.mteb.results: .*FILE is a file"),
    ({"benchmark": None, "tasks": []}, "name a benchmark or tasks"),
])
def test_encmap_check_refuses_mteb_targets_that_would_fail_later(tmp_path, capsys, change, why):
    """Old (issue 41): encmap check accepted an unknown benchmark (ignored when tasks are given),
    unknown tasks, a bogus split, and a results path that does not exist or is a file."""
    import re

    import yaml

    from encmap.cli import main
    from support.project import REPO

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    (tmp_path / "FILE").write_text("not a folder\n")
    change = {k: str(tmp_path / v) if k == "results" else v for k, v in change.items()}
    params["regress"]["mteb"] |= {"results": str(DATA), "benchmark": "MTEB(eng, v1)", "tasks": [], "split": None} | change
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert main(["--params", str(tmp_path / "params.yaml"), "check"]) == 2
    err = capsys.readouterr().err
    assert re.search(why.replace("(", r"\(").replace(")", r"\)").replace(r".\*", ".*"), err), err
    params["regress"]["mteb"] |= {"results": str(DATA), "benchmark": "MTEB(eng, v1)", "tasks": [], "split": "dev"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert main(["--params", str(tmp_path / "params.yaml"), "check"]) == 0
