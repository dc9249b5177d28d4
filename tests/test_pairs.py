"""All-pairs measures from factored PIPs, reuse of stored pairs, subsets, agreement, heatmaps."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import spearmanr
from support.fake_run import fake_run

from encmap.artifacts.paircache import reuse_index, reuse_pairs
from encmap.qre.reference import dense_pairwise_qre
from encmap import factor_pip  # the public API
from encmap.similarity.agreement import agreement_table
from encmap.similarity.blocks import pair_flop, pair_measures
from encmap.similarity.cka import gram_cka, gram_cka_matrix, rbf_gram
from encmap.similarity.subset import select_group, select_pairs
from encmap.validation import EncmapError


def _encoders(n=60, dims=(3, 8, 20), seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, d)) @ rng.standard_normal((d, d)) + rng.standard_normal(d) for d in dims]


def test_pair_measures_match_dense_qre_and_textbook_linear_cka():
    """QRE against full n x n eigendecompositions; CKA against HSIC of explicit linear Grams."""
    Es = _encoders()
    out = pair_measures([factor_pip(E) for E in Es], eps=1e-4)
    H = np.eye(60) - 1.0 / 60
    for i, A in enumerate(Es):
        for j, B in enumerate(Es):
            if i == j:
                assert out["qre"][i, j] == 0 and out["cka"][i, j] == 1 and out["cka_debiased"][i, j] == 1
                continue
            assert out["qre"][i, j] == pytest.approx(dense_pairwise_qre(A, B, eps=1e-4), rel=1e-10)
            K, L = A @ A.T, B @ B.T
            hsic = lambda P, Q: np.trace(P @ H @ Q @ H)  # noqa: E731  (Gretton's biased HSIC)
            assert out["cka"][i, j] == pytest.approx(hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L)), rel=1e-10)
            assert out["cka_debiased"][i, j] == pytest.approx(gram_cka(K, L, debiased=True), rel=1e-10)
    assert np.allclose(out["cka"], out["cka"].T) and not np.allclose(out["qre"], out["qre"].T)


def test_pair_measures_compute_only_the_pairs_asked():
    specs = [factor_pip(E) for E in _encoders(dims=(3, 8, 20, 5))]
    full = pair_measures(specs, eps=1e-6)
    todo = np.zeros((4, 4), bool)
    todo[1, 3] = True
    part = pair_measures(specs, eps=1e-6, todo=todo)
    for k in ("qre", "cka", "cka_debiased"):
        known = ~np.isnan(part[k])
        assert known.sum() == 4 + 2  # the diagonal and the pair (1, 3) both ways
        # Other blocks, other summation order of the segment sums: equal up to rounding.
        assert np.allclose(part[k][known], full[k][known], rtol=1e-13, atol=0)
    # 2 n r_1 r_3 FLOP for the one product U_1^T U_3.
    assert pair_flop([s.rank for s in specs], 60, todo) == 2 * 60 * specs[1].rank * specs[3].rank


def test_stored_pairs_are_reused_only_for_unchanged_encoders():
    """Change one of m encoders: exactly its m - 1 pairs are recomputed; a new encoder adds its own."""
    ids, fps = ["a", "b", "c", "d"], ["1", "2", "3", "4"]
    stored = {"x": np.arange(16, dtype=float).reshape(4, 4)}
    idx = reuse_index(ids, fps, ids, ["1", "2", "X", "4"])
    assert idx.tolist() == [0, 1, -1, 3]
    todo, filled = reuse_pairs(idx, np.ones((4, 4), bool), stored)
    assert todo.sum() == 3 and set(zip(*np.nonzero(todo))) == {(0, 2), (1, 2), (2, 3)}
    assert filled["x"][0, 1] == 1 and filled["x"][3, 1] == 13 and np.isnan(filled["x"][2, 0])
    # Reordered and one added: stored values follow the ids, not the positions.
    idx = reuse_index(ids, fps, ["d", "e", "a"], ["4", "5", "1"])
    todo, filled = reuse_pairs(idx, np.ones((3, 3), bool), stored)
    assert set(zip(*np.nonzero(todo))) == {(0, 1), (1, 2)} and filled["x"][0, 2] == 12 and filled["x"][2, 0] == 3
    # A pair stored in one direction only (NaN in the other) is recomputed; nothing stored: all.
    half = {"x": np.where(np.tril(np.ones((4, 4), bool), -1), np.nan, stored["x"])}
    assert reuse_pairs(reuse_index(ids, fps, ids, fps), np.ones((4, 4), bool), half)[0].sum() == 6
    assert reuse_pairs(np.full(4, -1), np.ones((4, 4), bool), None)[0].sum() == 6


def test_gram_cka_matrix_matches_pairwise_gram_cka():
    Es = _encoders(n=40)
    G = [rbf_gram(E) for E in Es]
    for debiased in (False, True):
        M = gram_cka_matrix(G, debiased=debiased)
        for i in range(3):
            for j in range(3):
                assert M[i, j] == pytest.approx(gram_cka(G[i], G[j], debiased=debiased), abs=1e-12)
    todo = np.zeros((3, 3), bool)
    todo[0, 2] = True
    M = gram_cka_matrix([G[0], None, G[2]], todo=todo)
    assert np.isnan(M[0, 1]) and M[2, 0] == pytest.approx(gram_cka(G[0], G[2]))


def _rec(e, model, layer, pooling, kind, dim=None):
    return {"id": e, "model": model, "layer": layer, "pooling": pooling, "dim": dim, "d": 8, "meta": {"kind": kind}}


RECORDS = [
    _rec("bert__l00-mean", "bert", 0, "mean", "pretrained"), _rec("bert__l03-mean", "bert", 3, "mean", "pretrained"),
    _rec("bert__l03-cls", "bert", 3, "cls", "pretrained"), _rec("bert__l06-mean", "bert", 6, "mean", "pretrained"),
    _rec("bert__l09-mean", "bert", 9, "mean", "pretrained"), _rec("bert__out", "bert", None, "output", "pretrained"),
    _rec("bert__out-d4", "bert", None, "output", "pretrained", 4), _rec("e5__out", "e5", None, "output", "pretrained"),
    _rec("lsa__d8", "lsa", None, "output", "classical", 8), _rec("gauss__out", "gauss", None, "output", "control"),
    _rec("rand__l01-max", "rand", 1, "max", "control"), _rec("rand__l02-max", "rand", 2, "max", "control"),
]


def test_groups_by_hand():
    assert select_group(RECORDS, "outputs") == ["bert__out", "e5__out"]
    # Layers 0..9 of bert: the middle of 9 is 4.5, nearest 3 and 6; the lower wins, mean pooled.
    assert select_group(RECORDS, "middle") == ["bert__l03-mean"]
    assert select_group(RECORDS, "classical") == ["lsa__d8"]
    # A control without an output contributes its middle layer (max pooling: all it has).
    assert select_group(RECORDS, "controls") == ["gauss__out", "rand__l01-max"]
    ids, pairs = select_pairs(RECORDS, ["outputs", "classical"], encoders=["bert__l09-mean"])
    assert ids == ["bert__l09-mean", "bert__out", "e5__out", "lsa__d8"] and len(pairs) == 4 * 3
    assert ("bert__out", "e5__out") in pairs and ("e5__out", "bert__out") in pairs
    nn = np.array([[1]] + [[0]] * (len(RECORDS) - 1))  # every encoder's nearest: row 0 (row 0's: row 1)
    ids, pairs = select_pairs(RECORDS, [], neighbours=nn)
    assert len(ids) == len(RECORDS) and len(pairs) == 2 * (len(RECORDS) - 1)
    with pytest.raises(EncmapError, match="'nope' is not on the map"):
        select_pairs(RECORDS, ["outputs"], encoders=["nope"])
    with pytest.raises(EncmapError, match="unknown group 'layers'"):
        select_pairs(RECORDS, ["layers"])
    with pytest.raises(EncmapError, match="fewer than two encoders"):
        select_pairs(RECORDS, ["classical"])


def test_agreement_table_by_hand():
    a = np.array([1.0, 2.0, 3.0, 4.0, np.nan])
    rows = agreement_table({"a": a, "up": 10 * a, "down": -a, "other": np.array([1.0, 3.0, 2.0, 4.0, 5.0])})
    got = {(r["a"], r["b"]): (r["spearman"], r["pairs"]) for r in rows}
    assert got[("a", "up")] == (pytest.approx(1.0), 4) and got[("a", "down")] == (pytest.approx(-1.0), 4)
    # Ranks (1, 3, 2, 4) against (1, 2, 3, 4): 1 - 6 * 2 / (4 * 15) = 0.8.
    assert got[("a", "other")] == (pytest.approx(0.8), 4)
    assert got[("up", "other")][0] == pytest.approx(spearmanr([1, 2, 3, 4], [1, 3, 2, 4]).statistic)
    assert np.isnan(agreement_table({"a": a[:2], "b": a[:2]})[0]["spearman"])  # fewer than 3 pairs


def test_heatmap_is_byte_identical_and_greys_missing_cells(tmp_path):
    from PIL import Image

    from encmap.similarity.figures import draw_heatmap

    M = np.array([[1.0, 0.2, np.nan], [0.2, 1.0, 0.5], [np.nan, 0.5, 1.0]])
    names = ["a__out", "b__out", "c__out"]
    for k in ("1", "2"):
        draw_heatmap(M, names, names, tmp_path / f"{k}.png", tmp_path / f"{k}.svg", title="t", label="CKA",
                     vmin=0, vmax=1)
    assert (tmp_path / "1.png").read_bytes() == (tmp_path / "2.png").read_bytes()
    assert (tmp_path / "1.svg").read_bytes() == (tmp_path / "2.svg").read_bytes()
    svg = (tmp_path / "1.svg").read_text()
    assert all(n in svg for n in names)
    assert Image.open(tmp_path / "1.png").size[0] > 500


# ------------------------------------------------------------------ the steps, on a fake run

SIM = {"subset": {"groups": ["all"], "encoders": [], "neighbours": 0},
       "rbf": {"threshold": 1.0, "sample": 20, "seed": 0},
       "stitch": {"sample": 30, "val": 0.1, "test": 0.3, "seed": 0,
                  "methods": ["affine", "ridge", "procrustes", "mean", "random-source"], "ridge_alphas": [0.1, 10.0],
                  "mlp_depths": [1], "mlp_groups": ["controls", "middle"],
                  "mlp": {"max_epochs": 5, "patience": 2, "lr": 0.01, "batch_size": 8, "dtype": "float64"},
                  "knn_k": 3, "device": "cpu"}}


def _outs(root, *names):
    return {k: str(root / f"sim/{k}.out") for k in names}


def _rewrite_encoder(run: dict, i: int, seed: int) -> None:
    """New embeddings and PIP for encoder i of a fake run (same sentences, other values)."""
    import h5py

    from encmap.io import write_h5
    from encmap.pipeline.pip import pip_step

    emb = sorted(f for d in run["embeddings"] for f in __import__("pathlib").Path(d).glob("*.h5"))[i]
    with h5py.File(emb, "r") as f:
        attrs, d = dict(f.attrs), f["embeddings"].shape[1]
    E = np.random.default_rng(seed).normal(size=(30, d))
    write_h5(emb, {"embeddings": E.astype(np.float32)}, attrs)
    pip = next(p for p in run["pips"] if p.endswith("/" + emb.name))
    pip_step(str(emb.parent), emb.stem, pip, tol=1e-12, dense_max_n=0, center=False, normalize_rows=False)


def test_pair_steps_recompute_only_pairs_of_a_changed_encoder(tmp_path):
    """pairwise and stitch: a rerun computes nothing; one changed encoder of 8 recomputes its own
    pairs only (7 unordered, 14 ordered), and the results equal a run from scratch byte for byte."""
    import json

    from encmap.pipeline.agreement import agreement_step
    from encmap.pipeline.cka_rbf import cka_rbf_step
    from encmap.pipeline.pairwise import pairwise_step
    from encmap.pipeline.stitch import stitch_step

    def pair_run(run, root):
        o = _outs(root, "qre", "cka", "timing")
        pairwise_step(run["features"], run["pips"], o["qre"], o["cka"], o["timing"], eps=1e-6, code="c")
        r = _outs(root, "rbf", "rtimings")
        cka_rbf_step(run["features"], run["embeddings"], r | {"timing": r.pop("rtimings")}, subset=SIM["subset"],
                     rbf=SIM["rbf"], code="c")
        s = _outs(root, "stitches", "csv", "stimings")
        stitch_step(run["features"], run["embeddings"], s | {"timing": s.pop("stimings")}, subset=SIM["subset"],
                    stitch=SIM["stitch"], code="c")
        t1, t2, t3 = (json.loads(open(root / f"sim/{k}.out").read()) for k in ("timing", "stimings", "rtimings"))
        return t1["pairs_computed"], t2["stitch_pairs_computed"], t3["rbf_pairs_computed"]

    run = fake_run(tmp_path / "a")
    assert pair_run(run, tmp_path / "a") == (28, 56, 28)
    first = {p.name: p.read_bytes() for p in (tmp_path / "a/sim").iterdir() if "timing" not in p.name}
    assert pair_run(run, tmp_path / "a") == (0, 0, 0)
    assert first == {p.name: p.read_bytes() for p in (tmp_path / "a/sim").iterdir() if "timing" not in p.name}
    _rewrite_encoder(run, 3, seed=9)
    assert pair_run(run, tmp_path / "a") == (7, 14, 7)
    fresh = fake_run(tmp_path / "b")
    _rewrite_encoder(fresh, 3, seed=9)
    pair_run(fresh, tmp_path / "b")
    for name in ("qre.out", "cka.out", "rbf.out"):
        assert (tmp_path / "a/sim" / name).read_bytes() == (tmp_path / "b/sim" / name).read_bytes(), name
    # Stitches fitted to fewer stacked targets differ from a fresh run only in the last bits
    # (BLAS blocking depends on the width); a fresh run always reproduces its own bytes.
    table, ref = (json.loads((tmp_path / f"{r}/sim/stitches.out").read_text())["rows"] for r in "ab")
    assert len(table) == len(ref)
    for got, want in zip(table, ref):
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert got[k] == (pytest.approx(v, rel=1e-9, abs=1e-12) if isinstance(v, (float, list)) else v), k
    assert len(table) == 56 * 5 + 3 * 2  # MLPs among m0's layer 0 (control) and m1's and m2's middle layers
    # The affine rows carry every singular value of A (d_source of them, descending), the others none.
    import h5py

    widths = {}
    for d in run["embeddings"]:
        for f in __import__("pathlib").Path(d).glob("*.h5"):
            with h5py.File(f, "r") as h:
                widths[f.stem] = h["embeddings"].shape[1]
    for r in table:
        sv = r["singular_values"]
        assert (sv is None) == (r["method"] != "affine"), r
        if sv is not None:
            assert len(sv) == min(widths[r["source"]], widths[r["target"]]) and sv == sorted(sv, reverse=True)
            assert sv[0] == r["sigma_max"] and sv[-1] == r["sigma_min"]
    # Other params: nothing is reused.
    r = _outs(tmp_path / "a", "rbf", "timing")
    cka_rbf_step(run["features"], run["embeddings"], r, subset=SIM["subset"], rbf=SIM["rbf"] | {"threshold": 2.0}, code="c")
    assert json.loads(open(r["timing"]).read())["rbf_pairs_computed"] == 28

    c = {k: str(tmp_path / f"cmp/{k}") for k in ("agreement", "metrics")}
    from encmap.workflow.layout import similarity_figures

    c |= {k: str(tmp_path / v) for k, v in similarity_figures().items()}
    a = tmp_path / "a/sim"
    agreement_step(run["features"], *(str(a / f"{k}.out") for k in ("qre", "cka", "rbf", "stitches")), c)
    rows = open(c["agreement"]).read().splitlines()
    assert rows[0] == "a,b,spearman,pairs" and "l1,exact_qre," in rows[1] and rows[1].endswith(",28")
    metrics = json.loads(open(c["metrics"]).read())
    assert set(metrics["stitch_r2_median"]) == {"affine", "ridge", "procrustes", "mean", "random-source", "mlp1"}
    assert abs(metrics["stitch_r2_median"]["mean"]) < 0.5 and "l1~1-stitch_ridge" in metrics["agreement"]


def test_subset_steps_refuse_embeddings_of_another_sentence_set(tmp_path):
    from encmap.pipeline.cka_rbf import cka_rbf_step
    from encmap.pipeline.stitch import stitch_step

    run = fake_run(tmp_path / "a")
    other = fake_run(tmp_path / "b", sha="b" * 64)
    s = _outs(tmp_path / "a", "stitches", "csv", "timing")
    r = _outs(tmp_path / "a", "rbf", "timing")
    for step, out, extra in ((stitch_step, s, {"stitch": SIM["stitch"]}), (cka_rbf_step, r, {"rbf": SIM["rbf"]})):
        with pytest.raises(EncmapError, match=r"encoder 'm0__0': embeddings made from another sentence set"):
            step(run["features"], other["embeddings"], out, subset=SIM["subset"], code="c", **extra)
        with pytest.raises(EncmapError, match=r"no embeddings directory of model 'm2'"):
            step(run["features"], run["embeddings"][:2], out, subset=SIM["subset"], code="c", **extra)
    assert not (tmp_path / "a/sim").exists()


@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_blocked_products_equal_one_product_per_pair_and_dense(eps):
    """Blocks of any size (one encoder each, a few, all), NumPy or torch, a full or partial ``todo``:
    the same matrices as the dense n x n references, in both directions."""
    Es = _encoders(n=50, dims=(3, 8, 20, 5, 11), seed=4)
    specs = [factor_pip(E) for E in Es]
    m = len(specs)
    todo = np.zeros((m, m), bool)
    todo[1, [2, 4]] = todo[0, 3] = True
    ref = pair_measures(specs, eps=eps, block_columns=10**6)
    for cols in (1, 12, 30):
        for device in (None, "cpu"):
            got = pair_measures(specs, eps=eps, block_columns=cols, device=device)
            part = pair_measures(specs, eps=eps, block_columns=cols, device=device, todo=todo)
            for k in ("qre", "cka", "cka_debiased"):
                assert np.allclose(got[k], ref[k], rtol=1e-12, atol=0), (k, cols, device)
                known = ~np.isnan(part[k])
                assert known.sum() == m + 6 and np.allclose(part[k][known], ref[k][known], rtol=1e-12, atol=0)
    for i in range(m):
        for j in range(m):
            if i != j and (eps > 0 or np.isfinite(ref["qre"][i, j])):
                assert ref["qre"][i, j] == pytest.approx(dense_pairwise_qre(Es[i], Es[j], eps=eps), rel=1e-9)


def test_blocks_partition_by_columns():
    from encmap.similarity.blocks import blocks

    assert [b.tolist() for b in blocks([3, 8, 20, 5, 11], 12)] == [[0, 1], [2], [3], [4]]
    assert [b.tolist() for b in blocks([3, 8, 20, 5, 11], 100)] == [[0, 1, 2, 3, 4]]


@pytest.mark.gpu
def test_cuda_route_equals_numpy():
    specs = [factor_pip(E) for E in _encoders(n=300, dims=(30, 80, 200, 50), seed=5)]
    ref = pair_measures(specs, eps=1e-6)
    for cols in (1, 100, 4096):
        got = pair_measures(specs, eps=1e-6, block_columns=cols, device="cuda")
        for k in ("qre", "cka", "cka_debiased"):
            assert np.allclose(got[k], ref[k], rtol=1e-12, atol=0), (k, cols)


def test_pairwise_step_spills_u_to_disk_when_over_its_memory(tmp_path):
    """With less memory than the U's need, each U is derived once into a memory-mapped scratch
    file: the same bytes as in memory, the scratch removed, the timing says so."""
    import json

    from encmap.pipeline.pairwise import pairwise_step

    run = fake_run(tmp_path / "a")
    outs = {}
    for name, mem in (("ram", None), ("disk", 1.0)):
        o = _outs(tmp_path / name, "qre", "cka", "timing")
        pairwise_step(run["features"], run["pips"], o["qre"], o["cka"], o["timing"], eps=1e-6, memory_bytes=mem, code="c")
        outs[name] = o
        assert json.loads(open(o["timing"]).read())["u_spilled_to_disk"] is (mem is not None)
        assert not list((tmp_path / name).rglob("*.tmp"))
    for k in ("qre", "cka"):
        assert open(outs["ram"][k], "rb").read() == open(outs["disk"][k], "rb").read()


def test_an_edited_pair_result_is_never_reused(tmp_path):
    """Old: a value edited in qre_pairwise.h5 (still valid HDF5) survived a forced rerun
    (`pairs_reused: 21`) and flowed into the map's metrics."""
    import h5py

    from encmap.pipeline.cka_rbf import cka_rbf_step
    from encmap.pipeline.pairwise import pairwise_step
    from encmap.pipeline.stitch import stitch_step

    run = fake_run(tmp_path / "a")
    o = _outs(tmp_path / "a", "qre", "cka", "timing")
    r = _outs(tmp_path / "a", "rbf", "rtiming")
    r["timing"] = r.pop("rtiming")
    s = _outs(tmp_path / "a", "stitches", "csv", "stiming")
    s["timing"] = s.pop("stiming")
    sim = SIM | {"stitch": SIM["stitch"] | {"mlp_depths": []}}

    def rerun() -> tuple[int, int, int]:
        pairwise_step(run["features"], run["pips"], o["qre"], o["cka"], o["timing"], eps=1e-6, code="c")
        cka_rbf_step(run["features"], run["embeddings"], r, subset=sim["subset"], rbf=sim["rbf"], code="c")
        stitch_step(run["features"], run["embeddings"], s, subset=sim["subset"], stitch=sim["stitch"], code="c")
        t = [json.loads(open(f).read()) for f in (o["timing"], r["timing"], s["timing"])]
        return t[0]["pairs_computed"], t[1]["rbf_pairs_computed"], t[2]["stitch_pairs_computed"]

    assert rerun() == (28, 28, 56)
    good = {k: open(o[k], "rb").read() for k in ("qre", "cka")} | {"rbf": open(r["rbf"], "rb").read()}
    good_rows = json.loads(open(s["stitches"]).read())["rows"]
    assert rerun() == (0, 0, 0)  # intact: every pair reused
    for path, name in ((o["qre"], "qre"), (o["cka"], "cka_debiased"), (r["rbf"], "cka_rbf")):
        with h5py.File(path, "r+") as f:  # a test file, never a tracked one
            f[name][0, 1] = 0.123
    rows = json.loads(open(s["stitches"]).read())
    rows["rows"][0]["r2"] = 0.99
    open(s["stitches"], "w").write(json.dumps(rows))
    assert rerun() == (28, 28, 56)  # nothing of an edited file is reused
    assert {k: open(o[k], "rb").read() for k in ("qre", "cka")} | {"rbf": open(r["rbf"], "rb").read()} == good
    assert json.loads(open(s["stitches"]).read())["rows"] == good_rows


@pytest.mark.parametrize("n", [30, 400])
def test_device_route_derives_u_from_what_it_reads_and_equals_the_numpy_route(tmp_path, n):
    """The GPU route, run in torch on the CPU: U derived in torch from the embeddings as read (n =
    30: every PIP stores no basis, U is an SVD; n = 400: every PIP stores V), reads ahead in
    threads. Same matrices as the NumPy route (itself tested against dense QRE above)."""
    import h5py

    from encmap.artifacts.pip import read_pip_source
    from encmap.pipeline.pairwise import _pairwise, pairwise_step

    run = fake_run(tmp_path / "a", n=n)
    basis = {read_pip_source(p)[0].V is None for p in run["pips"]}
    assert basis == {n == 30}
    ref = _outs(tmp_path / "numpy", "qre", "cka", "timing")
    pairwise_step(run["features"], run["pips"], ref["qre"], ref["cka"], ref["timing"], eps=1e-6, code="c")
    dev = _outs(tmp_path / "torch", "qre", "cka", "timing")
    _pairwise(run["features"], run["pips"], dev["qre"], dev["cka"], dev["timing"], eps=1e-6, dev="cpu",
              block_columns=16, threads=2, memory_bytes=None, code="c", torch_device="cpu")
    for k, keys in (("qre", ["qre"]), ("cka", ["cka", "cka_debiased"])):
        with h5py.File(ref[k]) as a, h5py.File(dev[k]) as b:
            for key in keys:
                np.testing.assert_allclose(b[key][...], a[key][...], rtol=1e-9, atol=1e-12)
    timing = json.loads(open(dev["timing"]).read())
    assert timing["pairs_computed"] == 28 and 0 <= timing["waiting_for_reads_seconds"] <= timing["step_seconds"]


def test_device_route_refuses_a_pip_whose_svd_gives_another_spectrum(tmp_path):
    """A stored λ that the embeddings' SVD does not give back is refused by the device route as by
    the CPU one, naming the artifact; nothing is written."""
    import h5py

    from encmap.pipeline.pairwise import _pairwise

    run = fake_run(tmp_path / "a", n=30)
    with h5py.File(run["pips"][3], "r+") as f:
        lam = f["lam"][...]
        f["lam"][...] = np.sort(np.r_[lam[:-2], lam[-2:].sum() / 2, lam[-2:].sum() / 2])[::-1]
    o = _outs(tmp_path / "torch", "qre", "cka", "timing")
    with pytest.raises(EncmapError, match=r"m0__3.*another spectrum than the stored rank"):
        _pairwise(run["features"], run["pips"], o["qre"], o["cka"], o["timing"], eps=1e-6, dev="cpu",
                  block_columns=16, threads=2, memory_bytes=None, code="c", torch_device="cpu")
    assert not any(tmp_path.joinpath("torch").rglob("*.h5"))


def test_prefetch_reads_in_order_at_most_ahead_and_rereads_what_was_taken(monkeypatch):
    """Reads run in the given order, never more than `ahead` beyond the last one taken; a path
    taken before is read again (the device had no room to keep its U)."""
    import threading

    from encmap.pipeline import pairwise as pw

    started, lock = [], threading.Lock()

    def read(path):
        with lock:
            started.append(path)
        return (path, {})

    monkeypatch.setattr(pw, "read_pip_source", read)
    order = [f"p{i}" for i in range(6)]
    with pw._Prefetch(order, ahead=2, threads=4) as reads:
        for k, p in enumerate(order):
            assert reads.get(p) == p
            assert len(started) <= min(k + 1 + 2, 6)
        assert reads.get("p1") == "p1"
    assert started == order + ["p1"]


def test_the_subset_of_a_map_the_run_left_encoders_off_drops_them_and_lowers_its_neighbours(tmp_path, capsys):
    """Old: with on_error: skip, a subset encoder named in params whose model failed, or
    similarity.subset.neighbours too large for the encoders left, passed `encmap check` and the
    cka_rbf and stitch stages refused after the work ('... is not on the map'; 'map.neighbours = 9
    must be in [1, m - 1]', naming the wrong key). Now the named one is compared no more and k is
    lowered, each with a warning; an encoder params never had is still refused."""
    from support.fake_run import leave_off

    from encmap.pipeline.cka_rbf import cka_rbf_step

    run = fake_run(tmp_path)
    leave_off(run, failed={"gone__0": {"stage": "embed", "error": "cannot load"}})
    r = _outs(tmp_path, "rbf", "timing")
    subset = {"groups": ["controls"], "encoders": ["gone__0", "m1__1"], "neighbours": 9}
    cka_rbf_step(run["features"], run["embeddings"], r, subset=subset, rbf=SIM["rbf"], code="c")
    err = capsys.readouterr().err
    assert "warning: similarity.subset.encoders: gone__0 left off by the run" in err
    assert ("warning: similarity.subset.neighbours = 9 needs 10 encoders on the map, but 8 are left: the run left "
            "off 1 (gone__0: failed models or degenerate encoders); using 7 instead") in err
    assert json.loads(open(r["timing"]).read())["rbf_pairs"] == 28  # 7 neighbours of 8: every pair
    from encmap.pipeline.stitch import stitch_step

    s = _outs(tmp_path, "stitches", "csv", "timing")
    stitch_step(run["features"], run["embeddings"], s, subset=subset, code="c",
                stitch=SIM["stitch"] | {"methods": ["affine"], "mlp_depths": []})
    assert "warning: similarity.subset.neighbours = 9 needs 10" in capsys.readouterr().err
    assert len(json.loads(open(s["stitches"]).read())["rows"]) == 56  # both ways
    with pytest.raises(EncmapError, match=r"similarity.subset.encoders: encoder 'never__0' is not on the map"):
        cka_rbf_step(run["features"], run["embeddings"], r, subset=subset | {"encoders": ["never__0"]}, rbf=SIM["rbf"],
                     code="c")
    leave_off(run)  # nothing left off: a k too large is refused, naming its own key (old: map.neighbours)
    with pytest.raises(EncmapError, match=r"similarity.subset.neighbours = 9 must be in \[1, m - 1\] = \[1, 7\]"):
        cka_rbf_step(run["features"], run["embeddings"], r, subset=subset | {"encoders": []}, rbf=SIM["rbf"], code="c")
