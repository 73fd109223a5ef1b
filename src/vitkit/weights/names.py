"""Renaming a foreign layout's tensors by pattern rules (Hugging Face's towers, open_clip), and reading the depth
off a layout's block names."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Tuple

Rules = List[Tuple[str, str]]


def rename(sd: Mapping[str, Any], rules: Rules) -> Dict[str, Any]:
    """Each name by the first rule (regex, replacement) whose pattern matches all of it; a name no rule
    matches stays as ``unmapped:NAME``, which the loader reports as unexpected, by name (never dropped)."""
    compiled = [(re.compile(p), r) for p, r in rules]
    out: Dict[str, Any] = {}
    for key, value in sd.items():
        for pattern, repl in compiled:
            if pattern.fullmatch(key):
                out[pattern.sub(repl, key)] = value
                break
        else:
            out[f"unmapped:{key}"] = value
    return out


def depth_of(keys, prefix: str) -> int:
    """How many blocks a state dict's names hold, numbered after ``prefix`` (``blocks.`` -> ``blocks.N.*``); a
    ValueError where none is."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    return 1 + max(int(m.group(1)) for k in keys for m in [pattern.match(k)] if m)


__all__ = ["Rules", "rename", "depth_of"]
