"""Bottom-layer helpers every package may import: figures, seeds, flag help; and, re-exported where
they always were, the names of the modules beside it (files, extras, signals, machine), which
import nothing of vitkit but each other (extras uses signals)."""

from __future__ import annotations

import functools
import numbers
from pathlib import Path
from typing import Any, Dict, List, Tuple

from .extras import DISTRIBUTIONS, MissingExtra, distribution, first_line, require  # noqa: F401 (re-exported)
from .files import (  # noqa: F401 (re-exported: vitkit.utils.atomic_path and the rest, where they were)
    _OWNER,
    TEMP_SUFFIX,
    WORK_SUFFIX,
    DiskFull,
    PathLike,
    _try_lock,
    _umask,
    atomic_path,
    check_output,
    copy_file,
    free_bytes,
    is_disk_full,
    new_folder,
    remove_stale_temporaries,
    sweep_work_folders,
    work_folder,
    write_json,
    write_text,
)
from .machine import available_memory, native_bf16_cpu, usable_cores  # noqa: F401 (re-exported)
from .signals import (  # noqa: F401 (re-exported)
    _WORKER_KILLED,
    Terminated,
    _deferral,
    expect_worker_deaths,
    interrupt,
    interrupts_deferred,
    worker_stop,
)


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
SEED_STREAMS = ("init", "order", "augment", "mix", "sample", "shard-order", "shard-buffer", "mask", "eval-mask",
                "hf-stream", "layers", "stream-sample")


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


def check_switches(where: str, **switches: Any) -> None:
    """ValueError naming each keyword of ``where`` that is not True or False: a string such as
    ``"no"`` is truthy, and would switch on what it was meant to switch off."""
    bad = [f"{name}={value!r}" for name, value in switches.items() if not isinstance(value, bool)]
    if bad:
        raise ValueError(f"{where}: {', '.join(bad)}: {'each' if len(bad) > 1 else 'it'} must be True or False")


def positive_whole(value: Any) -> bool:
    """Whether ``value`` is a whole number >= 1 (numpy's integers too; True is no count of anything)."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and value >= 1


def field_comments(cls: type) -> Dict[str, str]:
    """The ``#:`` comment lines written above each field of a class (Sphinx's attribute docs),
    joined into one line per field: the help text of the command-line flags made from them."""
    return dict(_field_comments(cls))


@functools.lru_cache(maxsize=None)
def _field_comments(cls: type) -> Tuple[Tuple[str, str], ...]:
    """Read once per class and process: the source is tokenised to find it, 70% of the time
    building the command line's parser took (every in-process `vitkit.cli.main` call builds one)."""
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
    return tuple(out.items())
