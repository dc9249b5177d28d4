"""The catalogue: ``models:`` entries for hub encoders from MTEB's model registry, offline.

mteb ships its registry (``mteb.get_model_metas()``: name, pinned revision, parameters, width,
languages, license, release date, framework, loader, ``adapted_from``, ...). This module turns
its records into params.yaml model entries. Pure data: records (dicts, see :func:`record_of`)
in, entries and counts out; reading the registry is :func:`registry_records`.

Which records become entries
----------------------------
Only open-weight, text-only, dense encoders that mteb itself loads as a sentence-transformers
model (plain, or with instructions): encmap's ``sentence-transformers`` backend is then the
same computation. Cross-encoders, sparse, late-interaction, closed (API) models and models with
their own loader class are never emitted, and every record left out is counted with its reason.
A model whose loader runs the checkpoint's own code (``trust_remote_code``) is left out unless
the caller allows it.

What an entry maps
------------------
The model's own output (``layers: []``, ``output: true``): the embedding MTEB evaluates, so the
regression's targets (its MTEB scores) belong to exactly that encoder, ``<id>__out``.

Which prompt a probe sentence gets
----------------------------------
``prompt="none"`` (the default): every model embeds the bare sentence. The map compares what
models do with the same text; an instruction or prefix is how a model is used on a task (and
for most instruction models applies to queries only), and differs between models, so it would
confound the comparison. ``prompt="document"``: the passage/document prompt the registry
documents for the model (``model_prompts``: e.g. E5's ``passage: ``), "" where it documents
none or where the model's passage instruction depends on the task. The choice is written in
each entry (``prompt`` and ``meta.prompt``) and so in every artifact's provenance.

How MTEB scored the model is recorded beside it (``meta.mteb_scored_with``): ``none`` (bare
texts), ``prompts`` (the fixed prefixes of ``model_prompts``, e.g. E5's ``query: `` /
``passage: ``) or ``instructions`` (task instructions: an instruction template, or prompts the
checkpoint itself defines). For the last two the published scores belong to the model *used
with* those texts, not to the bare-sentence encoder on the map; ``regress.mteb.bare_only``
keeps the targets to models scored without any.

Metadata the registry gets wrong
--------------------------------
The registry's width and parameter count are checked against what MTEB's results say of the
same model (each revision folder's ``model_meta.json``; :func:`check_metadata`). Where they
contradict, the entry does not copy the registry's number (``null``) and records both in
``meta.metadata_conflicts``; ``encmap catalogue`` counts and lists them. The map's ``dimension`` is
never the registry's: it is the width encmap measures on the embeddings.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from ..validation import EncmapError

#: mteb loaders that load a plain sentence-transformers model (with or without instructions).
ST_LOADERS = ("SentenceTransformerEncoderWrapper", "InstructSentenceTransformerModel",
              "sentence_transformers_loader", "instruct_loader", "q3e_instruct_loader")
#: Checkpoint ``model_type`` values of decoder (causal) language models.
DECODER_TYPES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
                           "gemma2", "gemma3", "gemma3_text", "phi", "phi3", "olmo", "olmo2", "gpt2", "gptj",
                           "gpt_neox", "falcon", "starcoder2", "stablelm", "internlm2", "minicpm"})
#: Name fragments of decoder (causal) families, where no checkpoint config is at hand. Google's
#: embeddinggemma is Gemma 3 trained with bidirectional attention (its config says so): no decoder.
DECODER_NAMES = re.compile(r"qwen|mistral|llama|(?<!embedding)gemma|phi-|olmo|smollm|sfr-embedding|linq",
                           re.IGNORECASE)
#: Two parameter counts of one model contradict each other when they differ by more than this
#: share (counting conventions differ by a few percent: with or without a pooler, tied
#: embeddings) and the more precise one, rounded to the other's significant digits, is not the
#: other (sources round: 1,889,792 is "2,000,000").
PARAMETERS_RTOL = 0.05
SCORED_WITH = ("none", "prompts", "instructions")
PROMPTS = ("none", "document")
DTYPES = ("auto", "float32", "bfloat16", "float16")
#: Below this many parameters an entry runs in float32; at or above it, with dtype auto, bfloat16.
HALF_FROM = 1_000_000_000


def record_of(meta: Any) -> dict[str, Any]:
    """The fields of one ``mteb.ModelMeta`` this module uses, as plain data."""
    loader = meta.loader
    kwargs = json.dumps(meta.loader_kwargs or {}, default=str)
    prompts = (meta.loader_kwargs or {}).get("model_prompts") or {}
    return {
        "name": meta.name, "revision": meta.revision, "n_parameters": meta.n_parameters,
        # A list for Matryoshka models (their sizes): the full width is the largest.
        "embed_dim": max(meta.embed_dim) if isinstance(meta.embed_dim, (list, tuple)) else meta.embed_dim,
        "languages": list(meta.languages or []), "license": meta.license,
        "release_date": str(meta.release_date) if meta.release_date else None,
        "framework": list(meta.framework or []), "use_instructions": meta.use_instructions,
        "adapted_from": meta.adapted_from, "open_weights": meta.open_weights,
        "modalities": list(meta.modalities or []), "model_type": list(getattr(meta, "model_type", None) or []),
        "loader": getattr(loader, "__name__", None) if loader is not None else None,
        "trust_remote_code": '"trust_remote_code": true' in kwargs,
        "passage_instruction": bool((meta.loader_kwargs or {}).get("apply_instruction_to_passages")),
        "document_prompt": prompts.get("document") or prompts.get("passage") or "",
        "has_model_prompts": bool(prompts),
        "instruction_template": bool((meta.loader_kwargs or {}).get("instruction_template")),
        "max_tokens": meta.max_tokens,
    }


def scored_with(r: dict[str, Any]) -> str:
    """How mteb embeds the model's texts when it scores it (one of :data:`SCORED_WITH`)."""
    if r["has_model_prompts"] and not r["instruction_template"]:
        return "prompts"
    return "instructions" if r["use_instructions"] or r["instruction_template"] else "none"


def registry_records() -> list[dict[str, Any]]:
    """Every record of the mteb registry installed with encmap (offline), sorted by name.

    ``model_type``: the checkpoint config's ``model_type`` where that config (at the pinned
    revision) is in the local Hugging Face cache; the registry itself does not say.
    """
    import mteb
    from huggingface_hub import try_to_load_from_cache

    out = []
    for meta in mteb.get_model_metas():
        r = record_of(meta)
        try:  # names of API models are not repository ids ("openai/... (embed_dim=512)")
            found = try_to_load_from_cache(r["name"], "config.json", revision=r["revision"]) if r["revision"] else None
        except ValueError:
            found = None
        try:
            config = json.loads(Path(found).read_text()) if isinstance(found, str) else {}
            r["config_model_type"] = config["model_type"] if config else None
        except (OSError, ValueError, KeyError):
            config, r["config_model_type"] = {}, None
        # A decoder architecture trained bidirectionally (embeddinggemma: gemma3_text) is no decoder.
        r["config_bidirectional"] = bool(config.get("use_bidirectional_attention")) if isinstance(config, dict) else False
        out.append(r)
    return sorted(out, key=lambda r: r["name"])


def left_out_reason(r: dict[str, Any], trust_remote_code: bool = False) -> str | None:
    """Why a record gets no entry (None: it gets one). The first reason that applies."""
    if not r["open_weights"]:
        return "closed weights (API only)"
    if r["modalities"] != ["text"]:
        return "not text-only"
    if r["model_type"] != ["dense"]:
        return f"not a dense encoder ({'/'.join(r['model_type']) or 'unknown type'})"
    if r["loader"] not in ST_LOADERS:
        return "own mteb loader: no faithful sentence-transformers route"
    if not r["revision"]:
        return "no pinned revision"
    if r["trust_remote_code"] and not trust_remote_code:
        return "needs trust_remote_code"
    return None


def model_id(name: str) -> str:
    """A path-safe params id for a hub name: ``org/Model-v1`` -> ``org--model-v1``."""
    out = re.sub(r"[^a-z0-9._-]", "-", name.lower().replace("/", "--")).strip("-._")
    if not out or not out[0].isalnum():
        raise EncmapError(f"hub name {name!r} gives no usable model id")
    return out.replace("__", "_-")  # "__" separates a model id from its variant in encoder ids


def family_root(name: str, by_name: dict[str, dict[str, Any]]) -> str | None:
    """The root of ``name``'s ``adapted_from`` chain (the model it derives from, transitively);
    None when it derives from nothing the registry names."""
    seen, cur = {name}, by_name[name]["adapted_from"] if name in by_name else None
    root = None
    while cur and cur not in seen:
        seen.add(cur)
        root = cur
        cur = by_name[cur]["adapted_from"] if cur in by_name else None
    return root


def language_scope(languages: list[str]) -> str:
    """english (every language English), multilingual (more than one language), the one
    language's ISO 639-3 code, or unknown."""
    codes = sorted({lang.split("-")[0] for lang in languages})
    if not codes:
        return "unknown"
    if codes == ["eng"]:
        return "english"
    return "multilingual" if len(codes) > 1 else codes[0]


def size_band(parameters: float | None) -> str:
    if parameters is None:
        return "unknown"
    return "<100M" if parameters < 1e8 else "100M-1B" if parameters < 1e9 else ">=1B"


def entry(r: dict[str, Any], by_name: dict[str, dict[str, Any]], *, prompt: str = "none",
          dtype: str = "auto") -> dict[str, Any]:
    """The params.yaml entry of one registry record (every result-changing key written)."""
    if prompt not in PROMPTS:
        raise EncmapError(f"prompt {prompt!r}: use one of {PROMPTS}")
    if dtype not in DTYPES:
        raise EncmapError(f"dtype {dtype!r}: use one of {DTYPES}")
    params = r["n_parameters"]
    big = params is not None and params >= HALF_FROM
    org = r["name"].split("/")[0]
    root = family_root(r["name"], by_name)
    config_type = r.get("config_model_type")
    decoder = (config_type in DECODER_TYPES and not r.get("config_bidirectional") if config_type
               else bool(DECODER_NAMES.search(r["name"]) or (root and DECODER_NAMES.search(root))))
    text = r["document_prompt"] if prompt == "document" and not r["passage_instruction"] else ""
    year = int(r["release_date"][:4]) if r["release_date"] else None
    return {
        "backend": "sentence-transformers", "source": f"hub:{r['name']}", "revision": r["revision"],
        # Probe sentences are short (<= 40 words by default): no truncation within 512 tokens.
        "max_seq_length": int(min(512, r["max_tokens"] or 512)),
        "batch_size": 16 if big else 64, "prompt": text, "layers": [],
        "pooling": ["last"] if decoder else ["mean"], "output": True, "dims": [],
        "renormalize_truncated": True, "init": "pretrained", "seed": 0,
        "dtype": ("bfloat16" if big else "float32") if dtype == "auto" else dtype,
        "trust_remote_code": bool(r["trust_remote_code"]),
        "meta": {
            "family": root.split("/")[-1] if root else org,
            "architecture": config_type or ("decoder" if decoder else "unknown"),
            "parameters": params, "languages": r["languages"], "objective": "unknown", "kind": "pretrained",
            "organisation": org, "base_model": r["adapted_from"], "width": r["embed_dim"],
            # Lineage: the registry's adapted_from (catalogue() names the parent by its model id
            # when the parent is on the same map, so the page draws the edge).
            "derived_from": {"model": r["adapted_from"], "relation": "adapted"} if r["adapted_from"] else None,
            "language_scope": language_scope(r["languages"]), "license": r["license"], "release_year": year,
            "instructions": bool(r["use_instructions"]), "prompt": prompt if text else "none",
            "mteb_scored_with": scored_with(r),
            "mteb_name": r["name"], "mteb_revision": r["revision"],
        },
    }


def select(records: Iterable[dict[str, Any]], *, min_params: float | None = None, max_params: float | None = None,
           languages: Iterable[str] = (), english_only: bool = False, organisations: Iterable[str] = (),
           name_pattern: str | None = None, framework: str | None = None) -> list[dict[str, Any]]:
    """Records that satisfy every given filter (a parameter range, languages: any of these ISO
    639-3 codes, English only, organisations, a regular expression on the name, a framework)."""
    langs, orgs = set(languages), set(organisations)
    try:
        pattern = re.compile(name_pattern) if name_pattern else None
    except re.error as e:
        raise EncmapError(f"--name {name_pattern!r} is not a regular expression: {e}") from None
    out = []
    for r in records:
        p = r["n_parameters"]
        if (min_params is not None or max_params is not None) and p is None:
            continue
        if (min_params is not None and p < min_params) or (max_params is not None and p > max_params):
            continue
        codes = {lang.split("-")[0] for lang in r["languages"]}
        if langs and not codes & langs:
            continue
        if english_only and language_scope(r["languages"]) != "english":
            continue
        if orgs and r["name"].split("/")[0] not in orgs:
            continue
        if pattern and not pattern.search(r["name"]):
            continue
        if framework and framework not in r["framework"]:
            continue
        out.append(r)
    return out


def catalogue(records: list[dict[str, Any]], *, trust_remote_code: bool = False, limit: int | None = None,
              prompt: str = "none", dtype: str = "auto",
              **filters: Any) -> tuple[dict[str, dict[str, Any]], Counter]:
    """Model entries by id for the records that pass the filters and have a faithful route.

    Returns the entries (sorted by id; the first ``limit`` of them) and how many selected
    records were left out, by reason. ``records`` is the whole registry: ``adapted_from``
    chains are followed through records that the filters drop.
    """
    by_name = {r["name"]: r for r in records}
    left: Counter = Counter()
    entries: dict[str, dict[str, Any]] = {}
    names: dict[str, str] = {}
    for r in select(records, **filters):
        why = left_out_reason(r, trust_remote_code)
        if why:
            left[why] += 1
            continue
        key = model_id(r["name"])
        if key in names:
            raise EncmapError(f"hub names {names[key]!r} and {r['name']!r} give the same model id {key!r}")
        names[key] = r["name"]
        entries[key] = entry(r, by_name, prompt=prompt, dtype=dtype)
    ids = sorted(entries)
    if limit is not None:
        left["over --limit"] += max(0, len(ids) - limit)
        ids = ids[:limit]
    on_map = {names[k]: k for k in ids}
    for k in ids:
        d = entries[k]["meta"]["derived_from"]
        if d and d["model"] in on_map:
            d["model"] = on_map[d["model"]]
    return {k: entries[k] for k in ids}, left


def composition(entries: dict[str, dict[str, Any]]) -> dict[str, Counter]:
    """Counts of the entries by family, size band, architecture and language scope."""
    metas = [e["meta"] for e in entries.values()]
    return {"family": Counter(m["family"] for m in metas),
            "size": Counter(size_band(m["parameters"]) for m in metas),
            "architecture": Counter(m["architecture"] for m in metas),
            "languages": Counter(m["language_scope"] for m in metas),
            "dtype": Counter(e["dtype"] for e in entries.values())}


def same_count(a: float, b: float) -> bool:
    """Whether two parameter counts name the same model (:data:`PARAMETERS_RTOL`, or rounding)."""
    if abs(a - b) <= PARAMETERS_RTOL * max(abs(a), abs(b)):
        return True

    def zeros(x: float) -> int:  # trailing zeros of an integer count: how far it was rounded
        s = str(int(x))
        return len(s) - len(s.rstrip("0")) if x == int(x) and int(x) else 0

    rounder, precise = (a, b) if zeros(a) >= zeros(b) else (b, a)
    return round(precise, -zeros(rounder)) == rounder


def check_metadata(entries: dict[str, dict[str, Any]],
                   sightings: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Where the registry's width or parameter count contradicts another source, stop copying it.

    Parameters
    ----------
    entries : model entries by id (changed in place)
    sightings : mteb name -> what other sources say of it: dicts with ``source`` (e.g.
        ``results/<org__model>/external/model_meta.json``), ``embed_dim``, ``n_parameters``

    Returns
    -------
    dict
        id -> field (``width`` / ``parameters``) -> {source: value} (the registry's first), for
        every contradicted field; those entries get ``null`` there and the same in
        ``meta.metadata_conflicts``. A width contradicts when it differs at all, a parameter
        count when it differs by more than :data:`PARAMETERS_RTOL`.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key, e in entries.items():
        meta = e["meta"]
        claims = {"width": meta["width"], "parameters": meta["parameters"]}
        found: dict[str, dict[str, Any]] = {}
        for seen in sightings.get(meta["mteb_name"], []):
            for field_, other in (("width", seen.get("embed_dim")), ("parameters", seen.get("n_parameters"))):
                mine = claims[field_]
                if isinstance(other, list):  # Matryoshka sizes: the full width is the largest
                    other = max(other) if other else None
                if mine is None or not isinstance(other, (int, float)) or isinstance(other, bool):
                    continue
                differs = other != mine if field_ == "width" else not same_count(other, mine)
                if differs:
                    found.setdefault(field_, {"mteb registry": mine})[seen["source"]] = other
        if found:
            out[key] = found
            for field_ in found:
                meta[field_] = None
            meta["metadata_conflicts"] = found
    return out
