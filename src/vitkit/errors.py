"""Any exception in one line of words: what the command line prints, and what a study says of a
run that failed (the message of an input error as it is, the others named in plain words)."""

from __future__ import annotations

import sys


def describe_error(e: BaseException) -> str:
    """One line for an exception that reached the command line: the message of an input error
    as it is, the others named in plain words (the traceback is one VITKIT_DEBUG=1 away)."""
    from .files import DiskFull, is_disk_full, too_large

    text = " ".join(str(e).split()) if str(e).strip() else ""
    if text.startswith("Caught ") and "Original Traceback" in text:  # re-raised from a DataLoader worker
        last = str(e).strip().splitlines()[-1]
        text = last.split(": ", 1)[1].strip() if ": " in last else last.strip()
    if is_disk_full(e, "."):
        where = f" while writing {e.filename}" if getattr(e, "filename", None) else ""
        if isinstance(e, DiskFull):
            return text
        if too_large(e):
            return f"a file grew past the largest this process may write (its file-size limit: ulimit -f){where}"
        return f"no space left on device{where}: free some space and run it again"
    if isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and any(  # (numpy's in a data worker: "Unable
            words in text for words in ("can't allocate memory", "DefaultCPUAllocator", "out of memory",  # to ...")
                                        "Unable to allocate"))):
        return (f"out of memory ({text or 'MemoryError'}): use a smaller --img-size or model (or --batch-size, where "
                f"the command takes one), or free memory")
    if isinstance(e, RecursionError):
        return "the input is nested too deeply to read (a recursion limit was reached)"
    if isinstance(e, OSError) and e.filename is not None and e.strerror:  # not "[Errno 13] ...: 'x'"
        return f"{e.strerror}: {e.filename}"
    if isinstance(e, OSError) and e.strerror and text.startswith("[Errno"):  # not "[Errno 98] cannot listen ..."
        return e.strerror
    if isinstance(e, (ValueError, OSError)) or is_user_error(e):
        return text or type(e).__name__
    return (f"unexpected {type(e).__name__}: {text or 'no detail'} (VITKIT_DEBUG=1 shows where; please report it "
            f"if the input was sound)")


class AnsweredError(ValueError):
    """An input error the verb's ``--json`` document on stdout already holds (``predict``'s images without an
    answer): the command line says it on stderr only, not as a second JSON object."""


def is_user_error(e: BaseException) -> bool:
    """vitkit's own errors of input that are not ValueError/OSError (a missing extra, a diverged run);
    the training loop is looked up, not imported: an error before it loaded is none of its."""
    from .extras import MissingExtra

    loop = sys.modules.get("vitkit.train.loop")
    return isinstance(e, MissingExtra) or (loop is not None and isinstance(e, loop.NonFiniteLoss))
