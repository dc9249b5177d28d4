"""A server's answer is checked, never taken on trust: what is cached and mapped is what was asked
for, and a refusal says what was wrong without quoting the server.

:func:`_parse` reads an embeddings response's fields from its body and :func:`_vectors` checks
them. Vectors are placed by the ``index`` each one carries, whatever order they come in; a
response of another length, indices out of range or repeated, vectors of another width or not
finite, a token count below one per input are refused, and nothing from a refused answer is kept.
An answer larger than the vectors asked for can take (:data:`BYTES_PER_NUMBER`) is refused by the
backend as it arrives. An error the server answers with becomes a refusal holding a status code
and a fixed reason (:func:`_refusal`; a 4xx names the first input it refuses, :func:`_first_bad`);
the server's own words go to stderr only (:func:`~encmap.encoders.served.keys.said`).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from ...validation import EncmapError
from .keys import said

#: Bytes an answer may hold once decoded, per number it should carry (an embeddings response spends
#: ~20 characters per float in JSON), and the width assumed when none is known yet: a small gzip
#: answer that inflates to hundreds of MB is refused as it arrives, before it is held.
BYTES_PER_NUMBER, WIDEST = 48, 16384


def _parse(where: str, body: bytes, ctype: str, key: str | None) -> SimpleNamespace:
    """An embeddings response's fields (``data`` items with ``index`` and ``embedding``, ``usage``,
    ``model``) from its body, or a refusal saying what it was instead (quoting the body, the key
    redacted before it is cut)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        said(f"{where} ({ctype.split(';')[0].strip()[:40] or 'no content type'})", body.decode("utf-8", "replace"), key)
        raise EncmapError(f"{where} is not an embeddings response: not JSON (its words are in the job's log); "
                          "refused (nothing from it is kept)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        said(where, body.decode("utf-8", "replace"), key)
        raise EncmapError(f"{where} is not an embeddings response: no 'data' list (its words are in the job's log); "
                          "refused (nothing from it is kept)")
    items = [SimpleNamespace(index=d.get("index"), embedding=d.get("embedding")) if isinstance(d, dict)
             else SimpleNamespace(index=None, embedding=None) for d in doc["data"]]
    usage = doc.get("usage")
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    model = doc.get("model")
    return SimpleNamespace(data=items, usage=SimpleNamespace(prompt_tokens=tokens),  # checked in _vectors
                           model=model if isinstance(model, str) else None)


def _vectors(model: str, response, count: int, width: int | None, first: int | None,
             key: str | None, texts: list[str] | None = None) -> tuple[np.ndarray, int | None]:
    """The response's vectors (count, d) in input order, checked; its tokens (None if not reported).
    ``first``: the index of the batch's first input (None: the drift probes); ``key``: redacted
    from the server's words on stderr; ``texts``: the inputs (a count below one token per
    non-empty input is refused)."""
    data = list(response.data)
    what = "the drift probes" if first is None else f"inputs {first}-{first + count - 1}"
    where = f"model {model!r}: the endpoint's response to {what}"
    if not all(isinstance(d.index, int) and not isinstance(d.index, bool) for d in data):
        raise EncmapError(f"{where} has items without an integer index; refused (nothing from it is kept)")
    idx = [d.index for d in data]
    if len(data) != count or sorted(idx) != list(range(count)):
        raise EncmapError(f"{where} holds {len(data)} embeddings with indices {sorted(idx)[:8]}..., expected one per "
                          f"input, 0-{count - 1}; refused (nothing from it is kept)")
    rows = [None] * count
    for i, d in zip(idx, data):
        rows[i] = _embedding(where, i, getattr(d, "embedding", None), key)
    widths = {len(r) for r in rows}
    if len(widths) != 1 or (width is not None and widths != {width}):
        raise EncmapError(f"{where} has vectors of width {sorted(widths)}, expected {width if width else 'one width'}; "
                          "refused (nothing from it is kept)")
    E = np.asarray(rows, dtype=np.float64).astype(np.float32)  # checked in the dtype it is stored in
    if not np.all(np.isfinite(E)):
        raise EncmapError(f"{where} holds NaN, inf or values beyond float32 (|x| > 3.4e38); refused (nothing from it "
                          "is kept)")
    if first is None and not np.all(np.linalg.norm(E, axis=1) > 0):  # a probe must be able to fingerprint the model
        raise EncmapError(f"{where} holds an all-zero vector; refused (a probe answer never becomes the reference)")
    usage = getattr(response, "usage", None)
    tokens = getattr(usage, "prompt_tokens", None) if usage is not None else None
    least = sum(1 for t in texts if t) if texts is not None else 1
    if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < least):
        # Added to the entry's spend, a negative count would switch its budget off, and 0 for texts
        # that are not empty would stop it counting: both are impossible, as is a count not an integer.
        said(f"{where}: usage.prompt_tokens", repr(tokens), key)
        what = (f"{tokens}, fewer than its {least} non-empty inputs" if isinstance(tokens, int)
                and not isinstance(tokens, bool) else f"a {type(tokens).__name__}")
        raise EncmapError(f"{where} reports usage.prompt_tokens {what}, not a number of tokens these inputs can "
                          "take: the server's error; refused (nothing from it is kept; its tokens are counted as "
                          "estimated)")
    return E, tokens


def _embedding(where: str, i: int, value, key: str | None) -> list | np.ndarray:
    """One item's ``embedding``: a list of numbers, or base64 of little-endian float32 (what the
    protocol's ``encoding_format: base64`` returns, and some servers send unasked)."""
    if isinstance(value, str):
        import base64
        import binascii

        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raw = b"\0"  # not base64: refused below
        if len(raw) % 4:
            raise EncmapError(f"{where}: item {i}'s embedding is a string that is not base64 of float32 values; "
                              "refused (nothing from it is kept)")
        return np.frombuffer(raw, dtype="<f4")
    if not isinstance(value, (list, tuple)) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                       for x in value):
        said(f"{where}: item {i}'s embedding", repr(value), key)
        raise EncmapError(f"{where}: item {i}'s embedding is {type(value).__name__}, "
                          "not a list of numbers; refused (nothing from it is kept)")
    return value


def _refusal(model: str, spec: dict, e, first: int | str, key: str | None = None, *,
             retries: int) -> EncmapError:
    """An API error as an EncmapError naming the model, the status and what to do: a status code and
    a fixed reason; the server's own words go to stderr only (:func:`said`). ``retries``: the
    client's, spent when no answer came."""
    import openai

    status = getattr(e, "status_code", None)
    at = first if isinstance(first, str) else f"input {first}"
    said(f"model {model!r}: {type(e).__name__} from {spec['base_url']} at {at}", getattr(e, "message", None) or str(e),
         key)
    if isinstance(e, (openai.AuthenticationError, openai.PermissionDeniedError)):
        return EncmapError(f"model {model!r}: the endpoint {spec['base_url']} refused the key in ${spec['api_key_env']} "
                           f"(HTTP {status}); nothing was written (the server's words are in the job's log)")
    if isinstance(e, openai.APIStatusError) and 300 <= (status or 0) < 400:
        return EncmapError(f"model {model!r}: HTTP {status} from {spec['base_url']} at {at}: a redirect, which encmap "
                           "does not follow; set base_url to the address it points to (in the job's log); not retried")
    if isinstance(e, openai.APIStatusError):
        return EncmapError(f"model {model!r}: HTTP {status} from {spec['base_url']} at {at}: the server refused the "
                           "request (its words are in the job's log)")
    cause = e.__cause__ or e.__context__
    return EncmapError(f"model {model!r}: no answer from {spec['base_url']} after {retries} retries "
                       f"({type(e).__name__}{f' / {type(cause).__name__}' if cause else ''})")


def _first_bad(call, texts: list[str], first: int):
    """Index of the first input a 4xx refuses, by halving the batch (the error it gets)."""
    import openai

    lo, hi, err = 0, len(texts), None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            call(texts[lo:mid])
            lo = mid  # the first half passes: the offender is in the second
        except openai.APIStatusError as e:
            hi, err = mid, e
    return first + lo, err
