"""params.yaml: reading it (duplicate keys are errors) and validating it before any job starts.

params.yaml is both Snakemake's config and DVC's params file. It is checked against the JSON
schema beside this module (``params.schema.json``, one description per key: ``docs/parameters.md``
is generated from it), then against the rules a schema cannot state (unique encoder ids,
perplexity against the number of encoders, ...). This module only accepts or refuses params: it
never changes a value, so it is no DVC dependency of any stage (see ``docs/pipeline.md``).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import yaml

from .encoders.variants import expand_encoders
from .validation import EncmapError, check_eps, check_perplexity, lineage_cycle


class UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last).

    libyaml's C parser when PyYAML has it (~4x faster: a params file of 1,101 models is 10,000
    lines); the mappings are still built by the Python constructor below, which sees every key's line.
    """


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise EncmapError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1} "
                              f"(first at line {seen[key] + 1})")
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """An integer, or a YAML error at its line: Python reads no integer of more than 4,300 digits
    (its raw ValueError named neither the file nor the line)."""
    try:
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    except ValueError:
        raise yaml.constructor.ConstructorError(None, None, f"an integer of {len(node.value):,} characters, more than "
                                                "any key takes", node.start_mark) from None


UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def parse_yaml(text: str, where: str) -> Any:
    """Parse YAML safely; a duplicate key or a syntax error is an error naming ``where``."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except EncmapError as e:
        raise EncmapError(f"{where}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        if mark is None:
            raise EncmapError(f"{where}: not valid YAML: {e}") from None
        what = "; ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x)
        snippet = mark.get_snippet()
        raise EncmapError(f"{where}: not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {what}"
                          + (f"\n{snippet}" if snippet else "")) from None


def schema() -> dict:
    """The JSON schema of params.yaml (``params.schema.json`` beside this module)."""
    return json.loads(resources.files("encmap").joinpath("params.schema.json").read_text())


def load_params(path: str | Path) -> dict:
    """Read and validate a params file; errors name the file and the offending key."""
    p = Path(path)
    if not p.exists():
        raise EncmapError(f"{p}: params file not found")
    params = parse_yaml_file(p)
    validate_params(params, str(p))
    return params


def validate_params(params: Any, where: str = "params") -> None:
    """Validate against the schema, then the rules a schema cannot state (unique encoder ids)."""
    bad = _first(params, _non_finite)
    if bad is not None:
        # JSON Schema has no word for NaN / infinity (YAML's .nan, .inf): NaN passes every bound.
        raise EncmapError(f"{where}: key {bad[0]}: {bad[1]!r} is not a finite number")
    import jsonschema  # here: a Snakemake process whose config was already found valid never needs it (0.2 s)

    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(params), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    problems = list(dict.fromkeys(_message(e, params) for e in errors))
    encoders = {}
    if isinstance(params, dict) and isinstance(params.get("models"), dict):
        # Every model's own rules too (of the models the schema accepts), all reported at once.
        refused = {e.absolute_path[1] for e in errors if len(e.absolute_path) > 1 and e.absolute_path[0] == "models"}
        encoders = expand_encoders({m: s for m, s in params["models"].items()
                                    if m not in refused and isinstance(s, dict)}, problems)
    if len(problems) == 1:
        raise EncmapError(f"{where}: {problems[0]}")
    if problems:
        raise EncmapError(f"{where}: {len(problems)} problems:\n  " + "\n  ".join(problems))
    huge = _first(params, _huge_int)  # only a number key can hold one now (every integer key has a maximum)
    if huge is not None:
        raise EncmapError(f"{where}: key {huge[0]}: {_short_number(huge[1])} is not a finite number (beyond float64)")
    s = params["sentences"]
    if s["min_words"] > s["max_words"]:
        raise EncmapError(f"{where}: key sentences.min_words ({s['min_words']}) > max_words ({s['max_words']})")
    names = [src["name"] for src in s["sources"]]
    if len(set(names)) != len(names):
        raise EncmapError(f"{where}: key sentences.sources: duplicate source name in {names}")
    parent = {m: str(spec["meta"]["derived_from"]["model"]) for m, spec in params["models"].items()
              if (spec.get("meta") or {}).get("derived_from")}
    cycle = lineage_cycle(parent)
    if cycle:  # the map would draw lineage only after every embedding is computed: refuse now
        raise EncmapError(f"{where}: key models.{cycle[0]}.meta.derived_from: the lineage forms a cycle: "
                          + " -> ".join(cycle))
    u = params["regress"]["uncertainty"]
    if u["resamples"] * (1 - u["level"]) / 2 < 10 - 1e-9:  # a percentile interval needs resamples in both tails
        need = math.ceil(20 / (1 - u["level"]))
        raise EncmapError(f"{where}: key regress.uncertainty.resamples = {u['resamples']}: a {u['level']:g} interval "
                          f"needs at least {need} resamples (10 in each tail; 1,000 or more advised)")
    check_counts(params, len(encoders), where)
    unknown = [e for e in params["similarity"]["subset"]["encoders"] if e not in encoders]
    if unknown:
        raise EncmapError(f"{where}: key similarity.subset.encoders: no encoder {unknown[0]!r} in models")


def check_mteb_targets(params: dict, where: str = "params") -> None:
    """``regress.mteb`` against mteb's registry (:func:`encmap.downstream.mteb_results.check_targets`):
    only when published scores are asked for (importing mteb costs seconds), and from the entry
    points that start work (``encmap check``, a Snakemake run, ``encmap repro``, DVC's params
    stage), not from every DVC stage command."""
    if params["regress"]["mteb"]["results"] is None:
        return
    from .downstream.mteb_results import check_targets

    check_targets(params["regress"]["mteb"], where)


def check_api_keys(params: dict, where: str = "params") -> None:
    """Every ``openai`` model's key variable is set, and its value is nowhere in the model's
    ``base_url`` (the value is never shown)."""
    from .encoders.served.keys import check_key_env, check_key_form, check_key_not_in_url

    served = {m: s for m, s in params["models"].items() if s["backend"] == "openai"}
    for m, s in served.items():  # a key written where the variable's name goes: refused, never repeated
        try:
            check_key_env(m, s["api_key_env"])
        except EncmapError as e:
            raise EncmapError(f"{where}: {e}") from None
    unset = [(m, s["api_key_env"]) for m, s in served.items() if not os.environ.get(s["api_key_env"])]
    if unset:
        raise EncmapError(f"{where}: model {unset[0][0]!r}: its API key variable {unset[0][1]} (api_key_env) is not set"
                          + (f" (nor are {len(unset) - 1} other models' keys)" if len(unset) > 1 else "")
                          + "; export it before the run")
    for m, s in served.items():
        try:
            check_key_form(m, s["api_key_env"], os.environ[s["api_key_env"]])
            check_key_not_in_url(m, s, os.environ[s["api_key_env"]])
        except EncmapError as e:
            raise EncmapError(f"{where}: {e}") from None


def check_counts(params: dict, m: int, where: str = "params") -> None:
    """The rules that follow from how many encoders (m) and sentences (n) there will be.

    Checked before any job starts, so that a value that can only fail does not wait minutes for
    the stage that reads it (and does not cost that stage's previous outputs). m counts every
    encoder the models yield; the steps check again against the encoders actually mapped.
    """
    from .similarity.stitch import split_rows  # the very rule the stitch step applies

    n = params["sentences"]["n"]
    try:
        check_eps(params["qre"]["eps"], params["qre"]["direction"])
    except EncmapError as e:
        raise EncmapError(f"{where}: key qre.eps: {e}") from None
    mp = params["map"]
    # The map has at most m encoders (fewer if some are dropped).
    check_perplexity(mp["perplexity"], m, f"{where}: key map.perplexity")
    if not mp["neighbours"] < m:
        raise EncmapError(f"{where}: key map.neighbours = {mp['neighbours']}: each encoder lists its k nearest other "
                          f"encoders, so k must be below the m = {m} encoders")
    if not mp["trustworthiness_k"] < m / 2:
        raise EncmapError(f"{where}: key map.trustworthiness_k = {mp['trustworthiness_k']} must be below m/2 = {m / 2} "
                          f"for a map of m = {m} encoders (scikit-learn's trustworthiness)")
    if mp["metric"] == "exact-qre" and params["qre"]["eps"] == 0:
        raise EncmapError(f"{where}: key map.metric: exact-qre needs qre.eps > 0 (unsmoothed, the QRE between "
                          "encoders whose supports differ is infinite)")
    sim = params["similarity"]
    if not sim["subset"]["neighbours"] < m:
        raise EncmapError(f"{where}: key similarity.subset.neighbours = {sim['subset']['neighbours']} must be below "
                          f"the m = {m} encoders")
    if min(sim["rbf"]["sample"], n) < 4:
        raise EncmapError(f"{where}: key similarity.rbf.sample: CKA needs at least 4 sentences")
    st = sim["stitch"]
    if st["val"] + st["test"] >= 1:
        raise EncmapError(f"{where}: key similarity.stitch: val + test = {st['val'] + st['test']} leaves no "
                          "training sentences (must be below 1)")
    try:
        split = split_rows(min(st["sample"], n), val=st["val"], test=st["test"], random_state=st["seed"])
    except EncmapError as e:
        raise EncmapError(f"{where}: key similarity.stitch.sample: {e}") from None
    if not st["knn_k"] < len(split.test):
        raise EncmapError(f"{where}: key similarity.stitch.knn_k = {st['knn_k']} must be below the "
                          f"{len(split.test)} test sentences of a stitch")


def _first(node: Any, bad: Callable[[Any], bool], path: str = "") -> tuple[str, Any] | None:
    """The dotted path and value of the first value in params for which ``bad(value)`` holds, or None."""
    if bad(node):
        return path or "(top level)", node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        found = _first(v, bad, f"{path}.{k}" if path else str(k))
        if found:
            return found
    return None


def _non_finite(value: Any) -> bool:
    """NaN or an infinity (YAML's .nan, .inf)."""
    return isinstance(value, float) and not math.isfinite(value)


def _huge_int(value: Any) -> bool:
    """An integer no float64 holds: ``float()`` of it overflows."""
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.float_info.max


def _short_number(value: Any) -> str:
    """A number for a message: a long one cut, with its length said."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}…{text[-4:]} ({len(text):,} digits)"


def takes_key(spec: dict, key: str) -> bool:
    """Whether a model entry of ``spec``'s backend (and method) may hold ``key``: no branch of the
    schema that applies to it forbids the key (``openai`` entries have no ``source``)."""
    import jsonschema

    return not any(branch["then"].get("properties", {}).get(key) is False
                   for branch in schema()["$defs"]["model"]["allOf"]
                   if jsonschema.Draft202012Validator(branch["if"]).is_valid(spec))


#: The largest integer params.yaml may hold (the schema's ``maximum`` of every integer key):
#: NumPy's RandomState, and so scikit-learn and openTSNE, take no larger seed, and scikit-learn's
#: compiled loops no larger count (ElasticNet's ``max_iter``); a larger one passed the check and
#: died in the library, minutes into a run.
MAX_INT = 2**32 - 1


def _message(error, params: Any) -> str:
    """``key <dotted path>: <what is wrong>``, reworded where the schema's words would not say what to
    change (``error``: a jsonschema.ValidationError)."""
    import jsonschema

    path = list(error.absolute_path)
    if error.validator is None and len(path) == 2 and path[0] == "models":
        # A `false` schema in a backend's branch: a key that does not apply to that backend.
        model, spec = path[1], params["models"][path[1]]
        keys = [k for branch in schema()["$defs"]["model"]["allOf"]
                if jsonschema.Draft202012Validator(branch["if"]).is_valid(spec)
                for k, sub in branch["then"].get("properties", {}).items() if sub is False and k in spec]
        what = f"backend {spec.get('backend')!r}" + (f", method {spec['method']!r}" if "method" in spec else "")
        return f"key models.{model}.{keys[0]}: does not apply to model {model!r} ({what}); remove it"
    if error.validator == "pattern" and len(path) == 3 and path[0] == "models" and path[2] == "base_url":
        from .encoders.variants import base_url_problem  # words that never repeat a URL (it may hold a key)

        spec = params["models"][path[1]]
        problem = base_url_problem(error.instance, spec.get("api_key_env", "?")) or "names no host"
        return f"key models.{path[1]}.base_url: {problem}"
    if error.validator == "maximum" and error.validator_value == MAX_INT:
        return (f"key {'.'.join(str(x) for x in path)}: {_short_number(error.instance)} is above {MAX_INT:,} (2^32 - 1), the largest "
                "integer the libraries it reaches accept (NumPy's RandomState, so scikit-learn's and openTSNE's seeds; "
                "scikit-learn's compiled loops)")
    return f"key {'.'.join(str(x) for x in path) or '(top level)'}: {error.message}"


#: Parsed config files of this process, by (path, size, modification time): a Snakemake process
#: checks params.yaml in the Snakefile and again with the merged config; it is parsed once.
_PARSED: dict[tuple[str, int, int], Any] = {}


def parse_yaml_file(path: str | Path) -> Any:
    """:func:`parse_yaml` of a file, once per process while the file is unchanged."""
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _PARSED:
        _PARSED[key] = parse_yaml(p.read_text(encoding="utf-8"), str(p))
    return _PARSED[key]


def check_yaml_file(path: str | Path) -> None:
    """Parse a config file before Snakemake does: its own error names neither the line nor the column."""
    if Path(path).exists():
        parse_yaml_file(path)


#: Where the Snakefile's JSON rendering of params.yaml lives (ignored by git and DVC).
RENDERED = Path(".snakemake") / "encmap"


def snakemake_configfile(path: str | Path = "params.yaml") -> str:
    """The file the Snakefile's ``configfile:`` loads: ``path`` itself, or its JSON rendering.

    Snakemake parses YAML config files with PyYAML's pure-Python loader (through yte): ~1.2 s for
    a params file of 1,101 models, in every Snakemake process, and DVC runs one per stage. It
    tries JSON first, which it reads in milliseconds. So ``path`` is parsed here (libyaml,
    duplicate keys refused, naming the line), rendered as JSON once per content under
    ``.snakemake/encmap/<name>-<sha256>.json``, and that file is what Snakemake loads; errors
    about the config still name ``path`` (:func:`encmap.workflow.config.check_snakemake_config`).
    """
    import hashlib

    from .io import atomic_write_text

    p = Path(path)
    if not p.exists():
        return str(p)  # Snakemake's own error: the configfile is missing
    digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    out = RENDERED / f"{p.stem}-{digest}.json"
    if not out.exists():
        try:
            text = json.dumps(parse_yaml_file(p), allow_nan=True)
        except TypeError:  # a value JSON cannot hold (a YAML date): Snakemake reads the YAML itself
            return str(p)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, text)
        for old in out.parent.glob(f"{p.stem}-*.json"):  # renderings of earlier contents
            if old != out:
                old.unlink(missing_ok=True)
    _RENDERED_FROM[str(out)] = str(p)
    return str(out)


#: JSON rendering -> the YAML file it renders (what errors name).
_RENDERED_FROM: dict[str, str] = {}


def _type_text(node: dict) -> str:
    """A schema node's type and constraints in a few words (for the parameters page)."""
    if "const" in node:
        return f"`{node['const']}`"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" if v is not None else "`null`" for v in node["enum"])
    if "$ref" in node:
        return "model entry" if node["$ref"].endswith("/model") else "mapping"
    t = node.get("type", "")
    text = " or ".join(t) if isinstance(t, list) else str(t)
    if "oneOf" in node or "anyOf" in node:
        text = " or ".join(_type_text(x) for x in node.get("oneOf", node.get("anyOf", [])))
    if t == "array" and isinstance(node.get("items"), dict):
        inner = node["items"]
        text = f"list of {_type_text(inner) if 'properties' not in inner else 'mappings'}"
    bounds = [f"{op} {node[k]}" for k, op in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"),
                                              ("exclusiveMaximum", "<")) if k in node]
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def _rows(node: dict, prefix: str) -> list[tuple[str, str, str]]:
    rows = []
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        rows.append((path, _type_text(sub), sub.get("description", "")))
        rows += _rows(sub, path)
        if isinstance(sub.get("items"), dict) and "properties" in sub["items"]:
            rows += _rows(sub["items"], f"{path}[]")
    return rows


def parameters_markdown() -> str:
    """``docs/parameters.md``: every key of params.yaml with its type and description, from the schema.

    ``encmap params-doc`` prints it; a test keeps the committed page equal to it.
    """
    s = schema()
    lines = ["# Parameters", "",
             "Every key of `params.yaml` (Snakemake's config and DVC's params file), generated from the schema",
             "`src/encmap/params.schema.json` by `encmap params-doc > docs/parameters.md`. Every value that",
             "changes a result is written in `params.yaml` explicitly (`encmap check` refuses a file that",
             "leaves one out); the default run's values are in the repository's `params.yaml`. Every integer is",
             f"at most {MAX_INT:,} (2^32 − 1): NumPy's RandomState, and so scikit-learn and openTSNE, take no",
             "larger seed, and scikit-learn's compiled loops no larger count.", ""]

    def table(rows: list[tuple[str, str, str]]) -> None:
        lines.extend(["| key | type | what |", "| --- | --- | --- |"])
        bar = "\\|"  # a literal | inside a table cell
        lines.extend(f"| `{k}` | {t} | {d.replace('|', bar)} |" for k, t, d in rows)
        lines.append("")

    for section, node in s["properties"].items():
        lines += [f"## `{section}`", "", node.get("description", ""), ""]
        if section == "models":
            lines += ["`models.<id>`: one entry per model (id: path-safe, a-z 0-9 . _ -). Keys by backend are "
                      "checked by the schema; the entry:", ""]
            table(_rows(s["$defs"]["model"], "models.<id>"))
            lines += ["`models.<id>.meta`:", ""]
            table(_rows(s["$defs"]["meta"], "models.<id>.meta"))
        elif _rows(node, section):
            table(_rows(node, section))
    return "\n".join(lines).rstrip() + "\n"


def append_models(params_path: str | Path, entries: dict[str, dict[str, Any]], replace: bool = False) -> None:
    """Add model entries (``{id: spec}``) at the end of the ``models:`` block of a params file, keeping its comments.

    ``replace``: they replace the block's entries instead. The new file is validated before it
    replaces the old one.
    """
    from .io import atomic_write_text

    p = Path(params_path)
    lines = p.read_text(encoding="utf-8").splitlines(keepends=True)
    try:
        start = next(i for i, line in enumerate(lines) if line.rstrip() == "models:")
    except StopIteration:
        raise EncmapError(f"{p}: no top-level 'models:' block to append to") from None
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\n", "#", "")), len(lines))
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    if replace:
        lines, end = lines[:start + 1] + lines[end:], start + 1
    clash = sorted(set(entries) & set(parse_yaml("".join(lines), str(p)).get("models") or {}))
    if clash:
        raise EncmapError(f"{p}: models {clash[:5]} are already in its 'models:' block"
                          + (" (and more)" if len(clash) > 5 else ""))
    entry = yaml.safe_dump(entries, sort_keys=False, default_flow_style=None, width=120)
    block = "".join("  " + line if line.strip() else line for line in entry.splitlines(keepends=True))
    text = "".join(lines[:end]) + block + "".join(lines[end:])
    if replace:
        text = _drop_subset_encoders(text, str(p))
    validate_params(parse_yaml(text, str(p)), str(p))
    atomic_write_text(p, text)


_SUBSET_ENCODERS = re.compile(r"^(    encoders: )\[[^\]]*\][^\n]*", re.M)
_SUBSET_GROUPS = re.compile(r"^(    groups: )\[[^\]]*\][^\n]*", re.M)


def _drop_subset_encoders(text: str, where: str) -> str:
    """After ``encmap catalogue --replace``: a ``similarity.subset`` that names encoders of the replaced
    models becomes the named groups alone (every model's output, middle layer, classical and
    control encoders), so that the new models are compared."""
    params = parse_yaml(text, where)
    named = ((params.get("similarity") or {}).get("subset") or {}).get("encoders") or []
    if not named or set(named) <= set(expand_encoders(params.get("models") or {})):
        return text
    new, n1 = _SUBSET_ENCODERS.subn(r"\g<1>[]   # emptied by encmap catalogue --replace (it named replaced models)",
                                    text, count=1)
    new, n2 = _SUBSET_GROUPS.subn(r"\g<1>[outputs, middle, classical, controls]", new, count=1)
    if (n1, n2) != (1, 1):
        raise EncmapError(f"{where}: similarity.subset.encoders names encoders of replaced models; edit it by hand")
    print(f"encmap: {where}: similarity.subset named {len(named)} encoders of the replaced models; it now takes "
          "the groups outputs, middle, classical, controls", file=sys.stderr)
    return new

