"""What the pre-training objectives share: the encoder and its checks, pixels as patches, the
output, and the native save.

A pre-training model wraps a plain :class:`~vitkit.models.VisionTransformer`, or an EVA-style one (rotary
positions, SwiGLU, LayerScale: EVA-02, timm's rope ViTs, BEiT's layout), as ``.encoder``
(headless: ``num_classes=0``, no pre-logits layer), so whatever it learns is a ViT that
fine-tuning (``vitkit train --init``), few-shot evaluation and inspection take as it is. The
objective's own parts (mask token, decoder, prediction head) sit beside it. Every objective
takes images in the encoder's normalisation and returns a :class:`PretrainOutput`.

Patches are laid out as in MAE and Hugging Face (``patchify``): patch ``n`` of the row-major
grid holds its pixels as (ph, pw, C), channel last -- the order of MAE's targets and
predictions; SimMIM's pixel shuffle is the same map (its channels are (C, ph, pw) per
position, which :func:`unpatchify_channels_first` undoes).

Where an objective cannot apply the model is refused by name, with the reason:

- a hybrid (a CNN before the patch embedding): the CNN sees the whole image before any
  patch is masked, so masked pixels reach visible tokens through its receptive fields;
- DeiT's distillation token: it is trained against a teacher's labels, which pre-training
  has not (fine-tuning can add it);
- CaiT, ConViT and the ResNetV2 classifier: other families (class attention, gated
  positional attention over the full grid, no tokens at all); pre-train a plain or an EVA-style ViT.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Union

import torch
from torch import nn

from ..files import PathLike
from ..models import VisionTransformer, ViTConfig, get_model_config
from ..models.config_base import ConfigMixin
from ..models.eva import EvaConfig
from ..models.layers import IntPair
from ..models.registry import build_from_config
from ..models.serialize import save_pretrained

#: The key of a native ``config.json`` that marks a pre-training model (its objective's options).
CONFIG_KEY = "pretraining"


@dataclass
class PretrainOutput:
    """What every objective returns.

    ``loss``: scalar. ``pred``: per-patch predictions (B, N, K) -- pixels (ph*pw*C) for SimMIM
    and MAE, colour logits for masked patch prediction. ``mask``: (B, N) float, 1 where a patch
    was masked (corrupted, for MPP). ``target``: what ``pred`` was scored against (pixels, or
    colour classes (B, N)). Objectives add their own: MAE ``ids_restore``, SimMIM
    ``reconstruction`` (B, C, H, W), MPP ``kinds`` (which corruption each patch got).
    """

    loss: torch.Tensor
    pred: torch.Tensor
    mask: torch.Tensor
    target: torch.Tensor
    ids_restore: Optional[torch.Tensor] = None
    reconstruction: Optional[torch.Tensor] = None
    kinds: Optional[torch.Tensor] = None
    #: correct predictions among the scored patches (MPP's colour accuracy), else None
    correct: Optional[torch.Tensor] = None


@dataclass
class PretrainConfig(ConfigMixin):
    """The options of an objective (each objective subclasses it); the encoder has its own config."""

    KIND: ClassVar[str] = "pre-training"
    #: the objective's name (what ``config.json`` stores under ``"pretraining"``)
    objective: str = ""
    #: share of the patches masked (corrupted); each objective has the paper's default
    mask_ratio: float = 0.5

    def __post_init__(self) -> None:
        own = type(self).__dataclass_fields__["objective"].default
        problems = [] if self.objective == own else [f"objective must be {own!r}, got {self.objective!r}"]
        if not isinstance(self.mask_ratio, (int, float)) or isinstance(self.mask_ratio, bool) \
                or not 0.0 < self.mask_ratio < 1.0:
            problems.append(f"mask_ratio must be in (0, 1), got {self.mask_ratio!r}")
        problems += self.problems()
        if problems:
            raise ValueError(f"invalid {own} config: " + "; ".join(problems))

    def problems(self) -> List[str]:
        """The checks of the objective's own fields."""
        return []

    def to_dict(self) -> Dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def encoder_config(config: ViTConfig, objective: str) -> ViTConfig:
    """The ViT config an objective pre-trains: headless (no classes, no pre-logits layer), or a
    ValueError naming why the architecture cannot be pre-trained this way."""
    if type(config) not in (ViTConfig, EvaConfig):  # (other families subclass ViTConfig too)
        arch = getattr(config, "architecture", type(config).__name__)
        why = {"cait": "CaiT's class-attention stage reads only the class token",
               "convit": "ConViT's gated positional attention works over the full patch grid",
               "resnetv2": "a ResNetV2 is a CNN without patch tokens",
               "coca": "the pre-training encoder is built as a plain ViT, without CoCa's attention-pool "
                       "heads",
               "sam": "SAM's windows and offset tables span the whole grid (MAE encodes the visible patches alone), "
                      "and its neck is no token decoder's input",
               "gemma4": "Gemma 4's sandwich blocks, clamps and soft tokens are not built into the objectives",
               **{tower: f"the objectives are not built for {kind}'s family (its weights in timm's names are "
                         f"an encoder and a head, as a pre-training model's are: not yet told apart)"
                  for tower, kind in (("deepseek", "DeepSeek"), ("qwen3", "Qwen3"))}}.get(arch, "it is no ViT")
        raise ValueError(f"{objective} pre-trains a plain ViT or an EVA-style one, not {arch!r}: {why}; pre-train "
                         f"a ViT (e.g. --model vit_fmnist) and fine-tune it")
    if config.backbone is not None:
        raise ValueError(f"{objective} cannot pre-train a hybrid ({config.name or 'a CNN before the patches'}): its "
                         f"CNN sees the whole image before patches are masked, so masked pixels leak into visible "
                         f"tokens through its receptive fields; use a plain ViT (e.g. --model vit_fmnist)")
    if objective == "mae" and config.pos_embed in ("relative", "relative_mlp"):
        raise ValueError("mae encodes the visible patches alone, a different set in every image, which a relative "
                         "position bias over the whole grid cannot follow; pre-train it with simmim or mpp, or give "
                         "the encoder absolute positions (--model-args '{\"pos_embed\": \"sincos2d\"}')")
    if config.distill_token:
        raise ValueError(f"{objective} pre-trains without DeiT's distillation token (it learns from a teacher's "
                         f"labels); build the encoder with distill_token=False")
    return config.replace(num_classes=0, representation_size=None, label_names=None)


class Pretrainer(nn.Module):
    """An encoder (``.encoder``, a headless VisionTransformer) and an objective's parts.

    ``model(images, **draws)`` -> :class:`PretrainOutput`; ``model.draw(B, generator)`` gives
    the random inputs of one batch (masks, noise), which ``forward`` draws itself when not given.
    """

    #: the objective's name and options class
    objective: ClassVar[str] = ""
    config_cls: ClassVar[type] = PretrainConfig

    def __init__(self, encoder: Union[None, str, ViTConfig, VisionTransformer] = None,
                 config: Optional[PretrainConfig] = None, **options: Any):
        """``encoder``: a model name or size string ("vit_fmnist", "S/16"), a ViTConfig, or a
        headless VisionTransformer to pre-train in place; ``options``: the objective's fields."""
        super().__init__()
        if isinstance(encoder, str):
            encoder = get_model_config(encoder)
        if isinstance(encoder, nn.Module) and not isinstance(encoder, VisionTransformer):  # (another family's model)
            encoder = getattr(encoder, "config", encoder)
        if isinstance(encoder, VisionTransformer):
            enc_cfg = encoder_config(encoder.config, self.objective)
            if enc_cfg.num_classes != encoder.config.num_classes or encoder.config.representation_size:
                raise ValueError(f"{self.objective}: give the encoder without a head (num_classes=0, "
                                 f"representation_size=None) or give its config")
            self.encoder = encoder
        else:
            self.encoder = build_from_config(encoder_config(encoder if encoder is not None else ViTConfig(),
                                                            self.objective))
        base = config if config is not None else self.config_cls()
        self.config = base.replace(**options) if options else base
        self.grid: IntPair = tuple(self.encoder.patch_embed.grid_size)
        self.patch_size: IntPair = tuple(self.encoder.config.patch_size)
        self.num_patches = self.grid[0] * self.grid[1]
        if self.num_patches < 2:  # (MPP masked none of one: a loss of exactly 0, nothing learnt, exit 0)
            raise ValueError(f"invalid {self.objective} config: its {self.grid[0]}x{self.grid[1]} grid of patches "
                             f"leaves none to mask beside one to see; use smaller patches (patch_size)")

    # ------------------------------------------------------------------ pixels and patches

    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, N, ph*pw*C), MAE's and Hugging Face's layout."""
        B, C, H, W = images.shape
        (ph, pw), (gh, gw) = self.patch_size, (H // self.patch_size[0], W // self.patch_size[1])
        x = images.reshape(B, C, gh, ph, gw, pw).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(B, gh * gw, ph * pw * C)

    def unpatchify(self, patches: torch.Tensor, grid: Optional[IntPair] = None) -> torch.Tensor:
        """(B, N, ph*pw*C) -> (B, C, H, W), the inverse of :meth:`patchify`."""
        (gh, gw), (ph, pw) = grid or self.grid, self.patch_size
        B = patches.shape[0]
        C = patches.shape[-1] // (ph * pw)
        x = patches.reshape(B, gh, gw, ph, pw, C).permute(0, 5, 1, 3, 2, 4)
        return x.reshape(B, C, gh * ph, gw * pw)

    def pixels(self, images: torch.Tensor) -> torch.Tensor:
        """Normalised model input -> pixel values in [0, 1] (the encoder's mean and std undone)."""
        cfg = self.encoder.config
        mean = images.new_tensor(cfg.mean).view(1, -1, 1, 1)
        std = images.new_tensor(cfg.std).view(1, -1, 1, 1)
        return images * std + mean

    def check_images(self, images: torch.Tensor) -> None:
        """Clear errors for a wrong layout or size: the native one only (the objectives' masks
        and decoders are built for its grid)."""
        self.encoder.patch_embed.check_images(images, strict=True)

    def check_draw(self, name: str, value: torch.Tensor, batch: int, dtype: Optional[torch.dtype] = None) -> None:
        """A given mask/noise must be (B, N) for this batch and grid."""
        if tuple(value.shape) != (batch, self.num_patches):
            raise ValueError(f"{name} must have shape (batch, patches) = ({batch}, {self.num_patches}) for the "
                             f"{self.grid[0]}x{self.grid[1]} grid, got {tuple(value.shape)}")
        if dtype is not None and value.dtype != dtype:
            raise ValueError(f"{name} must be a {str(dtype).replace('torch.', '')} tensor, got {value.dtype}")
        if dtype is None and not (value.is_floating_point() and torch.isfinite(value).all()):  # MAE's noise sorts
            raise ValueError(f"{name} must be finite floating-point values (they are sorted), got {value.dtype}"
                             f"{'' if not value.is_floating_point() else ' with NaN or inf'}")
        if name == "mask" and not value.any(dim=1).all():  # (a loss of exactly 0: nothing to predict)
            raise ValueError(f"mask must mask at least one patch of each image; image "
                             f"{int((~value.any(dim=1)).nonzero()[0])} has none")

    # ------------------------------------------------------------------ the objective's API

    def draw(self, batch: int, generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
        """The random inputs of a batch of ``batch`` images (CPU tensors, first dimension B)."""
        raise NotImplementedError

    def draw_problems(self) -> List[str]:
        """Why :meth:`draw` cannot honour the configuration (checked before a run starts)."""
        return []

    def _draws(self, images: torch.Tensor, given: Dict[str, Optional[torch.Tensor]]) -> Dict[str, torch.Tensor]:
        """``given`` draws, the missing ones drawn now (global random state), on the images' device."""
        if any(v is None for v in given.values()):
            drawn = self.draw(images.shape[0])
            given = {k: drawn[k] if v is None else v for k, v in given.items()}
        return {k: v.to(images.device) for k, v in given.items()}

    def pixel_prediction(self, images: torch.Tensor, out: PretrainOutput) -> torch.Tensor:
        """What the model predicts for each patch, as pixels in [0, 1] (B, C, H, W)."""
        raise NotImplementedError

    @torch.no_grad()
    def visualise(self, images: torch.Tensor, generator: Optional[torch.Generator] = None
                  ) -> Dict[str, torch.Tensor]:
        """Images (the model's input) -> pixels in [0, 1] for a figure: ``image``; ``masked``,
        the input with its masked patches grey; ``prediction``, the visible patches as they
        are and the masked ones as predicted; and the patch ``mask`` (B, N)."""
        was_training = self.training
        self.eval()
        draws = {k: v.to(images.device) for k, v in self.draw(images.shape[0], generator).items()}
        out = self(images, **draws)
        self.train(was_training)
        image = self.pixels(images.float()).clamp(0, 1)
        P = self.patch_size[0] * self.patch_size[1] * images.shape[1]
        where = self.unpatchify(out.mask.float()[..., None].expand(-1, -1, P)) > 0.5
        pred = self.pixel_prediction(images, out).float().clamp(0, 1)
        return {"image": image, "masked": torch.where(where, torch.full_like(image, 0.5), image),
                "prediction": torch.where(where, pred, image), "mask": out.mask}

    def no_weight_decay(self) -> set:
        """The encoder's exemptions (tokens, positions) and the objective's tokens."""
        own = {n for n, _ in self.named_parameters() if n.endswith(("mask_token", "pos_embed"))}
        return {f"encoder.{n}" for n in self.encoder.no_weight_decay()} | own

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.encoder.set_grad_checkpointing(enable)

    # ------------------------------------------------------------------ saving

    def save_pretrained(self, directory: PathLike) -> Path:
        """config.json (the encoder's config, and the objective under ``"pretraining"``) and
        model.safetensors of the whole model: :func:`vitkit.from_pretrained` rebuilds it."""
        return save_pretrained(self, directory, config=self.encoder.config, **{CONFIG_KEY: self.config.to_dict()})

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.config.to_dict().items() if k != "objective")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of per-patch ``values`` (B, N) over the patches where ``mask`` (B, N) is 1."""
    return (values * mask).sum() / mask.sum().clamp_min(1)


def count_for(ratio: float, n: int) -> int:
    """How many of ``n`` patches a ratio masks: round(ratio x n), at least 1 and at most n - 1."""
    return min(max(int(round(ratio * n)), 1), n - 1)


__all__ = ["PretrainOutput", "PretrainConfig", "Pretrainer", "encoder_config", "masked_mean", "count_for",
           "CONFIG_KEY"]
