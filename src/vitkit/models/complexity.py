"""Analytic cost of a model: parameters, multiply-accumulates, tokens, attention memory.

Each family counts its own matrix products (patch projection, qkv, q k^T, attention x v,
output projection, MLP, pre-logits, head) and, for hybrids and the ResNetV2 classifier,
every convolution of the CNN (at its SAME-padded output size); LayerNorm, GroupNorm, GELU,
ReLU, softmax, pooling and additions are left out, as fvcore and timm's tables do. FLOPs =
2 x MACs (the convention of ``torch.utils.flop_counter``); many papers quote MACs and call
them FLOPs (ViT-B/16 at 224 px: 17.6 G MACs = 35.1 GFLOPs). :func:`complexity` asks the
config's family (``Family.complexity``); :func:`token_complexity` is the record every
token family fills.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
from torch.nn import init

from .registry import build_from_config, family_of


@dataclass
class Complexity:
    params: int
    macs: int
    img_size: tuple
    patch_size: tuple
    grid: tuple
    tokens: int
    heads: int
    depth: int
    attn_entries_per_layer: int
    attn_bytes_per_layer_fp32: int
    attn_macs_share: float
    pixel_tokens: int
    pixel_attn_entries: int
    #: MACs of the CNN of a hybrid (or of a ResNet classifier's convolutions), included in macs
    backbone_macs: int = 0

    @property
    def flops(self) -> int:
        return 2 * self.macs

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["flops"] = self.flops
        return d


#: One count at a time patches torch.nn.init; re-entrant, so a count inside a build cannot deadlock.
_COUNTING = threading.RLock()


def count_params(config: Any) -> int:
    """Exact parameter count, by building the model on the meta device (no memory) with
    ``torch.nn.init`` idle (its calls on meta tensors are half the build: ``vitkit models``
    counts 250 models)."""
    with _COUNTING, _idle_init(), torch.device("meta"):
        model = build_from_config(config)
    return sum(p.numel() for p in model.parameters())


@contextlib.contextmanager
def _idle_init() -> Iterator[None]:
    """``torch.nn.init``'s in-place initialisers return their tensor untouched in this thread, which
    builds on the meta device (as Hugging Face's ``no_init_weights`` does while it builds a model
    whose weights are loaded next); a model another thread builds meanwhile is initialised as ever.
    (The thread is asked, not the tensor: under the meta device every tensor attribute read goes
    through torch's function modes, and asking each tensor cost a third of the time saved.)"""
    names = [n for n in dir(init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(init, n) for n in names}
    counting = threading.get_ident()
    for n, f in saved.items():
        setattr(init, n, _idle_in(counting, f))
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(init, n, f)


def _idle_in(thread: int, initialise: Any) -> Any:
    def idle_in_the_counting_thread(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == thread:
            return tensor
        return initialise(tensor, *args, **kwargs)
    return idle_in_the_counting_thread


def complexity(config: Any) -> Complexity:
    """Cost of one image, as the config's family counts it."""
    return family_of(config).complexity(config)


def token_complexity(config: Any, macs: int, mix: int, tokens: int, patch_size: Optional[Tuple[int, int]] = None,
                     backbone_macs: int = 0) -> Complexity:
    """The record of a token model from its MACs, attention-mixing MACs (q k^T and attention x v
    of every layer) and the token count of its attention; ``patch_size``: the pixels per token
    when they differ from the config's (hybrids)."""
    (h, w), H, pixels = config.img_size, config.num_heads, config.img_size[0] * config.img_size[1]
    return Complexity(
        params=count_params(config), macs=macs, img_size=(h, w), patch_size=tuple(patch_size or config.patch_size),
        grid=tuple(config.grid_size), tokens=tokens, heads=H, depth=config.depth,
        attn_entries_per_layer=H * tokens * tokens, attn_bytes_per_layer_fp32=4 * H * tokens * tokens,
        attn_macs_share=mix / macs, pixel_tokens=pixels, pixel_attn_entries=pixels * pixels,
        backbone_macs=backbone_macs)


def params_floor(config: Any) -> Optional[int]:
    """A lower bound of a token model's parameters from its config alone, without building it
    (a typo such as depth 1,000,000 would fill the memory while being built): each block's qkv,
    projection and MLP matrices. None for a family without tokens."""
    if not hasattr(config, "embed_dim"):
        return None
    width = config.embed_dim
    mlp = getattr(config, "mlp_dim", None) or 4 * width
    return config.depth * (4 * width * width + 2 * width * mlp) + head_params(config)


def head_params(config: Any) -> int:
    """The classifier's weights: one row of the (pre-logits) width per class."""
    width = getattr(config, "representation_size", None) or config.embed_dim
    return int(config.num_classes or 0) * (int(width) if isinstance(width, int) else config.embed_dim)


def memory_floor(config: Any, batch: int, training: bool = True, cost: Optional[Complexity] = None
                 ) -> Optional[int]:
    """A lower bound of the bytes a pass of ``batch`` images takes: the fp32 weights (with their
    gradients and Adam's two moments when ``training``) and, per image, the activations no
    kernel avoids in the cheapest precision (bf16): four (tokens x width) tensors a block (its
    input, attention output, MLP output and the residual), kept for every block when training,
    one block at a time otherwise. Attention's tokens x tokens weights are left out (fused
    kernels never hold them), so the true need is higher: a size refused by this bound cannot
    run. None for a family without tokens (the ResNetV2 classifier). ``cost``: the config's
    :func:`complexity`, when the caller has it already."""
    if not hasattr(config, "embed_dim"):
        return None
    c = cost or complexity(config)
    per_block = 4 * c.tokens * config.embed_dim * 2  # bf16
    per_image = per_block * (c.depth if training else 1)
    return c.params * 4 * (4 if training else 1) + batch * per_image


__all__ = ["Complexity", "count_params", "complexity", "token_complexity", "params_floor", "memory_floor"]
