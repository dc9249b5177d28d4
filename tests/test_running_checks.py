"""The variants' checks proven on the device (encmap.encoders.running_checks).

The proof is checked against the host's own checks and against the textbook least residual
(an SVD); the route through a transformer pass must give the host's verdicts and bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from encmap.encoders.running_checks import MARGIN, RunningChecks
from encmap.validation import DEGENERATE_RTOL, EncmapError, check_embeddings, degenerate_reason

RNG = np.random.default_rng(7)
N, D = 300, 12


def _cases() -> dict[str, np.ndarray]:
    """Matrices (n, d) float32 of every kind the host's checks tell apart, and near its line."""
    v = RNG.standard_normal(D)
    line = np.outer(RNG.standard_normal(N), v)
    out = {"gaussian": RNG.standard_normal((N, D)), "constant": np.tile(v, (N, 1)), "rank-1": line,
           "zero": np.zeros((N, D)), "one zero row": np.vstack([np.zeros((1, D)), RNG.standard_normal((N - 1, D))])}
    for eps in (1e-1, 1e-3, 1e-5, 1e-6, 3e-7):  # rank 1 plus noise: from plainly sound to float32's rounding
        out[f"rank-1 + {eps:g}"] = line + eps * RNG.standard_normal((N, D))
    out["anisotropic"] = 5.0 + 0.05 * RNG.standard_normal((N, D))  # cos ~0.9999 between rows, as deep layers give
    nan = RNG.standard_normal((N, D))
    nan[17, 3] = np.nan
    inf = RNG.standard_normal((N, D))
    inf[200, 0] = -np.inf
    out |= {"nan": nan, "inf": inf}
    return {k: np.asarray(a, dtype=np.float32) for k, a in out.items()}


CASES = _cases()


def _host_verdict(E: np.ndarray) -> str | None:
    """What embed_model's host check says: an error's message, a degenerate reason, or None."""
    try:
        check_embeddings(E, "e", as_float64=False)
    except EncmapError as e:
        return str(e)
    return degenerate_reason(E)


def _run(arrays: dict[str, np.ndarray], batches: list[np.ndarray]) -> RunningChecks:
    """Every matrix side by side, fed to the checks in the given batches of rows."""
    side = torch.from_numpy(np.concatenate(list(arrays.values()), axis=1))
    checks = RunningChecks({k: a.shape[1] for k, a in arrays.items()}, "cpu")
    for idx in batches:
        checks.add(side[torch.from_numpy(idx)])
    return checks


def _batches(n: int, size: int, seed: int) -> list[np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    return [order[i:i + size] for i in range(0, n, size)]


@pytest.mark.parametrize("size", [1, 16, 64, N])
def test_a_variant_proven_sound_is_sound_to_the_host_and_plain_ones_are_proven(size):
    """Whatever the batches (one row each to the whole matrix), nothing the host would refuse or
    call degenerate is proven, and every plainly sound matrix is: the fast path is the usual one."""
    proven = _run(CASES, _batches(N, size, seed=size)).proven()
    for key, E in CASES.items():
        if proven[key]:
            assert _host_verdict(E) is None, key
    # The bound sees two rows, so it proves a matrix whose residual is above ~n MARGIN rtol² of its
    # sum of squares: here 3e-4; rank 1 plus 1e-3 noise (1e-6) is left to the host.
    plain = ("gaussian", "one zero row", "rank-1 + 0.1", "anisotropic")
    assert [k for k in plain if not proven[k]] == []
    # The near-line cases the host still calls sound are left to it, not guessed.
    assert not proven["rank-1 + 3e-07"] and not proven["rank-1"] and not proven["constant"]
    assert not any(proven[k] for k in ("zero", "nan", "inf"))


def test_the_bound_is_below_the_least_residual_of_any_line():
    """q* never exceeds the textbook least residual of projecting every row onto one line,
    Σσ² − σ₁² (SVD): the proof's inequality, checked on matrices from sound to rank 1."""
    for key in ("gaussian", "rank-1 + 0.1", "rank-1 + 0.001", "rank-1 + 1e-05", "anisotropic", "one zero row"):
        E = CASES[key].astype(np.float64)
        checks = _run({key: CASES[key]}, _batches(N, 32, seed=1))
        s = np.linalg.svd(E, compute_uv=False)
        least = float(np.sum(s**2) - s[0] ** 2)
        q, total = float(checks.q[0]), float(checks.total[0])
        assert 0 < q <= least * (1 + 1e-9), key
        assert total == pytest.approx(float(np.sum(E * E)), rel=1e-12)
    # Hand-checkable: rows (1, 0) and (0, 2): a = (0, 2), b = (1, 0) at 90 degrees, q = min(4, 1) * 1.
    checks = _run({"x": np.array([[1, 0], [0, 2]], dtype=np.float32)}, [np.array([0, 1])])
    assert float(checks.q[0]) == 1.0 and float(checks.total[0]) == 5.0
    assert MARGIN * DEGENERATE_RTOL**2 * 5.0 < 1.0 and checks.proven() == {"x": True}
    # The shorter of the two rows bounds it: a = (0, 2) first, then b = (10, 0). Any line leaves at
    # least 4 (the line along b leaves exactly a's 4), so q = min(4, 100) * 1 = 4, not 100.
    checks = _run({"x": np.array([[0, 2], [10, 0]], dtype=np.float32)}, [np.array([0]), np.array([1])])
    assert float(checks.q[0]) == 4.0 and float(checks.total[0]) == 104.0


def test_an_update_that_fails_keeps_nothing():
    """Out of memory halfway through an update, a batch retried later must count once."""
    checks = _run({"g": CASES["gaussian"]}, [np.arange(10)])
    before = (checks.total.clone(), checks.q.clone())
    with pytest.raises(ValueError, match="width"):
        checks.add(torch.zeros(3, D + 1))
    assert torch.equal(checks.total, before[0]) and torch.equal(checks.q, before[1])


def _faulty_pool(real, fault: str):
    """Pooling with faults planted: CLS constant (zero variance), max rank 1 (each row a multiple
    of one vector), or max with a NaN in each batch's first row; mean as it is."""
    def pool(hidden, mask, how):
        x = real(hidden, mask, how)
        if how == "cls":
            return torch.ones_like(x)
        if how == "max" and fault == "rank-1":
            return x[:, :1] * torch.linspace(1.0, 2.0, x.shape[1], device=x.device)
        if how == "max" and fault == "nan":
            x = x.clone()
            x[0, 1] = float("nan")
        return x
    return pool


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_pass_checked_on_the_device_gives_the_hosts_verdicts_and_bytes(tiny_bert, monkeypatch, device):
    """A tiny BERT's layer x pooling variants, once checked on the device and once on the host,
    with faults planted in the pooling: the same arrays, the same degenerate verdicts, the same
    refusal of a NaN (its count and rows); only the sound variants proven on the device."""
    from encmap.encoders import pooling
    from encmap.encoders.backends import transformer
    from encmap.encoders.embed import embed_model

    spec = {"backend": "transformers", "source": f"path:{tiny_bert}", "revision": None, "layers": [1, 2],
            "pooling": ["mean", "cls", "max"], "init": "pretrained", "max_seq_length": 64,
            "batch_size": 3, "prompt": "", "seed": 0, "dtype": "float32", "output": False, "dims": []}
    texts = ["the city by the river", "a king of the world", "the music of the night was art", "water", "a b",
             "people read the book", "the war was long and the night was cold"]
    real = pooling.pool
    runs: dict[str, dict] = {"device": {}, "host": {}}
    for where, run in runs.items():
        monkeypatch.setattr(transformer, "CHECKS_ON_DEVICE", (torch.device(device).type,) if where == "device" else ())
        monkeypatch.setattr(pooling, "pool", _faulty_pool(real, "rank-1"))
        run["dropped"] = embed_model("tiny", spec, texts, device, degenerate="drop")
        monkeypatch.setattr(pooling, "pool", _faulty_pool(real, "nan"))
        with pytest.raises(EncmapError) as refused:
            embed_model("tiny", spec, texts, device, degenerate="drop")
        run["refusal"] = str(refused.value)
    dev, host = runs["device"]["dropped"], runs["host"]["dropped"]
    assert dev.degenerate == host.degenerate
    assert sorted(host.degenerate) == ["tiny__l01-cls", "tiny__l01-max", "tiny__l02-cls", "tiny__l02-max"]
    assert "zero variance" in host.degenerate["tiny__l01-cls"] and "rank <= 1" in host.degenerate["tiny__l01-max"]
    assert runs["device"]["refusal"] == runs["host"]["refusal"]
    assert "encoder 'tiny__l01-max': 3 non-finite values (NaN/inf) in 3 rows" in runs["host"]["refusal"]
    for v in host.variants:
        assert dev.arrays[v.id].tobytes() == host.arrays[v.id].tobytes(), v.id
    assert host.proven == frozenset() and dev.proven == {"tiny__l01-mean", "tiny__l02-mean"}
