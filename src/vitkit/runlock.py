"""One writer per run folder: an exclusive lock held for the life of the run.

``run_dir/.lock`` is locked with ``fcntl.flock`` by the process that writes the run (rank 0)
and holds its pid, host and start time for the message a second writer gets. The kernel
releases a flock when its process dies, however it dies, so the lock of a killed run is never
stale: ``--resume`` takes it at once. A flock belongs to the open file, which a fork shares: a
DataLoader worker forked by the writer would keep the lock alive for the seconds it outlives a
killed writer (the resume was refused, naming the dead writer), so every forked child closes
its copy at once. Where ``fcntl`` does not exist (Windows) the lock is a no-op.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import time
from pathlib import Path
from typing import Optional

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"

#: Descriptors of the locks this process holds; a forked child closes its copies (see above).
_HELD: set = set()


def _close_in_child() -> None:
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class RunLocked(OSError):
    """Another process is writing this run (``folder``, ``writer``: who, for a caller's own message)."""

    def __init__(self, message: str, folder: Optional[Path] = None, writer: str = "another process"):
        super().__init__(message)
        self.folder, self.writer = folder, writer


class RunLock:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        self.fd: Optional[int] = None

    def acquire(self) -> "RunLock":
        """Take the lock or raise :class:`RunLocked` naming the process that holds it."""
        if fcntl is None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunLocked(f"{self.path.parent} is being written by {holder}; wait for it to finish "
                            f"(--resume it then) or start another run (--name)", self.path.parent, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()} since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        self.fd = fd
        _HELD.add(fd)
        return self

    def release(self) -> None:
        if self.fd in _HELD:  # not in a forked child: its copy is closed, and unlocking would free the parent's
            _HELD.discard(self.fd)
            os.ftruncate(self.fd, 0)  # a finished run's lock names no writer (the file stays: unlinking races)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
        self.fd = None


def holder(run_dir: Path) -> Optional[str]:
    """Who writes ``run_dir`` now ("process N on HOST since ..."), or None when nobody does."""
    path = Path(run_dir) / LOCK_NAME
    if fcntl is None or not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # granted only when no writer holds it
    except BlockingIOError:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
    finally:
        os.close(fd)  # and closing gives the shared lock back at once
    return None


def run_settings(folder: Path) -> Optional[dict]:
    """The settings a training run saved in ``folder/config.json`` (None: no such file, or a model's config.json,
    which names no recipe)."""
    try:
        saved = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) and "recipe" in saved else None


def unfinished_run(source: str) -> Optional[str]:
    """Why ``source`` cannot be read as weights when it is a run folder without its model yet
    (None otherwise): being written now, or stopped, with the command that finishes it."""
    folder = Path(source)
    if not (folder / "config.json").is_file() or (folder / "model" / "config.json").is_file() \
            or (folder / "model.safetensors").is_file():
        return None
    saved = run_settings(folder)
    if saved is None:
        return None
    writer = holder(folder)
    if writer is not None:
        return f"{source} is a run still being written by {writer}: its model is saved when it finishes"
    verb = "train" if saved.get("objective", "classify") == "classify" else "pretrain"
    if not any((folder / "checkpoints").glob("step_*.pt")):
        return f"{source} is a run that stopped before its first checkpoint: it has no model and nothing to " \
               f"resume (vitkit {verb} --name {shlex.quote(folder.name)} runs it again in the same folder)"
    return f"{source} is a run that stopped before it finished: it has no model/ yet (vitkit {verb} --resume " \
           f"{shlex.quote(str(source))} finishes it)"
