"""What every patch-token model shares: timm's uniform API, written once.

A family's module (``VisionTransformer``, ``CaiT``, ``ConViT``) subclasses :class:`TokenModel`
and builds its parts with timm's names: ``patch_embed`` (grid, patch size, input checks),
``cls_token`` (a Parameter, or None), the position embedding (:mod:`.positions`), ``blocks``,
``norm``, the heads and ``pos_drop``. It then only says what differs: which tokens precede
the patches from the start (:meth:`prefix_tokens`), how layer ``i`` runs (:meth:`_layer`: a
ConViT's class token joins between two layers), how the last tokens are finished
(:meth:`_finish`: CaiT's class attention) and how tokens become logits (:meth:`forward_head`).
``forward``, ``forward_features``, ``forward_intermediates``, ``reset_classifier``,
``set_input_size``, ``no_weight_decay``, gradient checkpointing and the parameter groups of
layer-wise learning-rate decay (:class:`LayerGroups`, timm's ``group_matcher``) come from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from . import positions
from .config_base import MAX_CLASSES, TokenConfig
from .layers import IntPair, Linear, intermediates_plan, patch_tokens_as, to_2tuple
from .serialize import SaveMixin


def check_num_classes(num_classes: Any) -> None:
    """A class count a head can have, before anything changes (a refused reset left the head replaced)."""
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or not 0 <= num_classes <= MAX_CLASSES:
        raise ValueError(f"num_classes must be a whole number from 0 (features) to {MAX_CLASSES:,}, not "
                         f"{num_classes!r}")


@dataclass(frozen=True)
class LayerGroups:
    """Which layer each parameter is in for layer-wise learning-rate decay, by its name (timm's
    ``group_matcher``, as prefixes): a family declares its own (``TokenModel.layer_groups``)."""

    #: the embedding's parameters (layer 0), by the start of their names
    embed: Tuple[str, ...]
    #: the blocks' parameters, by the start of their names before the block's index (``blocks.3.``: layer 4)
    blocks: str = "blocks."

    def layer_of(self, name: str, depth: int) -> int:
        """0 the embedding, i + 1 block i, depth + 1 everything after the blocks (the final norm, the
        heads, an attention pool)."""
        if name.startswith(self.embed):
            return 0
        if name.startswith(self.blocks):
            return int(name[len(self.blocks):].split(".")[0]) + 1
        return depth + 1


class TokenModel(SaveMixin, nn.Module):
    """Patch tokens through a transformer: the shared half of every token family.

    ``model(x)`` -> logits (B, num_classes), or pooled features when ``num_classes == 0``.
    ``model(x, return_attention=True)`` -> ``(logits, [per-layer attention weights])``.
    """

    #: the family's config class (the default configuration when none is given)
    config_cls: type = TokenConfig
    #: parameters the papers' recipes exempt from weight decay (besides 1-D tensors)
    NO_WEIGHT_DECAY = ("cls_token", "dist_token", "reg_token") + positions.PARAMETER_NAMES  # timm's set
    #: layer-wise learning-rate decay's layers: the embedding -- patches, the class, distillation and
    #: register tokens, positions (the learned table and RoPE-Mixed's frequencies), the norm after the
    #: embedding -- then the blocks (a module that declares none is grouped by this rule too)
    layer_groups = LayerGroups(embed=("patch_embed.", "cls_token", "dist_token", "reg_token", "pos_embed", "rope.",
                                      "norm_pre."))

    def __init__(self, config: Optional[TokenConfig] = None, **overrides: Any):
        super().__init__()
        cfg = config if config is not None else self.config_cls()
        self.config = cfg.replace(**overrides) if overrides else cfg
        self.embed_dim = self.num_features = self.config.embed_dim
        self.num_classes = self.config.num_classes
        self.global_pool = self.config.global_pool
        self.dynamic_img_size = self.config.dynamic_img_size
        self.grad_checkpointing = False
        self.pos_drop: Optional[nn.Module] = None
        #: a norm of the first layer's tokens (CLIP's ``ln_pre``), when the family has one
        self.norm_pre: Optional[nn.Module] = None
        #: rotary position embeddings of the patch tokens (:mod:`.positions`), when the family has them
        self.rope: Optional[nn.Module] = None

    # ------------------------------------------------------------------ heads

    #: attributes holding classifier heads (DeiT adds ``head_dist``)
    def head_names(self) -> Tuple[str, ...]:
        return ("head",)

    def get_classifier(self) -> Union[nn.Module, Tuple[nn.Module, ...]]:
        """The classifier (timm's API): ``head``, or a distilled DeiT's two heads as timm gives them."""
        heads = tuple(getattr(self, name) for name in self.head_names())
        return heads[0] if len(heads) == 1 else heads

    def _new_head(self, num_classes: int) -> nn.Module:
        return Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    @torch.no_grad()
    def _zero_heads(self) -> None:
        """Zero-initialised classifiers (the official code's ``head_kernel_init``; the paper's fine-tuning)."""
        for name in self.head_names():
            head = getattr(self, name)
            if isinstance(head, nn.Linear):
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """Replace the heads by zero-initialised linear layers (0 classes: the model returns features)."""
        check_num_classes(num_classes)
        if global_pool is not None and global_pool != self.global_pool:
            pools = tuple(p for p in type(self.config).POOLS if p != "map")  # an attention pool is built, not chosen
            if global_pool not in pools:
                raise ValueError(f"global_pool must be one of {pools}, got {global_pool!r}")
            if global_pool == "token" and self.cls_token is None:
                raise ValueError("global_pool='token' needs a class token")
            self.global_pool = global_pool
        self.num_classes = num_classes
        device = next(self.patch_embed.parameters()).device
        for name in self.head_names():
            setattr(self, name, self._new_head(num_classes).to(device))
        self._zero_heads()
        # replace() drops label names that no longer fit the class count
        self.config = self.config.replace(num_classes=num_classes, global_pool=self.global_pool)

    # ------------------------------------------------------------------ public API

    @property
    def patch_size(self) -> IntPair:
        """Pixels per token side (for a hybrid: the CNN's stride x the projection patch)."""
        return self.patch_embed.patch_size

    def no_weight_decay(self) -> set:
        """Parameters the papers' recipes exempt from weight decay."""
        return {n for n, _ in self.named_parameters()
                if n in self.NO_WEIGHT_DECAY or n.endswith(positions.RELATIVE_LEAF)}

    def group_matcher(self, coarse: bool = False) -> Callable[[str], int]:
        """:attr:`layer_groups` in timm's form, so that timm's optimizer factory (``layer_decay=``) groups the
        parameters as vitkit's does: the embedding, then a group per block, the rest last (``coarse``: the same,
        a block is one group either way). Without it timm gave 54 of 56 tensors the scale 1. A callable (as timm's
        CaiT gives it), so that a family's own ``layer_of`` (CaiT's class-attention blocks) is its grouping too."""
        groups, depth = self.layer_groups, len(getattr(self, "blocks", ()))
        return lambda name: groups.layer_of(name, depth)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        if not isinstance(enable, bool):  # set_grad_checkpointing('no') switched it on
            raise ValueError(f"set_grad_checkpointing: enable must be True or False, not {enable!r}")
        self.grad_checkpointing = enable

    @torch.no_grad()
    def set_input_size(self, img_size: Union[int, Sequence[int]]) -> None:
        """Change the native input size; position embeddings are resampled in place. A size the config refuses
        changes nothing (a negative one set the grid to -1x-1 before torch refused it, and every later call failed)."""
        # a table held at another size (pos_embed_size) is resampled to the new one, as timm's set_input_size does
        sizes = {"img_size": to_2tuple(img_size), "pos_embed_size": None}
        self.config.replace(**sizes)  # checked first: patch size divides it, positive, bounded
        old_grid = self.patch_embed.grid_size
        self.patch_embed.set_img_size(sizes["img_size"])
        positions.resample_(self, old_grid, self.patch_embed.grid_size)
        self.config = self.config.replace(**sizes)

    def patch_pos_embed(self, grid: IntPair) -> Optional[torch.Tensor]:
        """The (1, gh*gw, D) position embedding of the patch tokens of a grid (None without one)."""
        return positions.patch_table(self, grid)

    # ------------------------------------------------------------------ forward pieces

    def prefix_tokens(self, batch: int) -> List[torch.Tensor]:
        """Tokens that precede the patches from the first layer on (none unless the family has them)."""
        return []

    def patch_tokens(self, x: torch.Tensor) -> Tuple[torch.Tensor, IntPair]:
        """Images -> patch embeddings (B, gh*gw, D) without positions, and the grid (where the
        pre-training objectives of :mod:`vitkit.selfsup` mask or corrupt them)."""
        x = self.patch_embed(x, strict=not self.dynamic_img_size)
        B, gh, gw, D = x.shape
        return x.reshape(B, gh * gw, D), (gh, gw)

    def embed_tokens(self, x: torch.Tensor, grid: IntPair, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Patch embeddings (B, gh*gw, D) -> the first layer's tokens: prefix + patches, with positions. ``keep``
        (B, K): only those patches, in that order (MAE encodes the visible ones; positions are added first)."""
        prefix = self.prefix_tokens(x.shape[0])
        if keep is None:
            x = positions.add(self, x, grid, prefix)
        else:
            x = positions.add_to_patches(self, x, grid)
            x = positions.join_prefix(self, torch.gather(x, 1, keep[..., None].expand(-1, -1, x.shape[-1])), prefix)
        if self.pos_drop is not None:
            x = self.pos_drop(x)
        return x if self.norm_pre is None else self.norm_pre(x)

    def embed(self, x: torch.Tensor) -> Tuple[torch.Tensor, IntPair]:
        """Images -> the first layer's tokens (prefix + patches, with positions), and the patch grid."""
        x, grid = self.patch_tokens(x)
        return self.embed_tokens(x, grid), grid

    def _checkpointed(self, blk: nn.Module, *args):
        if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
            return checkpoint(blk, *args, use_reentrant=False)
        return blk(*args)

    def _layer(self, i: int, blk: nn.Module, x: torch.Tensor, grid: IntPair, return_attention: bool,
               keep: Optional[torch.Tensor] = None):
        """Layer ``i`` (``blk``) on the tokens -> (tokens, attention weights or None); ``keep``: the patches the
        tokens hold (:meth:`embed_tokens`), whose rotations are picked per image."""
        bias = positions.attention_bias(self, blk, grid)  # relative positions: the layer's own bias
        rope = positions.rotary(self, i, grid)  # rotary positions: the patches' rotations in this layer
        if rope is not None and keep is not None:
            rope = positions.kept_rotations(rope, keep)
        if bias is not None and keep is not None:  # (a bias over the whole grid: MAE refuses such encoders)
            raise ValueError("a relative position bias covers the whole grid, not a subset of its patches")
        if rope is not None:
            return self._checkpointed(blk, x, return_attention, bias, rope)
        if bias is None:
            return self._checkpointed(blk, x, return_attention)
        return self._checkpointed(blk, x, return_attention, bias)

    def _finish(self, x: torch.Tensor, attns: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
        """The last layer's tokens -> the final normalised tokens (further maps appended to ``attns``)."""
        return self.norm(x)

    def finish_on(self, x: torch.Tensor, grid: IntPair, attns: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
        """The last layer's tokens of ``grid`` -> the final ones (:meth:`_finish`; a family whose finish reads the
        grid overrides this: SAM's neck, Gemma 4's soft tokens)."""
        return self._finish(x, attns)

    def encode(self, x: torch.Tensor, return_attention: bool = False):
        """Images -> final normalised tokens (B, N, D) and, when asked, per-layer attention."""
        x, grid = self.embed(x)
        return self.encode_tokens(x, grid, return_attention)

    def encode_tokens(self, x: torch.Tensor, grid: IntPair, return_attention: bool = False,
                      keep: Optional[torch.Tensor] = None):
        """The first layer's tokens (B, L, D) -> final normalised tokens and, when asked, per-layer
        attention (L may be fewer than the grid's patches: MAE encodes the visible ones only, ``keep``)."""
        attns: List[torch.Tensor] = []
        for i, blk in enumerate(self.blocks):
            # (keep only where given: a family's own _layer, as the docs' toy one, takes the five arguments)
            x, attn = self._layer(i, blk, x, grid, return_attention, *(() if keep is None else (keep,)))
            if return_attention:
                attns.append(attn)
        return self.finish_on(x, grid, attns if return_attention else None), attns

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.encode(x)[0]

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """Final tokens -> the pooled representation: the class token, or the mean of the patches."""
        if self.global_pool == "avg":
            return x[:, self.num_prefix_tokens:].mean(dim=1)
        return x[:, 0]

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens -> logits; ``pre_logits=True`` stops at the pooled representation."""
        x = self.pool(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        tokens, attns = self.encode(x, return_attention)
        logits = self.forward_head(tokens)
        return (logits, attns) if return_attention else logits

    def forward_intermediates(self, x: torch.Tensor, indices: Optional[Union[int, Sequence[int]]] = None,
                              norm: bool = False, output_fmt: str = "NCHW", return_prefix_tokens: bool = False,
                              intermediates_only: bool = False, stop_early: bool = False):
        """Features of chosen layers (timm's contract).

        ``indices``: an int n takes the last n layers of ``blocks``, a sequence takes those
        (negative from the end), None takes all. Returns ``(final_tokens, intermediates)``, or
        only the intermediates; each is the patch tokens as (B, D, gh, gw) for NCHW or
        (B, gh*gw, D) for NLC, paired with the layer's prefix tokens when
        ``return_prefix_tokens``. With ``stop_early`` the final tokens are those of the last
        chosen layer, finished as after the last one.
        """
        take, last = intermediates_plan(len(self.blocks), indices, output_fmt, stop_early, intermediates_only)
        x, grid = self.embed(x)
        patches = grid[0] * grid[1]
        outs = []
        for i, blk in enumerate(self.blocks[: last + 1]):
            x, _ = self._layer(i, blk, x, grid, False)
            if i in take:
                y = self.norm(x) if norm else x
                prefix, spatial = y[:, : y.shape[1] - patches], y[:, y.shape[1] - patches:]
                spatial = patch_tokens_as(spatial, grid, output_fmt)
                # timm pairs nothing on a model without prefix tokens: the maps alone
                outs.append((spatial, prefix) if return_prefix_tokens and prefix.shape[1] else spatial)
        if intermediates_only:
            return outs
        return self.finish_on(x, grid), outs

    def extra_repr(self) -> str:
        c = self.config
        return (f"img_size={c.img_size}, patch_size={c.patch_size}, grid={self.patch_embed.grid_size}, "
                f"pos_embed={self.pos_embed_kind}, global_pool={self.global_pool}")


__all__ = ["LayerGroups", "TokenModel"]
