"""Choice of the torch device: cuda > mps > cpu unless the user names one."""

from __future__ import annotations

import torch

from .validation import EncmapError


def resolve_device(requested: str = "auto") -> str:
    """Return the device to run on.

    Parameters
    ----------
    requested : {"auto", "cuda", "mps", "cpu"} or a torch device string such as "cuda:1"
    """
    if requested == "auto":
        if torch.cuda.is_available():
            return "cuda"
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return "mps"
        return "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise EncmapError(f"embed.device is {requested!r} but torch sees no CUDA device")
    if requested == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise EncmapError("embed.device is 'mps' but MPS is not available")
    return requested
