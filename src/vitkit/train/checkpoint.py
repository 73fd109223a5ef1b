"""Checkpoints: finite, written atomically and read back before they count; resumed from the newest intact one.

A checkpoint is written only when every tensor of its model and optimiser state is finite
(a diverged run must not leave a "last good checkpoint" full of NaN), to a temporary file
that is read back (``weights_only``) before it is renamed into place; then the oldest beyond
``keep`` are deleted, so the newest finite checkpoint is never the one removed. Resuming takes
the newest checkpoint that loads; a zero-byte or truncated one (a full disk, a kill at the
wrong moment on a file system without atomic rename) is skipped and said so, then set aside as
``*.unreadable`` by the resume. A checkpoint
that asks to build Python objects is refused by name, never loaded.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from ..files import DiskFull, atomic_path
from ..models.serialize import non_finite
from ..weights.io import UNREADABLE_TORCH_FILE, unsafe_object

_NAME = re.compile(r"^step_(\d+)\.pt$")


class NonFiniteState(RuntimeError):
    """The state to checkpoint holds NaN or infinite values."""


def checkpoint_paths(run_dir: Path) -> List[Path]:
    """Checkpoints of a run, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint file holds, from its name (``step_00000500.pt`` -> 500)."""
    return int(_NAME.match(Path(path).name).group(1))


def _tensors(obj: Any) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def non_finite_parts(state: Dict[str, Any], unbounded: Sequence[str] = ()) -> List[str]:
    """The parts of a checkpoint state (model, optimizer, ema) holding NaN or inf (the model's and its average's
    clamp bounds, ``unbounded``, may be infinite: :func:`vitkit.models.serialize.non_finite`)."""
    def broken(part: str) -> bool:
        if part in ("model", "ema"):
            return bool(non_finite(state[part], unbounded))
        return any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in _tensors(state[part]))

    return [part for part in ("model", "optimizer", "ema") if part in state and broken(part)]


def save_checkpoint(run_dir: Path, step: int, state: Dict[str, Any], keep: int, unbounded: Sequence[str] = ()) -> Path:
    """Write ``state`` as ``checkpoints/step_N.pt``: checked finite (``unbounded``: the model's bounds that may be
    infinite), written to a temporary file, read back, renamed; then the oldest beyond ``keep`` are deleted."""
    bad = non_finite_parts(state, unbounded)
    if bad:
        raise NonFiniteState(f"the {' and '.join(bad)} state at step {step} is not finite")
    folder = Path(run_dir) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:08d}.pt"
    try:
        with atomic_path(path) as tmp:
            torch.save(state, tmp)
            back = torch.load(tmp, map_location="cpu", weights_only=True)  # a file that cannot be read never counts
            if back.get("step") != step:
                raise OSError(f"checkpoint {path} did not read back as written (step {back.get('step')!r})")
    except DiskFull as full:
        kept = checkpoint_paths(run_dir)
        if not kept:
            raise
        size = kept[-1].stat().st_size / 1e6
        raise DiskFull(path, f"the checkpoints before are intact (the newest of step {checkpoint_step(kept[-1])}); "
                             f"a checkpoint is written beside the ones kept before the oldest goes, so "
                             f"--keep-checkpoints {keep} needs room for {keep + 1} of {size:,.1f} MB: free some "
                             f"space, then --resume the run", full.too_large) from None
    for old in checkpoint_paths(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def read_checkpoint(path: Path) -> Dict[str, Any]:
    """A checkpoint's state (tensors and plain containers only); ValueError naming an unsafe file."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        named = unsafe_object(e)
        if named:
            raise ValueError(f"refused to resume from {path}: it asks to build the Python object "
                             f"{named!r}, which could run code; vitkit never loads it. Delete it "
                             f"to resume from the checkpoint before it") from None
        raise OSError(f"{path} is not a readable checkpoint ({str(e).splitlines()[-1][:200]})") from None
    except UNREADABLE_TORCH_FILE as e:
        raise OSError(f"{path} is not a readable checkpoint ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(state, dict) or "step" not in state or "model" not in state:
        raise OSError(f"{path} is not a vitkit checkpoint (no step and model state)")
    return state


def load_intact(run_dir: Path, log: Callable[[str], None] = print) -> Optional[Tuple[Dict[str, Any], Path]]:
    """The newest checkpoint that reads, and its path (None: no checkpoint at all). Unreadable
    newer ones are skipped with a line each; an unsafe one stops with ValueError."""
    paths = checkpoint_paths(run_dir)
    for path in reversed(paths):
        try:
            return read_checkpoint(path), path
        except OSError as e:
            log(f"skipping a checkpoint that does not load: {e}")
    if paths:
        raise OSError(f"none of the {len(paths)} checkpoints in {Path(run_dir) / 'checkpoints'} loads; "
                      f"the run cannot be resumed")
    return None


def set_aside_unreadable(run_dir: Path, used: Path, log: Callable[[str], None] = print) -> None:
    """Rename the checkpoints newer than ``used`` (the newest that loads: the newer ones did not) to ``*.unreadable``:
    kept for a look, out of the run's count, so that ``keep_checkpoints`` prunes none of the good ones to keep a
    damaged one (a junk step 9 was kept, the step 1 the run resumed from removed)."""
    for path in checkpoint_paths(run_dir):
        if checkpoint_step(path) > checkpoint_step(used):
            aside = path.with_name(path.name + ".unreadable")
            os.replace(path, aside)
            log(f"set {path.name}, which does not load, aside as {aside.name}")


def load_latest(run_dir: Path) -> Optional[Dict[str, Any]]:
    """The state of the newest checkpoint that loads (None without checkpoints)."""
    found = load_intact(run_dir, log=lambda message: None)
    return None if found is None else found[0]
