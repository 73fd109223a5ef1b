"""Bottom-layer helpers every package may import (no other vitkit imports here)."""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Union

PathLike = Union[str, "os.PathLike[str]"]


#: The pip name of each optional module whose name is not its package's (the extras in
#: ``pyproject.toml`` list pip names; tests/test_extras.py checks every ``require`` against them).
DISTRIBUTIONS = {"yaml": "pyyaml", "skimage": "scikit-image", "torch.utils.tensorboard": "tensorboard"}


class MissingExtra(ImportError):
    """An optional package a feature needs is not installed, or is installed but does not import.

    The message is one line naming the package, what needs it and the extra that installs it,
    from a checkout and from the package index; ``extra`` is that extra's name.
    """

    def __init__(self, message: str, extra: str = ""):
        super().__init__(message)
        self.extra = extra


def distribution(module: str) -> str:
    """The pip name of the package that provides ``module`` ("yaml" -> "pyyaml")."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in DISTRIBUTIONS:
            return DISTRIBUTIONS[".".join(parts[:i])]
    return parts[0]


def require(module: str, extra: str, purpose: str) -> Any:
    """Import and return ``module``, an optional dependency listed in the extra ``extra``; raise
    :class:`MissingExtra` ("torchvision is needed for PURPOSE: pip install -e '.[train]' ...")
    when it is missing or broken, so a user reads what to install instead of a traceback.

    Call it where the feature starts (a dataset, a config file, a source), not per item: the
    import is a dict lookup once done, but the feature should fail before any work.
    """
    package = distribution(module)
    parts = module.split(".")
    try:  # each parent in turn, as `from a.b import c` does: a hidden or missing parent is missing
        for i in range(1, len(parts) + 1):
            found = importlib.import_module(".".join(parts[:i]))
        return found
    except Exception as e:  # a broken install raises anything (protobuf's TypeError, torch ops' RuntimeError)
        # missing: the module, a parent, or the package a wrapper imports (torch.utils.tensorboard's tensorboard)
        missing = isinstance(e, ModuleNotFoundError) and e.name is not None and (
            module == e.name or module.startswith(e.name + ".") or e.name.split(".")[0] == package)
        problem = "" if missing else (f" and is installed but does not import ({type(e).__name__}: "
                                      f"{_first_line(e)}); reinstall it")
        fix = f"pip install -e '.[{extra}]' (in a checkout) or pip install 'vitkit[{extra}]'"
        raise MissingExtra(f"{package} is needed for {purpose}{problem}: {fix}", extra) from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "no detail"


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path``.

    A crash or an exception leaves the old file (or nothing) in place, never half a file; a
    killed process can leave its temporary (``.NAME.*.tmp``), which :func:`remove_stale_temporaries`
    deletes. The file gets the permissions the umask gives a new file (mkstemp's are 0600), so
    colleagues can read a shared run. A full disk is said in words, naming the file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"no space left on device while writing {path}; nothing was "
                                        f"replaced (the previous file, if any, is intact)") from e
        raise


#: The suffix of atomic_path's temporaries.
TEMP_SUFFIX = ".tmp"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def remove_stale_temporaries(folder: PathLike) -> int:
    """Delete the temporaries that killed writers left in ``folder`` and its subfolders
    (``.NAME.*.tmp`` of :func:`atomic_path`); call it only while holding the folder (its
    writer's lock). Returns how many were removed."""
    removed = 0
    for tmp in Path(folder).rglob(f".*{TEMP_SUFFIX}"):
        if tmp.is_file():
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
                removed += 1
    return removed


def write_json(path: PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def pyplot():
    """matplotlib's pyplot on the off-screen Agg backend (imported on first use: figures are
    optional work, and matplotlib is slow to import)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Any, path: PathLike, **savefig: Any) -> Path:
    """Write ``fig`` as a 110-dpi PNG atomically (a crash leaves no half image) and close it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, **savefig)
    pyplot().close(fig)
    return Path(path)


#: The random streams of a run, each drawn from its own seed (:func:`seed_for`).
SEED_STREAMS = ("init", "order", "augment", "mix", "sample", "shard-order", "shard-buffer", "mask", "eval-mask")


def seed_for(seed: int, stream: str, *index: int) -> int:
    """The 63-bit seed of one random stream of a run: ``stream`` (one of ``SEED_STREAMS``) at
    ``index`` (epoch, step, micro-batch, rank, ...) under the run's ``seed``.

    numpy's SeedSequence hashes the whole key, so every (seed, stream, index) gives an
    independent stream and nearby keys share nothing -- no multipliers that could collide.
    A pure function of its arguments: a resumed run draws what the uninterrupted run drew.
    """
    import numpy as np

    if stream not in SEED_STREAMS:
        raise ValueError(f"unknown random stream {stream!r}; known: {', '.join(SEED_STREAMS)}")
    key = [int(seed), SEED_STREAMS.index(stream), *(int(i) for i in index)]
    if min(key) < 0:
        raise ValueError(f"seeds and indices must be >= 0, got {key}")
    return int(np.random.SeedSequence(key).generate_state(1, np.uint64)[0] >> np.uint64(1))


def field_comments(cls: type) -> Dict[str, str]:
    """The ``#:`` comment lines written above each field of a class (Sphinx's attribute docs),
    joined into one line per field: the help text of the command-line flags made from them."""
    import inspect
    import re

    out: Dict[str, str] = {}
    pending: List[str] = []
    for line in inspect.getsource(cls).splitlines():
        text = line.strip()
        if text.startswith("#:"):
            pending.append(text[2:].strip())
            continue
        field = re.match(r"^\s+(\w+)\s*:", line)
        if field and pending:
            out[field.group(1)] = " ".join(pending)
        if text:
            pending = []
    return out
