"""The server's metrics in Prometheus' text exposition format (version 0.0.4), kept in memory.

Counters (requests by endpoint and status), gauges (queue depth) and histograms (latency, batch
size, batch time) with fixed buckets; ``render()`` is what ``GET /metrics`` answers. Written
here, not through a client library: a few dozen lines, and one dependency fewer.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Dict, Sequence, Tuple

#: bucket upper bounds per histogram (seconds for the times, images for the batch size)
BUCKETS: Dict[str, Tuple[float, ...]] = {
    "vitkit_request_seconds": (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    "vitkit_batch_seconds": (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    "vitkit_batch_size": (1, 2, 4, 8, 16, 32, 64, 128, 256),
}
HELP = {
    "vitkit_requests_total": ("counter", "Requests answered, by endpoint and HTTP status."),
    "vitkit_images_total": ("counter", "Images through the model, by endpoint."),
    "vitkit_queue_depth": ("gauge", "Requests waiting for a batch."),
    "vitkit_request_seconds": ("histogram", "Time from a request's arrival to its answer, by endpoint."),
    "vitkit_batch_seconds": ("histogram", "Time of one batched forward pass."),
    "vitkit_batch_size": ("histogram", "Images per batched forward pass."),
}

Labels = Tuple[Tuple[str, str], ...]


def _labels(labels: Dict[str, str]) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def _show(labels: Labels, extra: Sequence[Tuple[str, str]] = ()) -> str:
    pairs = list(labels) + list(extra)
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"


class Metrics:
    """Thread-safe counters, gauges and histograms (the batch runs in a worker thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._values: Dict[str, Dict[Labels, float]] = defaultdict(lambda: defaultdict(float))
        self._hist: Dict[str, Dict[Labels, list]] = defaultdict(dict)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        with self._lock:
            self._values[name][_labels(labels)] += amount

    def set_gauge(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._values[name][_labels(labels)] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        bounds = BUCKETS[name]
        with self._lock:
            counts = self._hist[name].setdefault(_labels(labels), [0] * len(bounds) + [0, 0.0])
            for i, bound in enumerate(bounds):
                if value <= bound:
                    counts[i] += 1
            counts[-2] += 1  # count (the +Inf bucket)
            counts[-1] += value  # sum

    def value(self, name: str, **labels: str) -> float:
        """A counter's or gauge's value (0 when never set)."""
        with self._lock:
            return self._values[name].get(_labels(labels), 0.0)

    def histogram(self, name: str, **labels: str) -> Tuple[int, float]:
        """(count, sum) of a histogram's observations."""
        with self._lock:
            counts = self._hist[name].get(_labels(labels))
            return (int(counts[-2]), float(counts[-1])) if counts else (0, 0.0)

    def render(self) -> str:
        lines = []
        with self._lock:
            for name, (kind, text) in HELP.items():
                if name not in self._values and name not in self._hist:
                    continue
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
                for labels, value in sorted(self._values.get(name, {}).items()):
                    lines.append(f"{name}{_show(labels)} {value:g}")
                for labels, counts in sorted(self._hist.get(name, {}).items()):
                    for bound, count in zip(BUCKETS[name], counts):
                        lines.append(f"{name}_bucket{_show(labels, [('le', f'{bound:g}')])} {count}")
                    lines.append(f"{name}_bucket{_show(labels, [('le', '+Inf')])} {counts[-2]}")
                    lines.append(f"{name}_count{_show(labels)} {counts[-2]}")
                    lines.append(f"{name}_sum{_show(labels)} {counts[-1]:g}")
        return "\n".join(lines) + "\n"
