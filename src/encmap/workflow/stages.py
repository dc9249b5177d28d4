"""The pipeline graph, described once: each stage's rule, inputs, outputs and params.

Everything that names a stage's files or values reads this registry:

- ``dvc.yaml`` is generated from it whole (:func:`encmap.workflow.deps.dvc_yaml`, ``encmap deps
  --write``; a test fails when the committed file differs): deps, params and outputs (:class:`Stage`).
- The rules take their inputs and outputs from it (``rules/common.smk``: ``stage_input`` and
  ``stage_output``), so a rule file declares only what Snakemake alone needs (params, log,
  threads, resources, the script).
- ``encmap stage`` and ``encmap repro`` take each stage's Snakemake job from it (:func:`stage_job`),
  and the ``params`` stage its slices (:attr:`Stage.params`).

A stage's *code* is not listed: it is what its rule and script run, found by import analysis
(:mod:`encmap.workflow.deps`) and hashed into its digest. Adding a stage: a rule file, a script,
a step module, one entry here, then ``encmap deps --write``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..validation import EncmapError
from .layout import (
    FEATURE_MATRIX,
    LAYOUT,
    MAP_MODEL,
    REGRESSORS,
    SENTENCES,
    artifact_paths,
    map_figures,
    similarity_figures,
)

@dataclass(frozen=True)
class Track:
    """One output as DVC tracks it.

    ``path`` may hold ``{model}`` (a per-model stage's model) and ``{set}`` (``sentences.set``);
    ``kind``: ``outs``, ``metrics`` (``cache: false``: git keeps it, ``dvc metrics diff`` reads
    it; ``cache=True`` for a metrics file that changes on every run) or ``plots`` (``plot``: x,
    y, template of a CSV). Every output persists (DVC never deletes it before its stage runs).
    """

    path: str
    kind: str = "outs"
    cache: bool = True
    plot: dict[str, str] | None = None


@dataclass(frozen=True)
class Stage:
    """One stage: a rule, a script, a step module and a DVC stage, all of this name.

    Attributes
    ----------
    name : the stage's (and rule's, script's, step module's) name
    per_model : one DVC stage per model (``<name>@<model>``); its files hold ``{model}``
    deps : DVC data deps (paths with ``{model}``, ``{set}``); code digest and slice are added
    sources : params-named files DVC must hash too: ``(config) -> paths`` (the corpora curate
        reads, user score tables, a local copy of MTEB's results)
    tracks : how DVC tracks the outputs
    params : the params the outputs depend on (the stage's slice): dotted paths, ``{model}``
        for a per-model stage's own entry, ``models.*.<key>`` for one key of every model,
        ``<path> except <k>[,<k>...]`` to leave out keys that change no output
    inputs, outputs : ``(config) -> {name: path or list}``: the rule's inputs and outputs;
        ``{model}``, ``{encoder}`` wildcards; outputs named in ``directories`` are directories
    target : the output a single stage's Snakemake call names (per-model stages: every output
        of the model)
    doc : the comment above the stage in ``dvc.yaml``
    """

    name: str
    deps: tuple[str, ...]
    tracks: tuple[Track, ...]
    inputs: Callable[[dict], dict[str, Any]]
    outputs: Callable[[dict], dict[str, str]]
    params: tuple[str, ...] = ()
    per_model: bool = False
    sources: Callable[[dict], list[str]] = field(default=lambda config: [])
    directories: tuple[str, ...] = ()
    target: str | None = None
    doc: str = ""


def _sentences(config: dict) -> str:
    return SENTENCES.format(set=config["sentences"]["set"])


def _per_model(pattern: str) -> Callable[[dict], list[str]]:
    return lambda config: [pattern.format(model=m) for m in sorted(config["models"])]


def _source_paths(config: dict) -> list[str]:
    """The corpora the sentence sources read (their own files: a new release reruns curate)."""
    return [s["path"] for s in config["sentences"]["sources"] if s.get("path")]


def _task_sources(config: dict) -> list[str]:
    data = config["evaluate"]["data"]
    return [p for p in (data["wordnet"], data["brown"], data["gensim"]) if p]


def _regress_sources(config: dict) -> list[str]:
    mteb = config["regress"]["mteb"]["results"]
    return [t["path"] for t in config["regress"]["score_tables"]] + ([mteb] if mteb not in (None, "remote") else [])


#: Per stage with sources, the sha256 of each file they hold (``<stage>.sha256``), rewritten only when
#: one changes: the rule's input that stands for them. Its stat cache beside it (``.json``).
SOURCE_STAMPS = ".snakemake/encmap/sources"


def source_inputs(name: str, config: dict, root: str | Path = ".") -> dict[str, str]:
    """Stage ``name``'s sources as a rule input (``{"sources": stamp}``, or ``{}``): a file listing
    the sha256 of each file params names for it, every file of a folder included, rewritten when one
    changes. A plain run then remakes what read a source that changed, as DVC (which hashes them)
    decides; one input, not hundreds of files (a corpus folder) in each of Snakemake's lines, and a
    source touched but unchanged reruns nothing. A new stamp is dated 1970: only a change seen
    reruns a job (a fresh clone's, or an upgraded project's, results stand)."""
    import json

    from ..io import atomic_write_text, file_sha256

    files: list[Path] = []
    for p in map(Path, STAGES[name].sources(config)):
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.is_file()
                            and not any(part.startswith(".") for part in f.relative_to(p).parts))
        elif p.is_file():
            files.append(p)
    if not files:
        return {}
    stamp = Path(root) / SOURCE_STAMPS / f"{name}.sha256"
    cache_path = stamp.with_suffix(".json")
    try:
        cache = json.loads(cache_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cache = {}
    lines, seen = [], {}
    for f in files:
        st = f.stat()
        key = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        was = cache.get(str(f))
        sha = was[5] if isinstance(was, list) and was[:5] == key else file_sha256(f)
        seen[str(f)] = [*key, sha]
        lines.append(f"{sha}  {f}\n")
    text = "".join(lines)
    old = stamp.read_text(encoding="utf-8") if stamp.is_file() else None
    if text != old:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(stamp, text)
        if old is None:
            os.utime(stamp, ns=(0, 0))
    if seen != cache:
        atomic_write_text(cache_path, json.dumps(seen))
    return {"sources": str(stamp)}


STAGES: dict[str, Stage] = {s.name: s for s in (
    Stage("curate", deps=(), sources=_source_paths, params=("sentences",),
          tracks=tuple(Track(f"data/sentences/{{set}}.{ext}") for ext in ("txt", "manifest.tsv", "sha256",
                                                                          "sources.tsv")),
          inputs=lambda c: {},
          outputs=lambda c: {"txt": _sentences(c)} | {
              k: f"data/sentences/{c['sentences']['set']}.{ext}"
              for k, ext in (("manifest", "manifest.tsv"), ("sha", "sha256"), ("sources", "sources.tsv"))},
          target="txt", doc="The probe sentences, curated from the sources' own files."),
    Stage("embed", per_model=True, deps=(SENTENCES,), params=("models.{model} except meta", "embed except on_error",
                                                               "sentences.n"),
          tracks=(Track("results/embeddings/{model}"),),
          inputs=lambda c: {"sentences": _sentences(c)},
          outputs=lambda c: {"embeddings": "results/embeddings/{model}"}, directories=("embeddings",),
          doc="One forward pass per model: every encoder variant of it."),
    Stage("pip", per_model=True, deps=("results/embeddings/{model}",), params=("pip",),
          tracks=(Track("results/pip/{model}"),),
          inputs=lambda c: {"embeddings": "results/embeddings/{model}"},
          outputs=lambda c: {"pip": LAYOUT["pip"]},
          doc="Per encoder: its exact factored PIP (one Snakemake job per encoder; dropped variants pruned)."),
    Stage("features", per_model=True, deps=("results/pip/{model}", "results/embeddings/{model}"), params=("qre",),
          tracks=(Track("results/features/encoders/{model}"),),
          # U is derived from the embeddings (the PIP artifact stores no U)
          inputs=lambda c: {"pip": LAYOUT["pip"], "embeddings": "results/embeddings/{model}"},
          outputs=lambda c: {"features": LAYOUT["features"]},
          doc="Per encoder: QRE features w.r.t. the unit base encoder and the spectrum's summaries."),
    Stage("gather", deps=("results/features/encoders",), params=("models.*.meta",),
          tracks=(Track(FEATURE_MATRIX), Track("results/features/failures.json"),
                  Track("results/features/metrics.json", kind="metrics", cache=False)),
          inputs=lambda c: {"features": artifact_paths(c["models"], "features")},
          outputs=lambda c: {"features": FEATURE_MATRIX, "metrics": "results/features/metrics.json",
                             "failures": "results/features/failures.json"},
          target="features",
          doc="The m x n feature matrix; each model's meta from params (a model taken out of params leaves it)."),
    Stage("pairwise", deps=(FEATURE_MATRIX, "results/pip", "results/embeddings"), params=("qre.eps", "pairwise"),
          tracks=(Track("results/similarity/qre_pairwise.h5"), Track("results/similarity/cka.h5"),
                  Track("results/similarity/qre_pairwise.timing.json", kind="metrics")),
          inputs=lambda c: {"features": FEATURE_MATRIX, "pips": artifact_paths(c["models"], "pip"),
                            "embeddings": _per_model("results/embeddings/{model}")(c)},
          outputs=lambda c: {"qre": "results/similarity/qre_pairwise.h5", "cka": "results/similarity/cka.h5",
                             "timing": "results/similarity/qre_pairwise.timing.json"},
          target="qre",
          doc="Exact QRE and linear CKA of every pair; the pairs of unchanged encoders are reused."),
    Stage("cka_rbf", deps=(FEATURE_MATRIX, "results/embeddings"), params=("similarity.subset", "similarity.rbf"),
          tracks=(Track("results/similarity/cka_rbf.h5"), Track("results/similarity/cka_rbf.timing.json", kind="metrics")),
          inputs=lambda c: {"features": FEATURE_MATRIX, "embeddings": _per_model("results/embeddings/{model}")(c)},
          outputs=lambda c: {"rbf": "results/similarity/cka_rbf.h5", "timing": "results/similarity/cka_rbf.timing.json"},
          target="rbf", doc="RBF CKA over the subset."),
    Stage("stitch", deps=(FEATURE_MATRIX, "results/embeddings"), params=("similarity.subset", "similarity.stitch"),
          tracks=(Track("results/similarity/stitches.json"), Track("results/similarity/stitches.csv"),
                  Track("results/similarity/stitch.timing.json", kind="metrics")),
          inputs=lambda c: {"features": FEATURE_MATRIX, "embeddings": _per_model("results/embeddings/{model}")(c)},
          outputs=lambda c: {"stitches": "results/similarity/stitches.json", "csv": "results/similarity/stitches.csv",
                             "timing": "results/similarity/stitch.timing.json"},
          target="stitches", doc="Stitches over the subset."),
    Stage("agreement", deps=(FEATURE_MATRIX, "results/similarity/qre_pairwise.h5", "results/similarity/cka.h5",
                             "results/similarity/cka_rbf.h5", "results/similarity/stitches.json"),
          tracks=(Track("results/similarity/agreement.csv"),
                  Track("results/similarity/metrics.json", kind="metrics", cache=False),
                  Track("results/similarity/figures", kind="plots")),
          inputs=lambda c: {"features": FEATURE_MATRIX, "pairwise": "results/similarity/qre_pairwise.h5",
                            "cka": "results/similarity/cka.h5", "rbf": "results/similarity/cka_rbf.h5",
                            "stitches": "results/similarity/stitches.json"},
          outputs=lambda c: {"agreement": "results/similarity/agreement.csv",
                             "metrics": "results/similarity/metrics.json"} | similarity_figures(),
          target="metrics", doc="How the pair measures agree; heatmaps."),
    Stage("map", deps=(FEATURE_MATRIX, "results/similarity/qre_pairwise.h5", "results/regression/predictions.csv"),
          params=("map", "regress.predictor"),
          tracks=(Track("results/map/neighbours.csv"), Track("results/map/map.html"), Track(MAP_MODEL),
                  Track("results/map/metrics.json", kind="metrics", cache=False),
                  Track("results/map/timing.json", kind="metrics"),
                  Track("results/map/coords.csv", kind="plots", plot={"x": "x", "y": "y", "template": "scatter"}),
                  Track("results/map/figures", kind="plots")),
          inputs=lambda c: {"features": FEATURE_MATRIX, "pairwise": "results/similarity/qre_pairwise.h5",
                            # hover: measured and predicted scores
                            "predictions": "results/regression/predictions.csv"},
          outputs=lambda c: {"coords": "results/map/coords.csv", "neighbours": "results/map/neighbours.csv",
                             "html": "results/map/map.html", "model": MAP_MODEL,
                             "metrics": "results/map/metrics.json",
                             "timing": "results/map/timing.json"} | map_figures(c["map"]["fields"]),
          target="html", doc="The t-SNE map, neighbours, figures, the page and its faithfulness."),
    Stage("tasks", deps=(SENTENCES,), sources=_task_sources,
          params=("sentences.n", "evaluate.tasks", "evaluate.seed", "evaluate.supersense", "evaluate.gloss",
                  "evaluate.brown", "evaluate.polarity", "evaluate.data"),
          tracks=(Track("data/eval/tasks.json"),),
          inputs=lambda c: {"sentences": _sentences(c)},
          outputs=lambda c: {"tasks": "data/eval/tasks.json"}, target="tasks",
          doc="The offline tasks, once (probe sentences removed)."),
    Stage("evaluate", per_model=True, deps=("data/eval/tasks.json", SENTENCES),
          params=("models.{model} except meta", "sentences.n", "embed.degenerate", "embed.deterministic",
                  "embed.batch_tokens", "evaluate.seed",
                  "evaluate.classification", "evaluate.retrieval_k", "evaluate.device", "evaluate.mteb"),
          tracks=(Track("results/eval/{model}"),),
          inputs=lambda c: {"tasks": "data/eval/tasks.json", "sentences": _sentences(c)},
          outputs=lambda c: {"scores": "results/eval/{model}"}, directories=("scores",),
          doc="Per model: the downstream scores of every encoder."),
    Stage("regress", deps=(FEATURE_MATRIX, "results/similarity/qre_pairwise.h5", "results/eval"), sources=_regress_sources,
          params=("regress",),
          tracks=(Track("results/regression/table.csv"), Track("results/regression/scores.csv"),
                  Track(REGRESSORS), Track("results/regression/failures.json"),
                  Track("results/regression/mteb_scores.csv"), Track("results/regression/mteb_sources.json"),
                  Track("results/regression/metrics.json", kind="metrics", cache=False),
                  Track("results/regression/predictions.csv", kind="plots",
                        plot={"x": "actual", "y": "predicted", "template": "scatter"}),
                  Track("results/regression/figures", kind="plots")),
          inputs=lambda c: {"features": FEATURE_MATRIX, "evals": _per_model("results/eval/{model}")(c),
                            # the map's exact distances: the neighbours baseline
                            "pairwise": "results/similarity/qre_pairwise.h5",
                            "tables": [t["path"] for t in c["regress"]["score_tables"]],
                            # published MTEB scores read from a local copy of MTEB's results
                            "mteb": [r for r in [c["regress"]["mteb"]["results"]] if r not in (None, "remote")]},
          outputs=lambda c: {"metrics": "results/regression/metrics.json", "table": "results/regression/table.csv",
                             "predictions": "results/regression/predictions.csv",
                             "scores": "results/regression/scores.csv", "regressors": REGRESSORS,
                             # every model that failed (embed or evaluate, on_error: skip)
                             "failures": "results/regression/failures.json",
                             # published MTEB targets (regress.mteb), encoder,task,score, and their sources
                             "mteb_scores": "results/regression/mteb_scores.csv",
                             "mteb_sources": "results/regression/mteb_sources.json",
                             "figure_png": "results/regression/figures/predicted.png",
                             "figure_svg": "results/regression/figures/predicted.svg",
                             # Spearman of every feature set, per task
                             "baselines_png": "results/regression/figures/baselines.png",
                             "baselines_svg": "results/regression/figures/baselines.svg"},
          target="metrics", doc="Predicting every task's score from the features, against baselines."),
)}
#: DVC's bookkeeping stages (no Snakemake job): code digests and params slices.
CODE_STAGE, PARAMS_STAGE = "code", "params"
BOOKKEEPING = (CODE_STAGE, PARAMS_STAGE)


def stage(name: str) -> Stage:
    """The registry entry of stage ``name`` (an error naming the stages there are)."""
    if name not in STAGES:
        raise EncmapError(f"unknown stage {name!r}: stages are {', '.join(STAGES)} (per model: <stage>@<model>)")
    return STAGES[name]


@dataclass(frozen=True)
class StageJob:
    """What one DVC stage runs: Snakemake targets of one rule, after an optional prune."""

    stage: str
    rule: str
    targets: tuple[str, ...]
    prune: tuple[str, str] | None = None  # (layout kind, model id): drop files no encoder makes


def stage_job(name: str, params: dict, per_model: dict[tuple[str, str], list[str]] | None = None) -> StageJob:
    """The job of DVC stage ``name`` (``map``, ``embed@<model>``) under validated ``params``.

    Parameters
    ----------
    per_model : dict, optional
        ``(layout kind, model id) -> per-encoder targets`` when the caller has expanded every
        model's encoders already; else they are expanded here.
    """
    base, _, model = name.partition("@")
    st = stage(base)
    if st.per_model and model not in params["models"]:
        raise EncmapError(f"stage {name!r}: " + (f"no model {model!r} in params.yaml" if model else
                                                 f"a per-model stage: name it {base}@<model>"))
    if model and not st.per_model:
        raise EncmapError(f"stage {name!r}: {base!r} is no per-model stage")
    outputs = st.outputs(params)
    if base in LAYOUT:
        paths = per_model[base, model] if per_model is not None else artifact_paths(params["models"], base, [model])
        return StageJob(name, base, tuple(paths), (base, model))
    if st.per_model:
        return StageJob(name, base, tuple(v.format(model=model) for v in outputs.values()))
    return StageJob(name, base, (outputs[st.target or next(iter(outputs))],))


def all_targets(config: dict) -> list[str]:
    """Every artifact of every stage (``rule all``): a missing one is always made again."""
    out: list[str] = []
    for st in STAGES.values():
        if st.name in LAYOUT:
            out += artifact_paths(config["models"], st.name)
            continue
        for value in st.outputs(config).values():
            out += [value.format(model=m) for m in sorted(config["models"])] if st.per_model else [value]
    return list(dict.fromkeys(out))
