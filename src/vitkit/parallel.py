"""Use a CPU's cores by splitting the batch, not each operation.

PyTorch parallelises every operation over OpenMP threads, which meet at a barrier after each
one: hundreds of barriers per step. Alone on a CPU that works; beside another busy process the
scheduler runs one thread while its partner waits for a time slice, and every barrier costs a
slice. Measured on a 2-core AMD EPYC beside a 2-thread matmul loop: the default run fell from
~1,500 to 25-141 img/s. Here each of ``workers`` threads runs a contiguous part of the batch
with single-threaded operations (no barrier inside a step); their gradients (or scores) are
added in a fixed order, so a run's numbers depend on the number of parts, never on timing.
Alone it is also faster on small models (the default run: ~1.2x), and as fast on ViT-S/16.

The parts of a micro-batch are what gradient accumulation would make of it: a step with two
parts equals, bitwise, the same step taken as two accumulation micro-batches of the same images.
"""

from __future__ import annotations

import contextlib
import gc
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, List, Optional, Sequence

import torch
from torch import nn

#: ``--cpu-parallel``: batch (split the batch over single-threaded workers), ops (torch's own
#: OpenMP threads inside each operation), auto (batch where it keeps a run reproducible)
MODES = ("auto", "batch", "ops")


def parts(n: int, workers: int) -> List[slice]:
    """Contiguous, nearly equal slices of ``n`` samples, one per worker (fewer when ``n`` is small)."""
    k = max(1, min(workers, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(k)]


def stochastic_modules(model: nn.Module) -> List[str]:
    """Names of the modules that draw random numbers in training (dropout, drop-path): torch draws
    them from one process-wide generator, so workers running at once would draw in a timing-
    dependent order and a run could not be repeated."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            rate = module.p
        else:  # vitkit's own: DropPath.prob, a block's drop_path, attention-weight attn_drop
            rate = max((v for k, v in vars(module).items()
                        if isinstance(v, float) and (k == "prob" or "drop" in k)), default=0.0)
        if rate > 0:
            found.append(name or type(module).__name__)
    return found


class BatchParallel:
    """``workers`` threads that each run a part of a batch with single-threaded operations.

    ``run(fn, n)`` calls ``fn(part)`` for the slices of :func:`parts` at once and returns the
    results in order; the caller adds them up in that order. Each call enters the caller's
    autocast and grad mode in the worker (both are per thread in torch).
    """

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self.workers = workers
        self._pool: Optional[ThreadPoolExecutor] = None

    def run(self, fn: Callable[[slice], Any], n: int) -> List[Any]:
        slices = parts(n, self.workers)
        if len(slices) == 1:
            return [fn(slices[0])]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="vitkit-part")
        state = _thread_state()
        collecting = gc.isenabled()
        gc.disable()  # the cyclic collector would run in whichever worker allocates: objects of
        try:  # other libraries (a runtime's session) would then be freed on a part's thread
            futures = [self._pool.submit(_in_state, state, fn, s) for s in slices]
            return [f.result() for f in futures]
        finally:
            if collecting:
                gc.enable()

    def spread(self, fn: Callable[[Any], Any], items: Sequence[Any], costs: Sequence[float]) -> List[Any]:
        """``[fn(item) for item in items]``, the items shared out among the workers (the costliest first, each to
        the worker with the least so far: a fixed share for given costs) and each worker's run one after another:
        work of many independent pieces, such as Muon's matrices, on every core without a barrier between them."""
        if self.workers == 1 or len(items) < 2:
            return [fn(item) for item in items]
        shares: List[List[int]] = [[] for _ in range(self.workers)]
        loads = [0.0] * self.workers
        for i in sorted(range(len(items)), key=lambda i: (-costs[i], i)):
            least = loads.index(min(loads))
            shares[least].append(i)
            loads[least] += costs[i]
        done = self.run(lambda part: [fn(items[i]) for i in shares[part.start]], self.workers)  # part i: [i, i+1)
        results: List[Any] = [None] * len(items)
        for share, values in zip(shares, done):
            for i, value in zip(share, values):
                results[i] = value
        return results

    @contextlib.contextmanager
    def single_threaded_ops(self) -> Iterator[None]:
        """Operations on one thread each while the block runs (the workers are the parallelism)."""
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class PartedModel(nn.Module):
    """A model for inference whose every batch is computed in parts, one per thread (what
    ``vitkit predict`` and ``vitkit eval`` run on a CPU); its outputs are concatenated in order.
    ``config`` and the model's own attributes are the wrapped model's."""

    def __init__(self, model: nn.Module, parallel: BatchParallel):
        super().__init__()
        self.model = model
        self.parallel = parallel

    @property
    def config(self) -> Any:
        return self.model.config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(parts(len(x), self.parallel.workers)) == 1:  # one image: torch's threads inside each operation
            return self.model(x)  # (one part on one thread left the other cores idle: a server's lone request)
        with self.parallel.single_threaded_ops():
            return torch.cat(self.parallel.run(lambda part: self.model(x[part]), len(x)))


def for_inference(model: nn.Module, threads: Optional[int] = None) -> nn.Module:
    """``model`` computed in batch parts over ``threads`` (default: torch's) when it runs on a CPU
    with more than one thread; otherwise ``model`` itself."""
    threads = threads or torch.get_num_threads()
    params = next(model.parameters(), None)
    if threads < 2 or (params is not None and params.device.type != "cpu"):
        return model
    return PartedModel(model, BatchParallel(threads))


def _thread_state() -> dict:
    """The per-thread torch state a worker must share with its caller."""
    state = {"grad": torch.is_grad_enabled(), "inference": torch.is_inference_mode_enabled(), "autocast": None}
    if torch.is_autocast_enabled("cpu"):
        state["autocast"] = ("cpu", torch.get_autocast_dtype("cpu"))
    elif torch.cuda.is_available() and torch.is_autocast_enabled("cuda"):
        state["autocast"] = ("cuda", torch.get_autocast_dtype("cuda"))
    return state


def _in_state(state: dict, fn: Callable[[slice], Any], part: slice) -> Any:
    with contextlib.ExitStack() as stack:
        if state["inference"]:
            stack.enter_context(torch.inference_mode())
        stack.enter_context(torch.set_grad_enabled(state["grad"]))
        if state["autocast"] is not None:
            stack.enter_context(torch.autocast(state["autocast"][0], dtype=state["autocast"][1]))
        return fn(part)


def add_in_order(values: Sequence[Optional[torch.Tensor]]) -> Optional[torch.Tensor]:
    """``values[0] + values[1] + ...`` left to right (None where a part gave nothing)."""
    total = None
    for v in values:
        if v is not None:
            total = v if total is None else total + v
    return total


def choose(mode: str, threads: int, device: torch.device, world: int, model: nn.Module,
           compiled: bool) -> "tuple[Optional[BatchParallel], str]":
    """The run's CPU parallelism: (a BatchParallel or None for torch's own threads, why).

    ``auto`` splits the batch on a CPU with more than one thread, a single process, an eager
    model and no random layers; ``batch`` asks for it and is refused where it cannot apply.
    """
    if mode not in MODES:
        raise ValueError(f"cpu_parallel must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "ops" or device.type != "cpu" or threads < 2:
        return None, "ops"
    blockers = []
    if world > 1:
        blockers.append(f"{world} processes (each runs its own part already)")
    if compiled:
        blockers.append("--compile (a compiled model runs on one thread at a time)")
    random_layers = stochastic_modules(model)
    if random_layers:
        blockers.append(f"random layers ({', '.join(random_layers[:3])}{', ...' if len(random_layers) > 3 else ''}: "
                        f"their draws would follow the threads' timing)")
    if blockers:
        if mode == "batch":
            raise ValueError("cpu_parallel batch cannot split this run's batches: " + "; ".join(blockers)
                             + " (use --cpu-parallel ops or auto)")
        return None, "ops (" + "; ".join(blockers) + ")"
    return BatchParallel(threads), "batch"


__all__ = ["MODES", "BatchParallel", "PartedModel", "add_in_order", "choose", "for_inference", "parts",
           "stochastic_modules"]
