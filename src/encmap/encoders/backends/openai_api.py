"""Encoders behind an OpenAI-compatible embeddings endpoint (backend ``openai``): OpenAI, Azure
OpenAI and the servers people run (text-embeddings-inference, vLLM, infinity, Ollama, llama.cpp).

``POST {base_url}/embeddings`` through the official ``openai`` client: its retries and backoff
(429, 408, 409 and 5xx, ``Retry-After`` honoured) run the protocol. What a paying user of a map
needs besides is in :mod:`encmap.encoders.served`, one concern a module; this file is the story of
one call, in the order it happens:

1. :func:`embed` looks every text up in the cache on disk (:mod:`~encmap.encoders.served.cache`):
   only what it lacks is sent, and a cache another process holds write-locked is refused first;
2. the entry's token budget is checked and held, across processes, before anything is sent
   (:mod:`~encmap.encoders.served.budget`);
3. the key is read from its variable and checked, never repeated (:mod:`~encmap.encoders.served.keys`);
4. the drift probes go first: a model changed under its name is reported, and refused where the
   cache holds its old vectors (:mod:`~encmap.encoders.served.drift`);
5. each batch is one request (:meth:`Fetcher.call`): started within the entry's ``rate_limit``
   (:mod:`~encmap.encoders.served.ratelimit`), answered whole within :data:`REQUEST_DEADLINE_S`,
   one deadline for the request and all its retries (:mod:`~encmap.encoders.served.deadline`),
   refused as it arrives if larger than the vectors asked for can take, then parsed and checked
   (:mod:`~encmap.encoders.served.answers`) and written to the cache as it arrives, so that an
   interrupted run resumes without paying twice;
6. the vectors are placed in input order among the cached ones, and the run says what it cost.

Whatever a server says goes, normalised and redacted of the key, to stderr only (the terminal, the
job's log); a refusal holds a status code and a fixed reason, and the embed step writes nothing for
a model that fails. The key is read from the environment variable ``api_key_env`` names, at call
time, and never reaches params, an artifact, a log or the page. What makes an API encoder stale is
its ``model``, ``revision``, ``dimensions`` and truncations; ``base_url``, ``api_key_env``,
``batch_size``, ``concurrency``, ``rate_limit`` and ``max_tokens`` change how it is fetched, not
what (:data:`encmap.encoders.variants.TRANSPORT_KEYS`: left out of its params slice).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ...validation import EncmapError
from ..checkpoints import cache_dir
from ..result import EmbeddingResult, output_only
from ..served.answers import BYTES_PER_NUMBER, WIDEST, _first_bad, _parse, _refusal, _vectors
from ..served.budget import estimate_tokens, spend
from ..served.cache import ResponseCache, cache_key
from ..served.deadline import _DEADLINE, RequestDeadline, _bound_by_deadline
from ..served.drift import PROBES, check_drift
from ..served.keys import api_key, normalise, redact, said
from ..served.ratelimit import RateLimit

log = logging.getLogger(__name__)

#: Retries of one request by the client (exponential backoff, ``Retry-After`` honoured).
MAX_RETRIES = 8
#: Seconds the client waits for any one read (connect, a chunk of the answer).
TIMEOUT_S = 120.0
#: Seconds one request's whole answer may take to arrive, from connecting to the body's last
#: byte (a per-read timeout never trips on a server that sends a byte now and then); each retry
#: of the client's has its own, and a request past it is not retried.
REQUEST_DEADLINE_S = 300.0


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

    def batch(self, texts: list[str], first: int | None, keep: bool = True) -> np.ndarray:
        """Vectors (b, d) of ``texts`` (inputs ``first``...; None: the drift probes); cached when ``keep``."""
        import openai

        what = "the drift probes" if first is None else f"inputs {first}-{first + len(texts) - 1}"
        try:
            response = self.call(texts, what)
        except openai.APIStatusError as e:
            if 400 <= (e.status_code or 0) < 500 and e.status_code not in (401, 403, 429) and len(texts) > 1:
                bad, err = _first_bad(self.call, texts, first or 0)
                raise _refusal(self.model, self.spec, err or e, bad, self.key, retries=MAX_RETRIES) from None
            raise _refusal(self.model, self.spec, e, first if first is not None else "the drift probes",
                           self.key, retries=MAX_RETRIES) from None
        except openai.APIError as e:  # connection errors and timeouts, once the client's retries are spent
            raise _refusal(self.model, self.spec, e, first if first is not None else "the drift probes",
                           self.key, retries=MAX_RETRIES) from None
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


def _client(spec: dict, key: str):
    """The ``openai`` client of an entry: :data:`MAX_RETRIES` retries, :data:`TIMEOUT_S` per read, no
    redirect followed, every socket operation bound by the deadline of the request being sent."""
    try:
        import openai
    except ImportError:
        raise EncmapError("backend openai needs the openai package (pip install openai)") from None
    # A redirect is answered, not followed: a loop or a Location that does not parse would read as a
    # server that never answered after every retry; the 3xx is refused at once (base_url is to be fixed).
    http = openai.DefaultHttpxClient(follow_redirects=False, timeout=TIMEOUT_S)
    client = openai.OpenAI(base_url=spec["base_url"], api_key=key, max_retries=MAX_RETRIES, timeout=TIMEOUT_S,
                           http_client=http)
    if not _bound_by_deadline(client._client, REQUEST_DEADLINE_S):
        log.warning("the openai client's HTTP transport is not httpx's as encmap knows it: a request's deadline "
                    "(%.0f s) bounds its body only, not its connection, status line and headers", REQUEST_DEADLINE_S)
    return client


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False
