"""Ctrl-C and SIGTERM as exceptions raised where it is safe (deferred inside native imports), and
a DataLoader worker's death by such a signal read as the stop it means. Imports no other vitkit module."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from typing import Any, Dict, Iterator, Optional

# ---------------------------------------------------------------- signals, raised where it is safe
#
# The command line turns Ctrl-C and SIGTERM into exceptions raised wherever Python is, so that
# cleanup runs. Raised inside a native extension's callback into Python (nanobind while
# onnxruntime is imported), such an exception cannot cross the C++ frames: the process aborts
# ("terminate called after throwing ...") and cleans nothing. Sections of that kind defer it.

_deferral: Dict[str, Any] = {"depth": 0, "pending": None}


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold a Ctrl-C or SIGTERM that arrives inside this block (through :func:`interrupt`) and
    raise it when the block ends: for imports of native extensions, which must not be interrupted
    half-way."""
    _deferral["depth"] += 1
    try:
        yield
    finally:
        _deferral["depth"] -= 1
        pending = _deferral["pending"]
        if pending is not None and _deferral["depth"] == 0:
            _deferral["pending"] = None
            raise pending


def interrupt(error: BaseException) -> None:
    """Raise ``error`` (a signal handler's KeyboardInterrupt) now, or, inside
    :func:`interrupts_deferred`, when that block ends."""
    if _deferral["depth"]:
        _deferral["pending"] = error
        return
    raise error


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Python is when it arrives, so that it unwinds exactly as Ctrl-C does:
    every ``finally`` and context manager runs (temporaries and work folders removed, the run's
    lock released) before the process exits."""


#: what torch's DataLoader raises in the main process when one of its workers died of a signal
_WORKER_KILLED = re.compile(r"DataLoader worker \(pid \d+\) is killed by signal: (\w+)")


def worker_stop(error: BaseException) -> Optional[KeyboardInterrupt]:
    """The stop a DataLoader worker's death by SIGTERM or SIGINT means (the signal reached the
    worker, alone or with its process group), or None for any other error."""
    found = _WORKER_KILLED.search(str(error)) if isinstance(error, RuntimeError) else None
    if found is None or found.group(1) not in ("Terminated", "Interrupt"):
        return None
    return Terminated() if found.group(1) == "Terminated" else KeyboardInterrupt()


def expect_worker_deaths() -> None:
    """While a stop unwinds, workers that die (of the same signal, or shut down) are expected:
    torch's SIGCHLD handler would raise their deaths again inside the cleanup (``__del__``
    tracebacks). The command line puts the previous handler back when it returns."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
