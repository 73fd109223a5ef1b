"""What every model configuration shares: JSON round trips and checked copies.

Each architecture's config is a dataclass (``ViTConfig``, ``ResNetV2Config``, ``CaiTConfig``,
``ConViTConfig``) that ``config.json`` stores; this mixin gives them one ``to_dict`` /
``from_dict`` / ``replace`` instead of four copies. ``KIND`` names the family in errors.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, TypeVar

C = TypeVar("C", bound="ConfigMixin")


class ConfigMixin:
    KIND = "model"

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready: tuples become lists."""
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls: type[C], d: Dict[str, Any]) -> C:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown {cls.KIND} config fields: {', '.join(unknown)}")
        return cls(**d)

    def replace(self: C, **overrides: Any) -> C:
        """A copy with fields changed (validated again); a new class count drops stale label names."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "num_classes" in overrides and "label_names" not in overrides and self.label_names is not None \
                and overrides["num_classes"] != len(self.label_names):
            overrides["label_names"] = None
        return dataclasses.replace(self, **overrides)
