"""Input validation, in one place.

Every check raises :class:`ValueError` (or a subclass) with a message that names the culprit:
which file, which key, which encoder. Maths modules call these before doing any work.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

#: Encoder and model ids become file names: lower-case, digits, and ``._-`` only.
#: Longest id (model, encoder): a file name with room for an extension on every file system.
MAX_ID = 128
SAFE_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,%d}$" % (MAX_ID - 1))


class EncmapError(ValueError):
    """A user-facing error with a message that names the problem.

    ``refused``: artifact files a reader refused (another encoder's content, made from other
    sentences or other embeddings): the workflow's ledger then never records them as good
    (:mod:`encmap.workflow.integrity`).
    """

    def __init__(self, message: str = "", *, refused: tuple | list = ()):
        super().__init__(message)
        self.refused = tuple(str(f) for f in refused)


def shown(value: str, limit: int = 24) -> str:
    """``value`` as a message quotes it: its repr, cut to ``limit`` characters and its length said
    when longer (a 5,000-digit environment variable is not repeated whole)."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}… ({len(value):,} characters)"


def check_id(value: str, what: str = "id") -> str:
    """Return ``value`` if it is a path-safe id, else raise naming it.

    Parameters
    ----------
    value : str
        Candidate id.
    what : str
        What the id names (for the message), e.g. ``"model 'minilm'"``.
    """
    if not isinstance(value, str) or not SAFE_ID.match(value) or ".." in value:
        raise EncmapError(
            f"{what}: {value!r} is not a path-safe id (use 1-128 characters of a-z, 0-9, '.', "
            "'_', '-', starting with a letter or digit, no '..')"
        )
    return value


def check_unique_ids(ids: list[str], where: str) -> None:
    """Refuse a list of encoder ids naming one twice (rows would pair one encoder's data with
    another's): the error names ``where`` (the file) and the id."""
    seen: set[str] = set()
    for e in ids:
        if e in seen:
            raise EncmapError(f"{where}: encoder {e!r} appears twice (every encoder once)")
        seen.add(e)


def check_score_spread(Y: np.ndarray, ids: list[str], tasks: list[str], source: Any = None) -> None:
    """Refuse scores (m, T) that the regression cannot standardise in double precision: a task
    whose squared deviations from its mean overflow (e.g. a score of 1e200 or ±1.7e308, finite
    alone) gave scikit-learn's raw ValueError. The error names the task, the most extreme
    encoder and, through ``source(encoder, task)``, the file its score came from."""
    for t, task in enumerate(tasks):
        y = Y[:, t]
        have = np.flatnonzero(np.isfinite(y))
        if have.size == 0:
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            mid = float(np.median(y[have]))
            d = y[have] - mid
            ok = bool(np.isfinite(d).all() and np.isfinite(d @ d) and np.isfinite(np.mean(y[have])))
        if not ok:
            i = int(have[np.argmax(np.abs(np.nan_to_num(d, nan=np.inf)))])
            where = source(ids[i], task) if source is not None else None
            raise EncmapError(f"{where + ': ' if where else ''}encoder {ids[i]!r} task {task!r}: score {float(y[i])!r} is too "
                              "far from the others to standardise in double precision (squared deviations overflow); "
                              "give scores on a sane scale")


def unmasked(value: Any, name: str, hint: str = "fill or drop those entries") -> Any:
    """``value`` as plain data: a NumPy masked array (or a list of masked rows) with no entry masked
    is its data; one with masked entries is :class:`EncmapError` naming ``name`` and where they are.

    ``np.asarray`` drops a mask and keeps the values under it, so the maths would use numbers the
    user marked as missing. Which value a missing one stands for is the user's call (the rows are
    sentences: dropping one means dropping it from every encoder compared), so none is guessed."""
    if isinstance(value, (list, tuple)) and any(isinstance(x, np.ma.MaskedArray) for x in value):
        value = np.ma.asarray(value)  # a list of masked rows: np.asarray would drop their masks too
    if not isinstance(value, np.ma.MaskedArray):
        return value
    mask = np.ma.getmaskarray(value)
    if mask.any():
        at = np.argwhere(mask)
        rows = np.unique(at[:, 0]) if mask.ndim else np.zeros(0, int)
        where = (f" in {rows.size} rows, first rows {rows[:5].tolist()}" if mask.ndim == 2 else
                 f" at {at[:5, 0].tolist()}" if mask.ndim == 1 else "")
        k = int(mask.sum())
        raise EncmapError(f"{name}: a masked array with {k} masked value{'s' if k > 1 else ''}{where}; encmap uses "
                          f"every value and does not guess what a masked one stands for: {hint}, and pass a plain array")
    return value.data


def check_embeddings(E: Any, name: str = "embeddings", as_float64: bool = True) -> np.ndarray:
    """Validate an embedding matrix and return it as C-contiguous float64.

    Parameters
    ----------
    E : array_like, shape (n, d)
        Embedding matrix, one row per sentence.
    name : str
        What ``E`` is (encoder id or file), used in error messages.
    as_float64 : bool
        Return a float64 copy (for the maths); False only validates, without the copy.

    Returns
    -------
    ndarray, shape (n, d), float64 (or ``E`` as given when ``as_float64`` is False)
    """
    if type(E).__name__ == "Spectrum" and hasattr(E, "U"):  # a factored PIP where embeddings are expected
        raise EncmapError(f"{name}: a Spectrum (factored PIP) where embeddings (an n x d array) are expected here")
    try:
        A = np.asarray(unmasked(E, name, "drop those rows from every encoder compared (rows are sentences) or fill "
                                "them"))
    except EncmapError:
        raise
    except (ValueError, TypeError) as e:  # a ragged list of rows
        raise EncmapError(f"{name}: not a 2-D (n x d) matrix of numbers: {e}") from None
    if A.ndim != 2:
        raise EncmapError(f"{name}: expected a 2-D (n x d) matrix, got shape {A.shape}")
    if A.shape[0] < 1 or A.shape[1] < 1:
        raise EncmapError(f"{name}: empty embedding matrix of shape {A.shape}")
    if not np.issubdtype(A.dtype, np.number) or np.iscomplexobj(A):
        raise EncmapError(f"{name}: expected real numbers, got dtype {A.dtype}")
    A = np.ascontiguousarray(A, dtype=np.float64) if as_float64 else A
    bad = ~np.isfinite(A)
    if bad.any():
        rows = np.unique(np.nonzero(bad)[0])
        raise EncmapError(
            f"{name}: {int(bad.sum())} non-finite values (NaN/inf) in {rows.size} rows, "
            f"first rows {rows[:5].tolist()}"
        )
    if not np.any(A):
        raise EncmapError(
            f"{name}: all embeddings are zero, so the PIP matrix has trace 0 and no density matrix"
        )
    return A


#: Largest entries that :func:`in_safe_range` leaves as they are: their squares, summed over up
#: to 1e12 entries, stay far from float64's overflow and underflow.
SAFE_RANGE = (1e-100, 1e100)


def in_safe_range(A: np.ndarray) -> np.ndarray:
    """``A`` scaled by a power of two (exact: only the exponents change) when its largest entry is
    outside :data:`SAFE_RANGE`, else ``A`` itself (bit for bit).

    For maths that is invariant to E -> cE (ρ, the QRE features, CKA): squaring 1e200 overflows
    and squaring 1e-170 underflows, so such inputs are brought near 1 before any product.
    """
    k = safe_scale_exponent(A)
    return A if k == 0 else np.ldexp(A, -k)


def safe_scale_exponent(A: np.ndarray) -> int:
    """The k that :func:`in_safe_range` divides ``A`` by 2^k with (0: left as it is)."""
    top = float(np.max(np.abs(A))) if A.size else 0.0
    if top == 0.0 or SAFE_RANGE[0] <= top <= SAFE_RANGE[1]:
        return 0
    return int(np.frexp(top)[1])


def check_real(value: Any, name: str, *, positive: bool = False) -> float:
    """A real number (not a string, not a bool), finite, optionally > 0; else :class:`EncmapError`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise EncmapError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not np.isfinite(value) or (positive and not value > 0):
        raise EncmapError(f"{name} must be a finite number{' > 0' if positive else ''}, got {value!r}")
    return value


def check_real_array(value: Any, name: str) -> np.ndarray:
    """``value`` as an array of real numbers (an array of them as it is; a list becomes float64);
    anything else (objects, strings, booleans, complex, a ragged list) is :class:`EncmapError`
    naming ``name`` and what it holds. Strings of digits are not numbers here, as nowhere else."""
    try:
        value = unmasked(value, name)
        A = np.asarray(value)
    except EncmapError:
        raise
    except (TypeError, ValueError) as e:  # a ragged list
        raise EncmapError(f"{name} must be an array of numbers ({e})") from None
    if A.dtype.kind not in "iuf":
        raise EncmapError(f"{name} must be an array of numbers (int or float), got dtype {A.dtype}")
    return A if isinstance(value, np.ndarray) else A.astype(np.float64)


def check_same_sentences(X: Any, Y: Any, what: str, names: tuple[str, str] = ("X", "Y"),
                         min_rows: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Validate two embedding matrices of the same sentences and return them as float64.

    Parameters
    ----------
    X, Y : array_like, shapes (n, d) and (n, d')
        Row i of both is sentence i.
    what : str
        The measure that compares them (for messages), e.g. ``"CKA"``.
    names : (str, str)
        What X and Y are (for messages), e.g. ``("source", "target")``.
    min_rows : int
        Fewest sentences the measure is defined for.

    Returns
    -------
    X, Y : ndarray, shapes (n, d) and (n, d'), float64, C-contiguous
    """
    A = check_embeddings(X, names[0])
    B = check_embeddings(Y, names[1])
    if A.shape[0] != B.shape[0]:
        raise EncmapError(f"{what} needs the same sentences in both spaces: n = {A.shape[0]} ({names[0]}) "
                          f"vs n = {B.shape[0]} ({names[1]})")
    if A.shape[0] < min_rows:
        raise EncmapError(f"{what} needs at least {min_rows} sentences, got n = {A.shape[0]}")
    return A, B


#: degenerate_reason's tolerance: rank <= 1 when projecting onto the longest row leaves at most
#: this fraction of ‖E‖_F (float32 rounding of a rank-1 matrix leaves ~1e-7).
DEGENERATE_RTOL = 1e-5


def degenerate_reason(E: Any, rtol: float = DEGENERATE_RTOL) -> str | None:
    """Why an embedding matrix carries no information about its sentences, or None.

    Degenerate means rank <= 1: every row is a multiple of one vector (constant across
    sentences being the common case, e.g. CLS pooling of the input embeddings). Then
    ρ = PIP / tr PIP is (close to) a pure state whatever the sentences say.

    Checked in O(n d) without an SVD: project every row onto the longest row ``r``; the matrix
    has rank <= 1 iff that reconstructs it, up to ``rtol`` of ‖E‖_F (float32 rounding).

    Parameters
    ----------
    E : array_like, shape (n, d)
        Finite embeddings, not all zero (see :func:`check_embeddings`).

    Returns
    -------
    str or None
    """
    A = np.asarray(E)
    if A.shape[0] < 2:
        return None
    if not np.any(np.ptp(A, axis=0)):
        return "zero variance across sentences (every sentence has the same vector)"
    # In float64 but a block of rows at a time: no full-size temporary beside the embeddings.
    r = np.asarray(A[np.argmax(np.einsum("ij,ij->i", A, A, dtype=np.float64))], dtype=np.float64)
    total = resid = 0.0
    for start in range(0, A.shape[0], 1024):
        B = np.asarray(A[start:start + 1024], dtype=np.float64)
        total += float(np.einsum("ij,ij->", B, B))
        R = B - np.outer(B @ r / (r @ r), r)
        resid += float(np.einsum("ij,ij->", R, R))
    if np.sqrt(resid) <= rtol * np.sqrt(total):
        return "rank <= 1 (every sentence's vector is a multiple of one vector)"
    return None


def check_eps(eps: float, direction: str = "forward") -> float:
    """Validate the smoothing weight ε for a QRE direction.

    The reverse direction needs ε > 0: S(I/n ‖ ρ) = −ln n − (1/n) Tr ln ρ is +∞ whenever ρ
    has a null space (rank r < n), since ln 0 = −∞ on it; smoothing reinstates that space.
    """
    if direction not in ("forward", "reverse"):
        raise EncmapError(f"direction must be 'forward' or 'reverse', got {direction!r}")
    try:
        eps = float(unmasked(eps, "eps", "give a number"))
    except EncmapError:
        raise
    except (TypeError, ValueError):
        raise EncmapError(f"eps must be a number in [0, 1), got {eps!r}") from None
    if not (0.0 <= eps < 1.0):
        raise EncmapError(f"eps must be in [0, 1), got {eps!r}")
    if direction == "reverse" and eps == 0.0:
        raise EncmapError(
            "reverse QRE needs eps > 0: S(I/n || rho) = -ln n - (1/n) Tr ln rho diverges to +inf "
            "because rho has zero eigenvalues (its null space) and ln 0 = -inf; smoothing "
            "rho_eps = (1-eps) rho + eps I/n makes every eigenvalue >= eps/n"
        )
    return eps


def check_tol(tol: float) -> float:
    """Validate a relative eigenvalue tolerance (0 <= tol < 1)."""
    tol = check_real(tol, "tol")
    if not (0.0 <= tol < 1.0):
        raise EncmapError(f"tol must be in [0, 1), got {tol!r}")
    return tol


def check_density(rho: Any, name: str = "rho", atol: float = 1e-10) -> np.ndarray:
    """Validate a dense density matrix: square, symmetric, unit trace, PSD (to ``atol``).

    Returns
    -------
    ndarray, shape (n, n), float64
    """
    R = np.asarray(rho, dtype=np.float64)
    if R.ndim != 2 or R.shape[0] != R.shape[1]:
        raise EncmapError(f"{name}: expected a square matrix, got shape {R.shape}")
    if not np.all(np.isfinite(R)):
        raise EncmapError(f"{name}: contains NaN or inf")
    if not np.allclose(R, R.T, atol=atol):
        raise EncmapError(f"{name}: not symmetric")
    if abs(np.trace(R) - 1.0) > 1e-8:
        raise EncmapError(f"{name}: trace is {np.trace(R)!r}, expected 1")
    if np.linalg.eigvalsh(R).min() < -1e-8:
        raise EncmapError(f"{name}: not positive semi-definite")
    return R


def max_perplexity(m: int) -> float:
    """Largest perplexity openTSNE can honour for m points: it builds a 3 x perplexity
    nearest-neighbour graph, which needs 3 x perplexity <= m - 1 other points."""
    return (m - 1) / 3.0


def check_perplexity(perplexity: float, m: int, what: str = "map.perplexity") -> float:
    """Return ``perplexity`` if it suits a map of ``m`` points, else raise naming the bound."""
    if m < 4:
        raise EncmapError(f"a map needs at least 4 encoders, got m = {m}")
    if not perplexity > 0:
        raise EncmapError(f"{what} = {perplexity} must be > 0")
    if perplexity > max_perplexity(m):
        raise EncmapError(
            f"{what} = {perplexity} is too large for a map of m = {m} encoders: openTSNE uses the "
            f"3 x perplexity nearest neighbours of each point, so perplexity must be <= (m - 1)/3 = "
            f"{max_perplexity(m):.2f} (rule of thumb: 5-10 for ~50 encoders, 30-50 for ~1,000)")
    return float(perplexity)


#: The params the number of encoders on the map bounds: key -> (the largest value m encoders
#: allow, the fewest encoders a value needs). ``encmap check`` holds each to every encoder params yield.
MAP_COUNTS = {
    "map.perplexity": (max_perplexity, lambda p: math.ceil(3 * p + 1)),
    "map.neighbours": (lambda m: m - 1, lambda k: k + 1),
    "map.trustworthiness_k": (lambda m: (m - 1) // 2, lambda k: 2 * k + 1),  # scikit-learn: k < m/2
    "similarity.subset.neighbours": (lambda m: m - 1, lambda k: k + 1),
}


def fit_to_mapped(key: str, value: float, m: int, left_off: list[str]) -> tuple[float, str | None]:
    """``value`` of ``key`` (:data:`MAP_COUNTS`) for a map of ``m`` encoders, and a warning when it was lowered.

    ``encmap check`` held the value to every encoder params yield; the run can map fewer (failed
    models under ``on_error: skip``, degenerate encoders: ``left_off``), which nobody can know
    before the work. Then a value too large for the m left is lowered to the largest they allow,
    and the warning says so: a run of a thousand encoders is not lost at its last stages for a
    handful of failed checkpoints. With nothing left off the value is returned as it is (its own
    check refuses it, as before).
    """
    allowed, needs = MAP_COUNTS[key]
    if not left_off or value <= allowed(m):
        return value, None
    new = allowed(m)  # an int for the integer keys, a float for the perplexity
    return new, (f"{key} = {value} needs {needs(value)} encoders on the map, but {m} are left: the run left off "
                 f"{len(left_off)} ({few(left_off)}: failed models or degenerate encoders); using {new:.4g} instead")


def few(names: list[str], k: int = 3) -> str:
    """The first ``k`` of ``names`` for a message, and how many more there are."""
    return ", ".join(names[:k]) + (f" and {len(names) - k} more" if len(names) > k else "")


def lineage_cycle(parent: dict[str, str]) -> list[str] | None:
    """A cycle among ``meta.derived_from`` links (``model -> parent model``), or None.

    Returns the chain that closes the cycle (``[a, b, a]``), starting from the first model (in
    sorted order) whose ancestry loops, so the same params always name the same cycle.
    """
    for start in sorted(parent):
        seen = [start]
        while seen[-1] in parent:
            nxt = parent[seen[-1]]
            if nxt in seen:
                return seen[seen.index(nxt):] + [nxt]
            seen.append(nxt)
    return None


def check_writable(root: str | Path, tops: tuple[str, ...] = ("data", "results")) -> None:
    """Refuse, naming it, an artifact folder the pipeline cannot write (read-only, immutable).

    Checked before any job starts: otherwise the first job to write there ends in a traceback,
    after the jobs before it have run. Folders only (a few thousand stat calls at 1,101 models).
    """
    import os

    root = Path(root)
    for top in tops:
        for dirpath, dirnames, _ in os.walk(root / top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            if not os.access(dirpath, os.W_OK | os.X_OK):
                raise EncmapError(f"{Path(dirpath).relative_to(root)}: not writable (read-only or immutable), so "
                                  "the jobs that write there would fail; make it writable (chmod u+w, chattr -i) "
                                  "and run again")


def host_memory_available() -> int | None:
    """Bytes this process may still take on the host: the kernel's ``MemAvailable``, lowered to what
    a cgroup (v2: a container, a SLURM job) has left under its limit; None where neither is known."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        cg = Path("/sys/fs/cgroup")
        limit = (cg / "memory.max").read_text().strip()
        if limit != "max":
            left = int(limit) - int((cg / "memory.current").read_text())
            avail = left if avail is None else min(avail, left)
    except (OSError, ValueError):
        pass
    return avail


def check_host_memory(model: str, n: int, widths: list[int], device: str = "cpu",
                      available: int | None = None) -> int:
    """Refuse, before the pass, a model whose variants cannot all be held on the host.

    One pass fills one (n, width) float32 array per variant (every layer x pooling, the output and
    its truncations), all held until they are written: ``4 n sum(widths)`` bytes. A model with
    ``layers: all`` on a large set can need more than the host has (a 7 B decoder's 33 states x
    4,096 x 100,000 sentences: 54 GB for one pooling); swapping or the kernel's OOM killer would
    then end the job mid-pass, hours in. The checks' block temporaries are not counted.

    Parameters
    ----------
    model : str
    n : int
        Sentences.
    widths : list of int
        Width of every variant's array.
    device : str
        Named in the message (where the model runs).
    available : int, optional
        Bytes available; default :func:`host_memory_available` (unknown: no check).

    Returns
    -------
    int
        The bytes needed.
    """
    need = 4 * int(n) * int(sum(widths))
    available = host_memory_available() if available is None else available
    if available is not None and need > available:
        raise EncmapError(
            f"model {model!r}: its {len(widths)} variants of {n:,} sentences need {_bytes_text(need)} of host "
            f"memory (float32, one array each until written) but {_bytes_text(available)} is available; "
            "request fewer layers or poolings (layers, pooling in params.yaml), fewer sentences, or a host with more "
            f"memory (the model runs on {device})")
    return need


def _bytes_text(b: float) -> str:
    """``b`` bytes in GiB, MiB or KiB, whichever reads best."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b / 1024:.1f} KiB"
