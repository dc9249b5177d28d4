"""The public API: what docs/api.md names imports from the top-level package, and its examples run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import encmap

API_DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def _doc() -> str:
    return API_DOC.read_text()


def test_the_page_names_exactly_the_top_level_api():
    named = set(re.findall(r"^\| `encmap\.(\w+)", _doc(), flags=re.M))
    assert named == set(encmap.__all__)
    for name in named:
        assert getattr(encmap, name) is not None
        assert name in dir(encmap)


def test_every_example_runs_and_imports_nothing_below_the_top_level(capsys):
    blocks = re.findall(r"```python\n(.*?)```", _doc(), flags=re.S)
    assert len(blocks) >= 5
    code = "\n".join(blocks)
    assert not re.search(r"(from|import) encmap\.", code)  # only the promised paths
    namespace: dict = {}
    exec(compile(code, str(API_DOC), "exec"), namespace)
    out = capsys.readouterr().out
    assert "pairwise QRE needs the same sentences: n = 500 vs n = 100" in out
    M = namespace["M"]
    assert M.shape == (3, 3) and np.isfinite(M).all()


def test_the_api_agrees_with_its_independent_dense_references():
    # the dense O(n³) textbook formulas (eigendecompositions of the n x n matrices), not the same code
    from encmap.qre.reference import dense_pairwise_qre, dense_qre_features

    rng = np.random.default_rng(1)
    E, F = rng.normal(size=(60, 5)), rng.normal(size=(60, 7))
    np.testing.assert_allclose(encmap.qre_features(E, eps=1e-3), dense_qre_features(E, eps=1e-3), atol=1e-10)
    assert np.isclose(encmap.pairwise_qre(E, F, eps=1e-3), dense_pairwise_qre(E, F, eps=1e-3), atol=1e-9)


def test_import_encmap_stays_light():
    # every pipeline job and the command line import encmap: the maths loads on first use only
    code = "import sys, encmap; print('scipy' in sys.modules, 'encmap.qre.features' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# Issue 41: inputs the maths must scale or refuse. Each value is checked against an independent
# reference: the dense density matrices of the unscaled embeddings (scipy.linalg.logm).

def _dense_qre(E, F, eps):
    from scipy.linalg import logm

    def rho(X):
        R = X @ X.T
        R = R / np.trace(R)
        return (1 - eps) * R + eps * np.eye(len(R)) / len(R)

    a, b = rho(E), rho(F)
    return float(np.trace(a @ (logm(a) - logm(b))).real)


def _sample(seed=3, n=12, d=4):
    return np.random.default_rng(seed).standard_normal((n, d))


import pytest  # noqa: E402


#: (scale, refused): refused exactly where ||c E||_F^2 itself lies outside float64's normal range
#: (|E0|_F^2 ~ 30 here, so c^2 |E0|^2 overflows past c ~ 1e153 and underflows below c ~ 1e-155).
SCALES = [(1e200, True), (1e150, False), (1e100, False), (1e-150, False), (1e-170, True), (1e-300, True),
          (2.0 ** -1070, True)]


@pytest.mark.parametrize("c, refused", SCALES)
def test_the_maths_is_invariant_to_the_scale_of_the_embeddings(c, refused):
    """Old: E x 1e200 gave rank 0 with an overflow warning, qre_to_base -1.38e-5 (a relative entropy is
    >= 0), pairwise_qre 16.30 (true 10.24), cka NaN; 1e-170 and denormals were refused as 'trace 0'
    or 'constant embedding'. Now every value equals the unscaled one wherever ||E||_F^2 fits in a
    float64, and only where it does not is the input refused, naming that reason."""
    E0, F = _sample(3), _sample(4, d=6)
    eps = 1e-3
    X = c * E0  # what the user hands over (denormals keep fewer bits than E0: it is E up to rounding)
    E = np.ldexp(X, -np.frexp(np.abs(X).max())[1])  # the same matrix, exactly, brought near 1
    # Independent of the code under test: the exponent of ||X||_F^2 from frexp of the scaled copy.
    k = np.frexp(np.abs(X).max())[1]
    log2_trace = np.log2(float((E * E).sum())) + 2 * float(k)
    assert (not -1022 <= log2_trace < 1024) == refused  # the table above says what float64 holds
    assert encmap.cka(X, E) == pytest.approx(1.0, abs=1e-12)
    assert encmap.cka(X, F) == pytest.approx(encmap.cka(E, F), rel=1e-10)
    assert encmap.cka(X, F, kernel="rbf") == pytest.approx(encmap.cka(E, F, kernel="rbf"), rel=1e-10)
    if refused:
        with pytest.raises(encmap.EncmapError, match="outside float64's range.*divide the embeddings"):
            encmap.factor_pip(X)
        return
    spec = encmap.factor_pip(X)
    assert spec.rank == 4
    ref = encmap.factor_pip(E)
    np.testing.assert_allclose(spec.lam, ref.lam, rtol=1e-12)
    assert encmap.qre_to_base(X, eps=eps) == pytest.approx(_dense_qre(E, np.eye(12), eps), rel=1e-9)
    assert encmap.pairwise_qre(X, F, eps=eps) == pytest.approx(_dense_qre(E, F, eps), rel=1e-9)
    np.testing.assert_allclose(encmap.qre_features(X, eps=eps), encmap.qre_features(E, eps=eps), rtol=1e-9)


def _spec(**kw):
    U, _ = np.linalg.qr(_sample(5, 10, 3))
    base = dict(U=U, lam=np.array([0.5, 0.3, 0.2]), trace=2.0)
    return encmap.Spectrum(**(base | kw))


@pytest.mark.parametrize("bad, why", [
    (dict(lam=np.array([1.0, 0.6, 0.4])), "sum to 1"),
    (dict(lam=np.array([0.7, 0.5, -0.2])), "positive and finite"),
    (dict(lam=np.array([0.5, np.nan, 0.5])), "positive and finite"),
    (dict(U=_sample(5, 10, 3)), "not orthonormal"),
    (dict(U=np.full((10, 3), np.nan)), "NaN"),
    (dict(U=np.eye(10)[:, :2]), r"U \(10, 2\) and eigenvalues \(3,\) do not match"),
    (dict(trace=0.0), "trace"),
    (dict(trace=float("inf")), "trace"),
])
def test_a_hand_built_spectrum_is_checked_on_construction(bad, why):
    """Old: eigenvalues summing to 2, a non-orthonormal U, negative or NaN eigenvalues gave numbers."""
    _spec()  # a good one is accepted
    with pytest.raises(encmap.EncmapError, match=why):
        _spec(**bad)


def test_a_spectrum_is_accepted_by_cka_as_docs_api_says():
    """Old: cka(Spectrum, ...) said 'expected a 2-D (n x d) matrix, got shape ()'. A Spectrum's
    CKA is its embeddings' (the same kernel up to scale)."""
    E, F = _sample(3), _sample(4, d=6)
    S = encmap.factor_pip(E)
    for kernel in ("linear", "rbf"):
        assert encmap.cka(S, F, kernel=kernel) == pytest.approx(encmap.cka(E, F, kernel=kernel), rel=1e-10)
    assert encmap.linear_cka(S, encmap.factor_pip(F), debiased=True) == pytest.approx(
        encmap.linear_cka(E, F, debiased=True), rel=1e-10)


@pytest.mark.parametrize("call, why", [
    (lambda: encmap.qre_features([[1.0, 2.0], [3.0]]), "not a 2-D"),
    (lambda: encmap.cka([[1.0, 2.0], [3.0]], _sample()), "not a 2-D"),
    (lambda: encmap.cka(_sample(), _sample(), kernel="rbf", threshold="1"), "threshold must be a number"),
    (lambda: encmap.factor_pip(_sample(), tol="x"), "tol"),
    (lambda: encmap.pairwise_qre(_spec(), encmap.factor_pip(_sample(1, 9, 3))), "same sentences|n ="),
])
def test_bad_input_is_an_encmap_error(call, why):
    """Old: raw ValueError / TypeError / AttributeError, while docs/api.md promises EncmapError."""
    with pytest.raises(encmap.EncmapError, match=why):
        call()


def test_a_spectrum_built_from_python_lists_works_as_one_from_arrays():
    """Old: encmap.Spectrum(U.tolist(), lam.tolist(), trace) was accepted, then qre_to_base raised a raw
    AttributeError. api.md: bad input is an EncmapError; lists are input like any other."""
    E, F = _sample(3), _sample(4, d=6)
    s = encmap.factor_pip(E)
    listed = encmap.Spectrum(s.U.tolist(), s.lam.tolist(), float(s.trace))
    assert encmap.qre_to_base(listed, eps=1e-3) == encmap.qre_to_base(s, eps=1e-3)
    assert encmap.pairwise_qre(listed, F, eps=1e-3) == encmap.pairwise_qre(s, F, eps=1e-3)
    np.testing.assert_array_equal(encmap.qre_features(listed, eps=1e-3), encmap.qre_features(s, eps=1e-3))
    with pytest.raises(encmap.EncmapError, match="Spectrum: U must be an array of numbers"):
        encmap.Spectrum([["a"] * s.rank] * s.n, s.lam.tolist(), float(s.trace))
    with pytest.raises(encmap.EncmapError, match="eigenvalues must be positive"):
        encmap.Spectrum(s.U.tolist(), [-1.0] + s.lam.tolist()[1:], float(s.trace))


def test_a_spectrum_of_objects_strings_or_a_trace_that_is_no_number_is_an_encmap_error():
    """Old: object or string arrays, and a Decimal, None or list trace, were raw TypeErrors (and
    strings of digits in a list were read as numbers)."""
    from decimal import Decimal

    s = encmap.factor_pip(_sample(3))
    U, lam, tr = s.U, s.lam, float(s.trace)
    real = r"must be an array of numbers \(int or float\), got dtype"
    for kw, why in [
            (dict(U=U.astype(object)), "Spectrum: U " + real + " object"),
            (dict(lam=lam.astype(object)), "Spectrum: lam " + real + " object"),
            (dict(lam=lam.astype(str)), "Spectrum: lam " + real + " <U"),
            (dict(lam=[str(v) for v in lam]), "Spectrum: lam " + real + " <U"),
            (dict(lam=[Decimal(str(v)) for v in lam]), r"Spectrum: lam must be an array of numbers"),
            (dict(lam=lam + 0j), "Spectrum: lam " + real + " complex128"),
            (dict(U=U > 0), "Spectrum: U " + real + " bool"),
            (dict(V=np.zeros((6, s.rank), dtype=object)), r"Spectrum: V must be an array of numbers"),
            (dict(trace=Decimal("2.5")), r"Spectrum: trace \(tr M = \|\|E\|\|_F\^2\) must be a number, got Decimal"),
            (dict(trace=None), r"Spectrum: trace .* must be a number, got None"),
            (dict(trace=[2.0]), r"Spectrum: trace .* must be a number, got \[2.0\]"),
            (dict(trace="2.0"), r"Spectrum: trace .* must be a number, got '2.0'")]:
        with pytest.raises(encmap.EncmapError, match=why):
            encmap.Spectrum(**(dict(U=U, lam=lam, trace=tr) | kw))
    assert encmap.Spectrum(U, lam, np.float32(tr)).trace == pytest.approx(tr)  # numpy's scalars are numbers


# Issue 70 item 8: masked arrays, empty input, a non-finite eigenvalue.

def _masked(seed=3, n=12, d=4):
    """A masked embedding matrix whose masked entries hold a value that would change every result."""
    E = _sample(seed, n, d)
    M = np.ma.masked_array(E.copy(), mask=np.zeros(E.shape, bool))
    M.data[[2, 7], 1], M.mask[[2, 7], 1] = 1e6, True
    return M


@pytest.mark.parametrize("call, name", [
    (lambda M, F: encmap.qre_features(M), "embeddings"),
    (lambda M, F: encmap.qre_to_base(M, direction="reverse"), "embeddings"),
    (lambda M, F: encmap.factor_pip(M), "embeddings"),
    (lambda M, F: encmap.pairwise_qre(F, M), "E_b"),
    (lambda M, F: encmap.pairwise_qre_matrix([F, M]), "encoder 1"),
    (lambda M, F: encmap.pairwise_qre_matrix(np.ma.stack([M, M])), "encoder 0"),
    (lambda M, F: encmap.cka(M, F), "X"),
    (lambda M, F: encmap.cka(F, M, kernel="rbf"), "Y"),
    (lambda M, F: encmap.linear_cka(F, M, debiased=True), "Y"),
    (lambda M, F: encmap.qre_features(list(M)), "embeddings"),  # a list of masked rows
    (lambda M, F: encmap.cka(tuple(M), F), "X"),
])
def test_a_masked_array_is_refused_not_read_through_its_mask(call, name):
    """Old: np.asarray dropped the mask, so the maths used the values under it (here 1e6) silently."""
    M, F = _masked(), _sample(4, d=6)
    with pytest.raises(encmap.EncmapError, match=rf"^{name}: a masked array with 2 masked values in 2 rows, first "
                                                 r"rows \[2, 7\]; .*does not guess"):
        call(M, F)


def test_a_masked_array_with_nothing_masked_is_its_data_and_a_spectrum_refuses_masked_parts():
    E, F = _sample(3), _sample(4, d=6)
    plain = np.ma.masked_array(E)
    np.testing.assert_array_equal(encmap.qre_features(plain), encmap.qre_features(E))
    assert encmap.cka(plain, F) == encmap.cka(E, F)
    s = encmap.factor_pip(E)
    for kw, name in [(dict(U=np.ma.masked_array(s.U, mask=np.eye(*s.U.shape, dtype=bool))), "U"),
                     (dict(lam=np.ma.masked_array(s.lam, mask=[0, 1, 0, 0])), "lam"),
                     (dict(V=np.ma.masked_array(s.V, mask=s.V > 0)), "V")]:
        with pytest.raises(encmap.EncmapError, match=rf"Spectrum: {name}: a masked array"):
            encmap.Spectrum(**(dict(U=s.U, lam=s.lam, trace=s.trace, V=s.V) | kw))
    with pytest.raises(encmap.EncmapError, match="eps: a masked array with 1 masked value; .*give a number"):
        encmap.qre_features(E, eps=np.ma.masked)


@pytest.mark.parametrize("call, why", [
    (lambda U, lam: encmap.Spectrum(np.zeros((0, 3)), lam, 2.0), r"U \(0, 3\) has no rows"),  # old: ZeroDivisionError later
    (lambda U, lam: encmap.qre_features(encmap.Spectrum(U[:0], lam, 2.0)), r"U \(0, 3\) has no rows"),
    (lambda U, lam: encmap.Spectrum(np.broadcast_to(0.0, (0, 3)), lam, 2.0), "has no rows"),
    (lambda U, lam: encmap.Spectrum(U[:2], lam, 2.0), r"U \(2, 3\) has 2 rows .* for 3 eigenvalues"),
    (lambda U, lam: encmap.Spectrum(U, lam, 2.0, V=np.zeros((0, 3))), r"V \(0, 3\) must be d x r .*d >= r"),
    (lambda U, lam: encmap.pairwise_qre_matrix([]), "no encoder given"),  # old: an empty (0, 0) matrix
    (lambda U, lam: encmap.pairwise_qre_matrix(iter(())), "no encoder given"),
    (lambda U, lam: encmap.pairwise_qre(U[:0], U[:0]), r"E_a: empty embedding matrix of shape \(0, 3\)"),
    (lambda U, lam: encmap.cka(U[:0], U[:0]), r"X: empty embedding matrix"),
    (lambda U, lam: encmap.qre_to_base([]), r"expected a 2-D \(n x d\) matrix, got shape \(0,\)"),
])
def test_empty_input_is_an_encmap_error_everywhere(call, why):
    """Old: Spectrum(U) with 0 rows was accepted (an empty U has zero strides, taken for the rank-only
    stand-in) and qre_features, qre_to_base, pairwise_qre of it raised a raw ZeroDivisionError."""
    U, _ = np.linalg.qr(_sample(5, 10, 3))
    with pytest.raises(encmap.EncmapError, match=why):
        call(U, np.array([0.5, 0.3, 0.2]))


@pytest.mark.parametrize("lam, why", [
    ([np.inf, 0.5, 0.5], r"lam\[0\] = inf is not finite"),  # old: "... got min 0.5"
    ([0.5, -np.inf, 0.5], r"lam\[1\] = -inf is not finite"),
    ([0.5, 0.5, np.nan], r"lam\[2\] = nan is not a number"),
    ([0.7, 0.5, -0.2], r"lam\[2\] = -0.2 is not positive"),
    ([1.0, 0.0, 0.0], r"lam\[1\] = 0.0 is not positive \(2 such values\)"),
])
def test_a_bad_eigenvalue_is_named_with_what_is_wrong(lam, why):
    with pytest.raises(encmap.EncmapError, match=r"Spectrum: eigenvalues must be positive and finite: " + why):
        _spec(lam=np.array(lam))
