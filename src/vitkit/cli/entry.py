"""``vitkit <verb>``'s entry point and error boundary: every way a verb ends is one line on
stderr (0 done, 2 an error in words, 130 Ctrl-C, 143 SIGTERM) or none (141: stdout's reader,
``| head``, went away), warnings one ``note:`` line."""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import gc
import json
import logging
import os
import re
import select
import signal
import stat
import sys
import threading
import warnings
from typing import Optional, Sequence

from ..errors import AnsweredError, describe_error, is_user_error
from ..machine import first_process_alive, first_process_on_machine, under_torchrun
from ..progress import library_bars
from ..signals import Terminated, expect_worker_deaths, interrupt, own_signals, report_unraisable_unless_noted
from .common import use_threads
from .parser import build_parser


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM while cleaning up ends it at once
    expect_worker_deaths()  # sent to the process group, it ends the DataLoader workers too
    interrupt(Terminated(), signum)  # now, or after a native import (raised inside one, it would abort)


def _on_sigint(signum, frame):
    interrupt(KeyboardInterrupt(), signum)  # Python's own handler, made to wait out native imports too


def _one_line_warnings(verb: str):
    """Warnings as one line each (``vitkit VERB: note: ...``) instead of Python's two lines with a
    source line; each said once (a model built twice would say its note twice); returns the previous hook."""
    previous = warnings.showwarning
    said = set()

    def show(message, category, filename, lineno, file=None, line=None):
        text = " ".join(str(message).split())
        if text not in said and first_process_on_machine():  # (under torchrun every rank said each note)
            said.add(text)
            print(f"vitkit {verb}: note: {text}", file=sys.stderr)

    warnings.showwarning = show
    return previous


class _OneLineLogs(logging.Handler):
    """The library's log lines (a skipped file, files left out of a folder) as the verb's notes: Python's
    last-resort handler printed them bare, the one kind of line without ``vitkit VERB:`` before it."""

    def __init__(self, verb: str):
        super().__init__(logging.WARNING)
        self.verb = verb

    def emit(self, record: logging.LogRecord) -> None:
        if first_process_on_machine():
            print(f"vitkit {self.verb}: note: {' '.join(record.getMessage().split())}", file=sys.stderr)


def _said_by_first_process(e: BaseException) -> bool:
    """Under torchrun, whether this process leaves the line to its machine's first one: an input error or a stop
    that every rank meets alike, or another process's stop before the run began (``PeerLost``), was said once
    per rank. An unexpected error, and another's stop that left a checkpoint to name (rank 0 may be the one that
    stopped), are said by each process they reach."""
    if first_process_on_machine() or getattr(e, "said_by_each", False):
        return False
    return isinstance(e, (ValueError, OSError, KeyboardInterrupt)) or is_user_error(e)


#: the verbs that train on torchrun's processes (each rank its part of the batch)
DISTRIBUTED_VERBS = ("train", "pretrain")


def _check_one_process(verb: str) -> None:
    """Another verb under torchrun ran whole on every rank: it printed and wrote everything once per rank (a
    study's arms on both, eval's score twice)."""
    if verb not in DISTRIBUTED_VERBS and under_torchrun():
        raise ValueError(f"vitkit {verb} runs in one process, not under torchrun (each rank would run all of it): "
                         f"run it without torchrun (vitkit train and pretrain use its processes)")


def _leave_it_to_the_first_process(timeout_s: float = 30.0) -> None:
    """A rank that leaves its error to the machine's first process waits while that one runs: exiting first, it had
    torchrun stop the first before it said the error (still importing torch on a busy machine: the job ended
    without a word). torchrun stops this one once the first has failed; a first that meets no error (a rank's own,
    which a collective will notice) lets it go after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and first_process_alive():
            time.sleep(0.1)
    except (Terminated, KeyboardInterrupt):  # torchrun ending this rank: the first has said it
        pass


def _error(verb: str, e: Exception, debug: bool, as_json: bool = False) -> int:
    """The error's one line on stderr; with ``--json`` also ``{"error": ..., "exit": 2}`` on stdout, so that a
    script reading stdout has an answer to parse (unless the verb's own document already holds it)."""
    if debug:
        raise e
    if _said_by_first_process(e):
        _leave_it_to_the_first_process()
        return 2
    said = describe_error(e) if not _stdout_full(e) else ("no space left on the device stdout writes to: the "
                                                          "command's printed output is incomplete (send stdout to a "
                                                          "disk with space)")
    print(f"vitkit {verb}: error: {said}", file=sys.stderr)
    if as_json and not isinstance(e, AnsweredError):
        try:
            print(json.dumps({"verb": verb, "error": said, "exit": 2}), flush=True)
        except OSError:  # stdout's reader went away: stderr said it
            pass
    return 2


def _release_interrupted_work(stop: BaseException) -> None:
    """Free what the stopped verb held (its frames live on in the exception's traceback): a
    DataLoader's workers are shut down here, before the last line, rather than by the
    interpreter's exit, where its queues' threads and finalizers race and print tracebacks."""
    error: Optional[BaseException] = stop
    seen = set()
    while error is not None and id(error) not in seen:  # (a chain may loop: SIGTERM inside torch.onnx's import of
        seen.add(id(error))  # torch._dynamo made its own error the context of an error it caused, for ever)
        error.__traceback__ = None
        error = error.__context__ or error.__cause__
    gc.collect()


def _stdout_full(error: BaseException) -> bool:
    """Whether ``error`` is a full disk that stdout met (`vitkit fewshot --json > /dev/full`, said as the disk's,
    where every file the verb wrote was whole): an error naming no file, with stdout on /dev/full or a file on a
    disk with under 1 MiB left. If so stdout becomes /dev/null, so that Python's own flush at exit does not say
    it a second time."""
    from ..files import DiskFull

    if isinstance(error, DiskFull) or not (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
                                           and error.filename is None):  # (DiskFull names the file the verb wrote)
        return False
    try:  # (a failed write leaves nothing buffered to fail again: stdout's device is asked instead)
        fd = sys.stdout.fileno()
        kind = os.fstat(fd)
        if stat.S_ISCHR(kind.st_mode):
            full = kind.st_rdev == os.stat("/dev/full").st_rdev
        else:
            space = os.fstatvfs(fd)
            full = stat.S_ISREG(kind.st_mode) and space.f_bavail * space.f_frsize < 1 << 20
    except (AttributeError, ValueError, OSError):  # stdout is no file (a test's capture)
        return False
    if full:
        _to_devnull(fd)
    return full


def _stdout_closed() -> bool:
    """Whether stdout's reader went away (its pipe reports an error); if so stdout becomes /dev/null,
    so that Python's own flush at exit does not say 'Broken pipe' a second time."""
    try:
        fd = sys.stdout.fileno()
        probe = select.poll()
        probe.register(fd, select.POLLOUT)
        closed = any(events & select.POLLERR for _, events in probe.poll(0))
    except (AttributeError, ValueError, OSError):  # no poll (Windows), or stdout is no file
        return False
    if closed:
        _to_devnull(fd)
    return closed


def _to_devnull(fd: int) -> None:
    """``fd`` (stdout's) written to /dev/null from now on."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


#: verbs that write no file of their own: a stop says no "partial files were removed" (an export a server or
#: predict makes on the fly runs in a child that removes its own)
WRITES_NOTHING = ("models", "info", "predict", "serve")


def _check_thread_variable() -> None:
    """OMP_NUM_THREADS that is no thread count: OpenMP's own line ("Invalid value for environment variable") said
    nothing of what happens next; the run goes on with torch's default."""
    value = os.environ.get("OMP_NUM_THREADS")  # a count, or OpenMP's list of counts per nesting level ("4,2")
    if value is not None and not re.fullmatch(r"\s*0*[1-9]\d*(\s*,\s*\d+)*\s*", value, re.ASCII):
        warnings.warn(f"OMP_NUM_THREADS={value!r} is no thread count (a whole number >= 1): OpenMP ignores it, and "
                      f"the threads are --threads' where the verb has it, else torch's own choice", stacklevel=2)


def _stopped(args: argparse.Namespace, stop: KeyboardInterrupt) -> int:
    """A verb stopped by Ctrl-C or SIGTERM: its one line (what became of its files), with --json its object on
    stdout too; the exit code the shell gives a process the signal ended."""
    _release_interrupted_work(stop)
    signal_name = "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C"
    written = getattr(args, "written", None)  # (a stop after the verb's output was installed: it is whole)
    removed = "" if args.verb in WRITES_NOTHING else \
        f" after {written} was written whole" if written else "; partial files were removed"
    code = 143 if isinstance(stop, Terminated) else 130
    if not _said_by_first_process(stop):
        print(f"vitkit {args.verb}: stopped by {signal_name}{removed}", file=sys.stderr)
        if getattr(args, "json", False):  # a script reading stdout has an answer to parse, as for an error
            with contextlib.suppress(OSError):
                print(json.dumps({"verb": args.verb, "error": f"stopped by {signal_name}{removed}", "exit": code}),
                      flush=True)
    return code


def _parsed(argv: Optional[Sequence[str]]) -> Optional[argparse.Namespace]:
    """The verb and its values, each mistake one line (exit 2 by argparse); None where no verb was given: the help
    on stderr, as an error (it was exit 0, as if something ran)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    if extra:  # said by the verb's own parser, which knows the flags that were meant
        (verbs.get(getattr(args, "verb", None)) or parser).unknown(extra)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return None
    verbs[args.verb].check_values(args)
    return args


def _error_said(verb: str, e: Exception, debug: bool, as_json: bool) -> int:
    """:func:`_error`, and a signal arriving while its line is printed ends with the signal's code, not a
    traceback (a script that read the --json error and stopped the process)."""
    try:
        return _error(verb, e, debug, as_json)
    except KeyboardInterrupt as stop:
        if debug:
            raise
        return 143 if isinstance(stop, Terminated) else 130


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: one verb, and every way it can end as one line on stderr: 0 done, 2 an
    error (said in words; ``VITKIT_DEBUG=1`` shows its traceback), 130 Ctrl-C, 143 SIGTERM."""
    for name in ("stdout", "stderr"):  # closed (`vitkit models >&-`): Python has None there, and the work done was
        if getattr(sys, name) is None:  # "unexpected AttributeError" at the flush; its lines go nowhere, as asked
            setattr(sys, name, open(os.devnull, "w"))
    args = _parsed(argv)
    if args is None:
        return 2
    debug = bool(os.environ.get("VITKIT_DEBUG"))
    main_thread = threading.current_thread() is threading.main_thread()
    previous_unraisable = sys.unraisablehook
    if main_thread:
        own_signals()
        sys.unraisablehook = functools.partial(report_unraisable_unless_noted, previous_unraisable)
    previous_term = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    # Ctrl-C: only where Python's handler is installed (a background job ignores SIGINT: it still does)
    previous_int = signal.signal(signal.SIGINT, _on_sigint) \
        if main_thread and signal.getsignal(signal.SIGINT) is signal.default_int_handler else None
    previous_warn = _one_line_warnings(args.verb)
    logs = _OneLineLogs(args.verb)
    logging.getLogger("vitkit").addHandler(logs)
    previous_chld = signal.getsignal(signal.SIGCHLD) if main_thread else None  # see expect_worker_deaths
    try:
        _check_thread_variable()
        _check_one_process(args.verb)
        use_threads(args)
        with library_bars(not getattr(args, "no_progress", False)):
            code = int(args.func(args) or 0)
        # a buffered stdout (a pipe, without PYTHONUNBUFFERED) still holds the verb's lines: flushed
        # here, a reader that went away is caught below, not reported by Python at exit (status 120)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt as e:
        if debug:
            raise
        return _stopped(args, e)
    except BrokenPipeError as e:
        if debug or not _stdout_closed():
            return _error(args.verb, e, debug)
        return 141  # `vitkit models | head`: the reader took what it wanted; quiet, as `cat` is (128 + SIGPIPE)
    except Exception as e:
        return _error_said(args.verb, e, debug, bool(getattr(args, "json", False)))
    finally:
        # the handlers first: a SIGTERM landing here (torchrun ending a rank that has said its error) raised in
        # the middle of this block, a traceback after the line
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
        warnings.showwarning = previous_warn
        logging.getLogger("vitkit").removeHandler(logs)
        if main_thread:
            own_signals(False)
            sys.unraisablehook = previous_unraisable
        if main_thread and previous_chld is not None and signal.getsignal(signal.SIGCHLD) != previous_chld:
            signal.signal(signal.SIGCHLD, previous_chld)
