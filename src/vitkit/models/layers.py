"""Building blocks shared by every ViT-family model.

Parameter names follow timm (``patch_embed.proj``, ``blocks.N.attn.qkv`` ...) so that a
vitkit state dict *is* a timm state dict wherever the architectures coincide. The forward
paths skip identity modules instead of calling them: at batch 1 on a CPU the Python
overhead of a dozen ``nn.Identity`` calls per block is measurable.

The parts live in modules of their own, each importable from here as before: sizes (:mod:`.sizes`),
norms and activations (:mod:`.norms`), the patch embedding (:mod:`.patch`), ``Linear`` and the MLPs
(:mod:`.mlp`), and every position table, bias and rotation (:mod:`.positions`). This module holds the
attention layers and the blocks built from them.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from .mlp import MLPS, Linear, Mlp, SwiGLU, compile_for_inference, fast_inference, in_eval_mode, make_mlp  # noqa: F401 (re-exported)
from .norms import GELUS, NORMS, NormFactory, QuickGELU, RmsNorm, gelu_layer, norm_factory  # noqa: F401 (re-exported)
from .patch import PatchEmbed, PatchGrid, adapt_input_channels, resample_patch_embed  # noqa: F401 (re-exported)
from .positions import (  # noqa: F401 (re-exported)
    INTERPOLATIONS,
    RELATIVE_RESIZES,
    SINCOS_SPACINGS,
    RelativeBiasTable,
    RelativePositionBias,
    RelativePositionMlp,
    Rope,
    apply_rope,
    relative_log_coords,
    relative_position_index,
    resample_pos_embed,
    resample_pos_embed_grid,
    resize_relative_table,
    rotate_pairs,
    sincos_2d_pos_embed,
)
from .positions.relative import _ReluMlp  # noqa: F401 (re-exported)
from .sizes import IntPair, _whole, to_2tuple  # noqa: F401 (re-exported)

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
    elif isinstance(indices, numbers.Integral) and not isinstance(indices, bool):
        indices = int(indices)
        if not 0 < indices <= depth:
            hint = f" (a block counted from the end is a list: ({indices},))" if -depth <= indices < 0 else ""
            raise ValueError(f"indices={indices}: expected 1..{depth} last blocks{hint}")
        take = list(range(depth - indices, depth))
    else:
        if isinstance(indices, (str, bytes)) or not isinstance(indices, Sequence) or not indices or not all(
                isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in indices):
            raise ValueError(f"indices must be a number of last blocks or a non-empty list of block numbers "
                             f"(negative from the end), got {indices!r}")
        bad = [i for i in indices if not -depth <= i < depth]  # said as given (-4 was said as -1)
        if bad:
            raise ValueError(f"block indices {bad} out of range for depth {depth} (0..{depth - 1}, or "
                             f"-{depth}..-1 from the end)")
        take = [int(i) + depth if i < 0 else int(i) for i in indices]
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
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


# ----------------------------------------------------------------------------- attention


ATTN_IMPLS = ("auto", "sdpa", "explicit")


def mix_values(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, explicit: bool, dropout: float = 0.0,
               bias: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """softmax(q k^T / sqrt(d) + bias) v for q, k, v (B, heads, N, d) -> (B, heads, N, d) and, on the explicit
    path, the attention weights (before dropout; None on ``F.scaled_dot_product_attention``'s fused path).
    ``dropout``: on the weights (0 outside training)."""
    if not explicit:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=None if bias is None else bias.to(q.dtype),
                                              dropout_p=dropout), None
    attn = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    if bias is not None:
        attn = attn + bias.to(attn.dtype)
    attn = attn.softmax(dim=-1)
    return (F.dropout(attn, dropout) if dropout else attn) @ v, attn


class AttentionParts(nn.Module):
    """What the self-attention layers share around their own projection and mixing (standard attention here,
    :class:`~vitkit.models.diff_attention.DiffAttention`): the kernel choice, q/k norms over ``head_dim``,
    attention dropout, the inner norm, the output projection and its dropout, timm's names for each."""

    def add_parts(self, dim: int, head_dim: int, impl: str, attn_drop: float, proj_drop: float,
                  qk_norm: Optional[NormFactory], inner_norm: Optional[NormFactory], proj_bias: bool) -> None:
        if impl not in ATTN_IMPLS:
            raise ValueError(f"attention impl must be one of {ATTN_IMPLS}, got {impl!r}")
        self.impl = impl
        self.q_norm = qk_norm(head_dim) if qk_norm is not None else None
        self.k_norm = qk_norm(head_dim) if qk_norm is not None else None
        self.attn_drop = float(attn_drop)
        self.norm = inner_norm(dim) if inner_norm is not None else None
        self.proj = Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop) if proj_drop > 0 else None

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """The joined heads (B, N, D) -> the layer's output: inner norm, projection, dropout."""
        if self.norm is not None:
            x = self.norm(x)
        x = self.proj(x)
        return x if self.proj_drop is None else self.proj_drop(x)

    def _explicit(self, x: torch.Tensor) -> bool:
        return explicit_attention(self.impl, x, self.proj.weight)


class Attention(AttentionParts):
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
        if dim % num_heads:
            raise ValueError(f"width {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.build_projections(dim, qkv_bias)
        self.add_parts(dim, self.head_dim, impl, attn_drop, proj_drop, qk_norm, inner_norm, proj_bias)
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
        x, attn = mix_values(q, k, v, return_attention or self._explicit(x), self.attn_drop if self.training else 0.0,
                             bias)
        return self.finish(x.transpose(1, 2).reshape(B, N, C)), attn if return_attention else None


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


# ----------------------------------------------------------------------------- blocks


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


#: block kinds (``block`` field): pre-norm (the paper's), residual post-norm (timm's ``rpn`` models,
#: Swin v2's: x + norm(f(x))), or parallel attention and MLP (ViT-22B's, timm's ``pwee``:
#: :mod:`.parallel_block`)
BLOCKS = ("pre", "res_post", "parallel")


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
