"""The webdataset layout's pieces (:mod:`.shards`' notes): the member and file names, one shard's samples
read as raw records (a damaged tar named, not fatal), counted from the headers, and decoded."""

from __future__ import annotations

import logging
import os
import tarfile
from dataclasses import dataclass, field
from typing import Dict, Iterator, Optional, Tuple, Union

from PIL import Image

from .images import BadImageError, Skipped, decode_image

logger = logging.getLogger("vitkit.data")

#: the image members a sample may have (the first of these it has is its image)
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff")
#: the label member: an ASCII integer
LABEL_EXTENSION = "cls"
#: beside the shards: class names and samples per shard (JSON)
META_FILE = "meta.json"
#: beside the shards: one class name a line
CLASSES_FILE = "classes.txt"


@dataclass
class _Record:
    """The raw members of one sample, as read from a shard."""

    shard: str
    key: str
    members: Dict[str, bytes] = field(default_factory=dict)
    #: a member the sample holds twice (two samples written under one key): the sample is skipped, not merged
    twice: Optional[str] = None

    @property
    def name(self) -> str:
        return f"{self.shard}:{self.key}"


def _split_name(name: str) -> Tuple[str, str]:
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def iter_records(shard: str, strict: bool = False) -> Iterator[Union[_Record, Skipped]]:
    """The samples of one shard in order: consecutive members with the same key.

    Where the tar is damaged -- unreadable from some point, or cut short at a block boundary,
    which ``tarfile`` reads as a clean end (a tar ends with two zero blocks) -- the sample being
    read comes out as it is (decoding judges it) and then a :class:`Skipped` named
    ``SHARD#rest`` stands for the lost rest; ``strict`` raises instead.
    """
    current: Optional[_Record] = None
    try:
        with tarfile.open(shard, "r|*") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                key, ext = _split_name(member.name)
                data = tar.extractfile(member).read()
                if current is None or current.key != key:
                    if current is not None:
                        yield _whole(current, strict)
                    current = _Record(shard, key)
                if ext in current.members:
                    current.twice = current.twice or ext
                current.members[ext] = data
        if not _ends_like_a_tar(shard):
            raise tarfile.ReadError("it ends without the end-of-archive blocks: cut short")
        if current is not None:
            yield _whole(current, strict)
    except (tarfile.TarError, OSError, EOFError) as e:
        if strict:
            raise ValueError(f"shard {shard} is damaged: {e}") from e
        logger.warning("shard %s is damaged (%s): the rest of it is skipped", shard, e)
        if current is not None:
            yield current
        yield Skipped(f"{shard}#rest", f"the tar is damaged ({e}); the samples after this point are lost")


def _whole(record: _Record, strict: bool) -> Union[_Record, Skipped]:
    """``record``, or a Skipped where it holds a member twice: consecutive samples written under one key would
    be merged into one, the first's image lost without a word (webdataset refuses such a tar)."""
    if record.twice is None:
        return record
    why = (f"holds .{record.twice} twice: two samples under one key (a sample is the consecutive members with the "
           f"same key), so neither is read")
    if strict:
        raise BadImageError(record.name, why)
    logger.warning("skipping %s: %s", record.name, why)
    return Skipped(record.name, why)


_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ")  # gzip, bzip2, xz: their streams detect a cut themselves


def _ends_like_a_tar(path: str) -> bool:
    """Whether an uncompressed tar ends with its two zero blocks (compressed ones: always true)."""
    with open(path, "rb") as f:
        if f.read(6).startswith(_COMPRESSED):
            return True
        f.seek(0, os.SEEK_END)
        if f.tell() < 1024:
            return False
        f.seek(-1024, os.SEEK_END)
        return f.read(1024) == bytes(1024)


def count_samples(shard: str) -> int:
    """The number of samples in a shard, from its member headers (no image is decoded). A file
    that is no tar at all is a ValueError naming it; a damaged one counts what precedes the damage."""
    keys, last = 0, None
    try:
        with tarfile.open(shard, "r:*") as tar:
            for member in tar:
                key = _split_name(member.name)[0] if member.isfile() else None
                if key is not None and key != last:
                    keys, last = keys + 1, key
    except (tarfile.TarError, OSError, EOFError) as e:
        if keys == 0:
            raise ValueError(f"shard {shard} is not a readable tar file ({e})") from None
        logger.warning("shard %s is damaged after %d samples (%s)", shard, keys, e)
    return keys


def decode_record(record: _Record, channels: int = 3, num_classes: Optional[int] = None
                  ) -> Tuple[Image.Image, int]:
    """A raw sample -> (upright RGB/L image, label); :class:`BadImageError` naming it if unusable."""
    cls = record.members.get(LABEL_EXTENSION)
    if cls is None:
        raise BadImageError(record.name, f"no .{LABEL_EXTENSION} label member")
    try:
        label = int(cls.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise BadImageError(record.name, f"label {cls[:20]!r} is not an integer") from None
    if label < 0 or (num_classes is not None and label >= num_classes):
        raise BadImageError(record.name, f"label {label} is outside 0-{(num_classes or 1) - 1}")
    ext = next((e for e in IMAGE_EXTENSIONS if e in record.members), None)
    if ext is None:
        raise BadImageError(record.name, f"no image member ({', '.join(IMAGE_EXTENSIONS)})")
    return decode_image(record.members[ext], channels, name=f"{record.name}.{ext}"), label
