"""A dependency-free progress bar: one redrawn line on a terminal, periodic lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import Dict, Optional, TextIO


def _hms(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Progress:
    def __init__(self, total: int, start: int = 0, enabled: bool = True, stream: Optional[TextIO] = None,
                 every_s: float = 10.0):
        self.total, self.start = total, start
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s if not self.tty else 0.2
        self.t0 = time.perf_counter()
        self.last = 0.0

    def update(self, step: int, fields: Dict[str, float]) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.last < self.every_s and step < self.total:
            return
        self.last = now
        done = step - self.start
        rate = done / max(now - self.t0, 1e-9)
        eta = (self.total - step) / rate if rate > 0 else 0.0
        width = 24
        filled = int(width * step / max(self.total, 1))
        bar = "#" * filled + "-" * (width - filled)
        text = " ".join(f"{k} {v:.4g}" for k, v in fields.items())
        line = f"[{bar}] {step}/{self.total} {text} | {_hms(now - self.t0)} < {_hms(eta)}"
        if self.tty:
            self.stream.write("\r" + line[:160].ljust(160))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
