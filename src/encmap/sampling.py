"""Seeded samples of rows (sentences, task items): the one sampling rule every stage shares."""

from __future__ import annotations

import numpy as np


def sample_rows(n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of a seeded sample of min(size, n) of n rows, without replacement.

    Parameters
    ----------
    n : int
        Rows to draw from.
    size : int
        Rows wanted; all n (in order) when size >= n.
    rng : numpy.random.Generator
        The stream to draw from (it advances even when every row is taken, so a sequence of
        samples from one stream does not depend on whether an earlier one took everything).

    Returns
    -------
    ndarray, shape (min(size, n),), int, ascending
    """
    return np.sort(rng.choice(n, size=min(size, n), replace=False))
