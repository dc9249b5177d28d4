"""QRE maths against slow dense references, hand values, invariances and properties."""

import math
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import ortho_group
from support.fresh import array_digest, fresh_digests

from encmap import factor_pip, pairwise_qre, pairwise_qre_matrix, qre_features, qre_to_base  # the public API
from encmap.qre.reference import dense_pairwise_qre, dense_qre_features, quantum_relative_entropy, von_neumann_entropy
from encmap.qre.spectrum import spectrum_from_arrays
from encmap.validation import EncmapError


def rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


def make(kind, rng):
    if kind == "tall":  # d < n
        return rng.standard_normal((60, 12))
    if kind == "wide":  # d > n
        return rng.standard_normal((25, 70))
    if kind == "rankdef":  # rank 4 in 40 dims
        return rng.standard_normal((50, 4)) @ rng.standard_normal((4, 40))
    if kind == "dups":  # duplicated rows
        E = rng.standard_normal((40, 16))
        E[10:20] = E[:10]
        return E
    raise AssertionError(kind)


CASES = [
    (kind, eps, direction, method)
    for kind in ("tall", "wide", "rankdef", "dups")
    for eps in (0.0, 1e-8, 1e-3)
    for direction in ("forward", "reverse")
    for method in ("svd", "gram")
    if not (direction == "reverse" and eps == 0.0)
]


@pytest.mark.parametrize("kind,eps,direction,method", CASES)
def test_factored_matches_dense_eigh(kind, eps, direction, method):
    # A seed that replays in every process (hash() of a str is salted per process).
    rng = np.random.default_rng(zlib.crc32(f"{kind}|{eps}|{direction}".encode()))
    E = make(kind, rng)
    fast = qre_features(factor_pip(E, method=method), direction=direction, eps=eps)
    slow = dense_qre_features(E, direction=direction, eps=eps)
    assert rel(fast, slow) <= 1e-10
    # The features add up to the QRE against the base encoder, computed densely.
    n = E.shape[0]
    M = E @ E.T
    rho = M / np.trace(M)
    rho_eps = (1 - eps) * rho + eps * np.eye(n) / n
    rho_eps = (rho_eps + rho_eps.T) / 2
    dense = (quantum_relative_entropy(rho_eps, np.eye(n) / n) if direction == "forward"
             else quantum_relative_entropy(np.eye(n) / n, rho_eps))
    # With ε = 1e-8 the dense eigh of ρ_ε resolves its smallest eigenvalues (ε/n ~ 1e-10) only
    # to ~1e-16 absolute, so ln of them, which the reverse direction sums, is good to ~1e-7.
    tight = direction == "forward" or eps >= 1e-3
    assert fast.sum() == pytest.approx(dense, rel=1e-9 if tight else 1e-6, abs=1e-12)
    assert qre_to_base(E, direction=direction, eps=eps) == pytest.approx(fast.sum(), rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("kind", ["tall", "wide", "rankdef", "dups"])
@pytest.mark.parametrize("eps", [1e-3, 0.2])
def test_features_against_matrix_logarithm(kind, eps):
    """Independent reference: scipy's logm (Schur-Padé, no eigendecomposition of ours) of the
    dense smoothed density matrix; forward diag(ρ_ε logm(n ρ_ε)), reverse -diag(logm(n ρ_ε))/n."""
    import scipy.linalg

    E = make(kind, np.random.default_rng(zlib.crc32(f"logm|{kind}".encode())))
    n = E.shape[0]
    M = E @ E.T
    rho = (1 - eps) * M / np.trace(M) + eps * np.eye(n) / n
    L = np.real(scipy.linalg.logm(n * rho))
    spec = factor_pip(E)
    assert rel(qre_features(spec, direction="forward", eps=eps), np.diag(rho @ L)) <= 1e-8
    assert rel(qre_features(spec, direction="reverse", eps=eps), -np.diag(L) / n) <= 1e-8


def test_forward_sum_is_ln_n_minus_entropy():
    rng = np.random.default_rng(1)
    E = rng.standard_normal((30, 8))
    eps = 1e-3
    rho = E @ E.T / np.sum(E * E)
    rho_eps = (1 - eps) * rho + eps * np.eye(30) / 30
    f = qre_features(E, eps=eps)
    assert f.sum() == pytest.approx(math.log(30) - von_neumann_entropy((rho_eps + rho_eps.T) / 2), rel=1e-10)


def test_hand_values():
    assert quantum_relative_entropy(np.diag([0.3, 0.7]), np.eye(2) / 2) == pytest.approx(0.0822829, abs=5e-8)
    pure = np.array([[1.0, 0.0], [0.0, 0.0]])
    assert quantum_relative_entropy(pure, np.eye(2) / 2) == pytest.approx(math.log(2), rel=1e-14)
    assert quantum_relative_entropy(np.eye(2) / 2, pure) == math.inf
    assert von_neumann_entropy(np.eye(4) / 4) == pytest.approx(math.log(4))
    # Embeddings whose density matrix is diag(0.3, 0.7): forward features are
    # 0.3 ln 0.6 and 0.7 ln 1.4, adding to 0.0822829.
    E = np.diag([math.sqrt(0.3), math.sqrt(0.7)])
    f = qre_features(E, eps=0.0)
    assert f == pytest.approx([0.3 * math.log(0.6), 0.7 * math.log(1.4)], rel=1e-12)
    assert f.sum() == pytest.approx(0.0822829, abs=5e-8)
    # A pure state (one direction) vs I/n gives ln n; one-hot embeddings (the base encoder) give 0.
    assert qre_features(np.ones((5, 1)), eps=0.0).sum() == pytest.approx(math.log(5))
    assert qre_features(np.eye(6), eps=0.0) == pytest.approx(np.zeros(6), abs=1e-15)
    assert qre_features(np.eye(6), eps=0.1, direction="reverse") == pytest.approx(np.zeros(6), abs=1e-15)


def test_pairwise_matches_dense_and_basic_properties():
    rng = np.random.default_rng(2)
    n = 35
    encs = [rng.standard_normal((n, 5)), rng.standard_normal((n, 50)), make("dups", rng)[:n, :9],
            rng.standard_normal((n, 3)) @ rng.standard_normal((3, 20))]
    for eps in (1e-8, 1e-3, 0.2):
        mat = pairwise_qre_matrix(encs, eps=eps)
        for i in range(len(encs)):
            for j in range(len(encs)):
                exact = dense_pairwise_qre(encs[i], encs[j], eps=eps)
                assert mat[i, j] == pytest.approx(exact, rel=1e-9, abs=1e-12)
        if eps < 1e-3:
            continue  # dense eigh of ρ_ε itself cannot resolve ln(ε/n) to 1e-9 below this
        dense = []
        for E in encs:
            rho = E @ E.T / np.sum(E * E)
            r = (1 - eps) * rho + eps * np.eye(n) / n
            dense.append((r + r.T) / 2)
        for i in range(len(encs)):
            assert pairwise_qre(encs[i], encs[i], eps=eps) == pytest.approx(0.0, abs=1e-12)
            for j in range(len(encs)):
                ref = quantum_relative_entropy(dense[i], dense[j])
                assert mat[i, j] == pytest.approx(ref, rel=1e-9, abs=1e-12)
                assert mat[i, j] >= -1e-12
        assert np.all(np.diag(mat) == 0)


def test_pairwise_unsmoothed_support():
    rng = np.random.default_rng(3)
    A = rng.standard_normal((20, 3))
    B = np.hstack([A, rng.standard_normal((20, 4))])  # range(A) ⊂ range(B)
    assert pairwise_qre(A, B, eps=0.0) < math.inf
    assert pairwise_qre(B, A, eps=0.0) == math.inf
    rho_a = A @ A.T / np.sum(A * A)
    rho_b = B @ B.T / np.sum(B * B)
    assert pairwise_qre(A, B, eps=0.0) == pytest.approx(quantum_relative_entropy(rho_a, rho_b, tol=1e-10), rel=1e-8)


def test_invariances():
    rng = np.random.default_rng(4)
    E = rng.standard_normal((40, 10))
    Q = ortho_group.rvs(10, random_state=5)
    for direction, eps in (("forward", 0.0), ("forward", 1e-3), ("reverse", 1e-3)):
        f = qre_features(E, direction=direction, eps=eps)
        assert rel(qre_features(E @ Q, direction=direction, eps=eps), f) < 1e-10
        assert rel(qre_features(7.5 * E, direction=direction, eps=eps), f) < 1e-12
        assert rel(qre_features(E[:, rng.permutation(10)], direction=direction, eps=eps), f) < 1e-10
        p = rng.permutation(40)
        assert rel(qre_features(E[p], direction=direction, eps=eps), f[p]) < 1e-10


def test_spectrum_roundtrip_and_determinism():
    rng = np.random.default_rng(6)
    E = rng.standard_normal((30, 6))
    s = factor_pip(E)
    assert s.rank == 6 and s.lam.sum() == pytest.approx(1.0)
    assert s.trace == pytest.approx(np.sum(E * E))
    assert np.allclose(s.dense_pip(), E @ E.T, atol=1e-10)
    s2 = spectrum_from_arrays(s.U, s.lam, s.trace)
    assert np.array_equal(qre_features(s2), qre_features(s))
    # The same matrix, the same bits: here and in two fresh interpreters with other hash seeds.
    here = array_digest(s.lam, np.abs(s.U), qre_features(E))  # the eigenvectors' signs are LAPACK's
    assert fresh_digests(_SAME_BITS) == [here, here]


_SAME_BITS = """
import numpy as np
from encmap import factor_pip, qre_features
from support.fresh import array_digest
E = np.random.default_rng(6).standard_normal((30, 6))
s = factor_pip(E)
print(array_digest(s.lam, np.abs(s.U), qre_features(E)))
"""


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 30),
    d=st.integers(1, 30),
    cond=st.floats(0, 5),  # λ down to 1e-10, clear of the 1e-12 rank tolerance
    eps=st.sampled_from([0.0, 1e-6, 1e-2]),
    seed=st.integers(0, 2**31),
)
def test_property_factored_equals_dense(n, d, cond, eps, seed):
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((n, min(n, d))))
    V, _ = np.linalg.qr(rng.standard_normal((d, min(n, d))))
    s = np.logspace(0, -cond, min(n, d))  # singular values spread over `cond` decades
    E = (U * s) @ V.T
    for direction in ("forward", "reverse"):
        if direction == "reverse" and eps == 0:
            continue
        fast = qre_features(E, direction=direction, eps=eps)
        slow = dense_qre_features(E, direction=direction, eps=eps)
        assert np.allclose(fast, slow, rtol=1e-9, atol=1e-13 / n)
        if direction == "forward":
            assert fast.sum() >= -1e-12  # S(ρ‖I/n) ≥ 0


@pytest.mark.parametrize(
    "E,kw,match",
    [
        (np.array([[1.0, np.nan], [0.0, 1.0]]), {}, "non-finite"),
        (np.array([[1.0, np.inf], [0.0, 1.0]]), {}, "non-finite"),
        (np.zeros((3, 2)), {}, "all embeddings are zero"),
        (np.eye(3), {"eps": 1.0}, r"eps must be in \[0, 1\)"),
        (np.eye(3), {"eps": -0.1}, r"eps must be in \[0, 1\)"),
        (np.eye(3), {"eps": 0.0, "direction": "reverse"}, "diverges"),
        (np.eye(3), {"direction": "sideways"}, "direction"),
        (np.ones(3), {}, "2-D"),
    ],
)
def test_bad_input(E, kw, match):
    with pytest.raises(EncmapError, match=match):
        qre_features(E, **kw)
    assert issubclass(EncmapError, ValueError)


def test_pairwise_bad_input():
    with pytest.raises(ValueError, match="same sentences"):
        pairwise_qre(np.eye(3), np.eye(4))
    with pytest.raises(ValueError, match="eps"):
        pairwise_qre(np.eye(3), np.eye(3), eps=2.0)


def test_centring_and_row_normalising_before_the_pip():
    """Centring ignores a common offset; row normalising ignores each sentence's length."""
    from encmap.qre.spectrum import prepare_embeddings

    rng = np.random.default_rng(11)
    E = rng.standard_normal((30, 8))
    base = qre_features(prepare_embeddings(E, center=True, normalize_rows=False), eps=1e-3)
    shifted = qre_features(prepare_embeddings(E + rng.standard_normal(8), center=True, normalize_rows=False), eps=1e-3)
    assert rel(shifted, base) <= 1e-10
    unit = qre_features(prepare_embeddings(E, center=False, normalize_rows=True), eps=1e-3)
    scaled = qre_features(prepare_embeddings(E * rng.uniform(0.1, 10, (30, 1)), center=False, normalize_rows=True),
                          eps=1e-3)
    assert rel(scaled, unit) <= 1e-10
    # Hand case: two sentences; centred they are ±(a - b)/2, one direction: a pure state.
    C = prepare_embeddings(np.array([[3.0, 1.0], [1.0, 1.0]]), center=True, normalize_rows=False)
    assert np.array_equal(C, [[1.0, 0.0], [-1.0, 0.0]])
    assert qre_to_base(C, eps=0.0) == pytest.approx(math.log(2))
    with pytest.raises(EncmapError, match="all embeddings are zero after centring"):
        prepare_embeddings(np.ones((4, 3)), center=True, normalize_rows=False)


def _emb_file(path, E):
    from encmap.io import write_h5

    write_h5(path, {"embeddings": E.astype(np.float32)}, {"encoder_id": path.stem, "model": path.parent.name,
                                                            "sentences_sha256": "s" * 64})
    return path


def test_stored_pip_artifact_is_small_and_gives_dense_features_and_pairwise_qre(tmp_path):
    """Both stored forms (right vectors V when r <= n/20, else the SVD redone on read) cost <= 10% of
    the embeddings' bytes and give features and pairwise QRE equal to dense n x n references."""
    import h5py

    from encmap.artifacts.pip import load_spectrum
    from encmap.pipeline.pip import pip_step
    from encmap.similarity.blocks import pair_measures

    rng = np.random.default_rng(11)
    n, specs, Es = 1500, [], []
    for d, basis in ((40, "V"), (150, "svd")):
        # Anisotropic: singular values spread over 4 decades (λ over 8), as real encoders' are.
        E = (rng.standard_normal((n, d)) * np.logspace(0, -4, d)).astype(np.float32).astype(np.float64)
        emb = _emb_file(tmp_path / f"emb/m/e{d}.h5", E)
        pip = tmp_path / f"pip/m/e{d}.h5"
        pip_step(str(emb.parent), emb.stem, str(pip), tol=1e-12, dense_max_n=0, center=False, normalize_rows=False)
        with h5py.File(pip, "r") as f:
            assert f.attrs["basis"] == basis and "U" not in f and ("V" in f) == (basis == "V")
        assert pip.stat().st_size <= 0.10 * emb.stat().st_size, (pip.stat().st_size, emb.stat().st_size)
        s, attrs = load_spectrum(pip)
        assert s.rank == d and attrs["encoder_id"] == f"e{d}"
        assert rel(qre_features(s, eps=1e-6), dense_qre_features(E, eps=1e-6)) < 1e-10
        specs.append(s)
        Es.append(E)
    q = pair_measures(specs, eps=1e-6)["qre"]
    assert rel(q[0, 1], dense_pairwise_qre(Es[0], Es[1], eps=1e-6)) < 1e-10
    assert rel(q[1, 0], dense_pairwise_qre(Es[1], Es[0], eps=1e-6)) < 1e-10


def test_stored_pip_refuses_changed_or_missing_embeddings(tmp_path):
    from encmap.artifacts.pip import load_spectrum
    from encmap.pipeline.pip import pip_step

    rng = np.random.default_rng(12)
    emb = _emb_file(tmp_path / "emb/m/enc-a.h5", rng.standard_normal((50, 6)))
    pip = tmp_path / "pip/m/enc-a.h5"
    pip_step(str(emb.parent), "enc-a", str(pip), tol=1e-12, dense_max_n=0, center=True, normalize_rows=True)
    before = pip.read_bytes()
    _emb_file(emb, rng.standard_normal((50, 6)))  # re-embedded: other values
    with pytest.raises(EncmapError, match=r"pip/m/enc-a.h5: was factored from other embeddings .*enc-a.h5.*"
                                          r"rerun the pip stage of encoder 'enc-a'"):
        load_spectrum(pip)
    emb.unlink()
    with pytest.raises(EncmapError, match=r"its embeddings file .*enc-a.h5 is missing"):
        load_spectrum(pip)
    assert pip.read_bytes() == before


def test_pip_files_of_the_earlier_format_still_read(tmp_path):
    from encmap.artifacts.pip import load_spectrum
    from encmap.io import write_h5

    s = factor_pip(np.random.default_rng(13).standard_normal((20, 5)))
    write_h5(tmp_path / "old.h5", {"U": s.U, "lam": s.lam}, {"trace": s.trace, "encoder_id": "old",
                                                                     "model": tmp_path.name})
    got, _ = load_spectrum(tmp_path / "old.h5")
    assert np.array_equal(got.U, s.U) and np.array_equal(got.lam, s.lam)


# ---------------------------------------------------------------------------------- spectral summaries


def test_entropy_and_profile_against_dense_eigenvalues():
    """S(ρ_ε) against the dense reference's eigenvalues of ρ_ε; the forward features sum to
    ln n − S(ρ_ε); the profile is ln of the sorted dense eigenvalues at its ranks."""
    from encmap.qre.spectral import profile_ranks, spectral_profile
    from encmap.qre.spectral import von_neumann_entropy as entropy

    rng = np.random.default_rng(4)
    E = rng.standard_normal((80, 12)) * np.arange(1, 13) ** -1.5
    eps = 1e-3
    spec = factor_pip(E)
    rho = (1 - eps) * spec.dense_rho() + eps * np.eye(80) / 80
    assert entropy(spec, eps) == pytest.approx(von_neumann_entropy(rho), rel=1e-10)
    assert entropy(spec, eps) == pytest.approx(math.log(80) - qre_features(spec, eps=eps).sum(), rel=1e-10)
    dense = np.sort(np.linalg.eigvalsh(rho))[::-1]
    ranks = profile_ranks(80)
    assert ranks[0] == 1 and ranks[-1] == 80 and len(ranks) == 16 and np.all(np.diff(ranks) >= 0)
    np.testing.assert_allclose(spectral_profile(spec, eps), np.log(dense[ranks - 1]), rtol=1e-8)
    # Hand values: a rank-2 spectrum (0.75, 0.25) on n = 4 sentences, ε = 0: ln 0.75, ln 0.25,
    # then the floor (the smallest double), at ranks 1, 2, 3 (= round(4^(k/15))), 4.
    two = spectrum_from_arrays(np.eye(4)[:, :2], np.array([0.75, 0.25]))
    assert entropy(two, 0.0) == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    p = spectral_profile(two, 0.0)
    assert p[0] == math.log(0.75) and math.log(0.25) in p and p[-1] == math.log(np.finfo(float).tiny)


def test_spectral_summaries_ignore_the_eigenvectors_and_the_features_do_not():
    """Invariances: rotating the embeddings or permuting the sentences changes no spectrum; a
    permutation moves the per-sentence features with the sentences."""
    from encmap.qre.spectral import spectral_profile, von_neumann_entropy as entropy

    rng = np.random.default_rng(5)
    E = rng.standard_normal((60, 10))
    perm = rng.permutation(60)
    a, b, c = factor_pip(E), factor_pip(E @ ortho_group.rvs(10, random_state=1)), factor_pip(E[perm])
    for other in (b, c):
        np.testing.assert_allclose(spectral_profile(other), spectral_profile(a), rtol=1e-9)
        assert entropy(other) == pytest.approx(entropy(a), rel=1e-12)
    np.testing.assert_allclose(qre_features(c), qre_features(a)[perm], rtol=1e-9)


def test_the_random_eigenvector_null_keeps_the_spectrum_and_draws_haar_eigenvectors():
    from encmap.qre.spectral import random_eigenvectors

    spec = factor_pip(np.random.default_rng(6).standard_normal((50, 8)))
    a, b = random_eigenvectors(spec, 0), random_eigenvectors(spec, 0)
    assert np.array_equal(a.U, b.U) and np.array_equal(a.lam, spec.lam)  # same seed: same draw
    np.testing.assert_allclose(a.U.T @ a.U, np.eye(8), atol=1e-12)
    assert not np.array_equal(a.U, random_eigenvectors(spec, 1).U)


def test_the_null_matches_exact_qre_for_random_eigenvectors_and_not_for_shared_ones():
    """Two encoders whose eigenvectors are already random: their exact QRE lies within the null's
    seed-to-seed spread. Two encoders that share their eigenvectors (different spectra): the null
    puts them far further apart than they are."""
    from encmap.qre.spectral import random_eigenvectors

    n, r = 200, 20
    rng = np.random.default_rng(7)
    lam_a = np.arange(1, r + 1, dtype=float) ** -1.0
    lam_b = np.arange(1, r + 1, dtype=float) ** -2.0
    lam_a, lam_b = lam_a / lam_a.sum(), lam_b / lam_b.sum()

    def spec(U, lam):
        return spectrum_from_arrays(U, lam)

    def orth(seed):
        return np.linalg.qr(np.random.default_rng(seed).standard_normal((n, r)))[0]

    def null(a, b, seeds=range(20)):
        return np.array([pairwise_qre(random_eigenvectors(a, 2 * s), random_eigenvectors(b, 2 * s + 1), eps=1e-3)
                         for s in seeds])

    a, b = spec(orth(1), lam_a), spec(orth(2), lam_b)  # independent random eigenvectors
    real, draws = pairwise_qre(a, b, eps=1e-3), null(a, b)
    assert abs(real - draws.mean()) < 3 * draws.std() + 1e-9, (real, draws.mean(), draws.std())
    U = orth(3)  # the same eigenvectors for both
    a, b = spec(U, lam_a), spec(U, lam_b)
    real, draws = pairwise_qre(a, b, eps=1e-3), null(a, b)
    assert real < 0.2 * draws.min(), (real, draws.min())
    del rng
