"""The training loop's progress bar; it lives in :mod:`vitkit.progress`, which evaluation,
inspection and data loading share (this name stays for the imports that use it)."""

from ..progress import Progress, _hms  # noqa: F401

__all__ = ["Progress"]
