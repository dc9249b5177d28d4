"""One deadline bounds a request's whole answer, its retries included: httpx's timeouts are per
operation (connect, one read, one write), and a server that sends a byte now and then, or a status
line and then its headers a byte at a time, never trips them.

The backend sets the deadline of the request a thread sends (:data:`_DEADLINE`);
:func:`_bound_by_deadline` makes every socket operation of the client's connections (connect, TLS
handshake, each read and write) end by it, and past it :class:`RequestDeadline` ends the request,
which the client does not retry.
"""

from __future__ import annotations

import threading
import time
from functools import partial


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


def _start_deadline(request, seconds: float) -> None:
    """httpx's request hook: a request's first attempt starts its deadline, ``seconds`` away, which
    its retries share (the backend's ``Fetcher.call`` clears it once the request is answered or
    refused)."""
    if _DEADLINE.at is None:
        _DEADLINE.at = time.monotonic() + seconds


def _bound_by_deadline(http, seconds: float) -> bool:
    """Bound every socket operation of ``http`` (the httpx client openai sends through) by the
    deadline of the request being sent (``seconds`` from its first attempt, unless the sender set
    it first): httpx's timeouts are per operation (connect, one read, one write), and it has no
    deadline for a whole answer. Each connection pool's network backend (httpcore's public
    interface, reached through the transports' private attributes) is wrapped; False if the
    client is not built so (a later httpx), and the body alone is then bounded."""
    transports = [t for t in (getattr(http, "_transport", None), *getattr(http, "_mounts", {}).values()) if t]
    pools = [getattr(t, "_pool", None) for t in transports]
    if not pools or not all(hasattr(p, "_network_backend") for p in pools):
        return False
    for pool in pools:
        if not isinstance(pool._network_backend, _DeadlineBackend):
            pool._network_backend = _DeadlineBackend(pool._network_backend)
    hook = partial(_start_deadline, seconds=seconds)
    http.event_hooks = {**http.event_hooks, "request": [*http.event_hooks["request"], hook]}
    return True
