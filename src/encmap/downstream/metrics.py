"""Downstream scores of one encoder's embeddings on the tasks of :mod:`encmap.downstream.tasks` (pure maths).

The metrics follow MTEB's definitions so the scores read like MTEB's:

- classification: logistic regression (scikit-learn, ``max_iter`` 100) fitted on the
  embeddings of the training items, scored on the test items; MTEB's protocol of
  ``n_experiments`` seeded undersamples of at most ``samples_per_label`` training items per
  label, averaged; main score accuracy (macro-F1 beside it);
- retrieval: cosine ranking of the corpus for each query; main score nDCG@10 with binary
  relevance (scikit-learn's ``ndcg_score``), MRR@10 beside it;
- similarity: cosine of the two texts of each pair against the human score; main score
  Spearman (Pearson beside it).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..validation import EncmapError


def unit_rows(X: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (n, d); all-zero rows stay zero (their cosine with anything is 0)."""
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return np.divide(X, norms, out=np.zeros_like(X), where=norms > 0)


def undersample(labels: np.ndarray, idx: np.ndarray, per_label: int, rng: np.random.Generator) -> np.ndarray:
    """At most ``per_label`` of the indices ``idx`` of each label, drawn with ``rng`` (sorted)."""
    keep = []
    for y in np.unique(labels[idx]):
        members = idx[labels[idx] == y]
        keep.append(members if len(members) <= per_label else rng.choice(members, per_label, replace=False))
    return np.sort(np.concatenate(keep))


def classification_scores(X: np.ndarray, labels: list[str] | np.ndarray, folds: list[int] | np.ndarray,
                          test_folds: list[int], *, n_experiments: int, samples_per_label: int, max_iter: int,
                          random_state: int) -> dict[str, float]:
    """Accuracy and macro-F1 of logistic regression on embeddings, MTEB's protocol.

    Parameters
    ----------
    X : ndarray, shape (n, d)
        Embeddings of the n items.
    labels : sequence of n labels
    folds : sequence of n ints
        Fold of each item; for each fold ``f`` in ``test_folds`` the items of fold ``f`` are
        the test set and all others the training set (a fixed split is folds 0 / 1 with
        ``test_folds=[1]``; K-fold cross-validation is folds 0..K-1, all of them test folds).
    n_experiments, samples_per_label : int
        Per test fold, ``n_experiments`` classifiers, each trained on a seeded undersample of at
        most ``samples_per_label`` training items per label. When no label has more than that,
        every undersample is the whole training set and one fit stands for all.
    max_iter : int
        Iterations of the lbfgs solver (MTEB: 100).
    random_state : int

    Returns
    -------
    dict
        ``accuracy``, ``f1_macro`` (means over folds and experiments), ``accuracy_std`` (over
        the experiments and folds), ``n_train``, ``n_test`` (items per fold, summed over folds).
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score

    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(labels)
    folds = np.asarray(folds)
    rng = np.random.default_rng(random_state)
    acc, f1, n_train, n_test = [], [], 0, 0
    for f in test_folds:
        train, test = np.flatnonzero(folds != f), np.flatnonzero(folds == f)
        if len(test) == 0 or len(np.unique(y[train])) < 2:
            raise EncmapError(f"classification: fold {f} has {len(test)} test items and "
                              f"{len(np.unique(y[train]))} training labels; need >= 1 and >= 2")
        full = max(np.unique(y[train], return_counts=True)[1]) <= samples_per_label
        n_train, n_test = n_train + len(train), n_test + len(test)
        for _ in range(1 if full else n_experiments):
            sub = train if full else undersample(y, train, samples_per_label, rng)
            clf = LogisticRegression(max_iter=max_iter, random_state=random_state)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)  # MTEB's 100 iterations, as MTEB runs them
                clf.fit(X[sub], y[sub])
            pred = clf.predict(X[test])
            acc.append(accuracy_score(y[test], pred))
            f1.append(f1_score(y[test], pred, average="macro"))
    return {"accuracy": float(np.mean(acc)), "f1_macro": float(np.mean(f1)), "accuracy_std": float(np.std(acc)),
            "n_train": n_train, "n_test": n_test}


def mrr_at_k(relevant: list[list[int]], ranking: np.ndarray, k: int) -> float:
    """Mean reciprocal rank of the first relevant document within the top ``k`` (0 if none).

    ``ranking`` (q, >= k) holds each query's corpus indices, best first.
    """
    rr = []
    for rel, row in zip(relevant, ranking[:, :k]):
        hit = np.flatnonzero(np.isin(row, rel))
        rr.append(1.0 / (hit[0] + 1) if len(hit) else 0.0)
    return float(np.mean(rr))


def retrieval_scores(Q: np.ndarray, C: np.ndarray, relevant: list[list[int]], k: int = 10) -> dict[str, float]:
    """nDCG@k and MRR@k of ranking the corpus by cosine similarity to each query.

    Parameters
    ----------
    Q : ndarray, shape (q, d)
        Query embeddings.
    C : ndarray, shape (c, d)
        Corpus embeddings.
    relevant : list of q lists of int
        Corpus indices relevant to each query (binary relevance).
    k : int

    Returns
    -------
    dict
        ``ndcg_at_<k>``, ``mrr_at_<k>``.
    """
    from sklearn.metrics import ndcg_score

    if len(relevant) != len(Q) or any(not r for r in relevant):
        raise EncmapError("retrieval: every query needs at least one relevant document")
    S = unit_rows(Q) @ unit_rows(C).T
    truth = np.zeros_like(S)
    for i, rel in enumerate(relevant):
        truth[i, rel] = 1.0
    ranking = np.argsort(-S, axis=1, kind="stable")
    return {f"ndcg_at_{k}": float(ndcg_score(truth, S, k=k)), f"mrr_at_{k}": mrr_at_k(relevant, ranking, k)}


def similarity_scores(X: np.ndarray, pairs: list[list[int]] | np.ndarray, human: list[float]) -> dict[str, float]:
    """Spearman and Pearson correlation of the pairs' cosine similarity with the human scores.

    ``X`` (t, d) embeds the task's t texts; ``pairs`` (p, 2) index them.
    """
    from scipy.stats import pearsonr, spearmanr

    P = np.asarray(pairs, dtype=int)
    U = unit_rows(X)
    cos = np.einsum("ij,ij->i", U[P[:, 0]], U[P[:, 1]])
    if np.ptp(cos) == 0:
        # A constant prediction carries no ranking: correlation 0 rather than undefined.
        return {"spearman": 0.0, "pearson": 0.0, "n_pairs": len(P)}
    return {"spearman": float(spearmanr(cos, human).statistic), "pearson": float(pearsonr(cos, human).statistic),
            "n_pairs": len(P)}


def evaluate_task(task: dict[str, Any], X: np.ndarray, rows: dict[str, int], params: dict[str, Any],
                  random_state: int) -> dict[str, Any]:
    """Scores of one encoder on one task.

    Parameters
    ----------
    task : dict
        A task built by :func:`encmap.downstream.tasks.build_tasks`.
    X : ndarray, shape (t, d)
        Embeddings of every evaluation text; ``rows[text]`` is its row.
    params : dict
        ``classification`` (n_experiments, samples_per_label, max_iter) and ``retrieval_k``.

    Returns
    -------
    dict
        ``main_score`` (the task's MTEB main metric), ``metric`` (its name) and ``scores``.
    """
    def emb(texts: list[str]) -> np.ndarray:
        return X[[rows[t] for t in texts]]

    kind = task["type"]
    if kind == "classification":
        c = params["classification"]
        scores = classification_scores(emb(task["texts"]), task["labels"], task["folds"], task["test_folds"],
                                       n_experiments=c["n_experiments"], samples_per_label=c["samples_per_label"],
                                       max_iter=c["max_iter"], random_state=random_state)
    elif kind == "retrieval":
        scores = retrieval_scores(emb(task["queries"]), emb(task["corpus"]), task["relevant"], params["retrieval_k"])
    elif kind == "similarity":
        scores = similarity_scores(emb(task["texts"]), task["pairs"], task["human"])
    else:
        raise EncmapError(f"unknown task type {kind!r}")
    metric = task["main_score"] if kind != "retrieval" else f"ndcg_at_{params['retrieval_k']}"
    return {"main_score": scores[metric], "metric": metric, "scores": scores}


def score_tasks(X: np.ndarray, tasks: dict[str, dict[str, Any]], rows: dict[str, int], params: dict[str, Any],
                random_state: int) -> dict[str, dict[str, Any]]:
    """Scores of one encoder on every task: ``{task name: evaluate_task(...)}``.

    ``X`` (t, d) embeds every evaluation text (any float dtype; scored in float64).
    """
    X = np.asarray(X, dtype=np.float64)
    return {name: evaluate_task(task, X, rows, params, random_state) for name, task in tasks.items()}
