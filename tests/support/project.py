"""Throw-away encmap projects: tiny params, a copy of the workflow in a git + DVC repo, and running
commands in it with the test environment (offline hub, no DVC analytics)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from encmap.corpus.candidates import BROWN_DIR

from .models import WORDS

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


TFIDF = {"lowercase": True, "sublinear_tf": True, "min_df": 1, "max_df": 1.0, "ngram_range": [1, 1], "norm": "l2"}


#: Every offline task (params.yaml's evaluate.tasks): test_pipeline runs them all end to end.
ALL_TASKS = ("supersense", "gloss-retrieval", "brown-genre", "lee", "polarity", "wordsim353", "simlex999")
#: What the workflow's tests score by default: a similarity and a classification task, enough for the
#: regression's every protocol. Seven tasks cost the tiny pipeline 71 s of CPU against 60 s for these
#: two (its regress job 15 -> 10 s, tasks 6 -> 1 s), in every run of the tests that are about the
#: workflow (staleness, DVC, SLURM, failures), not about the tasks.
PLUMBING_TASKS = ("lee", "polarity")


def tiny_params(model_dir: Path, user_file: Path, n: int = 200, st_dir: Path | None = None,
                tasks: tuple[str, ...] = PLUMBING_TASKS) -> dict:
    """Four models: a sentence-transformers model with Pooling + Normalize (``st_dir``, else the
    bare BERT with sentence-transformers' default mean pooling), a random control, LSA, Gaussian;
    ``tasks`` scored (:data:`ALL_TASKS` for a test of the tasks themselves)."""
    meta = {"family": "tiny", "architecture": "bert", "parameters": 1000, "languages": ["en"],
            "objective": "none", "kind": "pretrained"}
    tr = {"revision": None, "max_seq_length": 64, "batch_size": 16, "prompt": "", "seed": 0, "dtype": "float32"}
    out = {"dims": [], "renormalize_truncated": True}
    return {
        "sentences": {"set": "tiny", "n": n, "seed": 0, "min_words": 6, "max_words": 40, "min_alpha": 0.8,
                      "sources": [{"name": "wiki", "kind": "gensim-wiki", "path": None, "weight": 1.0},
                                  {"name": "mine", "kind": "file", "path": str(user_file), "weight": 1.0,
                                   "text_field": "text"}]},
        "embed": {"device": "cpu", "degenerate": "error", "on_error": "stop", "deterministic": True,
                  "batch_tokens": None},
        "models": {
            "tiny-st": {"backend": "sentence-transformers", "source": f"path:{st_dir or model_dir}", "layers": "all",
                        "num_layers": 2, "pooling": ["mean", "cls"], "output": True, "dims": [8],
                        "renormalize_truncated": True, "init": "pretrained", **tr, "meta": meta},
            "tiny-rand": {"backend": "transformers", "source": f"path:{model_dir}", "layers": [2],
                          "pooling": ["max"], "init": "random", **tr, "meta": meta | {"kind": "control"}},
            "lsa": {"backend": "classical", "method": "tfidf-svd", "dims": [8, 16], "seed": 0,
                    "tfidf": TFIDF, "svd": {"algorithm": "arpack", "n_iter": 5},
                    "meta": meta | {"kind": "classical"}},
            "gauss": {"backend": "control", "method": "gaussian", "dim": 16, "rank": None, "seed": 0, **out,
                      "meta": meta | {"kind": "control"}},
        },
        "pip": {"tol": 1e-12, "dense_max_n": 500, "center": False, "normalize_rows": False},
        "qre": {"direction": "forward", "eps": 1e-6},
        "pairwise": {"device": "cpu", "block_columns": 4096},
        # 11 encoders: perplexity <= (11 - 1)/3.
        "map": {"metric": "manhattan", "perplexity": 3, "pca_dims": 0, "n_iter": 300, "early_exaggeration_iter": 100,
                "init": "auto", "seed": 0, "neighbours": 3, "trustworthiness_k": 3, "fields": ["model", "kind", "layer"]},
        # RBF CKA and stitches on the default groups (6 encoders here); MLPs between the outputs
        # of tiny-st and gauss and the middle layer of tiny-rand.
        "similarity": {
            "subset": {"groups": ["outputs", "middle", "classical", "controls"], "encoders": [], "neighbours": 0},
            "rbf": {"threshold": 1.0, "sample": 100, "seed": 0},
            "stitch": {"sample": n, "val": 0.1, "test": 0.3, "seed": 0,
                       "methods": ["affine", "ridge", "procrustes", "mean", "random-source"],
                       "ridge_alphas": [0.01, 1.0, 100.0], "mlp_depths": [0, 1], "mlp_groups": ["outputs", "controls"],
                       "mlp": {"max_epochs": 30, "patience": 5, "lr": 0.01, "batch_size": 64, "dtype": "float64"},
                       "knn_k": 5, "device": "cpu"},
        },
        # The tasks given, each cut small; 4 models = 4 groups for the grouped CV.
        "evaluate": {"tasks": list(tasks), "seed": 0,
                     "supersense": {"max_per_class": 4, "min_per_class": 4, "test": 0.5},
                     "gloss": {"max_queries": 30, "distractors": 30},
                     "brown": {"max_items": 120, "min_per_class": 4, "min_words": 5, "max_words": 60, "test": 0.5},
                     "polarity": {"folds": 3},
                     "classification": {"n_experiments": 2, "samples_per_label": 8, "max_iter": 100},
                     "retrieval_k": 10,
                     "data": {"wordnet": "/usr/share/wordnet", "brown": BROWN_DIR,
                              "gensim": None},
                     "device": "cpu", "mteb": {"tasks": [], "split": "test"}, "on_error": "stop"},
        # Two candidates per inner search (an α each for ridge, a PCA size each for ElasticNet): every
        # choice is still made by the inner CV, with fewer fits (test_regress checks the search).
        "regress": {"seed": 0, "max_loo_groups": 20, "elasticnet_max_loo_groups": 20, "folds": 3, "inner_folds": 2, "pca_dims": [2, 4],
                    "elasticnet_alphas": [0.1], "l1_ratios": [0.5], "ridge_alphas": [0.1, 10.0],
                    "max_iter": 10000, "score_tables": [], "predictor": "qre", "ridge_alpha_cv": "loo",
                    "uncertainty": {"resamples": 1000, "permutations": 99, "level": 0.95, "seed": 0,
                                    "min_units": 5},
                    "frontier": {"top": 0.2}, "neighbours_k": [1, 2, 3],
                    "intervals": {"level": 0.9, "folds": 0, "score": "absolute", "floor": 0.1, "features": ["head"]},
                    "mteb": {"results": None, "benchmark": "MTEB(eng, v1)", "tasks": [], "split": None, "bare_only": False}},
    }


def write_user_file(path: Path, count: int = 150) -> Path:
    """Generated but sentence-like lines: a capitalised start, 8-12 words, a full stop."""
    import random

    rnd = random.Random(7)
    lines = []
    for _ in range(count):
        words = [rnd.choice(WORDS) for _ in range(rnd.randint(8, 12))]
        lines.append(" ".join(words).capitalize() + ".")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def env() -> dict:
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    e["HF_HUB_OFFLINE"] = "1"
    e["TRANSFORMERS_OFFLINE"] = "1"
    e["DVC_NO_ANALYTICS"] = "1"
    e["GIT_AUTHOR_NAME"] = e["GIT_COMMITTER_NAME"] = "encmap-tests"
    e["GIT_AUTHOR_EMAIL"] = e["GIT_COMMITTER_EMAIL"] = "tests@encmap.invalid"
    return e


def run(cmd: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, shell=True, cwd=cwd, env=env(), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"`{cmd}` failed ({p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-6000:]}")
    return p


def make_project(root: Path, params: dict, git: bool = False) -> Path:
    """Copy the workflow (not the data) into ``root`` with the given params."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("Snakefile", "dvc.yaml", "rules", "scripts", "profiles", "envs", "requirements"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, root / name)
    # DVC deps name these sources; the installed package is what runs.
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.copy(REPO / ".gitignore", root / ".gitignore")  # the repository's, as a user's clone has it
    if git:
        run("git init -q -b main && dvc init -q && dvc config core.autostage true", root)
        shutil.copy(REPO / ".dvcignore", root / ".dvcignore")
        run("git add -A && git commit -qm init", root)
    return root


def tree_hashes(root: Path, *dirs: str) -> dict[str, str]:
    out = {}
    for d in dirs:
        base = root / d
        for f in sorted(base.rglob("*")) if base.exists() else []:
            if f.is_file() and not f.name.startswith(".") and f.name != ".gitignore":
                out[str(f.relative_to(root))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


ARTIFACTS = ("data", "results")
#: Map settings for a map of 4 encoders: perplexity <= (4 - 1)/3, trustworthiness k < m/2.
SMALL_MAP = {"perplexity": 1, "neighbours": 2, "trustworthiness_k": 1}
#: Artifacts that gather every encoder: any encoder's change changes them.
GATHERED = ("results/features/qre.h5", "results/features/metrics.json", "results/similarity/", "results/map/",
            "results/regression/")


def with_param(params: dict, path: str, value) -> dict:
    p = yaml.safe_load(yaml.safe_dump(params))
    node = p
    *head, last = path.split(".")
    for k in head:
        node = node[k]
    node[last] = value
    return p


def ran(out: str) -> set[str]:
    """Stages that `dvc repro` / `dvc exp run` actually ran (less DVC's bookkeeping: code digests, params slices)."""
    return set(re.findall(r"Running stage '([^']+)'", out)) - {"code", "params"}


def built_once(tmp_path_factory, name: str, build) -> Path:
    """A finished project that several test modules read, built once per test session: across
    xdist workers too (the first to ask builds it under a file lock, the others wait for it).
    ``build(root)`` makes it at ``root``; tests copy it before they change anything."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker has its own basetemp under a shared one
        base = base.parent
    home = base / "built-once" / name
    home.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(home) + ".lock"):
        if not (home / "done").exists():  # a build that failed left no marker: built again
            shutil.rmtree(home, ignore_errors=True)
            build(home / "p")
            (home / "done").touch()
    return home / "p"


META = {"family": "control", "architecture": "gaussian", "parameters": 0, "languages": [], "objective": "none",
        "kind": "control"}


def control_params(m: int, n: int = 80) -> dict:
    """The default params with m seeded Gaussian control models (widths 16-48) over n sentences."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["sentences"] |= {"set": f"ctl-n{n}", "n": n}
    params["models"] = {f"ctl-{i:04d}": {"backend": "control", "method": "gaussian", "dim": 16 + 16 * (i % 3),
                                         "rank": None, "seed": i, "dims": [], "renormalize_truncated": True,
                                         "meta": META} for i in range(m)}
    # What a map of m encoders allows (params validation): perplexity <= (m - 1)/3, k < m/2.
    params["map"] |= {"perplexity": min(3, (m - 1) / 3), "neighbours": min(5, m - 1),
                      "trustworthiness_k": min(2, (m - 1) // 2)}
    params["similarity"]["subset"]["encoders"] = []
    return params


def light_params() -> dict:
    """Ten control models, the costly settings cut down (no MLP stitches, small grids and tasks)."""
    params = control_params(10)
    params["similarity"]["stitch"] |= {"mlp_depths": [], "ridge_alphas": [0.1, 10.0]}
    params["regress"] |= {"pca_dims": [2, 4], "elasticnet_alphas": [0.01, 0.1], "l1_ratios": [0.5],
                          "ridge_alphas": [0.1, 10.0], "folds": 3, "inner_folds": 2}
    params["evaluate"] |= {"tasks": list(PLUMBING_TASKS), "gloss": {"max_queries": 30, "distractors": 30},
                           "brown": params["evaluate"]["brown"] | {"max_items": 120},
                           "classification": {"n_experiments": 2, "samples_per_label": 8, "max_iter": 100}}
    return params
