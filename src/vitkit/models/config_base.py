"""What every model configuration shares: JSON round trips and checked copies.

Each architecture's config is a dataclass (``ViTConfig``, ``ResNetV2Config``, ``CaiTConfig``,
``ConViTConfig``) that ``config.json`` stores; this mixin gives them one ``to_dict`` /
``from_dict`` / ``replace`` instead of four copies. ``KIND`` names the family in errors.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Sequence, TypeVar

from .layers import ATTN_IMPLS, INTERPOLATIONS

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

    def _token_problems(self, rates: Sequence[str] = ("drop_rate", "attn_drop_rate", "drop_path_rate")
                        ) -> List[str]:
        """Checks of the fields every patch-token family has (ViT, CaiT, ConViT): attention
        kernel and position-interpolation names, dropout ``rates`` in [0, 1), positive image
        and patch sizes."""
        problems = []
        if self.attn_impl not in ATTN_IMPLS:
            problems.append(f"attn_impl must be one of {ATTN_IMPLS}, got {self.attn_impl!r}")
        if self.pos_embed_interpolation not in INTERPOLATIONS:
            problems.append(f"pos_embed_interpolation must be one of {INTERPOLATIONS}")
        for rate in rates:
            if not 0.0 <= getattr(self, rate) < 1.0:
                problems.append(f"{rate} must be in [0, 1), got {getattr(self, rate)!r}")
        for name in ("img_size", "patch_size"):
            if min(getattr(self, name)) <= 0:
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        return problems

    def _patch_grid_problems(self) -> List[str]:
        """img_size must be a whole number of patches (nothing to say while a size is not positive)."""
        if min(self.img_size) <= 0 or min(self.patch_size) <= 0 or \
                not any(i % p for i, p in zip(self.img_size, self.patch_size)):
            return []
        near = [sorted({(i // p) * p, (i // p + 1) * p} - {0}) for i, p in zip(self.img_size, self.patch_size)]
        return [f"img_size {self.img_size} is not divisible by patch_size {self.patch_size} "
                f"(nearest multiples: {' / '.join(' or '.join(map(str, n)) for n in near)})"]

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
