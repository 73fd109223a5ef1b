"""Writing files without half-made ones: the atomic writer (flock-held temporaries), work folders,
new folders removed when their writer fails, and full disks said naming the file (DiskFull).
Imports only signals.py (a signal is held while a work folder is being made)."""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shlex
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, List, Optional, Union

from .signals import interrupts_deferred

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

PathLike = Union[str, "os.PathLike[str]"]


class DiskFull(OSError):
    """A write ran out of space (or quota), or past the process's file-size limit (``too_large``: ``ulimit -f``,
    said as an internal error before); the message names the file. An OSError with errno ENOSPC (EFBIG), so code
    that checks for full disks the usual way still does."""

    def __init__(self, path: PathLike, what: str = "nothing was replaced (the previous file, if any, is intact)",
                 too_large: bool = False):
        words = ("the file grew past the largest this process may write (its file-size limit: ulimit -f)"
                 if too_large else "no space left on device")
        super().__init__(errno.EFBIG if too_large else errno.ENOSPC, f"{words} while writing {path}; {what}")
        self.path, self.too_large = Path(path), too_large

    def __str__(self) -> str:  # the words, without OSError's "[Errno 28]"
        return self.strerror


def too_large(error: BaseException) -> bool:
    """Whether ``error`` is a write past the process's file-size limit (EFBIG; safetensors says it in its text)."""
    if isinstance(error, DiskFull):
        return error.too_large
    return isinstance(error, OSError) and error.errno == errno.EFBIG or any(
        words in str(error) for words in ("os error 27", "[Errno 27] File too large"))


def is_disk_full(error: BaseException, folder: Optional[PathLike] = None) -> bool:
    """Whether ``error`` means the disk (or the user's quota) is full. ``OSError`` says so by its
    errno and safetensors in its text; torch's zip writer, OpenVINO and protobuf raise errors whose
    text names neither (:data:`WRITER_WORDS`), so for those the free space of ``folder`` (or of the
    work folder the job failed in, when it failed) decides (under 1 MiB left)."""
    if isinstance(error, DiskFull) or (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)):
        return True
    text = str(error)
    if too_large(error) or any(words in text for words in ("No space left on device", "StorageFull",
                                                           "Disk quota exceeded", "os error 28")):
        return True
    if folder is not None and any(words in text for words in WRITER_WORDS):
        free = getattr(error, FREE_AT_FAILURE, None)  # (a work folder's files, removed since, held the space)
        free = free if free is not None else free_bytes(folder)
        return free is not None and free < 1 << 20
    return False


@contextlib.contextmanager
def said_as_disk_full(path: PathLike, what: str = "nothing was replaced (the previous file, if any, is intact)",
                      folder: Optional[PathLike] = None) -> Iterator[None]:
    """A full disk met inside the block raised as one :class:`DiskFull` naming ``path`` and what is left
    intact: exporters, quantizers and TensorBoard raise their own types, in words that name no file. The
    free space of ``folder`` (``path``'s own folder by default) decides where their words are ambiguous. A
    DiskFull from within (naming a work folder's file) is said again naming ``path``."""
    try:
        yield
    except Exception as e:
        if is_disk_full(e, Path(folder) if folder is not None else Path(path).parent):
            raise DiskFull(path, what, too_large(e)) from e
        raise


#: what writers say, in their own words, when a file they wrote or read back fell short: torch's zip writer
#: ("inline_container ... unexpected pos"), OpenVINO's C++ streams ("basic_ios::clear: iostream error"), and
#: protobuf reading a model that ONNX Runtime's tools wrote cut short without a word ("Error parsing message")
WRITER_WORDS = ("inline_container", "write", "iostream error", "Error parsing message")
#: the attribute a work folder puts on the exception that ended its job: the bytes still free at that moment
#: (once its files are removed, the disk no longer looks full)
FREE_AT_FAILURE = "vitkit_free_at_failure"


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
    made = _missing_folders(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent, path.name, recursive=False)
    fd, tmp = None, None
    try:
        with interrupts_deferred():  # a signal right after mkstemp would leave the temporary behind
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
            _try_lock(fd)
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        full = isinstance(e, Exception) and is_disk_full(e, path.parent)
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _remove_empty(made)  # a failed write (a download refused offline) leaves no empty folder it made
        if full:
            raise DiskFull(path, too_large=too_large(e)) from e
        if isinstance(e, OSError) and e.filename == tmp and e.errno is not None:  # the file meant, not its temporary
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    finally:
        if fd is not None:
            os.close(fd)


def _missing_folders(folder: Path) -> List[Path]:
    """``folder`` and its ancestors that do not exist yet, deepest first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_empty(folders: List[Path]) -> None:
    """Remove each of ``folders`` (deepest first) while it is empty: another writer's file keeps it."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


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
    folder, fd = None, None
    try:
        # a signal between making the folder and arming its removal would leave it behind (seen under
        # load: SIGTERM right after mkdtemp): held until both are done, then raised inside the try
        with interrupts_deferred():
            folder = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=WORK_SUFFIX, dir=parent))
            fd = os.open(folder / _OWNER, os.O_RDWR | os.O_CREAT, 0o600)
            _try_lock(fd)
        yield folder
    except BaseException as e:
        if folder is not None and not hasattr(e, FREE_AT_FAILURE):  # (the innermost job's folder says it)
            with contextlib.suppress(Exception):
                setattr(e, FREE_AT_FAILURE, free_bytes(folder))
        raise
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        if fd is not None:
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
    try:
        folder.mkdir(parents=True, exist_ok=True)  # inside: a signal right after it removes what it made
        yield folder
    except BaseException:
        if made:
            shutil.rmtree(made[-1], ignore_errors=True)  # the outermost folder this made
        elif was_empty:
            for child in folder.iterdir():
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def files_together(folder: PathLike) -> Iterator[Path]:
    """Files that belong together (an evaluation's numbers and its figure; a study's results, table and figure)
    written into ``folder`` all or none: into a work folder inside it (the path yielded), then renamed into place
    once every one is written. A failure (a full disk, a signal) leaves the files ``folder`` held as they were
    (replaced one by one, a full disk left new numbers beside an old figure) and no folder this made."""
    with new_folder(folder) as out, work_folder(out, "files") as stage:
        yield stage
        staged = sorted(p for p in stage.iterdir() if p.name != _OWNER)
        if any(p.is_dir() for p in staged):  # a folder's rename over a full one fails half-way through the set
            raise ValueError(f"files_together installs files, not folders: {[p.name for p in staged if p.is_dir()]}")
        if in_way := [out / p.name for p in staged if (out / p.name).is_dir()]:  # (the rename named the staging
            raise ValueError(f"{in_way[0]} is a folder, in the way of the file to write there: move or remove "
                             f"it (nothing was written)")  # folder's file, gone by the time it was read)
        with interrupts_deferred(), held(out):  # two writers at once: one whole set, then the other's (they
            for path in staged:                 # interleaved: one's figure beside the other's numbers)
                os.replace(path, out / path.name)


@contextlib.contextmanager
def weights_folder(folder: PathLike, old_files: Callable[[Path], List[Path]]) -> Iterator[Path]:
    """A model's files written into ``folder`` whole or not at all: the writer writes into a staging folder
    beside it (the path yielded), and only once it has finished does the staging folder become ``folder``
    (a rename, where there was none), or are the files a reader would take for the model the folder held
    (``old_files(folder)``: weights, shard indexes and their shards, configs) removed and the new ones moved
    in. A failure leaves the folder as it was (or none, and no parent this made); files of the user's own stay.
    Two processes saving into one folder at once install one after the other (a flock on the parent), so the
    folder ends with one writer's files, never some of each. The staging folder is a work folder (a lock file
    inside while its writer lives): one a killed writer left (SIGKILL, power loss) is removed by the next save
    of the same name (:func:`sweep_work_folders`)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder: give a folder to write the model into")
    made = [p for p in folder.parents if not p.exists()]
    staging = None
    try:
        with work_folder(folder.parent, folder.name) as staging:  # removed however the save ends
            sweep_work_folders(folder.parent, folder.name)  # and one of a killed save of this name
            yield staging
            with interrupts_deferred(), parent_held(folder):
                (staging / _OWNER).unlink()  # not the model's; the lock stays on the open file until the end
                _install(staging, folder, old_files)
    except BaseException as e:
        if made:
            shutil.rmtree(made[-1], ignore_errors=True)  # the outermost folder this made
        said = _as_written(e, staging, folder) if staging is not None else _staging_unmade(e, folder)
        if said is not None:
            raise said from e
        raise


def _staging_unmade(error: BaseException, folder: Path) -> Optional[OSError]:
    """The staging folder beside ``folder`` that could not be made, said as ``folder`` (it said its own name:
    "No such file or directory: /proc/.o9.5z0tfzy9.work" for --out /proc/o9); None for any other error."""
    named = Path(error.filename) if isinstance(error, OSError) and error.filename else None
    if named is None or named.parent != folder.parent or not named.name.startswith(f".{folder.name}."):
        return None
    return OSError(error.errno, error.strerror, str(folder))


def _as_written(error: BaseException, staging: Path, folder: Path) -> Optional[OSError]:
    """An OS error naming a file of the staging folder, naming the file it was to become instead (None: it names
    none): a full disk said ``.model.x8f2.tmp/attention.png`` where the user asked for ``model/``."""
    if not isinstance(error, OSError):
        return None
    named = error.path if isinstance(error, DiskFull) else Path(error.filename) if error.filename else None
    if named is None or not named.is_relative_to(staging):
        return None
    meant = folder / named.relative_to(staging)
    return DiskFull(meant, too_large=error.too_large) if isinstance(error, DiskFull) else \
        OSError(error.errno, error.strerror, str(meant))


def parent_held(folder: Path) -> ContextManager[None]:
    """An exclusive flock on ``folder``'s parent while a model is moved into ``folder`` (renames only: brief), or
    a file pair into place beside it (an OpenVINO IR's .xml and .bin)."""
    return held(folder.parent)


@contextlib.contextmanager
def held(folder: Path) -> Iterator[None]:
    """An exclusive flock on ``folder`` while files that belong together are renamed into it."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _install(staging: Path, folder: Path, old_files: Callable[[Path], List[Path]]) -> None:
    """``staging``'s files as ``folder``'s: the whole folder renamed into place where there is none, else the
    files the old model held replaced by the new ones (a name the folder holds as another kind refused first)."""
    if not folder.exists() and not folder.is_symlink():
        os.chmod(staging, 0o777 & ~_umask())  # mkdtemp's folders are 0700: a new folder is made as mkdir makes it
        os.rename(staging, folder)
        return
    written = sorted(staging.iterdir())
    for path in written:  # a name the folder holds as another kind (a folder where a file goes): before any move
        there = folder / path.name
        if there.exists() and there.is_dir() != path.is_dir():
            raise ValueError(f"{there} is a {'folder' if there.is_dir() else 'file'} where the new model has a "
                             f"{'folder' if path.is_dir() else 'file'}: move it away (nothing was replaced)")
    names = {p.name for p in written}
    for old in old_files(folder):
        if old.name not in names:
            old.unlink(missing_ok=True)
    for path in written:
        if path.is_dir():
            shutil.rmtree(folder / path.name, ignore_errors=True)
        os.replace(path, folder / path.name)


def check_output(path: PathLike, kind: str, what: str = "output") -> Path:
    """Refuse an output that cannot be written, before any work is done: ``kind`` "file" or
    "folder"; a file where a folder is wanted (or the reverse), a path under a file, or a folder
    this process may not write. ``what`` names it in the message (a flag, "DST")."""
    if str(path) == "":
        raise ValueError(f"{what} is empty: give a path")
    path = Path(path)
    if kind not in ("file", "folder"):
        raise ValueError(f"kind must be file or folder, not {kind!r}")
    if path.is_symlink() and not path.exists():  # (it was said to be "not a regular file (a FIFO, a device?)")
        raise ValueError(f"{what} {path} is a symbolic link to {os.readlink(path)}, which does not exist: give "
                         f"the path to write itself, or remove the link")
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
    try:  # what access() cannot tell (root may "write" anywhere): a folder that takes no files (/proc, no inodes)
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as e:  # (a full one said in words the disk-full line does not replace: it names the flag)
        why = "its file system is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else e.strerror or str(e)
        raise ValueError(f"{what} {path} cannot be written: {ancestor} takes no new files ({why})") from None
    return path


def as_argument(path: PathLike) -> str:
    """``path`` as a shell word, for a command vitkit suggests ("next: vitkit eval --weights ..."): a folder with a
    space or a quote in its name broke the command that was copied."""
    return shlex.quote(str(path))


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
