"""``vitkit <verb>``: a thin shell over the library; every verb calls a library function.

Every verb takes ``--json`` for machine-readable output. Errors of input print one line to
stderr and exit with status 2 (``VITKIT_DEBUG=1`` shows their traceback instead). The entry
point and error boundary are :mod:`.entry`; each verb's flags sit beside its handler
(:mod:`.describe`, :mod:`.weights`, :mod:`.evaluate`, :mod:`.inspect`, :mod:`.study`, :mod:`.train`).
"""

from ..errors import describe_error
from ..signals import Terminated  # noqa: F401 (the old names stay importable)
from .common import runtime_name as _runtime_name  # noqa: F401 (its old name)
from .entry import _on_sigterm, _one_line_warnings, main  # noqa: F401
from .parser import build_parser
from .train import train_config

__all__ = ["main", "build_parser", "describe_error", "train_config"]
