"""Where a run's metrics go: ``metrics.jsonl`` always, TensorBoard when it is installed.

The JSON lines file is the record (plots, resume and tests read it); TensorBoard is a view
on the same rows, written only by the main process.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any, Dict, Optional

from ..extras import MissingExtra, require
from ..files import atomic_path, said_as_disk_full

log = logging.getLogger("vitkit.train")


def _tensorboard_writer(folder: Path):
    try:  # torch's wrapper needs the tensorboard package (the train extra)
        tensorboard = require("torch.utils.tensorboard", "train", "TensorBoard logs")
    except MissingExtra as e:  # optional: metrics.jsonl is the record, so the run goes on without it
        log.info("%s; metrics go to metrics.jsonl only", e)
        return None
    _quiet_writer_threads()
    with _board_full(folder, "free some space (or run with --no-tensorboard: metrics.jsonl is the record)"):
        return tensorboard.SummaryWriter(log_dir=str(folder))


#: what a full disk under TensorBoard's writes mid-run leaves
ROWS_KEPT = "metrics.jsonl holds the rows before; free some space, then --resume the run"


def _board_full(folder, what: str = ROWS_KEPT):
    """A full disk under TensorBoard's writes, said naming its folder (whose free space decides: its words name
    no file)."""
    return said_as_disk_full(folder, what, folder=folder)


def _quiet_writer_threads() -> None:
    """TensorBoard writes from a thread of its own, which hands its error to the next call of the run's thread
    (said there) and then raises it again, printed as a thread's traceback after the run's last line: that
    second telling is dropped (a full disk, a folder removed), every other thread's is printed as before."""
    hook = threading.excepthook
    if getattr(hook, "vitkit_tensorboard", False):
        return

    def excepthook(args) -> None:
        if type(args.thread).__module__.startswith("tensorboard.") and isinstance(args.exc_value, OSError):
            log.info("TensorBoard's writer stopped: %s", args.exc_value)
            return
        hook(args)

    excepthook.vitkit_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = excepthook


def scalar_tag(key: str) -> str:
    """train_loss -> train/loss, val_acc -> val/acc, lr -> train/lr."""
    group, sep, name = key.partition("_")
    if sep and group in ("train", "val", "test"):
        return f"{group}/{name}"
    return f"train/{key}"


def _step_of(line: str) -> Optional[int]:
    """The step of a metrics row; None for a blank or torn line (a row cut short by a kill)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row.get("step", 0) if isinstance(row, dict) else None


class MetricsLog:
    """Appends metric rows (dicts with a ``step``) to every enabled sink."""

    def __init__(self, run_dir: Path, enabled: bool = True, tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.writer = _tensorboard_writer(Path(run_dir) / "tensorboard") if enabled and tensorboard else None

    def truncate_after(self, step: int) -> None:
        """Drop the rows after ``step`` (a resumed run writes them again from its checkpoint)."""
        if not self.enabled or not self.path.is_file():
            return
        lines = self.path.read_text().splitlines()
        kept = [line for line in lines if _step_of(line) is not None and _step_of(line) <= step]
        if len(kept) != len(lines):
            with atomic_path(self.path) as tmp:
                tmp.write_text("".join(line + "\n" for line in kept))

    def write(self, row: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        with said_as_disk_full(self.path, "the rows before are intact; free some space, then --resume the run"), \
                open(self.path, "ab") as f:
            end = f.tell()
            try:
                f.write((json.dumps(row) + "\n").encode())
                f.flush()
            except OSError:  # never half a row: cut the file back to the rows before
                f.truncate(end)
                raise
        if self.writer is not None:
            with _board_full(self.writer.log_dir):
                for key, value in row.items():
                    if key not in ("step", "epoch") and isinstance(value, (int, float)):
                        self.writer.add_scalar(scalar_tag(key), value, row["step"])

    def close(self, summary: Optional[Dict[str, Any]] = None) -> None:
        if self.writer is None:
            return
        writer, self.writer = self.writer, None
        with _board_full(writer.log_dir):
            if summary:
                for key in ("test_top1", "test_loss", "val_top1", "test_top1_tta"):
                    if isinstance(summary.get(key), (int, float)):
                        writer.add_scalar(f"final/{key}", summary[key], summary.get("steps", 0))
            writer.close()
