"""What the streaming readers (:class:`~vitkit.data.shards.ShardDataset`, :class:`~vitkit.data.hf.HFStream`)
share: the rank and world size they read for, and passes over a reader's share until its epoch length is met."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Tuple

import torch

from ..utils import seed_for
from .transforms import with_fixed_draws


def _default_rank_world() -> Tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class RankedReader:
    """The rank and world size a stream reads for: given, else torch.distributed's (else 0 of 1); and its
    samples' transform with their random draws fixed (:meth:`transformed`)."""

    _rank: Optional[int] = None
    _world_size: Optional[int] = None
    transform: Optional[Callable] = None
    seed: int = 0
    epoch: int = 0
    #: the DataLoader's batch size in training: each worker's share of an epoch is whole batches of it
    batch_quantum: int = 1
    #: training: each sample's random draws fixed by its place (evaluation's transform draws nothing)
    fixed_draws: bool = False

    def for_training(self, batch: int) -> None:
        """Read as training reads: whole batches of ``batch`` per worker, each sample's draws fixed."""
        self.batch_quantum, self.fixed_draws = batch, True

    def worker_quota(self, length: Optional[int], worker: int, workers: int) -> Optional[int]:
        """This worker's samples of an epoch of ``length`` (a rank's; None: no length, every sample once): whole
        batches of :attr:`batch_quantum` shared out among the workers. Each worker batches its own share and drops
        its own last part, so shares of samples made an epoch's batches depend on the worker count (a resume with
        another --workers rescaled the schedule), and the training then counted more than it read."""
        if length is None:
            return None
        batches, rest = divmod(length // self.batch_quantum, workers)
        return (batches + (worker < rest)) * self.batch_quantum

    def transformed(self, im: Any, *where: int) -> Any:
        """``im`` through the transform; in training (:meth:`for_training`) its random draws fixed by (seed, epoch,
        ``where``: the reader and the sample's position in its epoch): drawn from the process's own state, a resumed
        run's crops and flips were not the uninterrupted run's (its DataLoader's seed, and without workers the
        training's own draws, were others), though its samples were."""
        if self.transform is None:
            return im
        if not self.fixed_draws:
            return self.transform(im)
        return with_fixed_draws(seed_for(self.seed, "stream-sample", self.epoch, *where), self.transform, im)

    @property
    def rank(self) -> int:
        return self._rank if self._rank is not None else _default_rank_world()[0]

    @property
    def world_size(self) -> int:
        return self._world_size if self._world_size is not None else _default_rank_world()[1]


def repeat_passes(one_pass: Callable[[int], Iterator[Any]], quota: Optional[int], counts: Callable[[Any], bool],
                  empty: Callable[[], str], again: Callable[[int], None] = lambda produced: None) -> Iterator[Any]:
    """A reader's items over passes of its share (``one_pass(passes)``): one pass without a
    ``quota``, else passes until ``quota`` items that ``counts`` have been produced (an epoch
    length every reader meets, whatever its share). A pass that finds none is a ValueError with
    ``empty()``'s words instead of an endless loop; ``again(produced)`` is told before the second pass."""
    produced, passes = 0, 0
    while quota != 0:
        found = 0
        for item in one_pass(passes):
            found += counts(item)
            yield item
        produced += found
        passes += 1
        if quota is None or produced >= quota:
            return
        if found == 0:
            raise ValueError(empty())
        if passes == 1:
            again(produced)
