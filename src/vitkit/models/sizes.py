"""Sizes given as one int or an (H, W) pair: the type every grid, image and patch size has, and the check
that turns either form into a pair. The lowest of the model modules: the position math, the patch
embedding and the layers all read sizes."""

from __future__ import annotations

import operator
from typing import Any, Sequence, Tuple, Union

IntPair = Tuple[int, int]


def to_2tuple(value: Union[int, Sequence[int]]) -> IntPair:
    """``224`` -> ``(224, 224)``; ``(224, 160)`` stays as it is. Whole numbers only: ``28.5``,
    ``"28"`` or ``True`` are refused rather than truncated or read as 1."""
    items = (value, value) if not isinstance(value, (list, tuple)) else tuple(value)
    if len(items) != 2 or not all(_whole(v) for v in items):
        raise ValueError(f"expected an int or a pair (H, W) of ints, got {value!r}")
    return (int(items[0]), int(items[1]))


def _whole(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return value.is_integer()
    try:
        operator.index(value)  # int, numpy integers
    except TypeError:
        return False
    return True


def one_size(values: Any, flag: str = "--img-size") -> Any:
    """A size flag's one or two values as a model takes them: a side (as given: ``none`` too), or (height,
    width), two equal sides one. One rule and one wording for every verb (the values given are said)."""
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    if len(values) not in (1, 2) or (len(values) == 2 and not all(_whole(v) for v in values)):
        raise ValueError(f"{flag} takes one value or two (H W), not {' '.join(map(str, values))}")
    return values[0] if len(values) == 1 or values[0] == values[1] else tuple(values)
