"""Offline evaluation tasks from data that ships in installed packages (I/O module).

Every task is built once, as plain lists (texts, labels, folds, pairs, relevance), into one JSON
file that every model's ``evaluate`` job reads, so all encoders are scored on identical items.
Items whose text is one of the curated probe sentences (exact, or equal after
:func:`encmap.corpus.cleaning.normalise_key`) are removed first and counted: an encoder must never be
scored on a sentence its map position was computed from.

=================  ===============================================  ==============  ==========
task               data                                             kind            main score
=================  ===============================================  ==============  ==========
supersense         WordNet example sentences, label = the synset's  classification  accuracy
                   lexicographer file (45 supersenses)
gloss-retrieval    queries = WordNet definitions, corpus = example  retrieval       ndcg_at_10
                   sentences, relevant = the same synset's
brown-genre        Brown corpus sentences, 15 genres                classification  accuracy
lee                gensim lee.cor, 50 documents, human similarity   similarity      spearman
polarity           gensim pang_lee_polarity.cor, 200 sentences      classification  accuracy
wordsim353         gensim wordsim353.tsv, each word a text          similarity      spearman
simlex999          gensim simlex999.txt, each word a text           similarity      spearman
=================  ===============================================  ==============  ==========
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..artifacts.tasks import task_texts
from ..corpus.brown import read_brown
from ..corpus.candidates import INSTALL_HINT
from ..corpus.cleaning import clean, normalise_key
from ..corpus.wordnet import as_sentence, wordnet_synsets
from ..io import file_sha256, gensim_test_data, read_utf8_or_cp1252
from ..sampling import sample_rows
from ..validation import EncmapError

#: The 45 lexicographer files of WordNet 3.x by number (lexnames(5WN)).
LEXNAMES = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body "
    "noun.cognition noun.communication noun.event noun.feeling noun.food noun.group noun.location "
    "noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession noun.process "
    "noun.quantity noun.relation noun.shape noun.state noun.substance noun.time verb.body verb.change "
    "verb.cognition verb.communication verb.competition verb.consumption verb.contact verb.creation "
    "verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative verb.weather adj.ppl"
).split()

#: Files of gensim's test data that the tasks read.
GENSIM_FILES = ("lee.cor", "similarities0-1.txt", "pang_lee_polarity.cor", "wordsim353.tsv", "simlex999.txt")


class ProbeFilter:
    """Tells whether a text is one of the probe sentences, exactly or after normalisation."""

    def __init__(self, probes: list[str]):
        self.exact = set(probes)
        self.norm = {normalise_key(p) for p in probes}

    def match(self, text: str) -> str | None:
        """``"exact"``, ``"normalised"`` or None."""
        if text in self.exact:
            return "exact"
        if normalise_key(text) in self.norm:
            return "normalised"
        return None

    def split(self, texts: list[str]) -> tuple[np.ndarray, dict[str, int]]:
        """Boolean mask (len(texts),) of texts to keep, and how many were removed per kind."""
        kinds = [self.match(t) for t in texts]
        removed = {"exact": sum(k == "exact" for k in kinds), "normalised": sum(k == "normalised" for k in kinds)}
        return np.array([k is None for k in kinds], dtype=bool), removed


def gensim_data_dir(path: str | None) -> Path:
    """gensim's bundled ``test/test_data`` directory (or ``path``), checked to hold the task files."""
    root = Path(path) if path else gensim_test_data("evaluation data")
    missing = [f for f in GENSIM_FILES if not (root / f).is_file()]
    if missing:
        raise EncmapError(f"evaluation data: {root / missing[0]} not found; install: {INSTALL_HINT['gensim-wiki']}")
    return root


@lru_cache(maxsize=2)
def _synsets(path: str) -> tuple:
    """WordNet's synsets, read once for the two WordNet tasks."""
    return tuple(wordnet_synsets("wordnet", path))


def _split_folds(labels: list[str], test: float, seed: int, task: str) -> list[int]:
    """Stratified train (0) / test (1) assignment."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(labels))
    try:
        _, te = train_test_split(idx, test_size=test, random_state=seed, stratify=labels)
    except ValueError as e:
        raise EncmapError(f"task {task!r}: cannot split {len(labels)} items stratified by label ({e})") from None
    folds = np.zeros(len(labels), dtype=int)
    folds[te] = 1
    return folds.tolist()


def _drop_rare(texts: list[str], labels: list[str], min_per_class: int) -> tuple[list[str], list[str], list[str]]:
    counts: dict[str, int] = {}
    for y in labels:
        counts[y] = counts.get(y, 0) + 1
    rare = sorted(y for y, c in counts.items() if c < min_per_class)
    keep = [i for i, y in enumerate(labels) if counts[y] >= min_per_class]
    return [texts[i] for i in keep], [labels[i] for i in keep], rare


def _classification(texts: list[str], labels: list[str], folds: list[int], test_folds: list[int],
                    removed: dict[str, int], pool: int, **extra: Any) -> dict[str, Any]:
    return {"type": "classification", "main_score": "accuracy", "texts": texts, "labels": labels, "folds": folds,
            "test_folds": test_folds, "classes": sorted(set(labels)), "removed": removed, "pool": pool} | extra


def _unique_labelled(pairs: list[tuple[str, str]]) -> tuple[list[str], list[str], int]:
    """Texts with one label each: a text seen with two different labels is dropped (ambiguous)."""
    label: dict[str, str | None] = {}
    for t, y in pairs:
        label[t] = y if label.get(t, y) == y else None
    texts = [t for t, y in label.items() if y is not None]
    return texts, [label[t] for t in texts], sum(y is None for y in label.values())


def supersense(p: dict, probes: ProbeFilter, seed: int, wordnet: str) -> dict[str, Any]:
    """WordNet example sentences labelled by their synset's lexicographer file."""
    pairs = [(clean(as_sentence(ex)), LEXNAMES[s.lexfile]) for s in _synsets(wordnet) for ex in s.examples]
    texts, labels, ambiguous = _unique_labelled(pairs)
    keep, removed = probes.split(texts)
    texts = [t for t, k in zip(texts, keep) if k]
    labels = [y for y, k in zip(labels, keep) if k]
    pool = len(texts)
    # Up to max_per_class items of each supersense: adj.all alone holds 37% of WordNet's examples.
    rng = np.random.default_rng(seed)
    idx = np.sort(np.concatenate([
        members[sample_rows(len(members), p["max_per_class"], rng)]
        for y in sorted(set(labels)) for members in [np.flatnonzero(np.array(labels) == y)]]))
    texts, labels, rare = _drop_rare([texts[i] for i in idx], [labels[i] for i in idx], p["min_per_class"])
    return _classification(texts, labels, _split_folds(labels, p["test"], seed, "supersense"), [1], removed, pool,
                           ambiguous_dropped=ambiguous, rare_classes_dropped=rare)


def brown_genre(p: dict, probes: ProbeFilter, seed: int, brown: str) -> dict[str, Any]:
    """Brown corpus sentences labelled by genre."""
    pairs = []
    for c in read_brown("brown", brown):
        t = clean(c.text)
        if p["min_words"] <= len(t.split()) <= p["max_words"]:
            pairs.append((t, c.genre))
    texts, labels, ambiguous = _unique_labelled(pairs)
    keep, removed = probes.split(texts)
    texts = [t for t, k in zip(texts, keep) if k]
    labels = [y for y, k in zip(labels, keep) if k]
    pool = len(texts)
    idx = sample_rows(pool, p["max_items"], np.random.default_rng(seed))
    texts, labels, rare = _drop_rare([texts[i] for i in idx], [labels[i] for i in idx], p["min_per_class"])
    return _classification(texts, labels, _split_folds(labels, p["test"], seed, "brown-genre"), [1], removed, pool,
                           ambiguous_dropped=ambiguous, rare_classes_dropped=rare)


def polarity(p: dict, probes: ProbeFilter, seed: int, gensim_dir: Path) -> dict[str, Any]:
    """gensim's 200 labelled movie-review sentences (``__label__pos|neg text``), stratified K-fold."""
    from sklearn.model_selection import StratifiedKFold

    f = gensim_dir / "pang_lee_polarity.cor"
    pairs = []
    for i, line in enumerate(read_utf8_or_cp1252(f).splitlines(), start=1):
        if not line.strip():
            continue
        head, _, text = line.strip().partition(" ")
        if not head.startswith("__label__") or not text:
            raise EncmapError(f"task 'polarity': {f} line {i}: expected '__label__<class> <text>'")
        pairs.append((text.strip(), head[len("__label__"):]))
    texts, labels, ambiguous = _unique_labelled(pairs)
    keep, removed = probes.split(texts)
    texts = [t for t, k in zip(texts, keep) if k]
    labels = [y for y, k in zip(labels, keep) if k]
    folds = np.zeros(len(texts), dtype=int)
    cv = StratifiedKFold(n_splits=p["folds"], shuffle=True, random_state=seed)
    for k, (_, te) in enumerate(cv.split(np.zeros(len(labels)), labels)):
        folds[te] = k
    return _classification(texts, labels, folds.tolist(), list(range(p["folds"])), removed, len(texts),
                           ambiguous_dropped=ambiguous)


def gloss_retrieval(p: dict, probes: ProbeFilter, seed: int, wordnet: str) -> dict[str, Any]:
    """Queries = definitions, corpus = example sentences; relevant = the examples of the same synset.

    ``distractors`` further examples of other synsets join the corpus so that ranking is not
    only among the sampled synsets' own examples.
    """
    syns = [(clean(s.definition), [clean(as_sentence(ex)) for ex in s.examples])
            for s in _synsets(wordnet) if s.examples and s.definition]
    defs = [d for d, _ in syns]
    counts: dict[str, int] = {}
    for d in defs:
        counts[d] = counts.get(d, 0) + 1
    keep_def, removed_q = probes.split(defs)
    all_examples = sorted({e for _, exs in syns for e in exs})
    keep_ex, removed_c = probes.split(all_examples)
    ok_ex = {e for e, k in zip(all_examples, keep_ex) if k}
    # A definition shared by two synsets would make relevance ambiguous: leave those out.
    cand = [(d, [e for e in exs if e in ok_ex]) for (d, exs), k in zip(syns, keep_def) if k and counts[d] == 1]
    cand = [(d, exs) for d, exs in cand if exs]
    rng = np.random.default_rng(seed)
    chosen = [cand[i] for i in sample_rows(len(cand), p["max_queries"], rng)]
    relevant_texts = sorted({e for _, exs in chosen for e in exs})
    others = sorted(ok_ex - set(relevant_texts))
    distract = [others[i] for i in sample_rows(len(others), p["distractors"], rng)]
    corpus = sorted(set(relevant_texts) | set(distract))
    pos = {t: i for i, t in enumerate(corpus)}
    return {"type": "retrieval", "main_score": "ndcg_at_10", "queries": [d for d, _ in chosen], "corpus": corpus,
            "relevant": [sorted(pos[e] for e in exs) for _, exs in chosen],
            "removed": {"queries": removed_q, "corpus": removed_c}, "pool": len(cand)}


def _pairs_task(texts: list[str], pairs: list[tuple[int, int]], human: list[float], probes: ProbeFilter,
                **extra: Any) -> dict[str, Any]:
    """A similarity task; pairs that touch a probe sentence are removed."""
    keep, removed = probes.split(texts)
    kept = [(i, j, h) for (i, j), h in zip(pairs, human) if keep[i] and keep[j]]
    return {"type": "similarity", "main_score": "spearman", "texts": texts, "pairs": [[i, j] for i, j, _ in kept],
            "human": [h for _, _, h in kept], "removed": removed | {"pairs": len(pairs) - len(kept)}} | extra


def lee(p: dict, probes: ProbeFilter, seed: int, gensim_dir: Path) -> dict[str, Any]:
    """Lee et al. (2005): 50 news documents, mean human similarity of every two (upper triangle)."""
    docs = [line.strip() for line in read_utf8_or_cp1252(gensim_dir / "lee.cor").splitlines() if line.strip()]
    f = gensim_dir / "similarities0-1.txt"
    sim = np.loadtxt(f)
    if sim.shape != (len(docs), len(docs)):
        raise EncmapError(f"task 'lee': {f} is {sim.shape}, expected {len(docs)} x {len(docs)} (one row per document)")
    iu = np.triu_indices(len(docs), k=1)
    return _pairs_task(docs, list(zip(iu[0].tolist(), iu[1].tolist())), sim[iu].tolist(), probes)


def word_pairs(file: str) -> Callable[..., dict[str, Any]]:
    """A word-similarity task from a gensim ``word1<TAB>word2<TAB>score`` file."""

    def build(p: dict, probes: ProbeFilter, seed: int, gensim_dir: Path) -> dict[str, Any]:
        f = gensim_dir / file
        rows = []
        for i, line in enumerate(read_utf8_or_cp1252(f).splitlines(), start=1):
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split("\t")
            try:
                rows.append((parts[0].strip().lower(), parts[1].strip().lower(), float(parts[2])))
            except (IndexError, ValueError):
                raise EncmapError(f"{f} line {i}: expected 'word1<TAB>word2<TAB>score', got {line!r}") from None
        words = sorted({w for a, b, _ in rows for w in (a, b)})
        pos = {w: i for i, w in enumerate(words)}
        return _pairs_task(words, [(pos[a], pos[b]) for a, b, _ in rows], [h for _, _, h in rows], probes)

    return build


#: Task name -> (builder, data it reads: "wordnet" | "brown" | "gensim").
TASKS: dict[str, tuple[Callable[..., dict[str, Any]], str]] = {
    "supersense": (supersense, "wordnet"),
    "gloss-retrieval": (gloss_retrieval, "wordnet"),
    "brown-genre": (brown_genre, "brown"),
    "lee": (lee, "gensim"),
    "polarity": (polarity, "gensim"),
    "wordsim353": (word_pairs("wordsim353.tsv"), "gensim"),
    "simlex999": (word_pairs("simlex999.txt"), "gensim"),
}

#: params.yaml key under ``evaluate`` holding each task's own settings (tasks without one have none).
TASK_PARAMS = {"supersense": "supersense", "gloss-retrieval": "gloss", "brown-genre": "brown", "polarity": "polarity"}


def build_tasks(evaluate: dict[str, Any], probes: list[str]) -> dict[str, Any]:
    """Every task ``evaluate['tasks']`` names, with probe sentences removed.

    Parameters
    ----------
    evaluate : dict
        The ``evaluate`` section of params.yaml (tasks, seed, per-task settings, data paths).
    probes : list of str
        The curated sentence set.

    Returns
    -------
    dict
        ``{"tasks": {name: task}, "sources": {file label: sha256}}``; each task is a JSON-ready dict
        (see :func:`supersense`, :func:`gloss_retrieval`, :func:`lee` for the three kinds).
    """
    unknown = [t for t in evaluate["tasks"] if t not in TASKS]
    if unknown:
        raise EncmapError(f"evaluate.tasks: unknown task {unknown[0]!r} (known: {sorted(TASKS)})")
    paths = evaluate["data"]
    needs = {TASKS[t][1] for t in evaluate["tasks"]}
    where: dict[str, Any] = {"wordnet": paths["wordnet"], "brown": paths["brown"]}
    sources: dict[str, str] = {}
    if "gensim" in needs:
        where["gensim"] = gensim_data_dir(paths["gensim"])
        sources |= {f"gensim:{f}": file_sha256(where["gensim"] / f) for f in GENSIM_FILES}
    if "wordnet" in needs:
        sources |= {f"wordnet:data.{p}": file_sha256(Path(paths["wordnet"]) / f"data.{p}")
                    for p in ("noun", "verb", "adj", "adv") if (Path(paths["wordnet"]) / f"data.{p}").is_file()}
    filt = ProbeFilter(probes)
    tasks = {}
    for name in evaluate["tasks"]:
        builder, data = TASKS[name]
        own = evaluate.get(TASK_PARAMS.get(name, ""), {})
        task = builder(own, filt, evaluate["seed"], where[data])
        n = len(task_texts(task))
        if n == 0 or (task["type"] == "similarity" and len(task["pairs"]) < 3):
            raise EncmapError(f"task {name!r}: nothing left to evaluate after removing probe sentences ({task['removed']})")
        tasks[name] = task
    return {"tasks": tasks, "sources": sources}
