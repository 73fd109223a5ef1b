"""What every model configuration shares: JSON round trips and checked copies.

Each architecture's config is a dataclass (``ViTConfig``, ``ResNetV2Config``, ``CaiTConfig``,
``ConViTConfig``) that ``config.json`` stores; this mixin gives them one ``to_dict`` /
``from_dict`` / ``replace`` instead of four copies. ``KIND`` names the family in errors.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, TypeVar

C = TypeVar("C", bound="ConfigMixin")


class ConfigMixin:
    KIND = "model"

    def _io_problems(self) -> List[str]:
        """Checks of the input/output fields every family has (in_chans, num_classes, mean,
        std, label_names); coerces mean/std to float tuples and spreads the RGB default over
        another channel count (its first value), as the configs always have."""
        problems = []
        self.mean = tuple(float(m) for m in self.mean)
        self.std = tuple(float(s) for s in self.std)
        chans = self.in_chans if isinstance(self.in_chans, int) and self.in_chans > 0 else None
        if chans and (len(self.mean) != chans or len(self.std) != chans):
            if len(self.mean) == 3 and len(self.std) == 3 and chans != 3:
                self.mean = (self.mean[0],) * chans
                self.std = (self.std[0],) * chans
            else:
                problems.append(f"mean/std need {chans} values")
        if self.label_names is not None and self.num_classes and len(self.label_names) != self.num_classes:
            problems.append(f"{len(self.label_names)} label names for {self.num_classes} classes")
        return problems

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
