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
from typing import Callable, Iterator, NamedTuple, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

IntPair = Tuple[int, int]
#: width -> a normalisation layer of that width (a family's norm kind and eps, bound once)
NormFactory = Callable[[int], nn.Module]


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
                 bias: bool = True, norm: Optional["NormFactory"] = None, crop_remainder: bool = False):
        super().__init__()
        #: pixels past the last whole patch are left out (timm's and Hugging Face's strided convolution
        #: does so: SigLIP so400m/14 at 384 px reads 378 px of them); otherwise they are an error
        self.crop_remainder = bool(crop_remainder)
        self.patch_size = to_2tuple(patch_size)
        self.in_chans = in_chans
        self.embed_dim = embed_dim
        self.set_img_size(img_size)
        self.proj = nn.Conv2d(in_chans, embed_dim, self.patch_size, stride=self.patch_size,
                              bias=bias)
        #: a norm of each token after the projection (AIMv2's RMSNorm; timm's ``embed_norm_layer``)
        self.norm = norm(embed_dim) if norm is not None else None

    def grid_for(self, img_size: IntPair) -> IntPair:
        h, w = img_size
        ph, pw = self.patch_size
        if self.crop_remainder and h >= ph and w >= pw:
            return (h // ph, w // pw)
        if h % ph or w % pw:
            raise ValueError(
                f"image size {h}x{w} is not divisible by the patch size {ph}x{pw}; "
                f"resize or crop the input to a multiple of the patch size")
        return (h // ph, w // pw)

    def forward(self, x: torch.Tensor, strict: bool = True) -> torch.Tensor:
        self.check_images(x, strict)
        x = self.proj(x).permute(0, 2, 3, 1)  # (B, gh, gw, D)
        return x if self.norm is None else self.norm(x)


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


class RelativeBiasTable:
    """A learned relative position bias (Swin, BEiT; timm's ``RelPosBias``): one scalar per head for each
    2D offset between a query and a key patch, added to the attention logits before the softmax.
    Parameter ``relative_position_bias_table`` ((2 gh - 1)(2 gw - 1) + 3 prefix, heads), timm's name and
    layout; the index is a non-persistent buffer. A mixin of the module that holds the table (its own
    :class:`RelativePositionBias`, or BEiT's attention layer, which holds it itself).

    ``relative_bias(grid)`` -> the (1, heads, N, N) bias of a grid (another grid than the native one is
    resized on the fly by :func:`resize_relative_table`).
    """

    def init_relative(self, grid: IntPair, num_heads: int, prefix_tokens: int = 0) -> None:
        self.grid, self.prefix_tokens = tuple(grid), int(prefix_tokens)
        rows = (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3 * self.prefix_tokens
        self.relative_position_bias_table = nn.Parameter(torch.zeros(rows, num_heads))
        self.register_buffer("relative_position_index", relative_position_index(self.grid, self.prefix_tokens),
                             persistent=False)

    def relative_bias(self, grid: IntPair) -> torch.Tensor:
        table, index = self.relative_position_bias_table, self.relative_position_index
        if tuple(grid) != self.grid:
            table = resize_relative_table(table, self.grid, grid, self.prefix_tokens)
            index = relative_position_index(grid, self.prefix_tokens).to(index.device)
        n = index.shape[0]
        return table[index.view(-1)].view(n, n, -1).permute(2, 0, 1).unsqueeze(0)

    @torch.no_grad()
    def set_relative_grid(self, grid: IntPair) -> None:
        """Make ``grid`` the native one: the table resized in place, the index rebuilt."""
        grid = tuple(grid)
        if grid == self.grid:
            return
        table = resize_relative_table(self.relative_position_bias_table.data, self.grid, grid, self.prefix_tokens)
        self.relative_position_bias_table = nn.Parameter(table, requires_grad=self.relative_position_bias_table
                                                         .requires_grad)
        self.relative_position_index = relative_position_index(grid, self.prefix_tokens).to(table.device)
        self.grid = grid


class RelativePositionBias(RelativeBiasTable, nn.Module):
    """A block's relative position bias as a module of its own (``attn.rel_pos``, timm's ``RelPosBias``
    names): see :class:`RelativeBiasTable`. ``forward(grid)`` -> the (1, heads, N, N) bias."""

    def __init__(self, grid: IntPair, num_heads: int, prefix_tokens: int = 0):
        super().__init__()
        self.init_relative(grid, num_heads, prefix_tokens)

    def forward(self, grid: IntPair) -> torch.Tensor:
        return self.relative_bias(grid)

    def set_grid(self, grid: IntPair) -> None:
        self.set_relative_grid(grid)

    def extra_repr(self) -> str:
        return f"grid={self.grid}, prefix_tokens={self.prefix_tokens}"


class _ReluMlp(nn.Module):
    """Linear -> ReLU -> Linear, with timm's names (``fc1``, ``fc2``)."""

    def __init__(self, dim: int, hidden: int, out: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def relative_log_coords(grid: IntPair) -> torch.Tensor:
    """((2 gh - 1), (2 gw - 1), 2) offsets (dy, dx) between patches as sign(d) log(1 + |d|) (timm's 'cr' log
    coordinates, after Swin v2's): continuous in the offset, so a table for any grid is the same function."""
    gh, gw = grid
    dy = torch.arange(-(gh - 1), gh, dtype=torch.float32)
    dx = torch.arange(-(gw - 1), gw, dtype=torch.float32)
    coords = torch.stack(torch.meshgrid(dy, dx, indexing="ij"), dim=-1)
    return torch.sign(coords) * torch.log(1.0 + coords.abs())


class RelativePositionMlp(nn.Module):
    """A relative position bias computed by a small MLP from the log-spaced 2D offset of each query and key
    patch (timm's ``RelPosMlp``, mode 'cr': ``mlp.fc1`` 2 -> hidden, ReLU, ``mlp.fc2`` hidden -> heads); the
    prefix tokens get none (zero rows and columns). No table depends on the grid, so any grid is exact.
    ``relative_bias(grid)`` -> (1, heads, prefix + N, prefix + N)."""

    def __init__(self, grid: IntPair, num_heads: int, hidden: int = 128, prefix_tokens: int = 0):
        super().__init__()
        self.num_heads, self.prefix_tokens = num_heads, int(prefix_tokens)
        self.mlp = _ReluMlp(2, hidden, num_heads)
        self.grid = tuple(grid)
        self._buffers_for(self.grid)

    def _buffers_for(self, grid: IntPair) -> None:
        self.register_buffer("rel_coords_log", relative_log_coords(grid), persistent=False)
        self.register_buffer("relative_position_index", relative_position_index(grid, 0).view(-1), persistent=False)

    def relative_bias(self, grid: IntPair) -> torch.Tensor:
        coords, index = self.rel_coords_log, self.relative_position_index
        if tuple(grid) != self.grid:
            coords = relative_log_coords(grid).to(coords.device)
            index = relative_position_index(grid, 0).view(-1).to(index.device)
        n = grid[0] * grid[1]
        bias = self.mlp(coords).view(-1, self.num_heads)[index].view(n, n, self.num_heads).permute(2, 0, 1)
        if self.prefix_tokens:
            bias = F.pad(bias, [self.prefix_tokens, 0, self.prefix_tokens, 0])
        return bias.unsqueeze(0)

    def set_relative_grid(self, grid: IntPair) -> None:
        self.grid = tuple(grid)
        device = self.rel_coords_log.device
        self._buffers_for(self.grid)
        self.rel_coords_log, self.relative_position_index = (self.rel_coords_log.to(device),
                                                             self.relative_position_index.to(device))

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


# ----------------------------------------------------------------------------- norms and activations

#: normalisation kinds (``TokenConfig.norm``): LayerNorm, or RMSNorm (no centring, no bias: AIMv2, Sapiens)
NORMS = ("layernorm", "rmsnorm")
#: the MLP activation (``gelu`` field): exact GELU (timm, HF), its tanh approximation (the official JAX
#: code, SigLIP), or CLIP's QuickGELU x * sigmoid(1.702 x) (OpenAI's CLIP weights were trained with it)
GELUS = ("exact", "tanh", "quick")


class RmsNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension; ``weight`` as timm's RmsNorm names it."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def norm_factory(kind: str = "layernorm", eps: float = 1e-6) -> NormFactory:
    """The family's normalisation as a factory of widths (what blocks, heads and poolings are given)."""
    if kind not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")
    if kind == "rmsnorm":
        return lambda dim: RmsNorm(dim, eps)
    return lambda dim: nn.LayerNorm(dim, eps=eps)


class QuickGELU(nn.Module):
    """CLIP's GELU approximation x * sigmoid(1.702 x) (OpenAI's weights need it; open_clip's ``QuickGELU``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def gelu_layer(kind: str) -> nn.Module:
    """The MLP activation of a ``gelu`` kind (see :data:`GELUS`)."""
    if kind not in GELUS:
        raise ValueError(f"gelu must be one of {GELUS}, got {kind!r}")
    return QuickGELU() if kind == "quick" else nn.GELU(approximate="none" if kind == "exact" else "tanh")


# ----------------------------------------------------------------------------- rotary positions


class Rope(NamedTuple):
    """A rotary position embedding of the patch tokens: ``sin`` and ``cos`` broadcast against the heads'
    queries and keys (..., patches, head_dim), and the rotation layout: ``half`` rotates the two halves
    of a head ((a, b) -> (-b, a): DINOv3, Hugging Face), otherwise neighbouring pairs (EVA-02, timm's
    default). Built by :mod:`vitkit.models.positions`; the prefix tokens before the patches are not rotated.
    """

    sin: torch.Tensor
    cos: torch.Tensor
    half: bool = False


def rotate_pairs(x: torch.Tensor, half: bool) -> torch.Tensor:
    """The 90-degree rotation RoPE pairs with the sine: (x0, x1) -> (-x1, x0) within each pair."""
    if half:
        a, b = x.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)
    return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Rotate the patch tokens of queries or keys ``x`` (B, heads, N, head_dim) by their positions; the
    first ``N - patches`` (prefix) tokens are left as they are. Computed in the rope's precision (float32)
    and cast back, as timm does."""
    skip = x.shape[-2] - rope.sin.shape[-2]
    if skip < 0:
        raise ValueError(f"a rotary embedding of {rope.sin.shape[-2]} positions for {x.shape[-2]} tokens")
    patches = x[..., skip:, :] if skip else x
    rotated = (patches * rope.cos + rotate_pairs(patches, rope.half) * rope.sin).to(x.dtype)
    return torch.cat([x[..., :skip, :], rotated], dim=-2) if skip else rotated


# ----------------------------------------------------------------------------- attention


ATTN_IMPLS = ("auto", "sdpa", "explicit")


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection (rows [q | k | v]).

    The default path is ``F.scaled_dot_product_attention`` (fused kernels). When the caller
    needs the attention weights, ``forward(x, return_attention=True)`` runs the explicit
    softmax(q k^T / sqrt(d)) v path and returns them; both paths compute the same function.

    Options of the later ViTs, each a module with timm's name: ``qk_norm`` (a norm of each head's
    queries and keys, ``q_norm`` / ``k_norm``: ViT-22B, Sapiens), ``inner_norm`` (a norm of the heads'
    concatenated output before the projection, ``norm``: EVA-02 CLIP's and BEiT-3's sub-LN),
    ``proj_bias`` (AIMv2 has none). A rotary embedding (:class:`Rope`) rotates queries and keys after
    their norms. Subclasses change only how q, k, v are projected (:meth:`project`).
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, impl: str = "auto", qk_norm: Optional[NormFactory] = None,
                 inner_norm: Optional[NormFactory] = None, proj_bias: bool = True):
        super().__init__()
        if impl not in ATTN_IMPLS:
            raise ValueError(f"attention impl must be one of {ATTN_IMPLS}, got {impl!r}")
        self.impl = impl
        if dim % num_heads:
            raise ValueError(f"width {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.build_projections(dim, qkv_bias)
        self.q_norm = qk_norm(self.head_dim) if qk_norm is not None else None
        self.k_norm = qk_norm(self.head_dim) if qk_norm is not None else None
        self.attn_drop = float(attn_drop)
        self.norm = inner_norm(dim) if inner_norm is not None else None
        self.proj = Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop) if proj_drop > 0 else None
        #: a relative position bias (:class:`RelativePositionBias`), attached by the model for that kind
        self.rel_pos: Optional[nn.Module] = None

    def build_projections(self, dim: int, qkv_bias: bool) -> None:
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Tokens (B, N, D) -> q, k, v, each (B, heads, N, head_dim)."""
        B, N, _ = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return qkv.unbind(0)

    def forward(self, x: torch.Tensor, return_attention: bool = False, bias: Optional[torch.Tensor] = None,
                rope: Optional[Rope] = None):
        """``bias``: (1, heads, N, N) added to the logits before the softmax (relative positions);
        ``rope``: the patch tokens' rotary embedding."""
        B, N, C = x.shape
        q, k, v = self.project(x)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, rope).type_as(v), apply_rope(k, rope).type_as(v)
        if k.shape[1] != q.shape[1]:  # grouped-query attention: each key/value head serves a group
            k, v = _repeat_heads(k, q.shape[1]), _repeat_heads(v, q.shape[1])
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
        x = x.transpose(1, 2).reshape(B, N, C)
        if self.norm is not None:
            x = self.norm(x)
        x = self.proj(x)
        if self.proj_drop is not None:
            x = self.proj_drop(x)
        return x, attn if return_attention else None

    def _explicit(self, x: torch.Tensor) -> bool:
        return explicit_attention(self.impl, x, self.proj.weight)


def _repeat_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, kv, N, d) -> (B, heads, N, d), each of the kv heads repeated heads / kv times in a row
    (``repeat_interleave`` on the heads, written as expand + reshape: the ONNX exporter takes it)."""
    B, kv, N, d = x.shape
    return x[:, :, None].expand(B, kv, heads // kv, N, d).reshape(B, heads, N, d)


class QVBiasAttention(Attention):
    """Attention whose fused ``qkv`` projection has no bias of its own but learned q and v biases
    (``q_bias``, ``v_bias``) and none for k, which would cancel in the softmax: BEiT's and EVA's layout
    (timm's names)."""

    def build_projections(self, dim: int, qkv_bias: bool) -> None:
        self.qkv = Linear(dim, dim * 3, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(dim)) if qkv_bias else None
        self.v_bias = nn.Parameter(torch.zeros(dim)) if qkv_bias else None

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.q_bias is None:
            return super().project(x)
        B, N, _ = x.shape
        # the module is called (not its weight): hooks and adapters on qkv (LoRA) act on it
        bias = torch.cat([self.q_bias, torch.zeros_like(self.q_bias), self.v_bias])
        qkv = (self.qkv(x) + bias).reshape(B, N, 3, self.num_heads, self.head_dim)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)


class RelativeQVBiasAttention(RelativeBiasTable, QVBiasAttention):
    """BEiT's attention (timm's ``Beit`` names): q/v biases, and its own relative position bias table
    (``relative_position_bias_table`` on the layer, not in a submodule); made by the 'relative' position
    kind of a model whose attention layers hold their tables."""


class SplitAttention(Attention):
    """Attention with separate ``q_proj``, ``k_proj``, ``v_proj`` projections (EVA-02's unfused layout,
    timm's names); ``k_bias`` False leaves k without a bias, as EVA does. ``kv_heads`` fewer than the
    heads: grouped-query attention (Sapiens), each key/value head shared by heads / kv_heads query heads."""

    def __init__(self, *args, k_bias: bool = True, kv_heads: Optional[int] = None, **kwargs):
        self._k_bias, self._kv_heads = k_bias, kv_heads
        super().__init__(*args, **kwargs)

    def build_projections(self, dim: int, qkv_bias: bool) -> None:
        self.kv_heads = self._kv_heads or self.num_heads
        if self.num_heads % self.kv_heads:
            raise ValueError(f"{self.num_heads} heads cannot share {self.kv_heads} key/value heads")
        kv = self.kv_heads * self.head_dim
        self.q_proj = Linear(dim, dim, bias=qkv_bias)
        self.k_proj = Linear(dim, kv, bias=qkv_bias and self._k_bias)
        self.v_proj = Linear(dim, kv, bias=qkv_bias)

    def project(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, N, _ = x.shape
        q = self.q_proj(x).reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = (p(x).reshape(B, N, self.kv_heads, self.head_dim).transpose(1, 2) for p in (self.k_proj, self.v_proj))
        return q, k, v


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


class AttentionPool(nn.Module):
    """Multi-head attention pooling (MAP; SigLIP's head, timm's ``AttentionPoolLatent``): one learned
    query (``latent``) attends over the tokens (keys and values from ``kv``), then a projection and a
    residual MLP on the normalised result. Tokens (B, N, D) -> (B, D)."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, norm: NormFactory, gelu: str = "exact"):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"attention pooling: width {dim} is not divisible by {num_heads} heads")
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = Linear(dim, dim)
        self.kv = Linear(dim, dim * 2)
        self.proj = Linear(dim, dim)
        self.norm = norm(dim)
        self.mlp = Mlp(dim, mlp_dim, gelu)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        B, N, C = x.shape
        q = self.q(self.latent.expand(B, -1, -1)).reshape(B, 1, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        # one query: the explicit softmax costs what a fused kernel would (and its weights are at hand)
        attn = ((q * self.head_dim ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
        y = attn @ v
        y = self.proj(y.transpose(1, 2).reshape(B, 1, C))
        y = y + self.mlp(self.norm(y))
        y = y[:, 0]
        return (y, attn) if return_attention else y


@torch.no_grad()
def init_attention_pool_(pool: AttentionPool) -> None:
    """big_vision's MAPHead initialisation: Xavier-uniform probe (``latent``) and kernels (q, k, v each as
    its own D x D kernel), zero attention biases, the MLP as a block's (N(0, 1e-6) biases)."""
    D = pool.latent.shape[-1]
    xavier_uniform_fan(pool.latent, 1, D)
    for lin in (pool.q, pool.kv, pool.proj):
        for part in lin.weight.split(D, dim=0):
            xavier_uniform_fan(part, D, D)
        nn.init.zeros_(lin.bias)
    for fc in (pool.mlp.fc1, pool.mlp.fc2):
        xavier_uniform_fan(fc.weight, fc.in_features, fc.out_features)
        nn.init.normal_(fc.bias, std=1e-6)


# ----------------------------------------------------------------------------- MLPs + blocks

#: MLP kinds (``mlp`` field): Linear -> GELU -> Linear; SwiGLU with two input projections (``fc1_g``,
#: ``fc1_x``: EVA-02, AIMv2); SwiGLU with one packed projection (``fc1`` rows [gate | value]: DINOv2-g,
#: EVA-02 Ti/S)
MLPS = ("mlp", "swiglu", "swiglu_packed")


class Mlp(nn.Module):
    """The transformer MLP: Linear -> GELU -> Linear (dropout after each when asked). Hooks on
    ``fc1`` see its output and hooks on ``act`` fire, as in timm (in place only inside
    :func:`fast_inference`, and only while nothing watches). ``norm``: a norm of the hidden
    activations before ``fc2`` (EVA-02's and BEiT-3's sub-LN, timm's ``mlp.norm``)."""

    def __init__(self, dim: int, hidden: int, gelu: str = "exact", drop: float = 0.0, bias: bool = True,
                 norm: Optional[NormFactory] = None):
        super().__init__()
        self.fc1 = Linear(dim, hidden, bias=bias)
        self.act = gelu_layer(gelu)
        self.norm = norm(hidden) if norm is not None else None
        self.fc2 = Linear(hidden, dim, bias=bias)
        self.drop = nn.Dropout(drop) if drop > 0 else None

    gelu_in_place = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        if self.gelu_in_place and isinstance(self.act, nn.GELU) \
                and not (x.requires_grad and torch.is_grad_enabled()) and not self._watched():
            # fast_inference: GELU in place on the 4x-wide hidden tensor saves one allocation
            # and one pass over the largest activation of the block.
            x = torch.ops.aten.gelu_(x, approximate=self.act.approximate)
        else:
            x = self.act(x)
        return self.finish(x)

    def finish(self, h: torch.Tensor) -> torch.Tensor:
        """The hidden activations -> the output: dropout, the hidden norm, ``fc2``, dropout."""
        if self.drop is not None:
            h = self.drop(h)
        if self.norm is not None:
            h = self.norm(h)
        h = self.fc2(h)
        return h if self.drop is None else self.drop(h)

    def _watched(self) -> bool:
        """Whether a hook sees fc1's output or act: then they must be what their names say."""
        return bool(self.fc1._forward_hooks or self.act._forward_hooks or self.act._forward_pre_hooks
                    or nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks)


class SwiGLU(nn.Module):
    """SiLU(x W_g) * (x W_x), then ``fc2`` (Shazeer 2020's SwiGLU): ``hidden`` is the width of the gated
    product. ``packed``: one ``fc1`` whose rows are [gate | value] (timm's ``SwiGLUPacked``); otherwise
    ``fc1_g`` and ``fc1_x`` (timm's ``SwiGLU``). ``norm`` as in :class:`Mlp`."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.0, bias: bool = True,
                 norm: Optional[NormFactory] = None, packed: bool = False):
        super().__init__()
        self.packed = packed
        if packed:
            self.fc1 = Linear(dim, 2 * hidden, bias=bias)
        else:
            self.fc1_g = Linear(dim, hidden, bias=bias)
            self.fc1_x = Linear(dim, hidden, bias=bias)
        self.act = nn.SiLU()
        self.norm = norm(hidden) if norm is not None else None
        self.fc2 = Linear(hidden, dim, bias=bias)
        self.drop = nn.Dropout(drop) if drop > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            gate, x = self.fc1(x).chunk(2, dim=-1)
        else:
            gate, x = self.fc1_g(x), self.fc1_x(x)
        return self.finish(self.act(gate) * x)

    finish = Mlp.finish


def make_mlp(kind: str, dim: int, hidden: int, gelu: str = "exact", drop: float = 0.0, bias: bool = True,
             norm: Optional[NormFactory] = None) -> nn.Module:
    """The MLP of a kind (:data:`MLPS`); ``hidden``: the width ``fc2`` reads."""
    if kind == "mlp":
        return Mlp(dim, hidden, gelu, drop, bias, norm)
    if kind in ("swiglu", "swiglu_packed"):
        return SwiGLU(dim, hidden, drop, bias, norm, packed=kind == "swiglu_packed")
    raise ValueError(f"mlp must be one of {MLPS}, got {kind!r}")


@torch.no_grad()
def init_block_(blk: "Block") -> None:
    """The official vit_jax initialisation of one block: Xavier-uniform kernels (q, k and v each
    as its own D x D kernel, as the official code keeps them), zero attention biases, N(0, 1e-6)
    MLP biases. (The ViT's blocks and MAE's decoder blocks both use it.) Other projection
    layouts (separate q/k/v, SwiGLU's two inputs) get the same rule per D x D or D x hidden kernel."""
    D = blk.attn.proj.in_features
    for name, module in blk.attn.named_children():
        if name in ("qkv", "q_proj", "k_proj", "v_proj"):
            for part in module.weight.split(D, dim=0):
                xavier_uniform_fan(part, D, D)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for name in ("q_bias", "v_bias"):
        if getattr(blk.attn, name, None) is not None:
            nn.init.zeros_(getattr(blk.attn, name))
    xavier_uniform_fan(blk.attn.proj.weight, D, D)
    if blk.attn.proj.bias is not None:
        nn.init.zeros_(blk.attn.proj.bias)
    for name in ("fc1", "fc1_g", "fc1_x", "fc2"):
        fc = getattr(blk.mlp, name, None)
        if fc is None:
            continue
        parts = fc.weight.split(fc.out_features // 2) if name == "fc1" and getattr(blk.mlp, "packed", False) \
            else (fc.weight,)
        for part in parts:
            xavier_uniform_fan(part, fc.in_features, part.shape[0])
        if fc.bias is not None:
            nn.init.normal_(fc.bias, std=1e-6)


#: block kinds (``block`` field): pre-norm (the paper's), or residual post-norm (timm's ``rpn`` models,
#: Swin v2's: x + norm(f(x)))
BLOCKS = ("pre", "res_post")


class Block(nn.Module):
    """Pre-LN transformer block: x + DropPath(LS(MSA(LN(x)))), then the same for the MLP.

    The positional arguments build the paper's block; the later ViTs inject their parts instead
    (timm's way): ``norm`` (a width -> norm factory: RMSNorm, another eps), ``attn`` and ``mlp``
    (built modules: :class:`QVBiasAttention`, :class:`SwiGLU` ...).
    """

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, qkv_bias: bool = True,
                 norm_eps: float = 1e-6, gelu: str = "exact", drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float = 0.0,
                 init_values: Optional[float] = None, attn_impl: str = "auto",
                 norm: Optional[NormFactory] = None, attn: Optional[nn.Module] = None,
                 mlp: Optional[nn.Module] = None):
        super().__init__()
        norm = norm or norm_factory("layernorm", norm_eps)
        self.norm1 = norm(dim)
        self.attn = attn if attn is not None else Attention(dim, num_heads, qkv_bias, attn_drop, drop, attn_impl)
        self.norm2 = norm(dim)
        self.mlp = mlp if mlp is not None else Mlp(dim, mlp_dim, gelu, drop)
        self.ls1 = LayerScale(dim, init_values) if init_values else None
        self.ls2 = LayerScale(dim, init_values) if init_values else None
        self.drop_path = float(drop_path)

    def scale_attn(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.ls1 is None else self.ls1(y)

    def scale_mlp(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.ls2 is None else self.ls2(y)

    def forward(self, x: torch.Tensor, return_attention: bool = False, attn_bias: Optional[torch.Tensor] = None,
                rope: Optional[Rope] = None):
        y, attn = self.attn(self.norm1(x), return_attention, attn_bias, rope)
        x = x + drop_path(self.scale_attn(y), self.drop_path, self.training)
        y = self.mlp(self.norm2(x))
        x = x + drop_path(self.scale_mlp(y), self.drop_path, self.training)
        return x, attn


class ResPostBlock(Block):
    """Residual post-norm block: x + DropPath(LN(MSA(x))), then the same for the MLP (timm's
    ``ResPostBlock``, Swin v2's res-post-norm). No LayerScale: ``init_values`` starts the norms' weights
    there instead (timm's rule), which scales each branch as LayerScale would at the start."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, *args, init_values: Optional[float] = None,
                 **kwargs):
        super().__init__(dim, num_heads, mlp_dim, *args, init_values=None, **kwargs)
        self.init_values = init_values
        self.reset_norms()

    @torch.no_grad()
    def reset_norms(self) -> None:
        if self.init_values is not None:
            nn.init.constant_(self.norm1.weight, self.init_values)
            nn.init.constant_(self.norm2.weight, self.init_values)

    def forward(self, x: torch.Tensor, return_attention: bool = False, attn_bias: Optional[torch.Tensor] = None,
                rope: Optional[Rope] = None):
        y, attn = self.attn(x, return_attention, attn_bias, rope)
        x = x + drop_path(self.norm1(y), self.drop_path, self.training)
        x = x + drop_path(self.norm2(self.mlp(x)), self.drop_path, self.training)
        return x, attn
