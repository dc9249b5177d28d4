"""Where the workflow's artifacts live: per-encoder paths, the run's files, figure names.

Every per-encoder path follows from params.yaml alone (:func:`encmap.encoders.variants.expand_encoders`),
so Snakemake knows the whole DAG before any job runs and ``encmap stage`` can name a model's files
for DVC. The stage registry (:mod:`encmap.workflow.stages`) builds every stage's files from these.
"""

from __future__ import annotations

from pathlib import Path

from ..validation import EncmapError

#: Per-encoder artifacts (Snakemake outputs of rules pip and features): one file per encoder
#: inside a directory per model, which is what DVC tracks.
LAYOUT = {
    "pip": "results/pip/{model}/{encoder}.h5",
    "features": "results/features/encoders/{model}/{encoder}.h5",
}
#: Where the sentence set of ``sentences.set`` lives (``{set}``) and the run's other files a
#: command outside the pipeline reads (``encmap place``).
SENTENCES = "data/sentences/{set}.txt"
FEATURE_MATRIX = "results/features/qre.h5"
MAP_MODEL = "results/map/model.h5"
REGRESSORS = "results/regression/regressors.h5"
#: Where ``encmap place`` writes a placed model's files (``{model}``): outside what DVC tracks.
PLACED = "results/place/{model}"
#: Heatmaps of the agreement step (``results/similarity/figures/<name>.png|svg``).
HEATMAPS = ("cka_linear", "cka_rbf", "stitch_r2")


def map_figures(fields: list[str]) -> dict[str, str]:
    """Static figures of the map stage, by output name (``png_<field>``, ``svg_<field>``)."""
    return {f"{ext}_{f}": f"results/map/figures/map_{f}.{ext}" for f in fields for ext in ("png", "svg")}


def similarity_figures() -> dict[str, str]:
    """Heatmaps of the agreement step, by output name (``png_<name>``, ``svg_<name>``)."""
    return {f"{ext}_{h}": f"results/similarity/figures/{h}.{ext}" for h in HEATMAPS for ext in ("png", "svg")}


def artifact_paths(models: dict[str, dict], stage: str, only: list[str] | None = None) -> list[str]:
    """Per-encoder artifact paths of ``stage`` (a key of :data:`LAYOUT`), sorted by encoder id.

    ``only``: restrict to these model ids (unknown ids are an error naming them).
    """
    from ..encoders.variants import expand_encoders

    unknown = sorted(set(only or ()) - set(models))
    if unknown:
        raise EncmapError(f"unknown model {unknown[0]!r}; params have {sorted(models)}")
    keep = set(only or models)
    return [LAYOUT[stage].format(model=v.model, encoder=e)
            for e, v in sorted(expand_encoders(models).items()) if v.model in keep]


def stale_files(models: dict[str, dict], stage: str, model: str, root: str | Path = ".",
                paths: list[str] | None = None) -> list[Path]:
    """Per-encoder files of ``stage`` in ``model``'s directory that no encoder of params makes.

    What a dropped variant (a layer, a truncation taken out of params) leaves behind in a
    directory that Snakemake fills one file per encoder and DVC keeps between runs (persist).
    ``paths``: the model's artifact paths of ``stage`` when the caller has them already (encmap
    repro prunes thousands of models from one expansion of the encoders).
    """
    keep = {Path(p).name for p in (artifact_paths(models, stage, [model]) if paths is None else paths)}
    folder = Path(root) / Path(LAYOUT[stage].format(model=model, encoder="x")).parent
    return sorted(f for f in folder.glob("*.h5") if f.name not in keep) if folder.is_dir() else []
