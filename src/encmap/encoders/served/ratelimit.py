"""An entry's ``rate_limit`` (requests a minute) holds however many of its batches are sent side by
side (``concurrency``): the requests of one model start evenly spaced."""

from __future__ import annotations

import threading
import time


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
