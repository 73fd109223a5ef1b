"""The IDX format of MNIST and Fashion-MNIST (LeCun et al.), gzip-compressed or raw.

Header: two zero bytes, a type code, the number of dimensions, then one big-endian uint32
per dimension; the data follows in C order, big-endian.
"""

from __future__ import annotations

import gzip
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Optional, Tuple, Union

import numpy as np

_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


#: Files from this size up are kept decoded (:func:`read_idx`): a process that trains several
#: runs (a study, the test suite) decompresses Fashion-MNIST's images once, not once per run
#: (0.3-0.7 s each on 2 CPU cores).
CACHE_FROM_BYTES = 1 << 20
#: how many decoded files are kept (Fashion-MNIST's two image files, with room for MNIST's)
CACHE_FILES = 4
_decoded: "OrderedDict[Tuple, np.ndarray]" = OrderedDict()
_decoded_lock = threading.Lock()  # data threads and the main thread may read at once


class IDXError(ValueError):
    """A file that is not a well-formed IDX file."""


def file_version(path: Path) -> Optional[Tuple]:
    """What tells one version of a file from another (its real path, size, modification time and inode; None: it
    cannot be read): what is worked out from a file once is kept under it."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


def read_idx(path: Union[str, Path]) -> np.ndarray:
    """Read an IDX file (``.gz`` or raw) into a numpy array, checking header and size. A large
    file read before in this process, unchanged since (its size, modification time and inode),
    is not decoded again; the caller gets its own copy either way."""
    path = Path(path)
    key = file_version(path)
    if key is None:  # _decode says why it cannot be read
        return _decode(path)
    with _decoded_lock:
        kept = _decoded.get(key)
        if kept is not None:
            _decoded.move_to_end(key)
            return kept.copy()
    arr = _decode(path)
    if key[1] >= CACHE_FROM_BYTES:
        with _decoded_lock:
            _decoded[key] = arr.copy()
            while len(_decoded) > CACHE_FILES:
                _decoded.popitem(last=False)
    return arr


def _decode(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise IDXError(f"cannot read {path}: {e}") from e
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _TYPES:
        raise IDXError(f"{path} is not an IDX file (bad magic {data[:4].hex() or 'empty'})")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IDXError(f"{path}: truncated header")
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_TYPES[data[2]])
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise IDXError(f"{path}: {len(data)} bytes, expected {expected} for shape {shape} "
                       f"(truncated or corrupt file)")
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)
