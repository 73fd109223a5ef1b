"""Optional dependencies: ``require`` imports one or says, in one line, which extra installs it."""

from __future__ import annotations

import importlib
from typing import Any

from .signals import interrupts_deferred

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
        from .progress import quiet_libraries

        quiet_libraries()  # (a verb's --no-progress for the bars of datasets and the Hub too)
        return found
    except Exception as e:  # a broken install raises anything (protobuf's TypeError, torch ops' RuntimeError)
        # missing: the module, a parent, or the package a wrapper imports (torch.utils.tensorboard's tensorboard)
        missing = isinstance(e, ModuleNotFoundError) and e.name is not None and (
            module == e.name or module.startswith(e.name + ".") or e.name.split(".")[0] == package)
        problem = "" if missing else (f" and is installed but does not import ({type(e).__name__}: "
                                      f"{first_line(e)}); reinstall it")
        fix = f"pip install -e '.[{extra}]' (in a checkout) or pip install 'vitkit[{extra}]'"
        raise MissingExtra(f"{package} is needed for {purpose}{problem}: {fix}", extra) from e


# here rather than in utils (which re-exports it): require's message uses it, and utils imports this module
def first_line(e: BaseException) -> str:
    """The first line of an exception's message ("no detail" when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else "no detail"
