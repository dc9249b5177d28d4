"""Published MTEB scores: the one reader behind ``regress.mteb`` and ``encmap mteb-scores``.

MTEB's results repository (``embeddings-benchmark/results``; online through ``mteb.ResultCache``)
holds ``results/<org__model>/<revision>/<Task>.json``: one folder per revision a model was run
at (a pinned commit hash, ``external``, ``no_revision_available``), files written by every mteb
version since 0.0.2. Each file is parsed with mteb's own ``TaskResult.from_disk`` (which converts
the old formats); what is then scored and which folder is chosen is decided here, because
mteb's ``BenchmarkResults`` gets it wrong for real repositories (tests/test_mteb_results.py
shows each case on real files):

- **The score of a (model, task)** is the task's main score averaged over the task's evaluation
  splits (``task.eval_splits``: ``dev`` for MSMARCO; one split named by the user replaces them)
  and the subsets the benchmark uses (``en`` alone of AmazonCounterfactualClassification in
  ``MTEB(eng, v1)``; ``default`` of an aggregate task), as MTEB's leaderboard averages them.
  Every one of those subsets must be there exactly once with a finite main score in [-1, 1];
  otherwise the file is *left out* with its path and the reason (a missing or repeated subset,
  a 0-100 scale, a string, NaN, malformed JSON, a task name that is not its file's).
- **An old format's main score is derived where it is exact**: mteb 0.x pair-classification
  files give the AP of each similarity function (``cos_sim.ap``, ``manhattan.ap``, ...), and
  today's main score ``max_ap`` is their maximum (the model's own similarity is cosine or dot);
  with fewer than the four functions it is not derivable. Old reranking files give ``map``, the
  MAP of the old reranking evaluator, which is not today's ``map_at_1000``: left out, said so.
- **The folder a score comes from**: every revision folder holding a scorable file for the task
  is a candidate; the first by this rule is used: the pinned revision (the entry's
  ``meta.mteb_revision``, or the ``revision`` column of ``--models``; by default the registry's),
  then the registry's own revision, then files that state their mteb version before those that
  do not, named revisions before ``external`` / ``no_revision_available``, the newest mteb
  version, and the folder name. That is the priority of mteb's ``join_revisions`` (the
  leaderboard's) with the pinned revision first, except that mteb keeps its first candidate even
  when that file cannot be scored (the leaderboard shows a blank) and keeps one revision's
  tasks per model object (``model_results[0]`` lost the rest); here a scorable file of another
  folder is used, and every task is looked for in every folder.

A model or task without a usable file stays missing (never imputed): the reason is in the
sources report (:meth:`Published.report`), which the regress stage writes beside its table.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..validation import EncmapError

#: Prefix of published MTEB tasks among the regression's tasks.
PREFIX = "mteb:"
#: Revision folders that name no commit (mteb's join_revisions ranks them last).
UNPINNED = ("external", "no_revision_available")
#: Similarity functions whose AP the old pair-classification files give; max_ap is their maximum.
AP_FUNCTIONS = ("cosine_ap", "manhattan_ap", "euclidean_ap", "dot_ap")


def mteb_models(records: list[dict[str, Any]], bare_only: bool = False) -> dict[str, tuple[str, str | None]]:
    """``{encoder id: (MTEB name, revision)}`` for the output encoders of entries naming one.

    ``bare_only``: only models MTEB scored on bare texts (``meta.mteb_scored_with: none``; an
    entry that does not say is left out too): their published scores belong to the encoder of
    bare sentences the map shows.
    """
    out = {}
    for r in records:
        meta = r.get("meta") or {}
        if bare_only and meta.get("mteb_scored_with") != "none":
            continue
        if meta.get("mteb_name") and r["pooling"] == "output" and r["dim"] is None:
            out[r["id"]] = (meta["mteb_name"], meta.get("mteb_revision"))
    return out


def benchmark_tasks(benchmark: str | None, names: list[str]) -> list[Any]:
    """mteb task objects: the named tasks (every subset), else the benchmark's (its subsets)."""
    import mteb

    try:
        if names:
            return list(mteb.get_tasks(tasks=names))
        if not benchmark:
            raise EncmapError("regress.mteb: name a benchmark or tasks")
        return list(mteb.get_benchmark(benchmark).tasks)
    except (KeyError, ValueError) as e:
        raise EncmapError(f"regress.mteb: unknown MTEB benchmark or task ({e})") from None


def check_targets(mteb_params: dict[str, Any], where: str = "params") -> None:
    """Refuse ``regress.mteb`` values that would fail or be ignored later, before any job.

    With ``results`` set: a local results folder exists and looks like MTEB's results; the
    benchmark is one mteb knows (also when tasks are named, where it would be ignored); every
    task is known; a split is one of the selected tasks' evaluation splits. mteb's registry is
    installed, so nothing here needs the network. Nothing is checked when ``results`` is null.
    """
    results = mteb_params.get("results")
    if results is None:
        return
    key = f"{where}: key regress.mteb"
    if results != "remote":
        root = Path(results)
        if not root.exists():
            raise EncmapError(f"{key}.results: {root} does not exist (a local copy of MTEB's results repository, "
                              "or 'remote')")
        if not root.is_dir():
            raise EncmapError(f"{key}.results: {root} is a file, not MTEB's results repository (a folder)")
        try:
            results_folder(root)
        except EncmapError as e:
            raise EncmapError(f"{key}.results: {e}") from None
    import mteb

    bench = mteb_params.get("benchmark")
    if bench:
        try:
            with _quiet_mteb():
                chosen = list(mteb.get_benchmark(bench).tasks)
        except (KeyError, ValueError) as e:
            raise EncmapError(f"{key}.benchmark: unknown MTEB benchmark {bench!r} ({str(e).strip(chr(34))})") from None
    names = list(mteb_params.get("tasks") or [])
    if names:
        chosen = []
        for name in names:
            try:
                with _quiet_mteb():
                    chosen += list(mteb.get_tasks(tasks=[name]))
            except (KeyError, ValueError):
                raise EncmapError(f"{key}.tasks: unknown MTEB task {name!r}") from None
    elif not bench:
        raise EncmapError(f"{key}: name a benchmark or tasks")
    split = mteb_params.get("split")
    if split:
        splits = sorted({sp for t in chosen for sp in t.eval_splits})
        if split not in splits:
            raise EncmapError(f"{key}.split: {split!r} is not an evaluation split of any selected task (they use "
                              f"{', '.join(splits)}); null reads each task's own")


def results_folder(results: str | Path) -> Path:
    """The folder holding ``<org__model>/<revision>/`` folders: ``<results>/results`` (MTEB's
    repository, as cloned) or ``<results>`` itself."""
    root = Path(results)
    if (root / "results").is_dir():
        return root / "results"
    if root.is_dir() and any(p.is_dir() and "__" in p.name for p in root.iterdir()):
        return root
    raise EncmapError(f"MTEB results {root}: no 'results' folder in it and no <org__model> folders (expected "
                      "MTEB's results repository: results/<org__model>/<revision>/<Task>.json)")


@dataclass
class Unscorable(Exception):
    """A result file that gives no score for its task, and why."""

    reason: str


@dataclass
class Candidate:
    """One revision folder's file for one task."""

    folder: str
    path: Path
    score: float | None = None
    mteb_version: Any = None  # packaging Version, or None where the file does not say
    reason: str | None = None


@dataclass
class ModelSources:
    """Where one encoder's published scores come from."""

    encoder: str
    mteb_model: str
    revision: str | None
    folders: dict[str, int] = field(default_factory=dict)  # revision folder -> task files in it
    scored: dict[str, str] = field(default_factory=dict)  # task -> folder used
    missing: dict[str, str] = field(default_factory=dict)  # task -> why no score
    left_out: list[dict[str, str]] = field(default_factory=list)  # {path, reason} of unscorable files

    def to_dict(self) -> dict[str, Any]:
        return {"encoder": self.encoder, "mteb_model": self.mteb_model, "revision": self.revision,
                "folders": self.folders, "tasks_scored": len(self.scored), "tasks_missing": len(self.missing),
                "scored": self.scored, "missing": self.missing, "left_out": self.left_out}


@dataclass
class Published:
    """Published scores of the mapped encoders and where each comes from.

    Attributes
    ----------
    scores : {encoder: {task name: score}}
    tasks : the task names asked for, sorted
    sources : {encoder: ModelSources}
    split : the split named by the user, or None (each task's evaluation splits)
    """

    scores: dict[str, dict[str, float]]
    tasks: list[str]
    sources: dict[str, ModelSources]
    split: str | None

    def rows(self) -> list[dict[str, Any]]:
        """``{encoder, task, score}`` rows, by encoder then task."""
        return [{"encoder": e, "task": t, "score": s} for e in sorted(self.scores)
                for t, s in sorted(self.scores[e].items())]

    def counts(self) -> dict[str, Any]:
        """Models with a score, models complete on the tasks, pairs scored, files left out, by reason."""
        per_task = {t: sum(t in s for s in self.scores.values()) for t in self.tasks}
        reasons = Counter(_reason_kind(r["reason"]) for s in self.sources.values() for r in s.left_out)
        return {"models": len(self.sources), "models_with_a_score": sum(bool(s) for s in self.scores.values()),
                "models_complete": sum(len(s) == len(self.tasks) for s in self.scores.values()),
                "scores": sum(len(s) for s in self.scores.values()), "tasks": len(self.tasks),
                "per_task": per_task, "files_left_out": sum(reasons.values()), "left_out_by_reason": dict(reasons),
                "missing_by_reason": dict(Counter(_reason_kind(r) for s in self.sources.values()
                                                  for r in s.missing.values()))}

    def report(self) -> dict[str, Any]:
        """The sources report: counts, then per encoder its folders, tasks scored, tasks missing and why."""
        return {"split": self.split or "each task's evaluation splits", "counts": self.counts(),
                "models": [self.sources[e].to_dict() for e in sorted(self.sources)]}

    def summary(self) -> str:
        """One line for the log."""
        c = self.counts()
        line = (f"published MTEB scores: {c['scores']} (model, task) scores for {c['models_with_a_score']} of "
                f"{c['models']} models ({c['models_complete']} complete on {c['tasks']} tasks)")
        if c["files_left_out"]:
            line += f"; {c['files_left_out']} files left out: " + ", ".join(
                f"{n} {k}" for k, n in sorted(c["left_out_by_reason"].items(), key=lambda kv: -kv[1]))
        return line + " (sources report: per model, its folders and every reason)"


def _reason_kind(reason: str) -> str:
    """The kind of a reason (its text before the first colon): what the counts group by."""
    return reason.split(":", 1)[0]


@contextlib.contextmanager
def _quiet_mteb() -> Iterator[None]:
    """mteb logs each problem once per task name and warns for many it can live with: the
    reasons are reported here, per file, instead."""
    log = logging.getLogger("mteb")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _derived_main_score(subset: dict[str, Any], main: str, path: Path) -> float:
    """The main score an old-format subset gives exactly, else :class:`Unscorable` saying why."""
    if main == "max_ap":
        aps = [_number(subset.get(k)) for k in AP_FUNCTIONS]
        if all(a is not None for a in aps):
            return max(aps)  # type: ignore[type-var]
        have = [k for k, a in zip(AP_FUNCTIONS, aps) if a is not None]
        raise Unscorable(f"main score not derivable: max_ap is the best AP over {', '.join(AP_FUNCTIONS)}; "
                         f"the file gives {', '.join(have) or 'none of them'}")
    if main.endswith("map_at_1000") and "map" in subset:
        raise Unscorable(f"main score not derivable: {main} (mteb >= 2 reranking, MAP over the top 1,000) is not "
                         "the old reranking evaluator's 'map' this file gives")
    keys = sorted(k for k in subset if k not in ("hf_subset", "languages", "main_score", "mteb_version"))
    raise Unscorable(f"main score not derivable: {main} is not in the file (it gives {', '.join(keys[:8])}"
                     + (", ..." if len(keys) > 8 else "") + ")")


def _raw(path: Path) -> dict[str, Any]:
    """The file's JSON object, or Unscorable naming what is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise Unscorable(f"malformed file: not UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise Unscorable(f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise Unscorable("malformed JSON: nested deeper than a result file can be") from None
    if not isinstance(data, dict):
        raise Unscorable(f"not an MTEB result: a JSON {type(data).__name__}, not an object")
    return data


def score_file(path: Path, task: Any, split: str | None = None) -> tuple[float, Any]:
    """The score one result file gives for ``task`` (an mteb task object) and the file's mteb version.

    Parameters
    ----------
    path : the result file (``<Task>.json``)
    task : the task as the benchmark uses it (its ``eval_splits`` and ``hf_subsets``)
    split : one split to read instead of the task's evaluation splits

    Returns
    -------
    (score, mteb_version) : the mean main score over the splits and the benchmark's subsets

    Raises
    ------
    Unscorable
        With the reason, whatever is wrong with the file.
    """
    from mteb.results import TaskResult
    from mteb.results.task_result import renamed_tasks

    name = task.metadata.name
    data = _raw(path)
    stated = data.get("task_name", data.get("mteb_dataset_name"))
    if stated is not None and renamed_tasks.get(stated, stated) != name:
        raise Unscorable(f"task name mismatch: the file says task_name {stated!r}, its file name says {name!r}")
    try:
        with _quiet_mteb():
            tr = TaskResult.from_disk(path)
    except RecursionError:
        raise Unscorable("malformed JSON: nested deeper than a result file can be") from None
    except Exception as e:  # mteb raises what pydantic and its converters raise; each is this file's fault
        raise Unscorable(f"not an MTEB result mteb can read: {type(e).__name__}: {str(e).splitlines()[0][:200]}") \
            from None
    splits = [split] if split else list(task.eval_splits)
    want = ["default"] if task.is_aggregate else sorted(task.hf_subsets)
    main = task.metadata.main_score
    values = []
    for sp in splits:
        if sp not in tr.scores:
            raise Unscorable(f"split missing: no {sp!r} split (the file has {sorted(tr.scores)})")
        entries = tr.scores[sp]
        seen = Counter(e.get("hf_subset") for e in entries if isinstance(e, dict))
        twice = [s for s in want if seen[s] > 1]
        if twice:
            raise Unscorable(f"repeated subset: hf_subset {twice[0]!r} appears {seen[twice[0]]} times in split {sp!r}")
        lacking = [s for s in want if not seen[s]]
        if lacking:
            raise Unscorable(f"subset missing: split {sp!r} has no hf_subset {', '.join(map(repr, lacking))}")
        for entry in entries:
            if entry.get("hf_subset") not in want:
                continue
            raw = entry.get("main_score")
            v = _derived_main_score(entry, main, path) if raw is None else _number(raw)
            if v is None:
                raise Unscorable(f"not a number: main_score {raw!r} of subset {entry['hf_subset']!r}, split {sp!r}")
            if not math.isfinite(v):
                raise Unscorable(f"not finite: main_score {v} of subset {entry['hf_subset']!r}, split {sp!r}")
            if not -1.0 <= v <= 1.0:
                raise Unscorable(f"out of range: main_score {v} of subset {entry['hf_subset']!r}, split {sp!r} is "
                                 f"outside [-1, 1] (a 0-100 scale?); every MTEB main score ({main}) is a fraction")
            values.append(v)
    return sum(values) / len(values), TaskResult._parse_mteb_version_min(tr.mteb_version)


def rank(cands: list[Candidate], pinned: str | None, main_revision: str | None) -> list[Candidate]:
    """Scorable candidates in the order of preference (module docstring): the first is used."""
    from packaging.version import Version

    ok = sorted((c for c in cands if c.score is not None), key=lambda c: c.folder)
    ok.sort(key=lambda c: c.mteb_version or Version("0"), reverse=True)  # newest mteb first (stable)
    ok.sort(key=lambda c: (c.folder != pinned, c.folder != main_revision, c.mteb_version is None,
                           c.folder in UNPINNED))
    return ok


@functools.lru_cache(maxsize=1)
def registry_revisions() -> dict[str, str | None]:
    """The revision mteb's registry pins for each model it knows, by name."""
    import mteb

    with _quiet_mteb():
        return {m.name: m.revision for m in mteb.get_model_metas()}


def read_model(folder: Path, encoder: str, name: str, revision: str | None, tasks: list[Any],
               split: str | None) -> tuple[dict[str, float], ModelSources]:
    """One model's scores ``{task: score}`` and their sources, from its folder of revision folders."""
    main_revision = registry_revisions().get(name)
    pinned = revision or main_revision
    src = ModelSources(encoder, name, pinned)
    mdir = model_folder(folder, name)
    revs = sorted(p for p in mdir.iterdir() if p.is_dir()) if mdir.is_dir() else []
    if not revs:
        src.missing = {t.metadata.name: "no results: no revision folder for this model" for t in tasks}
        return {}, src
    names = {t.metadata.name for t in tasks}
    src.folders = {r.name: sum(1 for f in r.glob("*.json") if f.stem in names) for r in revs}
    scores: dict[str, float] = {}
    for task in tasks:
        t = task.metadata.name
        cands = []
        for r in revs:
            path = r / f"{t}.json"
            if not path.is_file():
                continue
            c = Candidate(r.name, path)
            try:
                c.score, c.mteb_version = score_file(path, task, split)
            except Unscorable as e:
                c.reason = e.reason
                src.left_out.append({"path": str(path), "reason": e.reason})
            cands.append(c)
        best = rank(cands, pinned, main_revision)
        if best:
            scores[t] = best[0].score  # type: ignore[assignment]
            src.scored[t] = best[0].folder
        elif cands:
            src.missing[t] = "every file left out: " + "; ".join(f"{c.folder}: {c.reason}" for c in cands)
        else:
            src.missing[t] = "no result file: in none of the revision folders"
    return scores, src


def model_folder(folder: Path, name: str) -> Path:
    """A model's folder of revision folders in a results folder (``org/name`` -> ``org__name``)."""
    return folder / name.replace("/", "__").replace(" ", "_")


def model_metas(results: str | Path, names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """What each revision folder's ``model_meta.json`` says of each model: ``{name: [{source,
    embed_dim, n_parameters}, ...]}`` (a malformed file is skipped: it is not a score)."""
    folder = results_folder(results)
    out: dict[str, list[dict[str, Any]]] = {}
    for name in names:
        for f in sorted(model_folder(folder, name).glob("*/model_meta.json")):
            try:
                meta = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError, RecursionError):
                continue
            if isinstance(meta, dict):
                out.setdefault(name, []).append({"source": str(f.relative_to(folder.parent)),
                                                 "embed_dim": meta.get("embed_dim"),
                                                 "n_parameters": meta.get("n_parameters")})
    return out


def published_scores(models: dict[str, tuple[str, str | None]], *, results: str | Path, benchmark: str | None,
                     tasks: list[str], split: str | None) -> Published:
    """Published scores of ``models`` (``{encoder: (MTEB name, revision or None)}``).

    ``results``: ``remote`` (MTEB's results repository, cloned or updated through mteb's
    ``ResultCache``) or a local copy of it (:func:`results_folder`). ``benchmark`` / ``tasks``:
    the tasks (named tasks take every subset). ``split``: one split for every task, or None for
    each task's own evaluation splits.
    """
    task_objs = benchmark_tasks(benchmark, tasks)
    names = sorted(t.metadata.name for t in task_objs)
    if results == "remote":
        import mteb

        cache = mteb.ResultCache()
        cache.download_from_remote()
        folder = cache.remote_repo_path / "results"
    else:
        folder = results_folder(results)
    scores, sources = {}, {}
    for enc, (name, revision) in sorted(models.items()):
        scores[enc], sources[enc] = read_model(folder, enc, name, revision, task_objs, split)
    return Published(scores, names, sources, split)
