"""A one-line progress indicator on standard error (silent when it is not a terminal)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str) -> None:
        self.total = total
        self.label = label
        self.done = 0
        self.start = time.perf_counter()
        self.live = sys.stderr.isatty()

    def step(self, what: str) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.start
        line = f"{self.label} [{self.done}/{self.total}] {elapsed:5.1f}s {what}"
        if self.live:
            sys.stderr.write("\r\x1b[K" + line)
            sys.stderr.flush()
        elif self.done == 1 or self.done == self.total or self.done % 10 == 0:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.live:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
