"""Dynamic batching: requests that arrive together share one forward pass.

Each request puts one item on a bounded queue and awaits its own future. One worker takes the
first waiting item, then gathers more until the batch holds ``max_batch`` or ``max_wait_ms``
has passed since that first item (at once when nothing else is queued or on its way: a lone
request pays no wait; see :meth:`Batcher.arriving`), runs the batch in a thread (the event loop keeps accepting
requests meanwhile) and hands each result back to its own future. A full queue refuses at once
(:class:`QueueFull`, answered 503 with Retry-After) rather than growing a backlog; an item whose
client went away before its batch ran is dropped, not computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Sequence

from .metrics import Metrics


class QueueFull(Exception):
    """The queue holds ``max_queue`` items: the server is at capacity (answered 503)."""


class Stopped(Exception):
    """The batcher is stopping (SIGTERM): no new work (answered 503)."""


@dataclass
class _Item:
    value: Any
    future: asyncio.Future
    queued: float = field(default_factory=time.perf_counter)


class Batcher:
    """Groups :meth:`submit`\\ ted items into calls of ``run(values) -> results`` (one result per
    value, in order), at most ``max_batch`` values each, waiting at most ``max_wait_ms`` for a
    batch to fill. ``name`` labels its metrics."""

    def __init__(self, run: Callable[[Sequence[Any]], List[Any]], name: str, max_batch: int = 32,
                 max_wait_ms: float = 5.0, max_queue: int = 256, metrics: Optional[Metrics] = None):
        if max_batch < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch and max_queue must be >= 1 and max_wait_ms >= 0, not {max_batch}, "
                             f"{max_queue} and {max_wait_ms}")
        self.run, self.name = run, name
        self.max_batch, self.max_wait, self.max_queue = max_batch, max_wait_ms / 1000.0, max_queue
        self.metrics = metrics or Metrics()
        self._queue: Optional[asyncio.Queue] = None
        self._worker: Optional[asyncio.Task] = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"vitkit-{name}")  # one model call at once
        self._stopping = False
        self._arriving = 0

    async def start(self) -> None:
        self._queue = asyncio.Queue(self.max_queue)
        self._worker = asyncio.get_running_loop().create_task(self._serve())

    async def submit(self, value: Any) -> Any:
        """The result for ``value`` once its batch has run (its exception, if the batch failed)."""
        if self._stopping or self._queue is None:
            raise Stopped()
        item = _Item(value, asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            raise QueueFull() from None
        self.metrics.set_gauge("vitkit_queue_depth", self._queue.qsize(), batcher=self.name)
        return await item.future

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """Around a request's reading and decoding, before it is submitted: while any request is on
        its way, a batch waits for it (up to ``max_wait_ms``); with none, the batch runs at once.
        (One client at a time paid the whole wait on every request: 4-5 ms of ViT-S/16's ~90 ms.)"""
        self._arriving += 1
        try:
            yield
        finally:
            self._arriving -= 1

    @property
    def depth(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    async def stop(self) -> None:
        """Finish what is queued, then stop (called after the server stopped taking requests)."""
        self._stopping = True
        if self._queue is not None and self._worker is not None:
            await self._queue.join()
            self._worker.cancel()
        self._pool.shutdown(wait=True)

    async def _serve(self) -> None:
        assert self._queue is not None
        while True:
            batch = await self._gather()
            live = [item for item in batch if not item.future.done()]  # a cancelled request: skipped
            try:
                if live:
                    await self._run(live)
            finally:
                for _ in batch:
                    self._queue.task_done()
                self.metrics.set_gauge("vitkit_queue_depth", self._queue.qsize(), batcher=self.name)

    async def _gather(self) -> List[_Item]:
        assert self._queue is not None
        batch = [await self._queue.get()]
        deadline = time.perf_counter() + self.max_wait
        while len(batch) < self.max_batch:
            if self._queue.empty() and not self._arriving:  # nothing more is coming: no reason to wait
                break
            left = deadline - time.perf_counter()
            if left <= 0:
                while len(batch) < self.max_batch and not self._queue.empty():  # what already waits joins
                    batch.append(self._queue.get_nowait())
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), left))
            except asyncio.TimeoutError:
                break
        return batch

    async def _run(self, items: List[_Item]) -> None:
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        try:
            results = await loop.run_in_executor(self._pool, self.run, [item.value for item in items])
            if len(results) != len(items):
                raise RuntimeError(f"the batch gave {len(results)} results for {len(items)} inputs")
        except Exception as e:  # every request of the batch learns why
            for item in items:
                if not item.future.done():
                    item.future.set_exception(e)
            return
        finally:
            self.metrics.observe("vitkit_batch_size", len(items), batcher=self.name)
            self.metrics.observe("vitkit_batch_seconds", time.perf_counter() - start, batcher=self.name)
        for item, result in zip(items, results):
            if not item.future.done():
                item.future.set_result(result)
