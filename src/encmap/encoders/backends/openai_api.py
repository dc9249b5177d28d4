"""Encoders behind an OpenAI-compatible embeddings endpoint (backend ``openai``): OpenAI, Azure
OpenAI and the servers people run (text-embeddings-inference, vLLM, infinity, Ollama, llama.cpp).

``POST {base_url}/embeddings`` through the official ``openai`` client: its retries and backoff
(429, 408, 409 and 5xx, ``Retry-After`` honoured) run the protocol; this module adds what a
paying user of a map needs:

- **A cache on disk** (:class:`ResponseCache`, SQLite in ``$ENCMAP_CACHE/api``): every returned
  vector under (model, revision, dimensions, text), written batch by batch as responses arrive,
  so an interrupted run resumes without paying twice and a rerun sends only what it lacks.
- **Refusals that name the problem**: a key variable that is not set, not a variable's name (a key
  written there), or a key the HTTP layer cannot send (a stray CR, LF or space, a character beyond
  Latin-1): refused before any request, the key never repeated; a ``base_url`` that holds a key;
  a 401/403 (the key's variable named); any other 4xx (the index of the first offending input,
  found by halving the failing batch); a redirect (not followed, not retried); a response of
  another length, indices out of range or repeated, vectors of another width or not finite, a
  token count below one per input; an answer larger than the vectors asked for can take (refused
  as it arrives, gzip inflated or not); an answer not whole within :data:`REQUEST_DEADLINE_S`, one
  deadline for a request and all its retries. A refusal holds a status code and a fixed reason:
  whatever a server says goes, normalised and :func:`redact`-ed of the key, to stderr only (the
  terminal, the job's log: :func:`said`), never into a refusal that reaches failure records,
  placeholder artifacts or DVC's cache. Nothing is cached from a refused response, and the embed
  step writes nothing for a model that fails.
- **Order**: vectors are placed by the ``index`` each one carries, whatever order they come in.
- **Cost**: tokens used are summed from the responses' ``usage`` (provenance and log; a count
  that is not an integer ≥ 0 is refused); with ``max_tokens`` the texts still to send are
  estimated (4 characters per token, rounded up) and refused before anything is sent when the
  entry's spend, the estimates held by its calls running now and this estimate exceed it
  (:func:`spend`: checked and held in one step across processes); a call killed after sending
  leaves what it sent in its hold, counted as spent by the next call. A cache write-locked by
  another process is refused before anything is sent; answers it cannot take once sent are used
  all the same, and written at the run's end if it can.
- **Drift** (:func:`check_drift`): a served model can change under the same name. The
  embeddings of :data:`PROBES` are fetched fresh with every run that sends anything, fingerprinted (sha256 of the unit
  vectors rounded to :data:`FINGERPRINT_DIGITS` decimals) and compared with the first ones
  seen for the same (model, revision, dimensions): a cosine distance above :data:`DRIFT_TOL`
  on any probe is reported plainly (the vectors decide, not the hash: rounding boundaries flip
  under a server's own float noise). A changed model whose old vectors the cache holds is refused:
  an encoder of old and new vectors would be neither.

The key is read from the environment variable ``api_key_env`` names, at call time, and never
reaches params, an artifact, a log or the page. What makes an API encoder stale is its
``model``, ``revision``, ``dimensions`` and truncations; ``base_url``, ``api_key_env``,
``batch_size``, ``concurrency``, ``rate_limit`` and ``max_tokens`` change how it is fetched,
not what (:data:`encmap.encoders.variants.TRANSPORT_KEYS`: left out of its params slice).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import sqlite3
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import numpy as np

from ...validation import EncmapError
from ..checkpoints import cache_dir
from ..result import EmbeddingResult, output_only

log = logging.getLogger(__name__)

#: Retries of one request by the client (exponential backoff, ``Retry-After`` honoured).
MAX_RETRIES = 8
#: Seconds the client waits for any one read (connect, a chunk of the answer).
TIMEOUT_S = 120.0
#: Seconds one request's whole answer may take to arrive, from connecting to the body's last
#: byte (a per-read timeout never trips on a server that sends a byte now and then); each retry
#: of the client's has its own, and a request past it is not retried.
REQUEST_DEADLINE_S = 300.0
#: Seconds a job waits for another job's lock on the vectors' cache (two jobs opening a fresh
#: cache together: SQLite's switch to WAL fails at once, without its busy timeout, while another
#: connection writes) before it is refused as locked, never as unreadable.
LOCK_WAIT_S = 60.0
#: Characters of the API key in a row that are redacted wherever they appear, in any case and
#: spelling (:func:`redact`). A piece of 8 characters of a random key occurs by chance in an
#: ordinary message about once in 10^12 places (62^8 ~ 2e14), so nothing but the key is hidden;
#: a piece left behind has at most 7 characters (42 bits of a key with 128 or more random bits, no
#: foothold for guessing the rest). The public prefix of OpenAI's project keys is 8 and is hidden too.
KEY_PIECE = 8
#: Characters of a server's words quoted on the terminal and in the job's log (never in an artifact).
QUOTE_CHARS = 2000
#: Bytes an answer may hold once decoded, per number it should carry (an embeddings response spends
#: ~20 characters per float in JSON), and the width assumed when none is known yet: a small gzip
#: answer that inflates to hundreds of MB is refused as it arrives, before it is held.
BYTES_PER_NUMBER, WIDEST = 48, 16384
#: Characters per token in the budget's estimate (OpenAI's rule of thumb for English).
CHARS_PER_TOKEN = 4
#: Fixed probe sentences whose embeddings fingerprint the served model.
PROBES = ("The cat sat on the mat.",
          "Interest rates rose again in the third quarter.",
          "She played the violin at her grandmother's funeral.",
          "Photosynthesis converts light energy into chemical energy.",
          "The match was cancelled because of heavy rain.",
          "A quick brown fox jumps over the lazy dog.",
          "He could not remember where he had parked the car.",
          "The committee approved the new budget on Tuesday.")
#: Decimals of the unit probe vectors hashed into the fingerprint.
FINGERPRINT_DIGITS = 3
#: Largest cosine distance between a probe's embeddings that is not drift (a server's float noise
#: is ~1e-7; a changed model moves probes by far more than 1e-4).
DRIFT_TOL = 1e-4


def api_key(model: str, spec: dict) -> str:
    """The key, from the environment variable the entry names; an error naming the variable, or
    saying (never repeating it) that ``base_url`` holds a key."""
    from ..variants import base_url_problem

    problem = base_url_problem(spec["base_url"], spec["api_key_env"])  # the entry may come from no params file
    if problem:
        raise EncmapError(f"model {model!r}: base_url {problem}")
    var = spec["api_key_env"]
    check_key_env(model, var)
    key = os.environ.get(var)
    if not key:
        raise EncmapError(f"model {model!r}: the environment variable {var} (api_key_env) that holds its API key is "
                          "not set; export it before the run")
    check_key_form(model, var, key)
    check_key_not_in_url(model, spec, key)
    return key


def check_key_env(model: str, var: str) -> None:
    """``api_key_env`` must be a variable's name; a key written there is refused without repeating it."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", var or ""):
        raise EncmapError(f"model {model!r}: api_key_env is not the name of an environment variable (letters, digits "
                          "and _ only; it may be the key itself, which belongs in that variable: it is not repeated "
                          "here); e.g. api_key_env: OPENAI_API_KEY")


def check_key_form(model: str, var: str, key: str) -> None:
    """A key the HTTP layer cannot send (a stray CR, LF, space or tab from a CRLF .env or a bad paste,
    a character beyond Latin-1 such as an ellipsis) is refused here, naming its variable, before any
    request: the client refuses it locally, and the retries then read as a server that never answered."""
    problems = [what for what, bad in (("a carriage return (a CRLF .env file?)", "\r" in key),
                                       ("a line break", "\n" in key),
                                       ("white space", any(c in key for c in " \t\v\f")),
                                       ("a character an HTTP header cannot carry (beyond Latin-1, e.g. …)",
                                        any(ord(c) > 255 for c in key)),
                                       ("a control character", any(ord(c) < 32 or 127 <= ord(c) < 160
                                                                   for c in key if c not in "\r\n\t\v\f")))
                if bad]
    if problems:
        raise EncmapError(f"model {model!r}: the API key in ${var} is malformed: it holds {', '.join(problems)}; "
                          "fix the variable (the key is not repeated here); nothing was sent")


def check_key_not_in_url(model: str, spec: dict, key: str) -> None:
    """Refuse a ``base_url`` that holds the key (any of the spellings :func:`redact` hides, in its
    path too), without repeating either: the URL reaches every artifact's provenance."""
    if redact(spec["base_url"], key) != spec["base_url"]:
        raise EncmapError(f"model {model!r}: base_url holds the API key (the value of ${spec['api_key_env']}); a "
                          "key belongs only in the environment variable api_key_env names, never in the URL, which "
                          "reaches every artifact's provenance, DVC's cache and the logs (it is not repeated here)")


def _key_spellings(key: str) -> set[str]:
    """Every run of :data:`KEY_PIECE` characters of ``key`` as a server may echo it, lower-cased:
    as is, percent-encoded (each byte, or as ``quote`` / ``quote_plus`` leave it), and the base64
    characters (standard and url-safe) that the run alone decides at each of the 3 alignments a
    longer encoded string (``Basic base64(user:key)``) may give it."""
    import base64
    from urllib.parse import quote, quote_plus

    out: set[str] = set()
    for i in range(len(key) - KEY_PIECE + 1):
        w = key[i:i + KEY_PIECE]
        b = w.encode("utf-8", "surrogatepass")
        out |= {w, quote(w, safe=""), quote_plus(w, safe=""), "".join(f"%{x:02x}" for x in b)}
        for o in range(3):  # after o other bytes: characters ceil(8o/6) to floor(8(o+len)/6) are the run's alone
            core = base64.b64encode(bytes(o) + b).decode()[-(-8 * o // 6):8 * (o + len(b)) // 6]
            out |= {core, core.translate(str.maketrans("+/", "-_"))}
    return {x.lower() for x in out}


def redact(text: str, key: str | None) -> str:
    """``text`` (a server's words, an exception's) with the API key and any bearer token replaced:
    a server may echo the Authorization header ("Incorrect API key provided: Bearer sk-..."), or the
    bare key cut short, upper-cased, percent- or base64-encoded, and a refusal's text goes to logs,
    failure records and DVC's cache. Every run of :data:`KEY_PIECE` or more of the key's characters,
    in any of those spellings and any case, is replaced; a key shorter than that (a local server's
    "EMPTY") only as written."""
    if key:
        text = text.replace(key, "[redacted]")
    if key and len(key) >= KEY_PIECE:
        # Lower-cased character by character, so that positions stay those of text.
        low = "".join(c.lower() if len(c.lower()) == 1 else c for c in text)
        hidden = bytearray(len(text))
        for form in _key_spellings(key):
            at = low.find(form)
            while at >= 0:
                hidden[at:at + len(form)] = b"\1" * len(form)
                at = low.find(form, at + 1)
        if any(hidden):
            text = "".join("[redacted]" if m.group()[0] else text[m.start():m.end()]
                           for m in re.finditer(rb"\x01+|\x00+", bytes(hidden)))
    return re.sub(r"(?i)\bBearer\s+[^\s\"',;]+", "Bearer [redacted]", text)


def normalise(text: str) -> str:
    """A server's words as a reader sees them, before :func:`redact` looks for the key: HTML entities
    (``&#x73;``) and escapes (``\\u0073``, ``\\x73``, ``%73``) decoded, invisible characters (zero-width
    spaces, joiners, direction marks: Unicode's format and control characters but line breaks and tabs)
    dropped."""
    import html
    import unicodedata
    from urllib.parse import unquote

    for _ in range(3):  # an entity of an escape, an escape of an entity: until nothing changes
        was = text
        text = html.unescape(text)
        text = re.sub(r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})",
                      lambda m: chr(int(m.group(1) or m.group(2), 16)), text)
        text = unquote(text)
        if text == was:
            break
    return "".join(c for c in text if c in "\n\t" or unicodedata.category(c) not in ("Cf", "Cc", "Co", "Cs", "Zl", "Zp"))


def said(where: str, words: str, key: str | None) -> None:
    """A server's words, normalised, redacted and cut to :data:`QUOTE_CHARS`, on stderr: the terminal
    and the job's log. Never in a refusal's text, which reaches failure records, placeholder
    artifacts, the feature matrix's records and DVC's cache: those hold a status code and a fixed
    reason, however a server spells a key it echoes (hex, base32, reversed...)."""
    print(f"encmap: {where}; the server said: {_quote(normalise(words), QUOTE_CHARS, key)}", file=sys.stderr)


def _quote(text: str, n: int, key: str | None) -> str:
    """The first ``n`` characters of ``text`` with the key redacted first: a copy cut before it is
    redacted keeps the piece of the key before the cut, which no longer matches the key (only so
    much of ``text`` is searched as may hold a spelling of the key that starts before ``n``)."""
    return redact(text[:n + 3 * len((key or "").encode("utf-8", "surrogatepass")) + 16], key)[:n]


def endpoint(spec: dict) -> str:
    """The endpoint an entry's vectors come from: its base URL, scheme and host lower-cased, no
    trailing slash. Two servers may serve different models under one name (infinity-emb answered a
    request for text-embedding-3-small with MiniLM's vectors), so vectors are shared only between
    entries of the same endpoint, model, revision and dimensions."""
    from urllib.parse import urlsplit, urlunsplit

    u = urlsplit(spec["base_url"].strip())
    return urlunsplit((u.scheme.lower(), u.netloc.lower(), u.path.rstrip("/"), u.query, ""))


def cache_key(spec: dict, text: str) -> str:
    """sha256 of (endpoint, model, revision, dimensions, text): the cache's key of one vector."""
    parts = json.dumps([endpoint(spec), spec["model"], spec["revision"], spec["dimensions"], text], ensure_ascii=False)
    return hashlib.sha256(parts.encode("utf-8")).hexdigest()


class ResponseCache:
    """Returned vectors on disk (SQLite: one row per vector, committed per batch; safe across
    processes and threads), under :func:`cache_key`."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else cache_dir() / "api" / "embeddings.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        deadline, pause = time.monotonic() + LOCK_WAIT_S, 0.01
        while True:
            db = None
            try:
                db = sqlite3.connect(self.path, timeout=LOCK_WAIT_S, check_same_thread=False)
                with self.lock, db:
                    db.execute("PRAGMA journal_mode=WAL")
                    db.execute("CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, width INTEGER, data BLOB)")
                self.db = db
                return
            except sqlite3.DatabaseError as e:
                if db is not None:
                    db.close()
                if not _locked(e):
                    raise EncmapError(f"{self.path}: the API vectors' cache cannot be read ({e}); move it aside to "
                                      "fetch the vectors again (they are paid for again)") from None
                if time.monotonic() + pause > deadline:
                    raise EncmapError(f"{self.path}: the API vectors' cache stayed locked by another process for "
                                      f"{LOCK_WAIT_S:g} s ({e}); the cache is intact: run again once the other "
                                      "encmap job is done, or stop the process that holds it") from None
                time.sleep(pause)  # another job is writing it: such locks clear in milliseconds
                pause = min(2 * pause, 1.0)

    def get(self, keys: list[str]) -> dict[str, np.ndarray]:
        out = {}
        with self.lock:
            for i in range(0, len(keys), 500):  # SQLite's bound-variable limit
                chunk = keys[i:i + 500]
                rows = self.db.execute(f"SELECT key, width, data FROM vectors WHERE key IN ({','.join('?' * len(chunk))})",
                                       chunk).fetchall()
                out.update({k: np.frombuffer(d, dtype=np.float32, count=w) for k, w, d in rows})
        return out

    def put(self, items: dict[str, np.ndarray]) -> None:
        rows = [(k, int(v.shape[0]), np.asarray(v, dtype=np.float32).tobytes()) for k, v in items.items()]
        try:
            with self.lock, self.db:
                self.db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)", rows)
        except sqlite3.DatabaseError as e:
            raise EncmapError(f"{self.path}: the API vectors' cache cannot be written ({e})") from None

    def check_writable(self) -> None:
        """Refuse, before anything is sent, a cache another process holds write-locked past
        :data:`LOCK_WAIT_S`: answers paid for could not be kept."""
        try:
            with self.lock:
                self.db.execute("BEGIN IMMEDIATE")
                self.db.rollback()
        except sqlite3.DatabaseError as e:
            raise EncmapError(f"{self.path}: the API vectors' cache stayed write-locked by another process for "
                              f"{LOCK_WAIT_S:g} s ({e}); nothing was sent (answers paid for could not be kept): run "
                              "again once the other encmap job is done, or stop the process that holds it") from None

    def close(self) -> None:
        self.db.close()


def _locked(e: sqlite3.DatabaseError) -> bool:
    """Whether SQLite's error is another connection's lock (SQLITE_BUSY, SQLITE_LOCKED), not a damaged file."""
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "busy" in str(e))


class RateLimit:
    """At most ``per_minute`` requests started in any minute, spaced evenly (None: no limit)."""

    def __init__(self, per_minute: float | None):
        self.gap = 60.0 / per_minute if per_minute else 0.0
        self.next = 0.0
        self.lock = threading.Lock()

    def wait(self) -> None:
        if not self.gap:
            return
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next)
            self.next = start + self.gap
        time.sleep(max(0.0, start - now))


class RequestDeadline(BaseException):
    """A request's answer did not arrive whole by its deadline. Not an ``Exception``: the client
    retries a request whose transport raised one (openai 1.x any), and a server that sends a byte
    now and then would hold each retry as long again."""


class _Deadline(threading.local):
    """The deadline (``time.monotonic()``) of the request this thread is sending; None: none."""

    at: float | None = None


_DEADLINE = _Deadline()


def _bounded(op, timeout: float | None):
    """``op(timeout)`` with ``timeout`` cut to what is left of this thread's request deadline;
    :class:`RequestDeadline` once it has passed (a timeout raised after it is the deadline's)."""
    at = _DEADLINE.at
    if at is None:
        return op(timeout)
    left = at - time.monotonic()
    if left <= 0:
        raise RequestDeadline
    try:
        return op(left if timeout is None else min(timeout, left))
    except Exception:
        if time.monotonic() >= at:
            raise RequestDeadline from None
        raise


class _DeadlineStream:
    """A connection (httpcore's ``NetworkStream`` interface) whose every read, write and TLS
    handshake ends by the deadline of the request being sent on it."""

    def __init__(self, inner):
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return _bounded(lambda t: self.inner.read(max_bytes, timeout=t), timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for i in range(0, len(buffer), 1 << 14):  # in pieces: a server may read a byte now and then too
            _bounded(lambda t: self.inner.write(buffer[i:i + (1 << 14)], timeout=t), timeout)

    def start_tls(self, ssl_context, server_hostname: str | None = None, timeout: float | None = None):
        return _DeadlineStream(_bounded(lambda t: self.inner.start_tls(ssl_context, server_hostname, timeout=t),
                                        timeout))

    def close(self) -> None:
        self.inner.close()

    def get_extra_info(self, info: str):
        return self.inner.get_extra_info(info)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class _DeadlineBackend:
    """httpcore's ``NetworkBackend`` interface: ``inner``'s connections, connected and used within
    the deadline of the request they are opened for."""

    def __init__(self, inner):
        self.inner = inner

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options=None) -> _DeadlineStream:
        return _DeadlineStream(_bounded(lambda t: self.inner.connect_tcp(
            host, port, timeout=t, local_address=local_address, socket_options=socket_options), timeout))

    def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options=None) -> _DeadlineStream:
        return _DeadlineStream(_bounded(lambda t: self.inner.connect_unix_socket(
            path, timeout=t, socket_options=socket_options), timeout))

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def _start_deadline(request) -> None:
    """httpx's request hook: a request's first attempt starts its deadline, which its retries share
    (:meth:`Fetcher.call` clears it once the request is answered or refused)."""
    if _DEADLINE.at is None:
        _DEADLINE.at = time.monotonic() + REQUEST_DEADLINE_S


def _bound_by_deadline(http) -> bool:
    """Bound every socket operation of ``http`` (the httpx client openai sends through) by the
    deadline of the request being sent: httpx's timeouts are per operation (connect, one read, one
    write), and it has no deadline for a whole answer. Each connection pool's network backend
    (httpcore's public interface, reached through the transports' private attributes) is wrapped;
    False if the client is not built so (a later httpx), and the body alone is then bounded."""
    transports = [t for t in (getattr(http, "_transport", None), *getattr(http, "_mounts", {}).values()) if t]
    pools = [getattr(t, "_pool", None) for t in transports]
    if not pools or not all(hasattr(p, "_network_backend") for p in pools):
        return False
    for pool in pools:
        if not isinstance(pool._network_backend, _DeadlineBackend):
            pool._network_backend = _DeadlineBackend(pool._network_backend)
    http.event_hooks = {**http.event_hooks, "request": [*http.event_hooks["request"], _start_deadline]}
    return True


def _client(spec: dict, key: str):
    try:
        import openai
    except ImportError:
        raise EncmapError("backend openai needs the openai package (pip install openai)") from None
    # A redirect is answered, not followed: a loop or a Location that does not parse would read as a
    # server that never answered after every retry; the 3xx is refused at once (base_url is to be fixed).
    http = openai.DefaultHttpxClient(follow_redirects=False, timeout=TIMEOUT_S)
    client = openai.OpenAI(base_url=spec["base_url"], api_key=key, max_retries=MAX_RETRIES, timeout=TIMEOUT_S,
                           http_client=http)
    if not _bound_by_deadline(client._client):
        log.warning("the openai client's HTTP transport is not httpx's as encmap knows it: a request's deadline "
                    "(%.0f s) bounds its body only, not its connection, status line and headers", REQUEST_DEADLINE_S)
    return client


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


def _refusal(model: str, spec: dict, e, first: int | str, key: str | None = None) -> EncmapError:
    """An API error as an EncmapError naming the model, the status and what to do: a status code and
    a fixed reason; the server's own words go to stderr only (:func:`said`)."""
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
    return EncmapError(f"model {model!r}: no answer from {spec['base_url']} after {MAX_RETRIES} retries "
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


class Fetcher:
    """Sends the batches of one model (concurrently, rate-limited), checks and caches the answers."""

    def __init__(self, model: str, spec: dict, cache: ResponseCache, on_send=None):
        self.model, self.spec, self.cache = model, spec, cache
        self.on_send = on_send or (lambda tokens: None)  # the budget's hold: what has been sent so far
        self.unsaved: dict[str, np.ndarray] = {}  # answers the cache could not take (kept for this run)
        self.key = api_key(model, spec)
        self.client = _client(spec, self.key)
        self.limit = RateLimit(spec["rate_limit"])
        self.width: int | None = spec["dimensions"]
        self.tokens = 0
        self.tokens_reported = True
        self.requests = 0
        self.served: set[str] = set()
        self.spent = 0  # tokens this fetcher used: reported, else estimated (for the entry's budget)
        self.lock = threading.Lock()

    def call(self, texts: list[str], what: str = "a batch") -> SimpleNamespace:
        """One request's answer, read whole within :data:`REQUEST_DEADLINE_S` of sending it (its
        connection, status line, headers and body: a server that sends a byte now and then never
        trips the client's per-read timeout) and parsed here: the protocol's fields or a refusal
        naming the model, the status and what was wrong."""
        self.limit.wait()
        self.on_send(estimate_tokens(texts))  # sent, and maybe billed, however the call ends
        kw = {"dimensions": self.spec["dimensions"]} if self.spec["dimensions"] is not None else {}
        with self.lock:
            self.requests += 1
        deadline = time.monotonic() + REQUEST_DEADLINE_S  # the body's, should the transport not be bounded
        _DEADLINE.at = deadline  # one deadline for the request, its retries included
        where = f"model {self.model!r}: the answer of {self.spec['base_url']} to {what}"
        cap = BYTES_PER_NUMBER * len(texts) * (self.width or WIDEST) + (1 << 20)
        body = None
        try:
            with self.client.embeddings.with_streaming_response.create(
                    model=self.spec["model"], input=texts, encoding_format="float", **kw) as raw:
                status, ctype, body = raw.status_code, raw.headers.get("content-type", ""), bytearray()
                for chunk in raw.iter_bytes():  # decoded (gzip inflated) as it arrives
                    body += chunk
                    if time.monotonic() > deadline:
                        raise RequestDeadline
                    if len(body) > cap:
                        raise EncmapError(f"{where} is larger than {cap:,} bytes once decoded, more than "
                                          f"{len(texts)} embeddings can take; refused as it arrived, not retried "
                                          "(nothing from it is kept)")
        except RequestDeadline:
            got = "its status line and headers incomplete" if body is None else f"{len(body)} bytes of its body so far"
            raise EncmapError(f"{where} did not arrive whole within {REQUEST_DEADLINE_S:.0f} s ({got}); refused, "
                              "not retried (nothing from it is kept)") from None
        except EncmapError:
            raise
        except Exception as e:  # the transport failed mid-answer (httpx's errors are not the client's)
            import openai

            if isinstance(e, openai.APIError):
                raise
            said(f"{where} broke off", f"{type(e).__name__}: {e}", self.key)
            raise EncmapError(f"{where} broke off ({type(e).__name__}); refused (nothing from it is kept)") from None
        finally:
            _DEADLINE.at = None
        return _parse(f"model {self.model!r}: HTTP {status} from {self.spec['base_url']} for {what}", bytes(body),
                      ctype, self.key)

    def batch(self, texts: list[str], first: int | None, keep: bool = True) -> np.ndarray:
        """Vectors (b, d) of ``texts`` (inputs ``first``...; None: the drift probes); cached when ``keep``."""
        import openai

        what = "the drift probes" if first is None else f"inputs {first}-{first + len(texts) - 1}"
        try:
            response = self.call(texts, what)
        except openai.APIStatusError as e:
            if 400 <= (e.status_code or 0) < 500 and e.status_code not in (401, 403, 429) and len(texts) > 1:
                bad, err = _first_bad(self.call, texts, first or 0)
                raise _refusal(self.model, self.spec, err or e, bad, self.key) from None
            raise _refusal(self.model, self.spec, e, first if first is not None else "the drift probes",
                           self.key) from None
        except openai.APIError as e:  # connection errors and timeouts, once the client's retries are spent
            raise _refusal(self.model, self.spec, e, first if first is not None else "the drift probes",
                           self.key) from None
        expected = self.spec["served_model"] or self.spec["model"]
        if response.model is not None and response.model != expected:
            said(f"model {self.model!r}: {self.spec['base_url']} answered {what} with another model than {expected!r}; "
                 "if it is the model you mean, set served_model to its name in the entry", response.model, self.key)
            raise EncmapError(f"model {self.model!r}: {self.spec['base_url']} answered {what} with another model than "
                              f"{expected!r} (its name is in the job's log); refused (nothing from it is kept). If "
                              "that is the model you mean, set served_model to its name in the entry")
        try:
            E, tokens = _vectors(self.model, response, len(texts), self.width, first, self.key, texts)
        except EncmapError:
            with self.lock:  # an answer arrived, and may be billed, however wrong: it counts against the budget
                self.spent += estimate_tokens(texts)
            raise
        with self.lock:
            self.width = self.width or E.shape[1]
            self.served.add(response.model or "not reported")
            self.spent += tokens if tokens is not None else estimate_tokens(texts)
            if tokens is None:
                self.tokens_reported = False
            else:
                self.tokens += tokens
        if keep:
            items = {cache_key(self.spec, t): e for t, e in zip(texts, E)}
            try:
                self.cache.put(items)
            except EncmapError as err:  # paid for: used in this run all the same, and said
                with self.lock:
                    if not self.unsaved:
                        print(f"encmap: model {self.model!r}: {err}; its answers are kept for this run and "
                              "written to the cache at its end if it can take them", file=sys.stderr)
                    self.unsaved.update(items)
        return E


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


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


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


def estimate_tokens(texts: list[str]) -> int:
    """Tokens of ``texts`` at :data:`CHARS_PER_TOKEN` characters per token (each rounded up)."""
    return sum(max(1, math.ceil(len(t) / CHARS_PER_TOKEN)) for t in texts)


def fingerprint(E: np.ndarray) -> str:
    """sha256 of the unit rows of E rounded to :data:`FINGERPRINT_DIGITS` decimals."""
    U = E / np.linalg.norm(E, axis=1, keepdims=True)
    R = np.round(U.astype(np.float64), FINGERPRINT_DIGITS) + 0.0  # + 0.0: -0.0 and 0.0 hash alike
    return hashlib.sha256(R.tobytes()).hexdigest()


def check_drift(model: str, spec: dict, probes: np.ndarray, path: Path | None = None) -> dict:
    """Compare the probes' embeddings (len(PROBES), d) with the first ones seen for the same
    (model, revision, dimensions) and record them if they are the first; report drift plainly.

    Returns
    -------
    dict
        ``fingerprint``, ``first_seen`` and, when the served model changed, ``drift`` (the largest
        cosine distance, the fingerprint first seen): for the provenance.
    """
    path = Path(path) if path else cache_dir() / "api" / "fingerprints.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    name = json.dumps([endpoint(spec), spec["model"], spec["revision"], spec["dimensions"]])
    fp = fingerprint(probes)
    from filelock import FileLock

    with FileLock(str(path) + ".lock"):
        try:
            seen = json.loads(path.read_text()) if path.is_file() else {}
        except (ValueError, OSError) as e:
            raise EncmapError(f"{path}: the drift probes' first answers cannot be read ({e}); move it aside (drift "
                              "is then measured from this run's answers)") from None
        first = seen.get(name)
        if first is None:
            seen[name] = {"fingerprint": fp, "first_seen": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          "probes": np.asarray(probes, dtype=np.float64).tolist()}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(seen))
            os.replace(tmp, path)
            return {"fingerprint": fp, "first_seen": seen[name]["first_seen"]}
    old = np.asarray(first["probes"])
    out = {"fingerprint": fp, "first_seen": first["first_seen"]}
    if old.shape != probes.shape:
        distance = 1.0
    else:
        cos = np.sum(old * probes, axis=1) / (np.linalg.norm(old, axis=1) * np.linalg.norm(probes, axis=1))
        distance = float(np.max(1.0 - cos))
    if distance > DRIFT_TOL:
        out["drift"] = {"max_cosine_distance": distance, "first_fingerprint": first["fingerprint"]}
        log.warning("model %r: the endpoint's model %r (revision %r) now answers differently than when first seen on "
                    "%s (probe cosine distance up to %.3g, fingerprint %s... was %s...): the served model changed "
                    "under the same name. Its cached vectors are the old model's: set a new revision to recompute "
                    "them.", model, spec["model"], spec["revision"], first["first_seen"], distance, fp[:12],
                    first["fingerprint"][:12])
    return out


def embed(model: str, spec: dict, texts: list[str], device: str, threads: int | None,
          cache: ResponseCache | None = None, fingerprints: Path | None = None) -> EmbeddingResult:
    """Every text's vector from the endpoint (or the cache), in input order: the output (n, d) and
    its truncations. ``cache`` / ``fingerprints``: where vectors and probe fingerprints are kept
    (default under ``$ENCMAP_CACHE/api``)."""
    try:
        return _embed(model, spec, texts, cache, fingerprints)
    except Exception as e:  # a library's words may hold a server's: to stderr, not into the refusal
        key = os.environ.get(spec["api_key_env"])
        if isinstance(e, EncmapError):
            text = str(e)
            if redact(normalise(text), key) == normalise(text):
                raise
            raise EncmapError(redact(normalise(text), key)) from None
        said(f"model {model!r}: {type(e).__name__} while fetching its vectors", str(e), key)
        raise EncmapError(f"model {model!r}: {type(e).__name__} while fetching its vectors from "
                          f"{spec['base_url']} (the details are in the job's log)") from None


def _embed(model: str, spec: dict, texts: list[str], cache: ResponseCache | None,
           fingerprints: Path | None) -> EmbeddingResult:
    own = cache is None
    cache = cache or ResponseCache()
    try:
        bad = next((i for i, t in enumerate(texts) if not _encodable(t)), None)
        if bad is not None:
            raise EncmapError(f"model {model!r}: input {bad} holds a lone surrogate ({texts[bad]!r:.80}), which is "
                              "no UTF-8 text a server can be sent; nothing was sent")
        keys = [cache_key(spec, t) for t in texts]
        have = cache.get(keys)
        todo = [i for i, k in enumerate(keys) if k not in have]
        ledger = (Path(fingerprints).parent if fingerprints else cache_dir() / "api") / "spent.json"
        # The budget is the entry's, across every call (embed, evaluate, place), the probes included.
        need = (estimate_tokens([texts[i] for i in todo]) + estimate_tokens(list(PROBES))
                if spec["max_tokens"] is not None and todo else None)
        if todo:
            cache.check_writable()  # answers paid for must have somewhere to go
        with spend(model, spec, ledger, need, len(todo)) as used:
            fetch = Fetcher(model, spec, cache, on_send=used.sent)
            try:
                return _fetch_all(model, spec, texts, keys, have, todo, fetch, fingerprints)
            finally:
                used[0] = fetch.spent
                if fetch.unsaved:
                    try:
                        cache.put(fetch.unsaved)
                    except EncmapError as e:
                        print(f"encmap: model {model!r}: {len(fetch.unsaved):,} answers were used but not cached "
                              f"({e}); a rerun sends them again", file=sys.stderr)
    finally:
        if own:
            cache.close()


def _fetch_all(model: str, spec: dict, texts: list[str], keys: list[str], have: dict, todo: list[int],
               fetch: "Fetcher", fingerprints: Path | None) -> EmbeddingResult:
    """The texts not in the cache (``todo``) fetched after the drift probes, placed among the cached ones."""
    drift = {}
    if todo:  # nothing to send, nothing sent: the probes go only with real work
        drift = check_drift(model, spec, fetch.batch(list(PROBES), None, keep=False), fingerprints)
        if "drift" in drift and have:
            raise EncmapError(f"model {model!r}: the endpoint's model {spec['model']!r} (revision "
                              f"{spec['revision']!r}) changed since {drift['first_seen']}, and the cache holds "
                              f"{len(have):,} of its vectors from before; an encoder of old and new vectors "
                              "would be neither. Set a new revision to recompute it; nothing was written")
    widths = {v.shape[0] for v in have.values()}
    if len(widths | ({fetch.width} if fetch.width else set())) > 1:
        raise EncmapError(f"model {model!r}: cached vectors of width {sorted(widths)} and the endpoint's "
                          f"{fetch.width}: the cache does not match this model; set a new revision")
    bs = spec["batch_size"]
    parts = [todo[i:i + bs] for i in range(0, len(todo), bs)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=spec["concurrency"]) as pool:
        done = list(pool.map(lambda p: (p, fetch.batch([texts[i] for i in p], p[0])), parts))
    got = dict(have)
    for p, E in done:
        got.update({keys[i]: e for i, e in zip(p, E)})
    full = np.vstack([got[k] for k in keys]) if texts else np.zeros((0, fetch.width or 0), np.float32)
    tokens = fetch.tokens if fetch.tokens_reported else None
    # To stderr, which is the job's log (logs/embed/<model>.log): what the run cost.
    print(f"encmap: model {model!r}: {len(texts)} texts, {len(texts) - len(todo)} from the cache, {len(todo)} sent "
          f"in {fetch.requests} requests with the drift probes ({time.perf_counter() - t0:.1f} s), tokens used: "
          f"{tokens if tokens is not None else 'not reported'}", file=sys.stderr)
    prov = {"api_model": spec["model"], "revision": spec["revision"], "dimensions": spec["dimensions"],
            "base_url": spec["base_url"], "texts_cached": len(texts) - len(todo), "texts_sent": len(todo),
            "requests": fetch.requests, "tokens": tokens, "width": int(full.shape[1]),
            "served_model": ", ".join(sorted(fetch.served)) or None} | drift
    return output_only(model, spec, full, prov)
