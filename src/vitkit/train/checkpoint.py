"""Checkpoints written atomically (temp file + rename), the last k kept; read without pickle code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from ..utils import atomic_path

_NAME = re.compile(r"^step_(\d+)\.pt$")


def checkpoint_paths(run_dir: Path) -> List[Path]:
    """Checkpoints of a run, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def save_checkpoint(run_dir: Path, step: int, state: Dict[str, Any], keep: int) -> Path:
    folder = Path(run_dir) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:08d}.pt"
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    for old in checkpoint_paths(run_dir)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_latest(run_dir: Path) -> Optional[Dict[str, Any]]:
    paths = checkpoint_paths(run_dir)
    if not paths:
        return None
    return torch.load(paths[-1], map_location="cpu", weights_only=True)
