"""Building blocks shared by every ViT-family model.

Parameter names follow timm (``patch_embed.proj``, ``blocks.N.attn.qkv`` ...) so that a
vitkit state dict *is* a timm state dict wherever the architectures coincide. The forward
paths skip identity modules instead of calling them: at batch 1 on a CPU the Python
overhead of a dozen ``nn.Identity`` calls per block is measurable.
"""

from __future__ import annotations

import contextlib
import math
import operator
import warnings
from typing import Iterator, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

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


# ----------------------------------------------------------------------------- init


def lecun_normal_(tensor: torch.Tensor) -> torch.Tensor:
    """Flax's default kernel init: truncated normal (2 std) with variance 1/fan_in.

    The constant corrects the standard deviation of a normal truncated at two sigma, as
    ``jax.nn.initializers.variance_scaling(1.0, 'fan_in', 'truncated_normal')`` does.
    """
    fan_in = tensor[0].numel() if tensor.dim() > 1 else tensor.numel()
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978
    with torch.no_grad():
        return nn.init.trunc_normal_(tensor, mean=0.0, std=std, a=-2 * std, b=2 * std)


def xavier_uniform_fan(tensor: torch.Tensor, fan_in: int, fan_out: int) -> torch.Tensor:
    """Glorot uniform with explicit fans (a fused qkv matrix is three D x D kernels)."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        return tensor.uniform_(-bound, bound)


# ----------------------------------------------------------------------------- patches


class PatchGrid:
    """What a patch embedding answers about its token grid (:class:`PatchEmbed`, the hybrid's
    ``HybridEmbed``); each defines ``grid_for(img_size)``, the grid of an input size."""

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    def set_img_size(self, img_size: Union[int, IntPair]) -> None:
        self.img_size = to_2tuple(img_size)
        self.grid_size = self.grid_for(self.img_size)

    def check_images(self, x: torch.Tensor, strict: bool = True) -> None:
        """Clear errors for a wrong layout, channel count or size (any size, when not ``strict``,
        that the grid can tile)."""
        if x.dim() != 4 or x.shape[1] != self.in_chans:
            raise ValueError(
                f"expected images of shape (B, {self.in_chans}, H, W), got {tuple(x.shape)}")
        size = (x.shape[-2], x.shape[-1])
        if strict and size != self.img_size:
            raise ValueError(
                f"input size {size[0]}x{size[1]} does not match the model's "
                f"{self.img_size[0]}x{self.img_size[1]}; build the model with "
                f"dynamic_img_size=True or call model.set_input_size({size})")
        if not strict:
            self.grid_for(size)  # clear error when not divisible


class PatchEmbed(PatchGrid, nn.Module):
    """Image (B, C, H, W) -> patch tokens (B, gh, gw, D) by a stride-P convolution.

    A convolution with kernel = stride = P is exactly "flatten each P x P patch and apply
    one shared linear map", the paper's Eq. 1, done in one kernel.
    """

    def __init__(self, img_size: IntPair, patch_size: IntPair, in_chans: int, embed_dim: int,
                 bias: bool = True):
        super().__init__()
        self.patch_size = to_2tuple(patch_size)
        self.in_chans = in_chans
        self.embed_dim = embed_dim
        self.set_img_size(img_size)
        self.proj = nn.Conv2d(in_chans, embed_dim, self.patch_size, stride=self.patch_size,
                              bias=bias)

    def grid_for(self, img_size: IntPair) -> IntPair:
        h, w = img_size
        ph, pw = self.patch_size
        if h % ph or w % pw:
            raise ValueError(
                f"image size {h}x{w} is not divisible by the patch size {ph}x{pw}; "
                f"resize or crop the input to a multiple of the patch size")
        return (h // ph, w // pw)

    def forward(self, x: torch.Tensor, strict: bool = True) -> torch.Tensor:
        self.check_images(x, strict)
        x = self.proj(x)
        return x.permute(0, 2, 3, 1)  # (B, gh, gw, D)


# ----------------------------------------------------------------------------- positions


INTERPOLATIONS = ("bicubic", "bilinear", "nearest")


def resample_pos_embed_grid(grid: torch.Tensor, new_size: IntPair, interpolation: str = "bicubic",
                            antialias: bool = True) -> torch.Tensor:
    """Resample a (1, gh, gw, D) grid of embeddings to (1, H', W', D).

    ``bicubic`` with ``antialias=True`` is timm's default (DeiT, timm checkpoints);
    the official JAX code resizes bilinearly; Hugging Face uses bicubic without antialias.
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {interpolation!r}; expected one of {INTERPOLATIONS}")
    if tuple(grid.shape[1:3]) == tuple(new_size):
        return grid
    mode = interpolation
    antialias = antialias and mode != "nearest"
    dtype = grid.dtype
    x = grid.float().permute(0, 3, 1, 2)
    x = F.interpolate(x, size=tuple(new_size), mode=mode, antialias=antialias,
                      align_corners=None if mode == "nearest" else False)
    return x.permute(0, 2, 3, 1).to(dtype)


def resample_pos_embed(pos_embed: torch.Tensor, new_size: IntPair,
                       old_size: Optional[IntPair] = None, num_prefix_tokens: int = 1,
                       interpolation: str = "bicubic", antialias: bool = True) -> torch.Tensor:
    """Resample a flat (1, prefix + gh*gw, D) table to a new grid, prefix slots kept apart.

    ``old_size`` defaults to a square grid; a table whose patch count is not a square
    needs it spelled out.
    """
    n_patch = pos_embed.shape[1] - num_prefix_tokens
    if old_size is None:
        side = int(round(math.sqrt(n_patch)))
        if side * side != n_patch:
            raise ValueError(
                f"cannot infer the grid of a position embedding with {n_patch} patch slots; "
                f"pass its grid size")
        old_size = (side, side)
    if old_size[0] * old_size[1] != n_patch:
        raise ValueError(f"position embedding has {n_patch} patch slots, "
                         f"not {old_size[0]}x{old_size[1]}")
    if tuple(old_size) == tuple(new_size):
        return pos_embed
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    grid = patches.reshape(1, old_size[0], old_size[1], -1)
    grid = resample_pos_embed_grid(grid, new_size, interpolation, antialias)
    return torch.cat([prefix, grid.reshape(1, -1, grid.shape[-1])], dim=1)


def resample_patch_embed(weight: torch.Tensor, new_size: IntPair, interpolation: str = "bicubic",
                         antialias: bool = True) -> torch.Tensor:
    """Patch filters (O, C, h, w) for patches of another size (O, C, h', w'), FlexiViT's way.

    Resizing a patch is a linear map ``x' = R x``; the new filter ``w'`` is the least-squares
    solution of ``<x, w> = <R x, w'>`` for every patch ``x``: ``w' = pinv(R)^T w``. A token of an
    image resized with ``interpolation`` (timm's default: bicubic, antialiased) keeps its value
    where the resize loses nothing (upsampling), and loses least where it must (Beyer et al.
    2023). ``R``'s columns are the resized one-pixel patches; computed in float32 as timm does.
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {interpolation!r}; expected one of {INTERPOLATIONS}")
    old, new = tuple(weight.shape[-2:]), tuple(to_2tuple(new_size))
    if old == new:
        return weight
    antialias = antialias and interpolation != "nearest"
    basis = torch.eye(old[0] * old[1], dtype=torch.float32, device=weight.device).reshape(-1, 1, *old)
    resized = F.interpolate(basis, size=new, mode=interpolation, antialias=antialias,
                            align_corners=None if interpolation == "nearest" else False)
    resize = resized.reshape(old[0] * old[1], new[0] * new[1]).T  # (h'w', hw): R
    flat = weight.float().reshape(-1, old[0] * old[1])
    return (flat @ torch.linalg.pinv(resize)).reshape(*weight.shape[:2], *new).to(weight.dtype)


def adapt_input_channels(weight: torch.Tensor, in_chans: int) -> torch.Tensor:
    """First-layer filters (O, C, kh, kw) for ``in_chans`` input channels, as timm's
    ``adapt_input_conv`` does: one channel sums the C filters (a grey image gives the response
    its colour version had); more or fewer channels repeat the C filters cyclically, cut to
    ``in_chans`` and scale by C / in_chans (a multiple of C: an image whose channels repeat its
    C channels keeps its response; otherwise a start, not the same function)."""
    have = weight.shape[1]
    if in_chans < 1:
        raise ValueError(f"in_chans must be at least 1, got {in_chans}")
    if in_chans == have:
        return weight
    dtype, w = weight.dtype, weight.float()
    if in_chans == 1:
        w = w.sum(dim=1, keepdim=True)
    else:
        w = w.repeat(1, math.ceil(in_chans / have), 1, 1)[:, :in_chans] * (have / in_chans)
    return w.to(dtype)


SINCOS_SPACINGS = ("big_vision", "mae")


def sincos_2d_pos_embed(grid_size: IntPair, dim: int, temperature: float = 10000.0,
                        spacing: str = "big_vision") -> torch.Tensor:
    """Fixed 2D sine-cosine embedding, laid out as big_vision's ``posemb_sincos_2d``.

    Returns (1, gh*gw, dim): [sin(x w), cos(x w), sin(y w), cos(y w)] with D/4 frequencies
    w_i = T^(-i / s). The two references differ only in s: big_vision spans [1, 1/T] (s = D/4 - 1);
    MAE (and Hugging Face's ViTMAE, after its half swap) stops one step short (s = D/4).
    """
    if dim % 4:
        raise ValueError(f"sincos2d position embedding needs a width divisible by 4, got {dim}")
    if spacing not in SINCOS_SPACINGS:
        raise ValueError(f"spacing must be one of {SINCOS_SPACINGS}, got {spacing!r}")
    gh, gw = grid_size
    y, x = torch.meshgrid(torch.arange(gh, dtype=torch.float64),
                          torch.arange(gw, dtype=torch.float64), indexing="ij")
    quarter = dim // 4
    omega = torch.arange(quarter, dtype=torch.float64) / (quarter if spacing == "mae" else max(quarter - 1, 1))
    omega = 1.0 / temperature ** omega
    y = y.flatten()[:, None] * omega[None, :]
    x = x.flatten()[:, None] * omega[None, :]
    pe = torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)
    return pe.float().unsqueeze(0)


# ----------------------------------------------------------------------------- relative positions


def relative_position_index(grid: IntPair, prefix_tokens: int = 0) -> torch.Tensor:
    """(N, N) long: for query token i and key token j, the row of a relative-bias table that holds
    their 2D offset (Swin / BEiT; equal to timm's ``gen_relative_position_index``).

    Patch p at (r, c) and q at (r', c') share the row (r - r' + gh - 1) * (2 gw - 1) + c - c' + gw - 1
    of the (2 gh - 1)(2 gw - 1) offsets. With one prefix token (a class token, ``prefix_tokens=1``)
    the table has three more rows, BEiT's: class -> patch, patch -> class, class -> class.
    """
    if prefix_tokens not in (0, 1):
        raise ValueError(f"relative position bias supports 0 or 1 prefix tokens (a class token), not {prefix_tokens}")
    gh, gw = grid
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    coords = torch.stack([rows.flatten(), cols.flatten()])  # (2, gh*gw)
    offsets = coords[:, :, None] - coords[:, None, :]  # (2, N, N): query minus key
    index = (offsets[0] + gh - 1) * (2 * gw - 1) + offsets[1] + gw - 1
    if prefix_tokens:
        offsets_count = (2 * gh - 1) * (2 * gw - 1)
        index = F.pad(index, (1, 0, 1, 0))
        index[0, :] = offsets_count  # class token as the query
        index[:, 0] = offsets_count + 1  # class token as the key
        index[0, 0] = offsets_count + 2
    return index.contiguous()


def resize_relative_table(table: torch.Tensor, old: IntPair, new: IntPair, prefix_tokens: int = 0) -> torch.Tensor:
    """A ((2 gh - 1)(2 gw - 1) + 3 prefix, heads) relative-bias table for grid ``old`` -> grid ``new``.

    An offset keeps its bias: it is the same displacement in pixels at any grid of the same patch
    size. A smaller grid keeps the central offsets (exact: resizing back restores the table); a
    larger one repeats the outermost learned offset outwards, as distances past the trained range
    share one bias (T5's far bucket). (timm's ``resize_rel_pos_bias_table`` stretches the table
    instead, as BEiT's fine-tuning did, so that offsets change meaning; vitkit keeps them.)
    """
    (oh, ow), (nh, nw) = old, new
    extra = table[table.shape[0] - 3 * prefix_tokens:]
    offsets = table[:table.shape[0] - 3 * prefix_tokens]
    if offsets.shape[0] != (2 * oh - 1) * (2 * ow - 1):
        raise ValueError(f"a relative-bias table of {table.shape[0]} rows is not that of a {oh}x{ow} grid "
                         f"with {prefix_tokens} prefix token(s)")
    grid = offsets.reshape(2 * oh - 1, 2 * ow - 1, -1)
    dy = (torch.arange(-(nh - 1), nh) + oh - 1).clamp(0, 2 * oh - 2)
    dx = (torch.arange(-(nw - 1), nw) + ow - 1).clamp(0, 2 * ow - 2)
    resized = grid[dy][:, dx].reshape((2 * nh - 1) * (2 * nw - 1), -1)
    return torch.cat([resized, extra]).contiguous()


class RelativePositionBias(nn.Module):
    """Learned relative position bias (Swin, BEiT; timm's ``RelPosBias``): one scalar per head for
    each 2D offset between a query and a key patch, added to the attention logits before the
    softmax. Parameter ``relative_position_bias_table`` ((2 gh - 1)(2 gw - 1) + 3 prefix, heads),
    timm's name and layout; the index is a non-persistent buffer.

    ``forward(grid)`` -> the (1, heads, N, N) bias of a grid (another grid than the native one is
    resized on the fly by :func:`resize_relative_table`).
    """

    def __init__(self, grid: IntPair, num_heads: int, prefix_tokens: int = 0):
        super().__init__()
        self.grid, self.prefix_tokens = tuple(grid), int(prefix_tokens)
        rows = (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3 * self.prefix_tokens
        self.relative_position_bias_table = nn.Parameter(torch.zeros(rows, num_heads))
        self.register_buffer("relative_position_index", relative_position_index(self.grid, self.prefix_tokens),
                             persistent=False)

    def forward(self, grid: IntPair) -> torch.Tensor:
        table, index = self.relative_position_bias_table, self.relative_position_index
        if tuple(grid) != self.grid:
            table = resize_relative_table(table, self.grid, grid, self.prefix_tokens)
            index = relative_position_index(grid, self.prefix_tokens).to(index.device)
        n = index.shape[0]
        return table[index.view(-1)].view(n, n, -1).permute(2, 0, 1).unsqueeze(0)

    @torch.no_grad()
    def set_grid(self, grid: IntPair) -> None:
        """Make ``grid`` the native one: the table resized in place, the index rebuilt."""
        grid = tuple(grid)
        if grid == self.grid:
            return
        table = resize_relative_table(self.relative_position_bias_table.data, self.grid, grid, self.prefix_tokens)
        self.relative_position_bias_table = nn.Parameter(table, requires_grad=self.relative_position_bias_table
                                                         .requires_grad)
        self.relative_position_index = relative_position_index(grid, self.prefix_tokens).to(table.device)
        self.grid = grid

    def extra_repr(self) -> str:
        return f"grid={self.grid}, prefix_tokens={self.prefix_tokens}"


# ----------------------------------------------------------------------------- forward_intermediates


def intermediates_plan(depth: int, indices: Optional[Union[int, Sequence[int]]], output_fmt: str,
                       stop_early: bool, intermediates_only: bool) -> Tuple[Set[int], int]:
    """Checked ``forward_intermediates`` arguments -> (blocks to return, last block to run).

    timm's contract: an int n takes the last n blocks, a sequence those blocks (negative from
    the end), None all of them; out of range is an error. Blocks after the last one returned
    need not run when only the intermediates are wanted or ``stop_early`` asks so.
    """
    if output_fmt not in ("NCHW", "NLC"):
        raise ValueError("output_fmt must be 'NCHW' or 'NLC'")
    if indices is None:
        take = list(range(depth))
    elif isinstance(indices, int):
        if not 0 < indices <= depth:
            raise ValueError(f"indices={indices}: expected 1..{depth} last blocks")
        take = list(range(depth - indices, depth))
    else:
        take = [i + depth if i < 0 else i for i in indices]
        bad = [i for i in take if not 0 <= i < depth]
        if bad:
            raise ValueError(f"block indices {bad} out of range for depth {depth}")
    return set(take), (max(take) if (stop_early or intermediates_only) else depth - 1)


def patch_tokens_as(tokens: torch.Tensor, grid: IntPair, output_fmt: str) -> torch.Tensor:
    """Patch tokens (B, gh*gw, D) as they are (NLC) or as a feature map (B, D, gh, gw) (NCHW)."""
    if output_fmt == "NLC":
        return tokens
    return tokens.reshape(tokens.shape[0], grid[0], grid[1], -1).permute(0, 3, 1, 2).contiguous()


# ----------------------------------------------------------------------------- regularisers


def drop_path(x: torch.Tensor, prob: float, training: bool) -> torch.Tensor:
    """Stochastic depth: drop the whole residual branch per sample, rescale the rest."""
    if prob == 0.0 or not training:
        return x
    keep = 1.0 - prob
    mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
    return x * mask.div_(keep)


def linear_drop_path_rates(rate: float, depth: int) -> list:
    """Stochastic depth rising linearly from 0 at the first block to ``rate`` at the last (timm's
    rule). One block gets 0, so a rate there would do nothing: said, not silent."""
    if rate > 0 and depth == 1:
        warnings.warn(f"drop_path_rate {rate:g} has no effect on a model of depth 1: stochastic depth rises "
                      f"linearly from 0 at the first block (use drop_rate, or depth >= 2)", stacklevel=3)
    return [rate * i / max(depth - 1, 1) for i in range(depth)]


class DropPath(nn.Module):
    def __init__(self, prob: float = 0.0):
        super().__init__()
        self.prob = float(prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.prob, self.training)

    def extra_repr(self) -> str:
        return f"prob={self.prob:.3f}"


class LayerScale(nn.Module):
    """Per-channel residual-branch scale (CaiT); ``gamma`` as timm names it."""

    def __init__(self, dim: int, init_values: float = 1e-5):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


# ----------------------------------------------------------------------------- linear


class Linear(nn.Linear):
    """``nn.Linear`` that, inside :func:`fast_inference`, keeps its autocast copy between calls.

    Under autocast PyTorch casts every fp32 weight to bf16/fp16 on every forward; at batch 1
    that cast is most of a ViT's time on a CPU. Inside ``fast_inference`` -- a promise that the
    weights do not change within the block -- with autograd off this layer keeps the cast
    weight and bias and reuses them, so results are bitwise those of plain autocast. Outside
    it, it is plain ``nn.Linear``: a weight may change in ways no counter sees (a fused
    optimiser, a write through ``.data``), so no copy is kept. Costs one low-precision copy of
    the weights while used.
    """

    keep_cast = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        if not self.keep_cast or torch.is_grad_enabled() or not torch.is_autocast_enabled(device) \
                or self.weight.is_inference():
            # Inference tensors (a model built under inference_mode) have no version counter,
            # so a change to them could not be seen: no cache for them.
            return F.linear(x, self.weight, self.bias)
        dtype = torch.get_autocast_dtype(device)
        w = self.weight
        key = (w.data_ptr(), w._version, w.device, dtype,
               None if self.bias is None else (self.bias.data_ptr(), self.bias._version))
        cached = self.__dict__.get("_autocast_cache")
        if cached is None or cached[0] != key:
            bias = None if self.bias is None else self.bias.detach().to(dtype)
            cached = (key, w.detach().to(dtype), bias)
            self.__dict__["_autocast_cache"] = cached
        return F.linear(x, cached[1], cached[2])


@contextlib.contextmanager
def fast_inference(model: nn.Module) -> Iterator[nn.Module]:
    """Inference with weights that stay fixed inside the block: each :class:`Linear` keeps its
    autocast (bf16/fp16) copy of weight and bias between calls instead of casting them on every
    forward (at batch 1 on a CPU that cast was ~2/3 of ViT-B's time), and each :class:`Mlp` runs
    GELU in place on its hidden tensor when no hook watches ``fc1`` or ``act``. Results are
    bitwise those of plain inference (tested). Changing a weight inside the block is not seen;
    the copies are dropped on exit."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    mlps = [m for m in model.modules() if isinstance(m, Mlp)]
    before = [(m, m.keep_cast) for m in linears] + [(m, m.gelu_in_place) for m in mlps]
    for m in linears:
        m.keep_cast = True
    for m in mlps:
        m.gelu_in_place = True
    try:
        yield model
    finally:
        for m, value in before:
            if isinstance(m, Linear):
                m.keep_cast = value
                m.__dict__.pop("_autocast_cache", None)
            else:
                m.gelu_in_place = value


def compile_for_inference(model: nn.Module) -> nn.Module:
    """``torch.compile`` for inference with inductor's freezing: the weights become constants of
    the compiled graph, so their bf16 casts are folded away and linear layers run on weights
    prepacked for oneDNN; norms and GELU are fused as in any compile. On this project's 2-core
    CPU it gains little over :func:`fast_inference` (ViT-B/16 bf16, batch 32, interleaved runs:
    -2% to +8%; ViT-Ti/16: +8%; ``benchmarks/bench_onnx.py --compile``), the GEMMs being
    oneDNN's either way; it is the PyTorch path's last lever before ONNX Runtime's int8.
    Call it under ``torch.inference_mode()`` (freezing applies only without autograd). Weights
    changed after the first call are not seen: compile again. Each new input shape compiles once
    (seconds to a minute)."""
    return torch.compile(model, dynamic=False, options={"freezing": True})


# ----------------------------------------------------------------------------- attention


ATTN_IMPLS = ("auto", "sdpa", "explicit")


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection (rows [q | k | v]).

    The default path is ``F.scaled_dot_product_attention`` (fused kernels). When the caller
    needs the attention weights, ``forward(x, return_attention=True)`` runs the explicit
    softmax(q k^T / sqrt(d)) v path and returns them; both paths compute the same function.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, impl: str = "auto"):
        super().__init__()
        if impl not in ATTN_IMPLS:
            raise ValueError(f"attention impl must be one of {ATTN_IMPLS}, got {impl!r}")
        self.impl = impl
        if dim % num_heads:
            raise ValueError(f"width {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = float(attn_drop)
        self.proj = Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop) if proj_drop > 0 else None
        #: a relative position bias (:class:`RelativePositionBias`), attached by the model for that kind
        self.rel_pos: Optional[nn.Module] = None

    def forward(self, x: torch.Tensor, return_attention: bool = False, bias: Optional[torch.Tensor] = None):
        """``bias``: (1, heads, N, N) added to the logits before the softmax (relative positions)."""
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = None
        if return_attention or self._explicit(x):
            attn = (q * self.scale) @ k.transpose(-2, -1)
            if bias is not None:
                attn = attn + bias.to(attn.dtype)
            attn = attn.softmax(dim=-1)
            weights = F.dropout(attn, self.attn_drop) if self.training and self.attn_drop else attn
            x = weights @ v
        else:
            x = F.scaled_dot_product_attention(
                q, k, v, attn_mask=None if bias is None else bias.to(q.dtype),
                dropout_p=self.attn_drop if self.training else 0.0)
        x = self.proj(x.transpose(1, 2).reshape(B, N, C))
        if self.proj_drop is not None:
            x = self.proj_drop(x)
        return x, attn if return_attention else None

    def _explicit(self, x: torch.Tensor) -> bool:
        return explicit_attention(self.impl, x, self.qkv.weight)


def explicit_attention(impl: str, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether an attention layer of kernel choice ``impl`` should run the explicit softmax
    path on input ``x`` (``weight``: one of its projections, to tell training from inference)."""
    if impl != "auto":
        return impl == "explicit"
    # PyTorch's fused CPU attention has a slow bf16 backward: for CPU training under
    # autocast the explicit path is 1.5x (ViT-Ti/16, 224 px) to 3x (28 px, 50 tokens)
    # faster here. In fp32 the fused kernel is as fast or faster (ViT-S/16: 1.17x).
    return (x.device.type == "cpu" and torch.is_grad_enabled() and torch.is_autocast_enabled("cpu")
            and (x.requires_grad or weight.requires_grad))


# ----------------------------------------------------------------------------- MLP + block


class Mlp(nn.Module):
    """The transformer MLP: Linear -> GELU -> Linear (dropout after each when asked). Hooks on
    ``fc1`` see its output and hooks on ``act`` fire, as in timm (in place only inside
    :func:`fast_inference`, and only while nothing watches)."""

    def __init__(self, dim: int, hidden: int, gelu: str = "exact", drop: float = 0.0):
        super().__init__()
        if gelu not in ("exact", "tanh"):
            raise ValueError(f"gelu must be 'exact' or 'tanh', got {gelu!r}")
        self.fc1 = Linear(dim, hidden)
        self.act = nn.GELU(approximate="none" if gelu == "exact" else "tanh")
        self.fc2 = Linear(hidden, dim)
        self.drop = nn.Dropout(drop) if drop > 0 else None

    gelu_in_place = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        if self.gelu_in_place and not (x.requires_grad and torch.is_grad_enabled()) and not self._watched():
            # fast_inference: GELU in place on the 4x-wide hidden tensor saves one allocation
            # and one pass over the largest activation of the block.
            x = torch.ops.aten.gelu_(x, approximate=self.act.approximate)
        else:
            x = self.act(x)
        if self.drop is not None:
            x = self.drop(x)
        x = self.fc2(x)
        if self.drop is not None:
            x = self.drop(x)
        return x

    def _watched(self) -> bool:
        """Whether a hook sees fc1's output or act: then they must be what their names say."""
        return bool(self.fc1._forward_hooks or self.act._forward_hooks or self.act._forward_pre_hooks
                    or nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks)


@torch.no_grad()
def init_block_(blk: "Block") -> None:
    """The official vit_jax initialisation of one block: Xavier-uniform kernels (q, k and v each
    as its own D x D kernel, as the official code keeps them), zero attention biases, N(0, 1e-6)
    MLP biases. (The ViT's blocks and MAE's decoder blocks both use it.)"""
    D = blk.attn.proj.in_features
    for part in blk.attn.qkv.weight.split(D, dim=0):
        xavier_uniform_fan(part, D, D)
    if blk.attn.qkv.bias is not None:
        nn.init.zeros_(blk.attn.qkv.bias)
    xavier_uniform_fan(blk.attn.proj.weight, D, D)
    nn.init.zeros_(blk.attn.proj.bias)
    for fc in (blk.mlp.fc1, blk.mlp.fc2):
        xavier_uniform_fan(fc.weight, fc.in_features, fc.out_features)
        nn.init.normal_(fc.bias, std=1e-6)


class Block(nn.Module):
    """Pre-LN transformer block: x + DropPath(LS(MSA(LN(x)))), then the same for the MLP."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, qkv_bias: bool = True,
                 norm_eps: float = 1e-6, gelu: str = "exact", drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float = 0.0,
                 init_values: Optional[float] = None, attn_impl: str = "auto"):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_drop, drop, attn_impl)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, mlp_dim, gelu, drop)
        self.ls1 = LayerScale(dim, init_values) if init_values else None
        self.ls2 = LayerScale(dim, init_values) if init_values else None
        self.drop_path = float(drop_path)

    def forward(self, x: torch.Tensor, return_attention: bool = False, attn_bias: Optional[torch.Tensor] = None):
        y, attn = self.attn(self.norm1(x), return_attention, attn_bias)
        if self.ls1 is not None:
            y = self.ls1(y)
        x = x + drop_path(y, self.drop_path, self.training)
        y = self.mlp(self.norm2(x))
        if self.ls2 is not None:
            y = self.ls2(y)
        x = x + drop_path(y, self.drop_path, self.training)
        return x, attn
