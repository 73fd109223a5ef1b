"""Where the loop's micro-batches come from: tensors in memory, or image files through a DataLoader.

Every source follows one order so that the step counter alone says where a run is: epoch
``e`` visits the training samples in ``epoch_order(seed, e)``, step ``s`` takes batch
``s mod steps_per_epoch`` of it, micro-batch ``k`` the k-th slice of that, and rank ``r``
the r-th part of the micro-batch. Randomness of augmentation is drawn from (seed, step) --
per batch in memory, per sample for files -- so a resumed run sees the same pixels.
Tar shards are streams: a resumed run re-reads the epoch up to its step (same order, same
samples); their augmentation follows the worker's random state and is not replayed.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..data.augment import random_crop, random_hflip
from ..data.folder import ImageFolder, collate_skip_bad
from ..data.images import BadImageError, Skipped
from ..data.loader import loader_batches
from ..data.transforms import with_fixed_draws
from ..evaluate.metrics import prepare_batch
from ..utils import seed_for

log = logging.getLogger("vitkit.train")

#: (inputs, labels, names of the bad samples dropped from it)
MicroBatch = Tuple[Optional[torch.Tensor], torch.Tensor, Tuple[str, ...]]


def generator(seed: int, stream: str, *index: int) -> torch.Generator:
    """A CPU generator for one random stream of the run (:func:`vitkit.utils.seed_for`)."""
    return torch.Generator().manual_seed(seed_for(seed, stream, *index))


def epoch_order(seed: int, epoch: int, n: int) -> torch.Tensor:
    """The permutation of ``n`` training samples that epoch ``epoch`` follows."""
    return torch.randperm(n, generator=generator(seed, "order", epoch))


def repeated_order(seed: int, epoch: int, n: int, repeats: int, layout: "Layout") -> torch.Tensor:
    """Repeated augmentation (DeiT; timm's RepeatAugSampler): the epoch's permutation with each
    index repeated ``repeats`` times in a row, padded to a multiple of the processes, dealt out
    round-robin (rank r takes positions r, r + world, ...), each rank keeping ceil(n / world)
    (timm's ``selected_round=0``) -- so an epoch still has about ``n`` samples, the first
    ``n / repeats`` of the permutation each ``repeats`` times in different augmentations.

    Returned in this module's global layout: micro-batch m holds every rank's m-th share
    (rank r's part is positions ``[r * local, (r + 1) * local)`` of it, as :meth:`Layout.mine`).
    """
    perm = epoch_order(seed, epoch, n)
    world = layout.world
    per_rank = math.ceil(n * repeats / world)
    rep = perm.repeat_interleave(repeats)
    rep = torch.cat([rep, rep[:per_rank * world - len(rep)]])
    keep = math.ceil(n / world)
    streams = torch.stack([rep[r::world][:keep] for r in range(world)])  # (world, keep)
    micros = keep // layout.local
    return streams[:, :micros * layout.local].reshape(world, micros, layout.local).transpose(0, 1).reshape(-1)


@dataclass
class Layout:
    """How a step's batch splits: accumulation micro-batches, then ranks."""

    batch_size: int
    accum_steps: int
    world: int
    rank: int

    @property
    def micro(self) -> int:  # global micro-batch
        return self.batch_size // self.accum_steps

    @property
    def local(self) -> int:  # this rank's part of it
        return self.micro // self.world

    @classmethod
    def fitting(cls, batch_size: int, accum_steps: int, world: int, rank: int,
                micro_batch: Optional[int] = None) -> "Layout":
        """The fewest accumulation steps (at least ``accum_steps``) that keep every process's
        micro-batch at or under ``micro_batch`` and divide the batch evenly."""
        accum = accum_steps
        if micro_batch:
            while accum <= batch_size and (batch_size % (accum * world) or batch_size // (accum * world) > micro_batch):
                accum += 1
        layout = cls(batch_size, min(accum, batch_size), world, rank)
        layout.check()
        return layout

    def check(self) -> None:
        if self.micro * self.accum_steps != self.batch_size or self.local * self.world != self.micro:
            raise ValueError(f"batch_size {self.batch_size} must divide into {self.accum_steps} accumulation "
                             f"steps x {self.world} processes")

    def mine(self, micro_batch: torch.Tensor) -> torch.Tensor:
        return micro_batch[self.rank * self.local:(self.rank + 1) * self.local]


def index_plan(n: int, seed: int, layout: Layout, start: int, total: int, repeats: int = 1
               ) -> Iterator[Tuple[int, int, torch.Tensor]]:
    """(step, k, global micro-batch indices) from ``start`` to ``total``; ``repeats`` > 1:
    repeated augmentation (:func:`repeated_order`)."""
    steps_per_epoch = n // layout.batch_size
    perm, perm_epoch = None, -1
    for step in range(start, total):
        epoch, index = divmod(step, steps_per_epoch)
        if epoch != perm_epoch:
            perm = epoch_order(seed, epoch, n) if repeats <= 1 else repeated_order(seed, epoch, n, repeats, layout)
            perm_epoch = epoch
        batch = perm[index * layout.batch_size:(index + 1) * layout.batch_size]
        for k in range(layout.accum_steps):
            yield step, k, batch[k * layout.micro:(k + 1) * layout.micro]


class MemoryBatches:
    """uint8 tensors on the device; crop and flip run on whole batches, drawn from (seed, step).

    Augmentation works on the uint8 pixels, before resizing and normalisation, in timm's
    order: crop (the padding is black, pixel 0, as torchvision's ``RandomCrop(padding=...)``
    fills; padding the normalised tensor with 0 would paint mean-grey bands that test images
    never have), flip, then ``randaugment`` (a :class:`~vitkit.data.randaugment.RandAugment`)
    per image, all drawn from the same (seed, step) generator.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, crop_pad: int = 0, hflip: bool = False,
                 randaugment: Optional[Callable] = None):
        self.images, self.labels = images, labels
        self.crop_pad, self.hflip, self.randaugment = crop_pad, hflip, randaugment

    def __len__(self) -> int:
        return len(self.labels)

    def train(self, config: Any, seed: int, layout: Layout, start: int, total: int, repeats: int = 1
              ) -> Iterator[MicroBatch]:
        plan = index_plan(len(self), seed, layout, start, total, repeats)
        for step, parts in itertools.groupby(plan, key=lambda item: item[0]):
            idx = torch.cat([part for _, _, part in parts]).to(self.images.device)
            # the step's whole global batch drawn at once from (seed, step), then each micro-batch and this
            # rank's part of it: the same image gets the same crop however the batch splits (micro-batches
            # drawn one by one had other draws with another number of processes or accumulation steps)
            aug = generator(seed, "augment", step)
            pixels = random_crop(self.images[idx], self.crop_pad, aug)
            if self.hflip:
                pixels = random_hflip(pixels, aug)
            if self.randaugment is not None:
                pixels = self.randaugment(pixels, aug)
            for k in range(layout.accum_steps):
                part = slice(k * layout.micro, (k + 1) * layout.micro)
                yield prepare_batch(layout.mine(pixels[part]), config), layout.mine(self.labels[idx[part]]), ()

    def eval(self, config: Any, batch_size: int) -> Iterator[MicroBatch]:
        for i in range(0, len(self), batch_size):
            yield prepare_batch(self.images[i:i + batch_size], config), self.labels[i:i + batch_size], ()


class _Seeded(Dataset):
    """Items ``(position, seed)`` -> the transformed sample, its random draws fixed by ``seed``."""

    def __init__(self, folder: ImageFolder, indices: Sequence[int], transform: Callable):
        self.folder, self.indices, self.transform = folder, list(indices), transform

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, item: Tuple[int, Optional[int]]):
        position, seed = item
        sample = self.folder[self.indices[position]]
        if isinstance(sample, Skipped):
            return sample
        if seed is None:
            return self.transform(sample[0]), sample[1]
        return with_fixed_draws(seed, self.transform, sample[0]), sample[1]


class FolderBatches:
    """Part of an :class:`ImageFolder` decoded in DataLoader workers through a torchvision pipeline."""

    def __init__(self, folder: ImageFolder, indices: Sequence[int], workers: int = 2):
        self.folder, self.indices, self.workers = folder, list(indices), workers

    def __len__(self) -> int:
        return len(self.indices)

    def first_size(self) -> Optional[Tuple[int, int]]:
        """(height, width) of the first image as stored (before any resize), None if it does not decode."""
        item = self.folder[self.indices[0]] if self.indices else None
        return None if item is None or isinstance(item, Skipped) else (item[0].height, item[0].width)

    def holds_colour(self, look: int = 16) -> bool:
        """Whether any of ``look`` images spread over the part is in colour as stored (its channels differ
        somewhere): a one-channel model reads them as grey, which its run says."""
        spread = sorted({self.indices[i * len(self.indices) // look] for i in range(min(look, len(self.indices)))})
        for index in spread:
            try:
                pixels = np.asarray(self.folder.stored_image(index), dtype=np.int16)
            except (BadImageError, OSError, ValueError):
                continue  # a bad file is skipped and said where it is read
            if np.abs(np.diff(pixels, axis=-1)).max() > 0:
                return True
        return False

    def _loader(self, dataset: Dataset, batches: Any) -> Iterator[MicroBatch]:
        return loader_batches(dataset, batch_sampler=batches, num_workers=self.workers, collate_fn=collate_skip_bad,
                              persistent_workers=False)

    def train(self, transform: Callable, seed: int, layout: Layout, start: int, total: int, repeats: int = 1
              ) -> Iterator[MicroBatch]:
        def plan() -> Iterator[List[Tuple[int, int]]]:
            for step, k, idx in index_plan(len(self), seed, layout, start, total, repeats):
                first = layout.rank * layout.local
                yield [(int(i), seed_for(seed, "sample", step, k, first + j)) for j, i in enumerate(layout.mine(idx))]
        yield from self._loader(_Seeded(self.folder, self.indices, transform), plan())

    def eval(self, transform: Callable, batch_size: int) -> Iterator[MicroBatch]:
        plan = [[(i, None) for i in range(s, min(s + batch_size, len(self)))]
                for s in range(0, len(self), batch_size)]
        yield from self._loader(_Seeded(self.folder, self.indices, transform), plan)


class ShardBatches:
    """A :class:`~vitkit.data.shards.ShardDataset` stream, ``local`` samples per micro-batch per rank."""

    def __init__(self, make_dataset: Callable[..., Any], workers: int = 2):
        self.make_dataset, self.workers = make_dataset, workers

    def train(self, transform: Callable, seed: int, layout: Layout, start: int, total: int,
              steps_per_epoch: int) -> Iterator[MicroBatch]:
        dataset = self.make_dataset(transform=transform, seed=seed, shuffle=True)
        dataset.for_training(layout.local)
        epoch, skip = divmod(start, steps_per_epoch)
        skip *= layout.accum_steps
        left = (total - start) * layout.accum_steps
        while left > 0:
            dataset.set_epoch(epoch)
            loader = loader_batches(dataset, batch_size=layout.local, num_workers=self.workers,
                                    collate_fn=collate_skip_bad, drop_last=True)
            n = 0
            for batch in loader:
                if n >= steps_per_epoch * layout.accum_steps:
                    break
                n += 1
                if n <= skip:  # resuming: the same order up to where the run stopped
                    continue
                yield batch
                left -= 1
                if left == 0:
                    return
            if n == 0:  # every worker holds less than one batch: each epoch would be empty, forever
                raise ValueError(f"the shards give no full batch of {layout.local} samples to any of the "
                                 f"{max(self.workers, 1)} DataLoader worker(s) of this process: use fewer "
                                 f"--workers or a smaller --batch-size")
            skip, epoch = 0, epoch + 1

    def eval(self, transform: Callable, batch_size: int) -> Iterator[MicroBatch]:
        dataset = self.make_dataset(transform=transform, seed=0, shuffle=False)
        yield from loader_batches(dataset, batch_size=batch_size, num_workers=self.workers,
                                  collate_fn=collate_skip_bad)
