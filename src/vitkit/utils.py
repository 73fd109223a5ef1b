"""Bottom-layer helpers every package may import (no other vitkit imports here)."""

from __future__ import annotations

import contextlib
import errno
import glob
import importlib
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Union

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

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
        with interrupts_deferred():  # native extensions load here: a signal inside one aborts the process
            for i in range(1, len(parts) + 1):
                found = importlib.import_module(".".join(parts[:i]))
        return found
    except Exception as e:  # a broken install raises anything (protobuf's TypeError, torch ops' RuntimeError)
        # missing: the module, a parent, or the package a wrapper imports (torch.utils.tensorboard's tensorboard)
        missing = isinstance(e, ModuleNotFoundError) and e.name is not None and (
            module == e.name or module.startswith(e.name + ".") or e.name.split(".")[0] == package)
        problem = "" if missing else (f" and is installed but does not import ({type(e).__name__}: "
                                      f"{first_line(e)}); reinstall it")
        fix = f"pip install -e '.[{extra}]' (in a checkout) or pip install 'vitkit[{extra}]'"
        raise MissingExtra(f"{package} is needed for {purpose}{problem}: {fix}", extra) from e


# ---------------------------------------------------------------- signals, raised where it is safe
#
# The command line turns Ctrl-C and SIGTERM into exceptions raised wherever Python is, so that
# cleanup runs. Raised inside a native extension's callback into Python (nanobind while
# onnxruntime is imported), such an exception cannot cross the C++ frames: the process aborts
# ("terminate called after throwing ...") and cleans nothing. Sections of that kind defer it.

_deferral: Dict[str, Any] = {"depth": 0, "pending": None}


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold a Ctrl-C or SIGTERM that arrives inside this block (through :func:`interrupt`) and
    raise it when the block ends: for imports of native extensions, which must not be interrupted
    half-way."""
    _deferral["depth"] += 1
    try:
        yield
    finally:
        _deferral["depth"] -= 1
        pending = _deferral["pending"]
        if pending is not None and _deferral["depth"] == 0:
            _deferral["pending"] = None
            raise pending


def interrupt(error: BaseException) -> None:
    """Raise ``error`` (a signal handler's KeyboardInterrupt) now, or, inside
    :func:`interrupts_deferred`, when that block ends."""
    if _deferral["depth"]:
        _deferral["pending"] = error
        return
    raise error


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Python is when it arrives, so that it unwinds exactly as Ctrl-C does:
    every ``finally`` and context manager runs (temporaries and work folders removed, the run's
    lock released) before the process exits."""


#: what torch's DataLoader raises in the main process when one of its workers died of a signal
_WORKER_KILLED = re.compile(r"DataLoader worker \(pid \d+\) is killed by signal: (\w+)")


def worker_stop(error: BaseException) -> Optional[KeyboardInterrupt]:
    """The stop a DataLoader worker's death by SIGTERM or SIGINT means (the signal reached the
    worker, alone or with its process group), or None for any other error."""
    found = _WORKER_KILLED.search(str(error)) if isinstance(error, RuntimeError) else None
    if found is None or found.group(1) not in ("Terminated", "Interrupt"):
        return None
    return Terminated() if found.group(1) == "Terminated" else KeyboardInterrupt()


def expect_worker_deaths() -> None:
    """While a stop unwinds, workers that die (of the same signal, or shut down) are expected:
    torch's SIGCHLD handler would raise their deaths again inside the cleanup (``__del__``
    tracebacks). The command line puts the previous handler back when it returns."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def first_line(e: BaseException) -> str:
    """The first line of an exception's message ("no detail" when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else "no detail"


class DiskFull(OSError):
    """A write ran out of space (or quota); the message names the file. An OSError with errno
    ENOSPC, so code that checks for full disks the usual way still does."""

    def __init__(self, path: PathLike, what: str = "nothing was replaced (the previous file, if any, is intact)"):
        super().__init__(errno.ENOSPC, f"no space left on device while writing {path}; {what}")
        self.path = Path(path)

    def __str__(self) -> str:  # the words, without OSError's "[Errno 28]"
        return self.strerror


def is_disk_full(error: BaseException, folder: Optional[PathLike] = None) -> bool:
    """Whether ``error`` means the disk (or the user's quota) is full. ``OSError`` says so by its
    errno and safetensors in its text; torch's zip writer raises a RuntimeError whose text names
    neither ("unexpected pos 576 vs 534"), so for a writer's RuntimeError the free space of
    ``folder`` decides (under 1 MiB left)."""
    if isinstance(error, DiskFull) or (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)):
        return True
    text = str(error)
    if any(words in text for words in ("No space left on device", "StorageFull", "Disk quota exceeded", "os error 28")):
        return True
    if isinstance(error, RuntimeError) and folder is not None and ("inline_container" in text or "write" in text):
        free = free_bytes(folder)
        return free is not None and free < 1 << 20
    return False


def free_bytes(folder: PathLike) -> Optional[int]:
    """Bytes this process may still write under ``folder`` (None when it cannot be asked)."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize if os.geteuid() else st.f_bfree * st.f_frsize


# ---------------------------------------------------------------- writing without half-made files
#
# Every temporary file and work folder is *held* by its writer with a flock (on the file itself,
# or on a lock file inside the folder). The kernel releases a flock when its process dies, however
# it dies, so "is the lock free?" tells a dead writer's leftovers from a live writer's work with no
# pid files and no clock: the next writer of the same target sweeps the dead ones' away.


def _try_lock(fd: int) -> bool:
    """Take an exclusive flock on ``fd`` without waiting; False when a live process holds it."""
    if fcntl is None:  # pragma: no cover - not POSIX: no locks, no sweeping of others' files
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path``.

    A crash or an exception leaves the old file (or nothing) in place, never half a file. The
    temporary (``.NAME.*.tmp``) is flock-held while it is written: one that a killed writer left
    is removed by the next writer of the same file (and by :func:`remove_stale_temporaries`). The
    file gets the permissions the umask gives a new file (mkstemp's are 0600), so colleagues can
    read a shared run. A full disk is a :class:`DiskFull` naming the file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent, path.name, recursive=False)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    _try_lock(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        full = isinstance(e, Exception) and is_disk_full(e, path.parent)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if full:
            raise DiskFull(path) from e
        raise
    finally:
        os.close(fd)


#: The suffix of atomic_path's temporaries.
TEMP_SUFFIX = ".tmp"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def remove_stale_temporaries(folder: PathLike, name: Optional[str] = None, recursive: bool = True) -> int:
    """Delete the temporaries (``.NAME.*.tmp`` of :func:`atomic_path`) that dead writers left in
    ``folder`` (and its subfolders when ``recursive``); ``name``: only those of that file. A
    temporary a live process is writing is flock-held and kept. Returns how many were removed."""
    folder = Path(folder)
    pattern = f".{glob.escape(name)}.*{TEMP_SUFFIX}" if name else f".*{TEMP_SUFFIX}"
    removed = 0
    for tmp in (folder.rglob(pattern) if recursive else folder.glob(pattern)):
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # gone meanwhile, a link, or not ours to open
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode) and _try_lock(fd):
                os.unlink(tmp)
                removed += 1
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
    return removed


#: The suffix of work_folder's folders, and the lock file inside each.
WORK_SUFFIX = ".work"
_OWNER = ".owner"


@contextlib.contextmanager
def work_folder(parent: PathLike, name: str) -> Iterator[Path]:
    """A private folder ``parent/.NAME.XXXX.work`` for a job of several files (an ONNX export,
    a quantization), removed when the job ends however it ends in Python (an error, Ctrl-C,
    SIGTERM through the command line). A lock file inside is held meanwhile, so the folders of
    killed writers (SIGKILL, power loss) are found dead and removed by the next job in ``parent``
    (:func:`sweep_work_folders`)."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    sweep_work_folders(parent)
    folder = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=WORK_SUFFIX, dir=parent))
    fd = os.open(folder / _OWNER, os.O_RDWR | os.O_CREAT, 0o600)
    _try_lock(fd)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)


def sweep_work_folders(parent: PathLike, name: Optional[str] = None) -> int:
    """Remove the work folders in ``parent`` (``name``: only that job's) whose writers are dead:
    their lock file is free. A folder of ``name`` without a lock file was left between its
    creation and its lock, so it is removed once a minute old; without ``name`` such folders are
    left alone (they may be another program's). Returns how many were removed."""
    removed = 0
    pattern = f".{glob.escape(name)}.*{WORK_SUFFIX}" if name else f".*{WORK_SUFFIX}"
    for folder in Path(parent).glob(pattern):
        if not folder.is_dir() or folder.is_symlink():
            continue
        try:
            fd = os.open(folder / _OWNER, os.O_RDONLY)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                if name and time.time() - folder.stat().st_mtime > 60:
                    shutil.rmtree(folder, ignore_errors=True)
                    removed += 1
            continue
        except OSError:
            continue
        try:
            if _try_lock(fd):
                shutil.rmtree(folder, ignore_errors=True)
                removed += 1
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def new_folder(folder: PathLike) -> Iterator[Path]:
    """Make ``folder`` (and its missing parents) for a writer of several files; when the writer
    fails (a full disk, an error, Ctrl-C) remove what this made, so no half-made folder is left:
    the folders it created, or what it wrote into a folder that was empty. A folder that held
    files before keeps them: its files are replaced one by one, atomically."""
    folder = Path(folder)
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    was_empty = not made and folder.is_dir() and not any(folder.iterdir())
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    except BaseException:
        if made:
            shutil.rmtree(made[-1], ignore_errors=True)  # the outermost folder this made
        elif was_empty:
            for child in folder.iterdir():
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
        raise


def check_output(path: PathLike, kind: str, what: str = "output") -> Path:
    """Refuse an output that cannot be written, before any work is done: ``kind`` "file" or
    "folder"; a file where a folder is wanted (or the reverse), a path under a file, or a folder
    this process may not write. ``what`` names it in the message (a flag, "DST")."""
    if str(path) == "":
        raise ValueError(f"{what} is empty: give a path")
    path = Path(path)
    if kind not in ("file", "folder"):
        raise ValueError(f"kind must be file or folder, not {kind!r}")
    if path.exists() or path.is_symlink():
        if kind == "folder" and not path.is_dir():
            raise ValueError(f"{what} {path} is a file, not a folder: give a folder to write into")
        if kind == "file" and path.is_dir():
            raise ValueError(f"{what} {path} is a folder, not a file name")
        if kind == "file" and not path.is_file():
            raise ValueError(f"{what} {path} exists and is not a regular file (a FIFO, a device?)")
    ancestor = path if path.is_dir() else path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{what} {path} cannot be made: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path} cannot be written: no permission to write in {ancestor}")
    return path


def available_memory() -> Optional[int]:
    """Bytes of memory this process can still use: the smaller of the system's available memory
    and the cgroup's limit left (None where neither can be read)."""
    found = []
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            found.append(max(int(limit) - used, 0))
    if not found:
        with contextlib.suppress(AttributeError, ValueError, OSError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return min(found) if found else None


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity; every core where that is unknown)."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def native_bf16_cpu() -> bool:
    """Whether this CPU runs bf16 matrix products natively (AVX-512 BF16 or AMX), by oneDNN's own
    probe. Elsewhere torch emulates bf16, many times slower than fp32: choose fp32 there."""
    import torch

    try:  # a private API, so guarded
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def write_json(path: PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_text(path: PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def copy_file(src: PathLike, dst: PathLike) -> None:
    """Copy ``src`` to ``dst`` atomically (a full disk is said naming ``dst``; no half copy)."""
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


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
                "hf-stream")


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
