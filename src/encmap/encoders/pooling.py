"""Pooling of token states into sentence vectors (pure maths on torch tensors)."""

from __future__ import annotations

import torch

POOLINGS = ("mean", "cls", "max", "last")


def pool(hidden: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """Pool token states of one layer.

    Parameters
    ----------
    hidden : Tensor, shape (b, t, h)
        Token states of one layer.
    mask : Tensor, shape (b, t)
        Attention mask (1 for real tokens, 0 for padding).
    how : {"mean", "cls", "max", "last"}
        ``last`` is the last real token of each sentence (what decoder embedders pool: under causal
        attention only that position has seen the whole sentence), found from the mask, so it is
        right under left padding (last column) and right padding (before the first pad) alike.

    Returns
    -------
    Tensor, shape (b, h)
    """
    if how == "cls":
        return hidden[:, 0]
    if how == "last":
        t = mask.shape[1]
        # Index of the last 1 in each row: t - 1 - (position of the first 1 in the reversed row).
        last = t - 1 - mask.flip(1).to(torch.int64).argmax(1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    if how == "mean":
        # Padding must not dilute the mean: divide by the number of real tokens.
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)
    if how == "max":
        return hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).max(1).values
    raise ValueError(f"unknown pooling {how!r} (use one of {POOLINGS})")
