"""Progress on the waits a person sits through: one redrawn line on a terminal, a line every
10 s otherwise (log files, CI), always on stderr so that stdout stays machine-readable
(``--json``).

* :class:`Progress` is the bar itself: ``update(step)`` with the count done so far, ``close()``
  at the end. The training loop draws one from its first step.
* :func:`working` is for one blocking call that counts nothing (an ONNX export, an NNCF
  quantization): after ``DELAY_S`` a thread redraws ``label | elapsed`` until the call returns.
* :func:`track` wraps an iterable of work (batches, files, steps) in a labelled bar that
  stays silent while the whole wait is short: it starts after ``DELAY_S`` (5 s), so a quick
  evaluation prints nothing and a two-minute one says what it does and when it ends::

      evaluating test [######------------------] 5/20 batches | 00:06 < 00:18

Written here rather than taken from tqdm because vitkit needs three things of it (a count, an
ETA, a quiet start) and tqdm is no dependency of vitkit. Only the process that reports draws
(``RANK`` 0 or unset, as ``vitkit train`` reports under torchrun), so a library default of
``progress=True`` never prints one line per process.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import sys
import threading
import time
from typing import Any, BinaryIO, Callable, Dict, Iterable, Iterator, List, Optional, TextIO, TypeVar

T = TypeVar("T")

#: Waits shorter than this (seconds) print nothing with :func:`track`.
DELAY_S = 5.0
#: Seconds between two lines when stderr is not a terminal (each line is kept in a log).
EVERY_S = 10.0
#: Seconds between two redraws on a terminal.
TTY_EVERY_S = 0.2
#: A download's unit of count.
MB = 1 << 20


def _hms(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def reporting_process() -> bool:
    """Whether this process is the one that prints (rank 0 under torchrun, or no torchrun)."""
    return os.environ.get("RANK", "0") == "0"


class Progress:
    """``[label] [bar] step/total unit fields | elapsed < ETA`` on ``stream`` (stderr).

    ``total`` None (a stream of unknown length) drops the bar and the ETA. Nothing is drawn
    before ``delay_s`` has passed since construction; after that at most every ``every_s``
    seconds (0.2 s on a terminal), and always at the last step. ``clock`` is for tests.
    """

    def __init__(self, total: Optional[int], start: int = 0, enabled: bool = True, stream: Optional[TextIO] = None,
                 every_s: float = EVERY_S, label: str = "", unit: str = "", delay_s: float = 0.0,
                 clock: Callable[[], float] = time.perf_counter):
        self.total, self.start, self.step = total, start, start
        self.enabled = enabled and reporting_process()
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s if not self.tty else TTY_EVERY_S
        # a line wider than the terminal wraps, and "\r" then redraws only its last part
        self.width = min(160, shutil.get_terminal_size((161, 24)).columns - 1) if self.tty else 160
        self.label, self.unit, self.delay_s = label, unit, delay_s
        self.clock = clock
        self.t0 = clock()
        self.last: Optional[float] = None  # when the last line was drawn
        self.shown = False

    def update(self, step: int, fields: Optional[Dict[str, float]] = None) -> None:
        """``step`` units of ``total`` are done; draw if it is time to."""
        self.step = step
        if not self.enabled:
            return
        now = self.clock()
        final = self.total is not None and step >= self.total
        if now - self.t0 < self.delay_s:
            return  # a short wait says nothing
        if self.last is not None and now - self.last < self.every_s and not final:
            return
        self.last, self.shown = now, True
        line = self.line(step, now, fields or {})
        if self.tty:
            self.stream.write("\r" + line[:self.width].ljust(self.width))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def advance(self, n: int = 1, fields: Optional[Dict[str, float]] = None) -> None:
        """``n`` more units are done."""
        self.update(self.step + n, fields)

    def line(self, step: int, now: float, fields: Dict[str, float]) -> str:
        elapsed = now - self.t0
        parts = [self.label] if self.label else []
        count = f"{step}/{self.total}" if self.total is not None else f"{step}"
        if self.total is not None:
            width = 24
            filled = min(width, int(width * step / max(self.total, 1)))
            parts.append("[" + "#" * filled + "-" * (width - filled) + "]")
        parts.append(f"{count} {self.unit}" if self.unit else count)
        parts += [f"{k} {v:.4g}" for k, v in fields.items()]
        parts += ["|", _hms(elapsed)]
        if self.total is not None:
            rate = (step - self.start) / max(elapsed, 1e-9)
            parts += ["<", _hms((self.total - step) / rate) if rate > 0 else "--:--"]
        return " ".join(parts)

    def close(self) -> None:
        """End the redrawn line (a terminal), so what follows starts on its own line."""
        if self.enabled and self.tty and self.shown:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Working(Progress):
    """``label | elapsed``: a :class:`Progress` with nothing to count; ``label`` may change per stage."""

    def line(self, step: int, now: float, fields: Dict[str, float]) -> str:
        return f"{self.label} | {_hms(now - self.t0)}"


@contextlib.contextmanager
def working(label: str, enabled: bool = True, stream: Optional[TextIO] = None) -> Iterator[Working]:
    """Say that a blocking call is still at work: silent for ``DELAY_S``, then ``label | 00:12``
    redrawn by a thread (each second on a terminal, every ``EVERY_S`` in a log) until the block
    ends. Set ``.label`` to name the stage it is in."""
    bar = Working(None, enabled=enabled, stream=stream, label=label, delay_s=DELAY_S)
    if not bar.enabled:
        yield bar
        return
    done = threading.Event()

    def redraw() -> None:
        while not done.wait(min(1.0, bar.every_s)):
            bar.update(0)

    thread = threading.Thread(target=redraw, name="vitkit-working", daemon=True)
    thread.start()
    try:
        yield bar
    finally:
        done.set()
        thread.join(timeout=2)
        bar.close()


def waiting_bar(total: Optional[int], label: str, enabled: bool = True, unit: str = "", **options) -> Progress:
    """A :class:`Progress` that stays silent for the first :data:`DELAY_S` seconds, as
    :func:`track`'s: for loops that count their work themselves (``advance()``, ``close()``)."""
    options.setdefault("delay_s", DELAY_S)
    return Progress(total, enabled=enabled, label=label, unit=unit, **options)


def track(items: Iterable[T], label: str, total: Optional[int] = None, enabled: bool = True, *,
          unit: str = "", delay_s: Optional[float] = None, stream: Optional[TextIO] = None,
          clock: Callable[[], float] = time.perf_counter) -> Iterator[T]:
    """Yield ``items``, drawing ``label [bar] i/total unit | elapsed < ETA`` once the wait has
    lasted ``delay_s`` (default :data:`DELAY_S`); nothing at all when ``enabled`` is False.

    ``total`` defaults to ``len(items)`` where it has one. An item counts as done when the
    loop asks for the next one, so the time the loop body takes is in the ETA.
    """
    if not enabled:
        yield from items
        return
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    bar = waiting_bar(total, label, unit=unit, delay_s=DELAY_S if delay_s is None else delay_s, stream=stream,
                      clock=clock)
    try:
        for i, item in enumerate(items, 1):
            yield item
            bar.update(i)
    finally:
        bar.close()


def copy_with_progress(src: BinaryIO, dst: BinaryIO, label: str, total_bytes: Optional[int] = None,
                       enabled: bool = True, chunk: int = 1 << 20) -> int:
    """Copy the file object ``src`` into ``dst`` as ``shutil.copyfileobj`` does, drawing the
    megabytes done (and the ETA when the size is known: ``total_bytes``, else an HTTP response's
    Content-Length) once it has lasted :data:`DELAY_S`. Returns the bytes copied."""
    if total_bytes is None:
        length = getattr(src, "headers", None) and src.headers.get("Content-Length")
        total_bytes = int(length) if length and str(length).isdigit() else None
    total_mb = -(-total_bytes // MB) if total_bytes else None
    done = 0
    with waiting_bar(total_mb, label, enabled, unit="MB") as bar:
        for data in iter(lambda: src.read(chunk), b""):
            dst.write(data)
            done += len(data)
            begun = -(-done // MB)  # megabytes begun: the end reads total/total
            bar.update(min(begun, total_mb) if total_mb else begun)
    return done


# ------------------------------------------------------------------ other libraries' bars

#: the libraries that draw bars of their own: (their switches' module, the variable a user sets)
LIBRARY_SWITCHES = {"datasets": ("datasets.utils", "HF_DATASETS_DISABLE_PROGRESS_BARS"),
                    "huggingface_hub": ("huggingface_hub.utils", "HF_HUB_DISABLE_PROGRESS_BARS")}
_LIBRARY_BARS = {"shown": True}
_SWITCHED_OFF: List[Any] = []


@contextlib.contextmanager
def library_bars(shown: bool) -> Iterator[None]:
    """A verb's ``--no-progress`` for the bars Hugging Face's libraries draw as well (datasets' "Generating train
    split" and "Downloading data" on a local folder filled stderr under it): switched off in a library already
    imported, and by :func:`quiet_libraries` in one imported during the verb; on again after it."""
    before = _LIBRARY_BARS["shown"]
    _LIBRARY_BARS["shown"] = shown
    try:
        quiet_libraries()
        yield
    finally:
        _LIBRARY_BARS["shown"] = before
        while _SWITCHED_OFF:
            _SWITCHED_OFF.pop().enable_progress_bars()


def quiet_libraries() -> None:
    """The bars of the libraries imported so far off while a verb runs without progress (``extras.require`` calls
    it after each import), except where the user's variable decides (each library reads its own)."""
    if _LIBRARY_BARS["shown"]:
        return
    for name, (module, variable) in LIBRARY_SWITCHES.items():
        if name in sys.modules and os.environ.get(variable) is None:
            switches = importlib.import_module(module)
            if not switches.are_progress_bars_disabled():
                switches.disable_progress_bars()
                _SWITCHED_OFF.append(switches)


__all__ = ["Progress", "track", "waiting_bar", "copy_with_progress", "reporting_process", "DELAY_S",
           "library_bars", "quiet_libraries"]
