"""Vectors paid for are kept on disk, so that an interrupted run resumes without paying twice and a
rerun sends only what it lacks.

:class:`ResponseCache` (SQLite in ``$ENCMAP_CACHE/api``) holds every returned vector under
(endpoint, model, revision, dimensions, text) (:func:`cache_key`), written batch by batch as
responses arrive; nothing is cached from a refused response. A cache write-locked by another
process is refused before anything is sent (:meth:`ResponseCache.check_writable`); a lock that
clears is waited for (:data:`LOCK_WAIT_S`), never reported as an unreadable cache.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np

from ...validation import EncmapError
from ..checkpoints import cache_dir

#: Seconds a job waits for another job's lock on the vectors' cache (two jobs opening a fresh
#: cache together: SQLite's switch to WAL fails at once, without its busy timeout, while another
#: connection writes) before it is refused as locked, never as unreadable.
LOCK_WAIT_S = 60.0


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
