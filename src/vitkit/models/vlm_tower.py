"""The vision towers of vision-language models as timm builds them (its ``deepseek_vit`` and ``qwen3_vit``
modules): an EVA-style ViT (:mod:`.eva`) whose patches a VLM projector maps to the language model's width.

What the families share, and each fills in (:mod:`.deepseek`, :mod:`.qwen3`):

- **The projector** (``projector_dim`` > 0: timm's ``_align`` / ``_merge`` classifiers and ``_enc`` encoders):
  r x r blocks of final patches side by side, then linear layers to the language model's width. With it,
  ``forward_features`` gives those tokens (what the language model reads, as timm's) and the pooled mean is theirs.
- **The classifier** pools the mean of the patches (or of the projector's tokens) and normalises it again
  with a norm that has no weight (``pooled_norm``; timm's ``final_norm``) before the head.
- **timm's names.** The classifier keeps its encoder under ``encoder.`` and the head beside it; vitkit's names
  are the encoder's own, as timm's ``_enc`` has them (:class:`TimmNames` moves the prefix). The projector's width,
  which timm takes from a checkpoint's tag, is read off its tensors.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Collection, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from .config_base import _is_int
from .eva import Eva, EvaConfig
from .vit import vit_complexity

#: where timm's classifier keeps everything but its head
TIMM_PREFIX = "encoder."


@dataclass
class TowerConfig(EvaConfig):
    """A VLM's vision tower (see the module notes): an EVA-style config, the fields its family fixes in ``FIXED``."""

    global_pool: str = "avg"
    class_token: bool = False
    dynamic_img_size: bool = True
    #: timm's ``final_norm``: the weightless norm of the pooled mean
    pooled_norm: bool = True
    #: the VLM projector's width (timm's ``out_features``: the language model's); 0: no projector
    projector_dim: int = 0
    #: the projector's r x r blocks of patches
    projector_ratio: int = 2
    #: the fields whose defaults make the family (another value would make another model)
    FIXED: ClassVar[Tuple[str, ...]] = ()
    #: the projector's width in the family's registered models (a checkpoint's is read off its tensors)
    LLM_WIDTH: ClassVar[int] = 0

    def family_problems(self) -> List[str]:
        problems = super().family_problems()
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        problems += [f"{k} is {defaults[k]!r} in a {self.KIND}, got {getattr(self, k)!r}" for k in self.FIXED
                     if getattr(self, k) != defaults[k]]
        if self.global_pool != "avg":
            problems.append(f"a {self.KIND} pools the mean of its patches (global_pool='avg'), got "
                            f"{self.global_pool!r}")
        if not _is_int(self.projector_dim) or self.projector_dim < 0:
            problems.append(f"projector_dim must be 0 (no VLM projector) or a positive integer, got "
                            f"{self.projector_dim!r}")
        if not _is_int(self.projector_ratio) or not 1 <= self.projector_ratio <= 16:
            problems.append(f"projector_ratio must be an integer in 1..16, got {self.projector_ratio!r}")
        return problems  # (pooled_norm's type: checked with every bool field, config_base)


def init_linears_(module: nn.Module) -> None:
    """timm's initialisation of a tower's projector: truncated normal weights, zero biases."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)


class Tower(Eva):
    """A VLM's vision tower (see the module notes); the family builds its projector and its pooled norm."""

    config_cls = TowerConfig
    #: the projector's attribute: its timm name (DeepSeek's ``aligner``, Qwen's ``merger``; each family's own)
    PROJECTOR: ClassVar[str]

    def __init__(self, config=None, **overrides: Any):
        super().__init__(config, **overrides)
        cfg = self.config
        projector = self.build_projector() if cfg.projector_dim else None
        setattr(self, self.PROJECTOR, projector)
        if projector is not None and next(projector.parameters()).device.type != "meta":
            init_linears_(projector)
        self.fc_norm = self.build_pooled_norm(self.num_features) if cfg.pooled_norm else nn.Identity()

    def build_projector(self) -> nn.Module:
        """The VLM projector: tokens (B, gh*gw, D) and their grid -> (B, L, projector_dim)."""
        raise NotImplementedError

    def build_pooled_norm(self, width: int) -> nn.Module:
        """The weightless norm of the pooled mean."""
        raise NotImplementedError

    @property
    def vlm_projector(self) -> Optional[nn.Module]:
        return getattr(self, self.PROJECTOR)

    def pooled_width(self, global_pool: str) -> int:
        """The projector's width where there is one (its tokens are pooled)."""
        return self.config.projector_dim or super().pooled_width(global_pool)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The final patches (B, N, D); with the projector, its tokens for the language model (B, L,
        projector_dim), as timm's ``forward_features``."""
        if self.vlm_projector is None:
            return super().forward_features(x)
        x, grid = self.embed(x)
        return self.vlm_projector(self.encode_tokens(x, grid)[0], grid)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        """As every token model's; with the projector, the head pools its tokens (the attention maps stay the
        encoder's)."""
        if self.vlm_projector is None:
            return super().forward(x, return_attention)
        x, grid = self.embed(x)
        tokens, attns = self.encode_tokens(x, grid, return_attention)
        logits = self.forward_head(self.vlm_projector(tokens, grid))
        return (logits, attns) if return_attention else logits


def tower_complexity(config: TowerConfig, projector_macs: Callable[[TowerConfig], int]):
    """The ViT's cost (:func:`.vit.vit_complexity`) and the projector's (``projector_macs``), with a head over
    its width."""
    c = vit_complexity(config)
    if not config.projector_dim:
        return c
    macs = c.macs + projector_macs(config) + (config.projector_dim - config.embed_dim) * config.num_classes
    return dataclasses.replace(c, macs=macs, attn_macs_share=c.attn_macs_share * c.macs / macs)


def blocks_ratio(inputs: int, width: int) -> Optional[int]:
    """The r of a projector's first layer taking ``inputs`` values of r x r blocks of ``width``-wide patches (None:
    no such r)."""
    ratio = math.isqrt(inputs // width) if width > 0 else 0
    return ratio if ratio and ratio * ratio * width == inputs else None


def blocks_of(config: TowerConfig, pad: bool) -> int:
    """How many r x r blocks of patches the projector makes (the grid padded to a multiple of r, or divisible)."""
    (gh, gw), r = config.grid_size, config.projector_ratio
    return (math.ceil(gh / r) * math.ceil(gw / r)) if pad else (gh // r) * (gw // r)


@dataclass(frozen=True)
class TimmNames:
    """A tower's tensor names in timm: its classifier's (``encoder.`` and ``head.``), its encoder's with the
    projector (vitkit's own names; the projector's tell them from another family's)."""

    #: a regex of the encoder's own names (without the projector's)
    encoder: str
    #: the projector's attribute (its names' first part)
    projector: str
    #: one name only this family's tensors have (a block's, as the family names it)
    telltale: str

    def _pattern(self, prefix: str) -> "re.Pattern":
        own = rf"{self.encoder}|{re.escape(self.projector)}\.[\w.]+"
        return re.compile(rf"{re.escape(prefix)}({own})|head\.(weight|bias)" if prefix else own)

    def is_timm_layout(self, keys: Collection[str]) -> bool:
        """Whether these are timm's tensors of this family: its classifier's, or its encoder's with the projector."""
        keys = list(keys)
        if TIMM_PREFIX + self.telltale in keys:
            pattern = self._pattern(TIMM_PREFIX)
            return all(pattern.fullmatch(k) for k in keys)
        if not any(k.startswith(self.projector + ".") for k in keys) or self.telltale not in keys:
            return False
        pattern = self._pattern("")
        return all(pattern.fullmatch(k) for k in keys)

    @staticmethod
    def from_timm(sd: Mapping[str, Any]) -> Dict[str, Any]:
        """timm's state dict -> vitkit's names (the classifier's encoder prefix off; the encoder's are vitkit's)."""
        return {k[len(TIMM_PREFIX):] if k.startswith(TIMM_PREFIX) else k: v for k, v in sd.items()}

    @staticmethod
    def timm_name(key: str, config: TowerConfig) -> str:
        """A tensor's name in timm: its encoder's (``_enc``: the projector, no classifier and no norm after
        pooling) are vitkit's; its classifier's have the encoder under ``encoder.`` and the head beside it."""
        encoder = bool(config.projector_dim) and not config.pooled_norm and not config.num_classes
        return key if encoder or key.startswith("head.") else TIMM_PREFIX + key

    def to_timm(self, model: nn.Module) -> Dict[str, torch.Tensor]:
        """vitkit's model -> timm's names (:meth:`timm_name`)."""
        return {self.timm_name(k, model.config): v.detach().cpu().contiguous() for k, v in model.state_dict().items()}

    def local(self, sd: Mapping[str, Any], name: str) -> Any:
        """A tensor by vitkit's name, in timm's classifier names or the encoder's (None where absent)."""
        return next((sd[k] for k in (name, TIMM_PREFIX + name) if k in sd), None)

    def projector_fields(self, sd: Mapping[str, Any], config: TowerConfig) -> Dict[str, Any]:
        """``Family.hub_tensor_fields``: the projector's width off its last layer and its ratio off its first, where
        the config has one (timm resolves the width from the checkpoint's tag; a hub config.json holds neither)."""
        fc1, fc2 = (self.local(sd, f"{self.projector}.{fc}.weight") for fc in ("fc1", "fc2"))
        if not config.projector_dim or fc1 is None or fc2 is None or len(fc1.shape) != 2:
            return {}  # (projector tensors in a file of a model without one: refused by the loader as unexpected)
        embed = self.local(sd, "patch_embed.proj.weight")
        width = int(embed.shape[0]) if embed is not None else config.embed_dim
        ratio = blocks_ratio(int(fc1.shape[1]), width)
        if ratio is None:
            raise ValueError(f"the VLM projector's first layer takes {int(fc1.shape[1])} inputs: no r x r blocks of "
                             f"{width}-wide patches")
        return {"projector_dim": int(fc2.shape[0]), "projector_ratio": ratio}


#: timm's tower arguments -> fields, as both families name them (each adds its projector's ratio)
TIMM_RENAMED = {"embed_dim": "embed_dim", "rope_temperature": "rope_temperature", "norm_eps": "norm_eps",
                "final_norm": "pooled_norm", "drop_path_rate": "drop_path_rate", "attn_drop_rate": "attn_drop_rate",
                "out_features": "projector_dim"}
#: timm's tower arguments the registered model's fields already say (or that change nothing computed)
TIMM_INERT = ("img_size", "patch_size", "in_chans", "num_classes", "depth", "num_heads", "drop_rate",
              "proj_drop_rate", "mlp_ratio")


def tower_timm_args(args: Mapping[str, Any], config: TowerConfig, renamed: Mapping[str, str],
                    inert: Tuple[str, ...], word: str, padded: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """timm's ``model_args`` of a tower -> fields. Whether the projector is there: the classifier's
    ``encoder_pool`` (``word``: 'align', 'merge'), the encoder's ``global_pool`` (``word``; 'avg' pools its patches
    without it); the width (timm's ``out_features``, else the checkpoint tag's) is read off the tensors
    (``Family.hub_tensor_fields``). ``padded``: switches vitkit does not read (refused when on)."""
    kw = {ours: args[theirs] for theirs, ours in renamed.items() if args.get(theirs) is not None}
    unknown = sorted(k for k in args if k not in renamed and k not in inert
                     and k not in ("global_pool", "encoder_pool") + padded)
    if unknown:
        raise ValueError(f"timm {config.KIND} model_args {', '.join(unknown)} are not read by vitkit; remove them or "
                         f"build the model with vitkit's fields")
    on = [k for k in padded if args.get(k)]
    if on:
        raise ValueError(f"timm {config.KIND} model_args {on[0]} is not read by vitkit: give it images whose size is a "
                         f"multiple of the patch")
    pool, encoder_pool = args.get("global_pool"), args.get("encoder_pool")
    encoder = bool(config.projector_dim) and not config.pooled_norm  # timm's _enc (no classifier, so no norm)
    if pool not in ((None, word, "avg") if encoder else (None, "avg")) or encoder_pool not in (None, "", word):
        raise ValueError(f"timm {config.KIND} model_args global_pool={pool!r}, encoder_pool={encoder_pool!r}: vitkit "
                         f"pools the patches (or the projector's tokens) into one vector ('avg'; the encoder's "
                         f"{word!r}: its projector's tokens)")
    if (encoder and pool == "avg") or encoder_pool == "":
        kw["projector_dim"] = 0  # the patches' mean, without the projector
    elif encoder_pool == word and not config.projector_dim:
        kw.setdefault("projector_dim", config.LLM_WIDTH)  # (the tensors' width replaces it)
    kw["global_pool"] = "avg"
    width = kw.get("embed_dim", config.embed_dim)
    if args.get("mlp_ratio") is not None or "embed_dim" in kw:  # timm's hidden width follows the width given
        ratio = args["mlp_ratio"] if args.get("mlp_ratio") is not None else config.mlp_dim / config.embed_dim
        kw["mlp_dim"] = int(width * ratio)
    return kw


__all__ = ["TIMM_PREFIX", "TIMM_RENAMED", "TIMM_INERT", "TowerConfig", "Tower", "TimmNames", "tower_complexity",
           "tower_timm_args", "blocks_of", "blocks_ratio", "init_linears_"]
