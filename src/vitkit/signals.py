"""Ctrl-C and SIGTERM as exceptions raised where it is safe (deferred inside native imports), and
a DataLoader worker's death by such a signal read as the stop it means. Imports no other vitkit module."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from typing import Any, Callable, Dict, Iterator, Optional

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


# The process whose handlers these are, and the stop they last raised in it. A process forked from
# it (a DataLoader worker before its worker_init_fn runs) inherits the handlers; and a stop raised
# inside an at-fork hook or a ``__del__`` is only reported by Python ("Exception ignored in"), not
# raised: the training loop asks :func:`stop_received` at each step so that none is lost.
_owner: Dict[str, Any] = {"pid": None, "stop": None}


def own_signals(owned: bool = True) -> None:
    """Called where the command line installs its handlers (this process is theirs, no stop yet)
    and, ``owned=False``, where it puts the previous ones back (a later library call in the same
    process, a test's, must not find the stop of a command that has ended)."""
    _owner["pid"], _owner["stop"] = (os.getpid() if owned else None), None


def stop_received() -> Optional[KeyboardInterrupt]:
    """A fresh copy of the stop a handler raised in this process since :func:`own_signals`, or None."""
    stop = _owner["stop"]
    return None if stop is None else stop()


def report_unraisable_unless_noted(previous: Callable[[Any], None], unraisable: Any) -> None:
    """``sys.unraisablehook`` while the command line owns the signals: a stop raised where Python
    could only report it (the at-fork hook that runs as a DataLoader's worker is forked, often
    where a SIGTERM lands) is noted, and raised at the next batch or step, not a traceback."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _owner["stop"] is not None:
        return
    previous(unraisable)


def _noted_in_forked_child(error: BaseException, signum: Optional[int]) -> bool:
    """In a process forked from the handlers' owner (a DataLoader worker between its fork and its
    worker_init_fn), note the stop and go on, as torch's workers do with Ctrl-C: raised there, it
    would be a traceback and a worker that "exited unexpectedly". The parent, sent the same signal,
    stops; a worker sent it alone hands the note on in its worker_init_fn. A second one ends it."""
    if signum is None or _owner["pid"] is None or os.getpid() == _owner["pid"]:
        return False
    signal.signal(signum, signal.SIG_DFL)
    _owner["stop"] = type(error)
    return True


def interrupt(error: BaseException, signum: Optional[int] = None) -> None:
    """Raise ``error`` (a signal handler's KeyboardInterrupt) now, or, inside
    :func:`interrupts_deferred`, when that block ends; in a forked child that inherited the
    handler (``signum`` given), only note it."""
    if _noted_in_forked_child(error, signum):
        return
    if _owner["pid"] is not None:  # only while the command line owns the signals: a library call goes on after
        _owner["stop"] = type(error)  # the type: a raised error's traceback holds frames (a DataLoader's workers)
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
        signal.signal(signal.SIGCHLD, _child_ended)


def _child_ended(signum: int, frame: Any) -> None:
    """SIGCHLD while a stop unwinds: nothing to do. A handler rather than SIG_DFL, because a
    SIGCHLD that arrived just before the stop (an evaluation's worker ending) is still pending for
    Python, which reports a pending signal whose handler became SIG_DFL as an error with a traceback
    ("Signal 17 ignored due to race condition")."""


def how_it_ended(code: int, who: str) -> str:
    """Why a child process (``who``) failed without a word: the signal that killed it, by name, or
    its exit code. SIGKILL is most often the kernel's out-of-memory killer, and says so."""
    if code >= 0:
        return f"{who} ended with exit code {code} before it said why"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"{who} was killed by {name} before it said why" + (" (out of memory?)" if -code == signal.SIGKILL else "")
