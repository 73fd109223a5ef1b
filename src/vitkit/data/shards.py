"""Tar shards in the webdataset layout, read as a stream: large image sets without a file per image.

Millions of small files are slow to list, copy and open, above all on network disks; a
few hundred tar files of ~1,000 images each are read sequentially instead. The layout is
webdataset's, so its tools read these shards and vitkit reads theirs, without depending on
the ``webdataset`` package: in each plain tar, consecutive members sharing a key (the path
up to the first dot of the base name) form a sample -- ``KEY.jpg`` (or jpeg, png, webp, bmp,
gif, tif, tiff) and ``KEY.cls``, the label as an ASCII integer. ``meta.json`` (class names,
samples per shard) and ``classes.txt`` (one class name a line) beside the shards name the
classes.

Who reads what, in :class:`ShardDataset`: every epoch, all ranks shuffle the shard list the
same way (from ``seed`` and the epoch), then deal it out: shard ``i`` of that order goes to
rank ``i % world_size``, and a rank's shards go to its DataLoader workers the same way.
Where there are fewer shards than readers (ranks, or one rank's workers), the split moves
down to samples: every reader of a shard keeps every n-th sample of it, so no sample is
read twice in an epoch and none is lost. Each worker then shuffles its samples within a
buffer of ``shuffle_buffer`` samples, seeded by (seed, epoch, rank, worker): the same seed
and epoch give the same sequence.

Unequal shares and DDP: when the shard count is not a multiple of ranks x workers, or
shards hold different numbers of samples, ranks see different numbers of samples, and a
rank that runs out first leaves the others waiting in their next gradient all-reduce.
``epoch_length`` (samples per rank, ``"auto"`` = all samples // world_size) makes every
rank yield exactly that many: a reader that runs out starts over on its own shards (a few
samples repeat), one with more stops early (a few wait for the next epoch, which shuffles
differently). Leave it unset for evaluation, which must see every sample exactly once.

Bad samples (an image Pillow cannot decode, a missing or non-integer ``.cls``, a label out
of range) and the lost rest of a damaged shard are logged (logger ``vitkit.data``) and come
out as :class:`~vitkit.data.images.Skipped` naming them: use
:func:`vitkit.data.folder.collate_skip_bad` as the DataLoader's ``collate_fn`` to drop them and
count them exactly, by name, across workers; ``strict=True`` raises instead. A file among the
shards that is no tar at all stops the reader at its start, named. ``set_epoch`` changes
the order of the next epoch; with ``persistent_workers=True`` the workers keep their own
copy of the dataset and never see it, so leave persistent workers off.
"""

from __future__ import annotations

import glob
import itertools
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info

from ..progress import track
from ..utils import seed_for
from .images import BadImageError, Skipped
from .shard_writer import ImageData, folder_to_shards, write_shards  # noqa: F401  (importable here as before)
from .streams import RankedReader, repeat_passes
from .tar_records import (  # noqa: F401  (importable here as before)
    CLASSES_FILE,
    IMAGE_EXTENSIONS,
    LABEL_EXTENSION,
    META_FILE,
    _Record,
    count_samples,
    decode_record,
    iter_records,
)
from .transforms import ImageShapeError

logger = logging.getLogger("vitkit.data")


# ---------------------------------------------------------------------------------- finding

_BRACES = re.compile(r"\{([^{}]*)\}")


def expand_braces(pattern: str) -> List[str]:
    """``"a-{000..002}.tar"`` -> a-000.tar, a-001.tar, a-002.tar; ``{x,y}`` lists alternatives."""
    m = _BRACES.search(pattern)
    if m is None:
        return [pattern]
    body = m.group(1)
    numbers = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if numbers:
        first, last = numbers.groups()
        if int(last) < int(first):
            raise ValueError(f"brace range {{{body}}} in {pattern!r} runs backwards")
        choices = [str(i).zfill(len(first)) for i in range(int(first), int(last) + 1)]
    else:
        choices = body.split(",")
    rests = expand_braces(pattern[m.end():])
    return [pattern[:m.start()] + choice + rest for choice in choices for rest in rests]


#: what a shard in a folder is named: a tar, compressed or not (the reader takes each)
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def expand_shards(shards: Union[str, Path, Sequence[Union[str, Path]]]) -> List[str]:
    """Shard paths from a list, a brace pattern, a glob, or a folder (its tars, compressed or not, sorted; where
    its ``meta.json`` lists the shards, exactly those)."""
    if isinstance(shards, (str, Path)):
        spec = str(shards)
        if os.path.isdir(spec):
            found = sorted(os.path.join(spec, name) for name in os.listdir(spec) if name.endswith(SHARD_SUFFIXES))
            if not found:
                raise FileNotFoundError(f"no .tar shards in the folder {spec}")
            _check_listed(Path(spec), found)
            return found
        out: List[str] = []
        for path in expand_braces(spec):
            if glob.has_magic(path):
                matched = sorted(glob.glob(path))
                if not matched:
                    raise FileNotFoundError(f"no shards match {path!r}")
                out += matched
            else:
                out.append(path)
    else:
        out = [p for item in shards for p in expand_shards(item)]
    if not out:
        raise ValueError("no shards given")
    missing = [p for p in out if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"{len(missing)} of {len(out)} shards not found, first: {missing[0]}")
    return out


def _check_listed(folder: Path, found: List[str]) -> None:
    """A folder whose ``meta.json`` lists its shards holds exactly those: a listed one missing was a part of the
    split lost without a word, an unlisted one (a stale shard of an earlier writing) was read as part of it."""
    counts = read_meta(folder)[1]
    if not counts:
        return
    names = {Path(p).name for p in found}
    missing, extra = sorted(set(counts) - names), sorted(names - set(counts))
    if missing or extra:
        said = [f"{len(missing)} listed shard(s) are not there (first: {missing[0]})"] if missing else []
        said += [f"{len(extra)} shard(s) are not listed (first: {extra[0]}, left from an earlier writing?)"] \
            if extra else []
        raise FileNotFoundError(f"{folder} does not hold the shards its {META_FILE} lists: {'; '.join(said)}; "
                                f"put them back, or write the shards again")


def read_meta(folder: Union[str, Path]) -> Tuple[Optional[List[str]], Dict[str, int]]:
    """Class names and samples per shard from ``meta.json``/``classes.txt`` in ``folder``, if there."""
    folder = Path(folder)
    classes, counts = None, {}
    if (folder / META_FILE).is_file():
        try:
            meta = json.loads((folder / META_FILE).read_text())
        except (ValueError, OSError) as e:
            raise ValueError(f"cannot read {folder / META_FILE}: {e}") from e
        classes = meta.get("classes")
        counts = {str(k): int(v) for k, v in (meta.get("shards") or {}).items()}
    if classes is None and (folder / CLASSES_FILE).is_file():
        classes = [line.strip() for line in (folder / CLASSES_FILE).read_text().splitlines() if line.strip()]
    return classes, counts


# ---------------------------------------------------------------------------------- reading

def _reading_plan(num_shards: int, rank: int, world_size: int, worker: int, num_workers: int
                  ) -> Tuple[List[int], int, int]:
    """Which shard positions one reader reads, and which of their samples it keeps.

    Returns (positions, modulus, residue): sample ``k`` of the shard at position ``s`` is
    kept when ``(k + s) % modulus == residue``. Shards are dealt out first across ranks, then
    across a rank's workers; where one level has fewer shards than readers it splits samples.
    """
    positions = list(range(num_shards))
    if num_shards >= world_size:
        positions, modulus, residue = positions[rank::world_size], 1, 0
    else:
        modulus, residue = world_size, rank
    if len(positions) >= num_workers:
        positions = positions[worker::num_workers]
    else:
        modulus, residue = modulus * num_workers, residue + modulus * worker
    return positions, modulus, residue



class ShardDataset(RankedReader, IterableDataset):
    """Samples streamed from tar shards, split across ranks and workers, shuffled in a buffer.

    ``shards``: a list of paths, a brace pattern (``"data/shard-{000000..000099}.tar"``), a
    glob, or a folder. ``shuffle_buffer=0`` reads shards and samples in order (evaluation);
    above 0 the shard order changes every epoch and samples are drawn at random from a buffer
    of that many raw samples (memory: that many encoded images). ``rank``/``world_size``
    default to torch.distributed's when it is initialised. See the module notes for how the
    work is split, ``epoch_length`` and bad samples. Yields (transformed image, label), or
    (PIL image, label) without a transform, or None for a bad sample.
    """

    def __init__(self, shards: Union[str, Path, Sequence[Union[str, Path]]],
                 transform: Optional[Callable[[Image.Image], Any]] = None, channels: int = 3,
                 seed: int = 0, shuffle_buffer: int = 0, rank: Optional[int] = None,
                 world_size: Optional[int] = None, epoch_length: Optional[Union[int, str]] = None,
                 strict: bool = False, classes: Optional[Sequence[str]] = None):
        super().__init__()
        self.shards = expand_shards(shards)
        if seed < 0 or shuffle_buffer < 0:
            raise ValueError("seed and shuffle_buffer must be >= 0")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither (torch.distributed's then)")
        if world_size is not None and not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0-{world_size - 1}")
        if not (epoch_length is None or epoch_length == "auto" or (isinstance(epoch_length, int) and epoch_length > 0)):
            raise ValueError(f"epoch_length must be a positive int, 'auto' or None, got {epoch_length!r}")
        self.transform = transform
        self.channels = channels
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self._rank, self._world_size = rank, world_size
        self._epoch_length = epoch_length
        self.strict = strict
        meta_classes, self._meta_counts = read_meta(Path(self.shards[0]).parent)
        self.classes: Optional[List[str]] = list(classes) if classes is not None else meta_classes
        self.epoch = 0
        self._counts: Optional[List[int]] = None
        if epoch_length == "auto":
            self.samples_per_shard()  # counted once here, not again in every worker

    def named_classes(self) -> List[str]:
        """The class names (``meta.json`` or ``classes.txt``, or given); one line where there are none."""
        if self.classes is None:
            raise ValueError(f"no class names for the shards in {Path(self.shards[0]).parent}: write meta.json or "
                             f"classes.txt beside them (vitkit's write_shards does)")
        return self.classes

    # -- sizes
    def samples_per_shard(self) -> List[int]:
        """From ``meta.json`` when it lists every shard, else by reading the tar headers (once)."""
        if self._counts is None:
            if self._counted_by_meta():
                self._counts = [self._meta_counts[Path(s).name] for s in self.shards]
            else:
                # every tar's headers read once: minutes for a large compressed set without meta.json
                self._counts = [count_samples(s) for s in track(self.shards, "counting samples in shards",
                                                                unit="shards")]
        return self._counts

    def _counted_by_meta(self) -> bool:
        """Whether ``meta.json`` gives every shard's count (else the tar headers are read)."""
        return all(Path(s).name in self._meta_counts for s in self.shards)

    @property
    def num_samples(self) -> int:
        return sum(self.samples_per_shard())

    def samples_per_rank(self) -> int:
        """The same number for every rank: all samples // world_size (what ``"auto"`` uses)."""
        n = self.num_samples // self.world_size
        if n == 0:
            raise ValueError(f"{self.num_samples} samples cannot feed {self.world_size} ranks")
        return n

    @property
    def epoch_length(self) -> Optional[int]:
        return self.samples_per_rank() if self._epoch_length == "auto" else self._epoch_length

    def __len__(self) -> int:
        if self.epoch_length is None:
            raise TypeError("ShardDataset has a length per rank only with epoch_length set "
                            "(a rank's share depends on how its shards fall)")
        return self.epoch_length

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch whose order the next iteration follows (call it before every epoch)."""
        self.epoch = int(epoch)

    # -- iteration
    def __iter__(self) -> Iterator[Union[Tuple[Any, int], Skipped]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        rank, world_size = self.rank, self.world_size
        quota = self.worker_quota(self.epoch_length, worker, num_workers)
        records = self._records(rank, world_size, worker, num_workers, quota)
        if self.shuffle_buffer > 0:
            rng = np.random.default_rng(seed_for(self.seed, "shard-buffer", self.epoch, rank, worker))
            records = _buffer_shuffle(records, self.shuffle_buffer, rng)
        if quota is not None:
            records = itertools.islice(records, quota)
        num_classes = len(self.classes) if self.classes is not None else None
        for count, record in enumerate(records):
            if isinstance(record, Skipped):
                yield record
                continue
            try:
                im, label = decode_record(record, self.channels, num_classes)
                sample = self.transformed(im, rank, worker, count), label
            except (BadImageError, ImageShapeError) as e:
                if not isinstance(e, BadImageError):  # evaluation's resize of a long thin image
                    e = BadImageError(record.name, str(e))
                if self.strict:
                    raise e from None
                logger.warning("skipping %s: %s", e.path, e.reason)
                yield Skipped(e.path, e.reason)
                continue
            yield sample

    def _epoch_order(self) -> List[str]:
        if self.shuffle_buffer == 0:
            return list(self.shards)
        rng = np.random.default_rng(seed_for(self.seed, "shard-order", self.epoch))
        permutation = rng.permutation(len(self.shards))
        return [self.shards[i] for i in permutation]

    def _records(self, rank: int, world_size: int, worker: int, num_workers: int,
                 quota: Optional[int]) -> Iterator[_Record]:
        """This reader's raw samples; with a quota, passes over its shards repeat until it is met."""
        order = self._epoch_order()
        positions, modulus, residue = _reading_plan(len(order), rank, world_size, worker, num_workers)

        def one_pass(passes: int) -> Iterator[_Record]:
            pass_positions = positions
            if passes and self.shuffle_buffer:
                rng = np.random.default_rng(seed_for(self.seed, "shard-buffer", self.epoch, rank, worker, passes))
                pass_positions = [positions[i] for i in rng.permutation(len(positions))]
            for s in pass_positions:
                for k, record in enumerate(iter_records(order[s], self.strict)):
                    if isinstance(record, Skipped):
                        yield from self._lost(order[s], k, record, lambda j: (j + s) % modulus == residue)
                    elif (k + s) % modulus == residue:
                        yield record

        yield from repeat_passes(
            one_pass, quota, lambda record: not isinstance(record, Skipped),
            lambda: f"rank {rank} worker {worker} of {num_workers} found no samples in its share of {len(order)} "
                    f"shards: too few samples for {world_size * num_workers} readers",
            lambda produced: self._short_pass(rank, worker, produced, quota))

    def _short_pass(self, rank: int, worker: int, produced: int, quota: int) -> None:
        """A reader's first pass ended short of its epoch length: a few samples of uneven shares are read again
        (said at info level); a pass far short, where meta.json's counts set that length, is a stale meta.json,
        whose epoch would be the same samples many times over (300 images said, 30 read 10 times): said."""
        stale = produced < quota // 2 and self._epoch_length == "auto" and self._counted_by_meta()
        if stale:
            logger.warning("rank %d worker %d: one pass over its shards gave %d samples where %s's counts make "
                           "its epoch %d: the same samples are read again to fill it (a stale %s? write the "
                           "shards again)", rank, worker, produced, META_FILE, quota, META_FILE)
        else:
            logger.info("rank %d worker %d: %d samples, %d wanted; reading its shards again", rank, worker,
                        produced, quota)

    def _lost(self, shard: str, read: int, rest: Skipped, mine: Callable[[int], bool]) -> Iterator[Skipped]:
        """The samples a damaged shard lost after ``read`` of them: one :class:`Skipped` each (those of
        this reader) when ``meta.json`` gives the shard's count, else the one ``rest`` (its first reader)."""
        expected = self._meta_counts.get(Path(shard).name)
        if expected is None:
            if mine(0):
                yield rest
            return
        for j in range(read, expected):
            if mine(j):
                yield Skipped(f"{shard}#{j}", rest.reason)


def _buffer_shuffle(items: Iterator[_Record], size: int, rng: np.random.Generator) -> Iterator[_Record]:
    """Yield items in random order, holding at most ``size`` of them."""
    buffer: List[_Record] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        i = int(rng.integers(len(buffer)))
        buffer[i], item = item, buffer[i]
        yield item
    for i in rng.permutation(len(buffer)):
        yield buffer[i]
