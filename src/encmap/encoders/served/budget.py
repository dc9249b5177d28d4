"""An entry's ``max_tokens`` holds across every call of it, in every process: its embed and evaluate
jobs run side by side, and checked apart both would pass a budget one of them filled.

Tokens used are summed from the responses' ``usage`` (provenance and log; the backend refuses a
count that is not an integer >= 0). With ``max_tokens``, the texts still to send are estimated
(:data:`CHARS_PER_TOKEN` characters per token, rounded up) and refused before anything is sent
when the entry's spend, the estimates held by its calls running now and this estimate exceed it
(:func:`spend`: checked and held in one step across processes); a call killed after sending
leaves what it sent in its hold, counted as spent by the next call.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ...validation import EncmapError
from .cache import endpoint

#: Characters per token in the budget's estimate (OpenAI's rule of thumb for English).
CHARS_PER_TOKEN = 4


def estimate_tokens(texts: list[str]) -> int:
    """Tokens of ``texts`` at :data:`CHARS_PER_TOKEN` characters per token (each rounded up)."""
    return sum(max(1, math.ceil(len(t) / CHARS_PER_TOKEN)) for t in texts)


def _budget_key(spec: dict) -> str:
    return json.dumps([endpoint(spec), spec["model"], spec["revision"], spec["dimensions"]])


def tokens_spent(spec: dict, ledger: Path) -> int:
    """Tokens spent so far on an entry's vectors (reported by the endpoint, else estimated)."""
    try:
        count = json.loads(ledger.read_text()).get(_budget_key(spec), 0) if ledger.is_file() else 0
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:  # a negative count: no budget at all
            raise ValueError(f"the count {count!r:.40} is not a number of tokens")
        return count
    except (ValueError, OSError, AttributeError) as e:
        raise EncmapError(f"{ledger}: the tokens spent per API entry cannot be read ({e}); move it aside to "
                          "start the count again") from None


def _held_tokens(folder: Path, prefix: str) -> tuple[int, int]:
    """Tokens that running calls of an entry hold (:func:`spend`: each hold's ``need``), and those
    that calls which died had sent (each hold's ``sent``, estimated as the requests went out): a
    holder that died is dropped, what it sent counted as spent. Call under the ledger's lock."""
    from ...device import try_lock

    held = dead = 0
    for path in folder.glob(f"{prefix}-*.held"):
        fd = try_lock(path)
        try:
            need, sent = ([int(x) for x in path.read_text().split()] + [0, 0])[:2]
        except (ValueError, OSError):  # a foreign file counts as 0
            need = sent = 0
        if fd is not None:  # nobody holds it: its call ended without settling (killed)
            path.unlink(missing_ok=True)
            os.close(fd)
            dead += max(0, sent)
            continue
        held += max(0, need)
    return held, dead


@contextmanager
def spend(model: str, spec: dict, ledger: Path, need: int | None, count: int) -> Iterator[list[int]]:
    """The entry's budget for one call: check ``need`` (estimated tokens of ``count`` texts and the
    probes; None: no budget) against its spend and what calls running now hold, and hold it, in one
    step under the ledger's lock; yields a one-item list the call sets to the tokens it used, recorded
    on exit as the hold is dropped. The embed and evaluate jobs of one entry run side by side, in
    other processes: checked apart, both passed a budget one of them filled.

    A hold is a file in ``<ledger>.held/`` under an exclusive ``flock`` for as long as the call
    runs: the kernel releases it however the process ends, so a killed call holds nothing.
    """
    from filelock import FileLock

    from ...device import try_lock

    lock, mine, fd = FileLock(str(ledger) + ".lock"), None, None
    used = _Hold()
    if need is not None:
        folder = ledger.with_name(ledger.name + ".held")
        folder.mkdir(parents=True, exist_ok=True)
        prefix = hashlib.sha256(_budget_key(spec).encode()).hexdigest()[:16]
        with lock:
            held, dead = _held_tokens(folder, prefix)
            if dead:  # calls killed after sending: what they sent may be billed
                _add_spent(spec, ledger, dead)
            spent = tokens_spent(spec, ledger)
            if spent + held + need > spec["max_tokens"]:
                running = f" and {held:,} tokens held by calls of this entry running now" if held else ""
                raise EncmapError(f"model {model!r}: about {need:,} tokens to send for {count:,} texts not in the "
                                  f"cache and the drift probes ({CHARS_PER_TOKEN} characters per token), with "
                                  f"{spent:,} already spent on this entry by earlier calls{running}, over its "
                                  f"max_tokens {spec['max_tokens']:,}; nothing was sent")
            mine = folder / f"{prefix}-{uuid.uuid4().hex}.held"
            fd = try_lock(mine)
            used.start(fd, need)
    try:
        yield used
    finally:
        if used[0] or mine is not None:
            _settle(spec, ledger, lock, used[0], mine, fd)


def _settle(spec: dict, ledger: Path, lock, tokens: int, hold: Path | None, fd: int | None) -> None:
    """Add ``tokens`` to the entry's count and drop its hold in one step under ``lock`` (never
    counted twice, nor not at all, by a call checking meanwhile)."""
    ledger.parent.mkdir(parents=True, exist_ok=True)
    with lock:
        if tokens:
            _add_spent(spec, ledger, tokens)
        if hold is not None:
            hold.unlink(missing_ok=True)
            os.close(fd)


def _add_spent(spec: dict, ledger: Path, tokens: int) -> None:
    """Add ``tokens`` to the entry's count in ``ledger``. Call under the ledger's lock."""
    from ...io import replace_shared_text

    counts = json.loads(ledger.read_text()) if ledger.is_file() else {}
    counts[_budget_key(spec)] = int(counts.get(_budget_key(spec), 0)) + int(tokens)
    replace_shared_text(ledger, json.dumps(counts, sort_keys=True))


class _Hold(list):
    """What :func:`spend` yields: ``[tokens the call used]``, set as it ends; :meth:`sent` keeps the
    tokens of the requests sent so far in the call's hold file (``<need> <sent>``), so that a call
    killed after sending leaves them to be counted (:func:`_held_tokens`)."""

    def __init__(self):
        super().__init__([0])
        self.fd, self.need, self.total, self.lock = None, 0, 0, threading.Lock()

    def start(self, fd: int, need: int) -> None:
        self.fd, self.need = fd, need
        os.write(fd, f"{need} 0".encode())

    def sent(self, tokens: int) -> None:
        with self.lock:
            self.total += tokens
            if self.fd is not None:
                text = f"{self.need} {self.total}".encode()
                os.pwrite(self.fd, text.ljust(40), 0)  # one write in place, never shorter than before
