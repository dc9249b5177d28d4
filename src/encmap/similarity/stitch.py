"""Stitching: maps trained from one encoder's embedding space to another's, and how well they fit.

Pure maths: arrays in, arrays and numbers out, explicit ``random_state``; no I/O.

A stitch f: R^d -> R^d' is fitted on training rows (sentences) of a source X (n x d) and a
target Y (n x d') and judged on held-out rows. Stitches: affine least squares (float64
``lstsq``, never an explicit inverse), ridge with the penalty chosen by cross-validation,
orthogonal Procrustes (a rotation/reflection of centred, zero-padded spaces, no scaling), and
MLPs of depth 0-6 (torch, seeded, early stopping on a validation split). Controls: the mean
estimator (the *training* rows' mean: centring on the evaluation rows' own mean would make the
baseline an oracle) and an affine stitch from a random Gaussian source of the same shape.
R² is 1 - SSE/SST over samples, per target dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validation import EncmapError, check_same_sentences

METHODS = ("affine", "ridge", "procrustes", "mlp", "mean", "random-source")
#: A target dimension whose SST is at most this share of the largest is constant (R² undefined).
CONSTANT_DIM_RTOL = 1e-9


@dataclass(frozen=True)
class Split:
    """Row indices of a seeded train / validation / test split of n sentences."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


def split_rows(n: int, *, val: float = 0.1, test: float = 0.2, random_state: int = 0) -> Split:
    """A seeded permutation of range(n) cut into train / validation / test (sorted within each)."""
    if not (0 < test < 1 and 0 <= val < 1 and val + test < 1):
        raise EncmapError(f"split fractions val = {val}, test = {test} must be in [0, 1) and sum below 1")
    perm = np.random.default_rng(random_state).permutation(n)
    n_test, n_val = int(round(n * test)), int(round(n * val))
    if n - n_test - n_val < 2 or n_test < 2:
        raise EncmapError(f"n = {n} sentences are too few for this split")
    return Split(np.sort(perm[n_test + n_val:]), np.sort(perm[n_test:n_test + n_val]), np.sort(perm[:n_test]))


def fit_affine(X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares A (d, d'), b (d',) minimising ||X A + 1 bᵀ - Y||_F (LAPACK gelsy, float64)."""
    import scipy.linalg

    X1 = np.hstack([X, np.ones((X.shape[0], 1))])
    # gelsy: complete orthogonal factorisation (QR with column pivoting), the minimum-norm
    # solution like gelsd's SVD but ~8x faster with many right-hand sides (stacked targets).
    coef, *_ = scipy.linalg.lstsq(X1, Y, lapack_driver="gelsy", check_finite=False)
    return coef[:-1], coef[-1]


def fit_procrustes(X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Orthogonal R on centred, zero-padded spaces: predict (X - μ_X) R + μ_Y, then drop padding.

    Returns (R (k, k) with k = max(d, d'), μ_X (d,), μ_Y (d',)).
    """
    from scipy.linalg import orthogonal_procrustes

    k = max(X.shape[1], Y.shape[1])
    mx, my = X.mean(axis=0), Y.mean(axis=0)
    R, _ = orthogonal_procrustes(_pad(X - mx, k), _pad(Y - my, k))
    return R, mx, my


def _pad(A: np.ndarray, k: int) -> np.ndarray:
    return np.hstack([A, np.zeros((A.shape[0], k - A.shape[1]))]) if A.shape[1] < k else A


def fit_mlp(X: np.ndarray, Y: np.ndarray, Xv: np.ndarray, Yv: np.ndarray, *, depth: int, random_state: int = 0,
            max_epochs: int = 2000, patience: int = 50, lr: float = 1e-2, batch_size: int = 256,
            device: str = "cpu", dtype: str = "float64"):
    """An MLP stitch: ``depth`` hidden layers of width max(d, d') with ReLU, then a linear layer.

    Depth 0 is a single affine layer. Adam on MSE, mini-batches in a seeded order; training stops
    when the validation MSE has not improved for ``patience`` epochs, and the best weights are
    kept. ``dtype``: float64, or float32 (GPU speed; the linear stitches stay in float64).
    Returns a function ndarray (k, d) -> ndarray (k, d') (float64).
    """
    import torch

    if not 0 <= depth <= 6:
        raise EncmapError(f"MLP depth {depth} must be in 0..6")
    if dtype not in ("float32", "float64"):
        raise EncmapError(f"MLP dtype {dtype!r}: choose float32 or float64")
    dt = getattr(torch, dtype)
    torch.manual_seed(random_state)
    d, e = X.shape[1], Y.shape[1]
    width = max(d, e)
    layers: list = []
    for i in range(depth):
        layers += [torch.nn.Linear(d if i == 0 else width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width if depth else d, e))
    net = torch.nn.Sequential(*layers).to(device=device, dtype=dt)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    t = {k: torch.as_tensor(v, dtype=dt, device=device) for k, v in (("X", X), ("Y", Y), ("Xv", Xv), ("Yv", Yv))}
    gen = torch.Generator().manual_seed(random_state)
    best, best_state, stale = float("inf"), None, 0
    for _ in range(max_epochs):
        net.train()
        for idx in torch.randperm(len(X), generator=gen).split(batch_size):
            idx = idx.to(device)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(t["X"][idx]), t["Y"][idx])
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            v = float(torch.nn.functional.mse_loss(net(t["Xv"]), t["Yv"]))
        if v < best - 1e-12:
            best, stale = v, 0
            best_state = {k: p.detach().clone() for k, p in net.state_dict().items()}
        else:
            stale += 1
            if stale >= patience:
                break
    if best_state is None:  # every validation loss NaN or infinite: training diverged from the start
        raise EncmapError(f"MLP stitch (depth {depth}, lr {lr}, {dtype}): the validation loss was never finite "
                          f"(last {v}): training diverged; lower mlp.lr, use dtype float64, or check the "
                          "embeddings' scale")
    net.load_state_dict(best_state)

    def predict(A: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return net(torch.as_tensor(A, dtype=dt, device=device)).cpu().numpy().astype(np.float64)

    return predict


def scores(Y: np.ndarray, P: np.ndarray, *, k: int = 10) -> dict:
    """How well predictions P match targets Y (both (n, d')) on held-out rows.

    Returns MSE, MAE, R² (mean over target dimensions of 1 - SSE_j/SST_j, SST about the rows' own
    mean, leaving out constant dimensions (``constant_dims``: SST_j <= 1e-9 max SST); and
    variance-weighted: 1 - ΣSSE/ΣSST), the mean cosine between predicted and true rows,
    and top-k neighbour overlap: the mean share of each row's k nearest rows (cosine) that the
    predicted space and the true space have in common.
    """
    Y, P = np.asarray(Y, dtype=np.float64), np.asarray(P, dtype=np.float64)
    err = Y - P
    sse = (err ** 2).sum(axis=0)
    sst = ((Y - Y.mean(axis=0)) ** 2).sum(axis=0)
    # R² of a constant target dimension is undefined (some models have dead output dimensions,
    # whose SST is rounding noise); such dimensions are left out of the per-dimension mean.
    ok = sst > CONSTANT_DIM_RTOL * sst.max()
    cos = np.einsum("ij,ij->i", Y, P) / np.maximum(np.linalg.norm(Y, axis=1) * np.linalg.norm(P, axis=1), 1e-300)
    return {"mse": float((err ** 2).mean()), "mae": float(np.abs(err).mean()),
            "r2": float(np.mean(1.0 - sse[ok] / sst[ok])), "r2_weighted": float(1.0 - sse.sum() / sst.sum()),
            "constant_dims": int((~ok).sum()),
            "cosine": float(cos.mean()), f"knn{k}_overlap": knn_overlap(Y, P, k)}


def knn_overlap(A: np.ndarray, B: np.ndarray, k: int = 10) -> float:
    """Mean |N_k^A(i) ∩ N_k^B(i)| / k over rows, neighbours by cosine among the same rows."""
    def nn(Z):
        Zn = Z / np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 1e-300)
        S = Zn @ Zn.T
        np.fill_diagonal(S, -np.inf)
        return np.argsort(-S, axis=1, kind="stable")[:, :k]

    if not 1 <= k < len(A):
        raise EncmapError(f"top-k neighbour overlap needs 1 <= k < rows = {len(A)}, got k = {k}")
    a, b = nn(A), nn(B)
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b)]))


#: Methods that fit each target column on its own: several targets can be stacked into one fit.
COLUMNWISE = ("affine", "ridge", "random-source", "mean")


def fit_predict(X: np.ndarray, Y: np.ndarray, method: str, split: Split, *, depth: int = 0, alphas=None,
                random_state: int = 0, device: str = "cpu", mlp: dict | None = None) -> tuple[np.ndarray, dict]:
    """Fit one stitch from X to Y on ``split.train`` (MLPs stop early on ``split.val``); predict ``split.test``.

    Parameters
    ----------
    X, Y : ndarray, shapes (n, d), (n, d'), rows = the same sentences. For a :data:`COLUMNWISE`
        method Y may stack several targets side by side: their fits are the separate fits.
    method : one of :data:`METHODS`
    depth : MLP depth (``method="mlp"``); alphas : ridge penalties tried by cross-validation
    mlp : training settings passed to :func:`fit_mlp` (``max_epochs``, ``patience``, ``lr``,
        ``batch_size``, ``dtype``)

    Returns
    -------
    P : ndarray, shape (len(split.test), d'), predictions of the test rows
    extra : dict, ``coef`` (A, (d, d')) of the affine fits, ``alpha`` (d',) chosen by ridge per
        target dimension
    """
    X, Y = check_same_sentences(X, Y, "stitching", names=("source", "target"))
    tr, va, te = split.train, split.val, split.test
    extra: dict = {}
    if method == "affine" or method == "random-source":
        if method == "random-source":
            # Its own stream (seed [random_state, 1]): never the same numbers as data drawn with random_state.
            X = np.random.default_rng([random_state, 1]).standard_normal(X.shape)
        A, b = fit_affine(X[tr], Y[tr])
        P = X[te] @ A + b
        extra["coef"] = A
    elif method == "ridge":
        from sklearn.linear_model import RidgeCV

        # Efficient leave-one-out CV (GCV) over the penalties, one per target dimension (each is
        # its own ridge problem); one SVD of the training rows serves every penalty and target.
        model = RidgeCV(alphas=np.logspace(-4, 6, 21) if alphas is None else alphas, gcv_mode="svd",
                        alpha_per_target=True).fit(X[tr], Y[tr])
        P = model.predict(X[te])
        extra["alpha"] = np.broadcast_to(model.alpha_, (Y.shape[1],))
    elif method == "procrustes":
        R, mx, my = fit_procrustes(X[tr], Y[tr])
        P = (_pad(X[te] - mx, R.shape[0]) @ R)[:, :Y.shape[1]] + my
    elif method == "mlp":
        if len(va) < 2:
            raise EncmapError("MLP stitches need a validation split (val > 0) for early stopping")
        f = fit_mlp(X[tr], Y[tr], X[va], Y[va], depth=depth, random_state=random_state, device=device,
                    **(mlp or {}))
        P = f(X[te])
    elif method == "mean":
        P = np.broadcast_to(Y[tr].mean(axis=0), (len(te), Y.shape[1]))
    else:
        raise EncmapError(f"stitch method {method!r}: choose one of {list(METHODS)}")
    return P, extra


def judged(Y_test: np.ndarray, P: np.ndarray, extra: dict, *, k: int = 10) -> dict:
    """:func:`scores` of one stitch's test predictions, plus ``singular_values`` of an affine A and
    the median ridge ``alpha``."""
    out = scores(Y_test, P, k=k)
    if "coef" in extra:
        out["singular_values"] = np.linalg.svd(extra["coef"], compute_uv=False).tolist()
    if "alpha" in extra:
        out["alpha"] = float(np.median(extra["alpha"]))  # the typical penalty over target dimensions
    return out


def stitch(X: np.ndarray, Y: np.ndarray, method: str, split: Split, *, depth: int = 0, alphas=None,
           k: int = 10, random_state: int = 0, device: str = "cpu", mlp: dict | None = None) -> dict:
    """Fit one stitch from source X to target Y on ``split.train`` and score it on ``split.test``.

    Parameters: see :func:`fit_predict`; ``k``: neighbours for the top-k neighbour overlap.

    Returns
    -------
    dict : :func:`scores` of the test rows, plus ``singular_values`` of A for affine stitches
        and ``alpha`` for ridge.
    """
    P, extra = fit_predict(X, Y, method, split, depth=depth, alphas=alphas, random_state=random_state,
                           device=device, mlp=mlp)
    return judged(np.asarray(Y, dtype=np.float64)[split.test], P, extra, k=k)
