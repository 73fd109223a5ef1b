"""A DataLoader's batches that stop as the command stops: a SIGTERM that reaches one of its
worker processes (alone, or with the whole process group) ends the run as one to the main
process does (:class:`~vitkit.signals.Terminated` at the next batch), not as torch's "worker is
killed by signal" error; and one that lands while the workers are forked is not lost. Training,
evaluation and feature extraction over files read through it."""

from __future__ import annotations

import functools
import multiprocessing
import signal
import threading
from typing import Any, Iterator, List, Tuple

from torch._C import _error_if_any_worker_fails
from torch.utils.data import DataLoader, Dataset

from ..signals import Terminated, interrupts_deferred, stop_received, worker_stop


def _note_sigterm(flag: Any, worker_id: int) -> None:
    """A DataLoader worker's first SIGTERM (sent to it alone, or to the whole process group) is
    noted for the main process, which stops the run cleanly at its next batch and shuts the
    workers down; a second one (torch's own terminate(), after a shutdown timed out) ends it."""
    if isinstance(stop_received(), Terminated):  # it came between the fork and here: the inherited
        flag.value = 1                          # handler noted it and put SIGTERM's default back
        return

    def on_sigterm(signum, frame):
        flag.value = 1
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, on_sigterm)


def loader_batches(dataset: Dataset, **options: Any) -> Iterator[Any]:
    """A DataLoader's batches; with workers, a SIGTERM that reached one of them stops the run as
    one to this process does (:class:`~vitkit.signals.Terminated` at the next batch), rather than
    torch's "worker is killed by signal" error."""
    if not options.get("num_workers"):
        yield from DataLoader(dataset, **options)
        return
    flag = multiprocessing.RawValue("b", 0)
    deaths: List[RuntimeError] = []

    def check() -> None:  # a worker's note or death, or a stop of this process Python could only report
        if deaths and not flag.value:
            raise worker_stop(deaths[0]) or deaths[0]
        stop = Terminated() if flag.value else stop_received()
        if stop is not None:
            raise stop

    loader = DataLoader(dataset, worker_init_fn=functools.partial(_note_sigterm, flag), **options)
    with interrupts_deferred():  # the workers' start: a stop raised inside it (or inside its at-fork
        batches = iter(loader)   # hooks, where it is lost) leaves an iterator whose __del__ fails
    waiting = [False]  # whether this process waits inside the loader, where a death is raised as torch raises it
    previous = _note_deaths_in(deaths, waiting)
    try:
        while True:
            waiting[0] = True
            try:
                batch = next(batches)
            except StopIteration:
                return
            finally:
                waiting[0] = False
            check()
            yield batch
            check()
    except RuntimeError:  # torch's word for a worker gone ("exited unexpectedly"), after one noted a SIGTERM that
        if flag.value or _died_of(batches, signal.SIGTERM):  # then ended it before this process asked, or one that
            raise Terminated() from None                     # came before its note could be made: the stop it means
        raise
    finally:
        del batches  # its workers shut down here (unless a traceback holds it), while a death is only noted
        _put_back(previous, deaths)


def _note_deaths_in(deaths: List[RuntimeError], waiting: List[bool]) -> Any:
    """While this process's main thread iterates a loader, a worker's death between batches is noted for the
    next one, not raised wherever the main thread is then (torch's SIGCHLD handler raises it there: inside the
    caller's own code, or pytest's, as a RuntimeError nothing expects); one while it waits for a batch is raised
    at once, as torch does. Returns the handler it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_child_ended(signum: int, frame: Any) -> None:
        try:
            _error_if_any_worker_fails()
        except RuntimeError as e:
            if waiting[0]:
                raise
            deaths.append(e)
    on_child_ended.deaths = deaths  # type: ignore[attr-defined]
    return signal.signal(signal.SIGCHLD, on_child_ended)


def _put_back(previous: Any, deaths: List[RuntimeError]) -> None:
    """The SIGCHLD handler before the loader's, unless a stop replaced the loader's meanwhile (see
    :func:`~vitkit.signals.expect_worker_deaths`)."""
    if threading.current_thread() is threading.main_thread() \
            and getattr(signal.getsignal(signal.SIGCHLD), "deaths", None) is deaths:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL if previous is None else previous)


def _died_of(batches: Any, signum: int) -> bool:
    """Whether one of the iterator's workers died of ``signum``. torch puts its own C handler for SIGTERM in a
    worker before the worker_init_fn runs (it prints nothing and ends the worker): a SIGTERM in that window left no
    note, and the stop was "unexpected RuntimeError: DataLoader worker ... exited unexpectedly" (exit 2)."""
    return any(getattr(w, "exitcode", None) == -signum for w in getattr(batches, "_workers", ()))


def decoded_batches(dataset: Dataset, batch_size: int, workers: int, skipped: List[str]) -> Iterator[Tuple[Any, Any]]:
    """(inputs, labels) batches of a dataset giving transformed samples or ``Skipped`` (an image
    folder, a Hugging Face split); the names of the skipped ones are appended to ``skipped``."""
    from .folder import collate_skip_bad

    for x, y, bad in loader_batches(dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate_skip_bad):
        skipped.extend(bad)
        if x is not None:
            yield x, y
