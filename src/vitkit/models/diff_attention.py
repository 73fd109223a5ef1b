"""Differential attention (Ye et al., 2024, "Differential Transformer", arXiv 2410.05258), as timm builds it
for its ``vit_dwee`` / ``vit_dlittle`` / ``vit_dpwee`` ViTs.

Each head splits its queries and keys in two halves of half the head width and takes the difference of
the two softmax maps, ``A1 - lambda * A2``, over values of the full head width: noise both maps share
cancels. lambda is learned (``exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init``, four vectors of the half
width), ``lambda_init = 0.8 - 0.6 exp(-0.3 depth)`` grows with the block's index, and each head's output
goes through an RMSNorm (``sub_norm``) and a ``1 - lambda_init`` scale before the heads are joined.
The half-heads are interleaved as timm has them: the projection's query rows ``[h0a | h0b | h1a | ...]``.

Because its rows are a difference of two distributions (each row sums to ``1 - lambda``, and may hold
negative weights), the maps ``return_attention`` gives are no distributions: :mod:`vitkit.inspect`'s
rollout and attention distance refuse such models instead of renormalising them into something else (its
report leaves those figures out and says why).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .layers import AttentionParts
from .mlp import Linear
from .norms import NormFactory, RmsNorm


def lambda_init_at(depth: int) -> float:
    """The paper's lambda_init for the block at index ``depth`` (0.2 at the first, towards 0.8)."""
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


def add_differential_parts(module: nn.Module, head_dim: int, depth: int) -> None:
    """Give ``module`` the learned lambda vectors and the per-head RMSNorm under timm's names
    (``lambda_q1``, ``lambda_k1``, ``lambda_q2``, ``lambda_k2``, ``sub_norm``), initialised as timm does."""
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
        setattr(module, name, nn.Parameter(torch.empty(head_dim).normal_(0.0, 0.1)))
    module.sub_norm = RmsNorm(2 * head_dim, eps=1e-5)
    module.lambda_init = lambda_init_at(depth)


def differential_lambda(module: nn.Module) -> torch.Tensor:
    """The scalar lambda of a module made by :func:`add_differential_parts` (computed in fp32)."""
    first = torch.exp(torch.sum(module.lambda_q1 * module.lambda_k1, dim=-1).float())
    second = torch.exp(torch.sum(module.lambda_q2 * module.lambda_k2, dim=-1).float())
    return first - second + module.lambda_init


def differential_mix(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, explicit: bool,
                     dropout: float) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """q, k (B, 2 heads, N, d), v (B, heads, N, 2d) -> the heads' normalised outputs (B, N, heads * 2d) and,
    on the explicit path, the differential maps (B, heads, N, N)."""
    B, H2, N, d = q.shape
    heads = H2 // 2
    lam = differential_lambda(module).to(q.dtype)
    attn = None
    if explicit:
        weights = ((q * d ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
        if dropout:
            weights = F.dropout(weights, dropout)
        weights = weights.view(B, heads, 2, N, N)
        attn = weights[:, :, 0] - lam * weights[:, :, 1]
        x = attn @ v
    else:
        q1, q2 = q.reshape(B, heads, 2, N, d).unbind(2)
        k1, k2 = k.reshape(B, heads, 2, N, d).unbind(2)
        x = F.scaled_dot_product_attention(q1, k1, v, dropout_p=dropout) \
            - lam * F.scaled_dot_product_attention(q2, k2, v, dropout_p=dropout)
    x = module.sub_norm(x) * (1.0 - module.lambda_init)
    return x.transpose(1, 2).reshape(B, N, heads * 2 * d), attn


def split_differential(qkv: torch.Tensor, heads: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Projected queries, keys, values (B, N, D) each -> q, k (B, 2 heads, N, D / 2 heads) and
    v (B, heads, N, D / heads)."""
    q, k, v = qkv
    B, N, D = q.shape
    d = D // heads // 2
    return (q.reshape(B, N, 2 * heads, d).transpose(1, 2), k.reshape(B, N, 2 * heads, d).transpose(1, 2),
            v.reshape(B, N, heads, 2 * d).transpose(1, 2))


class DiffAttention(AttentionParts):
    """Differential self-attention with one fused ``qkv`` projection (timm's ``DiffAttention``: the same
    parameter names). ``depth``: the block's index (it sets lambda_init). ``qk_norm`` normalises each
    half-head's queries and keys, ``inner_norm`` the joined heads before ``proj`` (timm's ``scale_norm``).
    Its parts around the mixing are :class:`~vitkit.models.layers.AttentionParts`', but it is not a kind of
    :class:`~vitkit.models.layers.Attention`: whatever swaps or rewrites standard attention
    (the ONNX export's separate projections) must leave this one as it is."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, impl: str = "auto", depth: int = 0, qk_norm: Optional[NormFactory] = None,
                 inner_norm: Optional[NormFactory] = None, proj_bias: bool = True):
        super().__init__()
        if dim % (2 * num_heads):
            raise ValueError(f"differential attention splits each head in two: width {dim} is not divisible by "
                             f"2 x {num_heads} heads")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads // 2
        self.qkv = Linear(dim, dim * 3, bias=qkv_bias)
        self.add_parts(dim, self.head_dim, impl, attn_drop, proj_drop, qk_norm, inner_norm, proj_bias)
        self.rel_pos = None  # no relative position bias (the config refuses one)
        add_differential_parts(self, self.head_dim, depth)

    def forward(self, x: torch.Tensor, return_attention: bool = False, bias: Optional[torch.Tensor] = None,
                rope=None):
        if bias is not None or rope is not None:
            raise ValueError("differential attention takes no relative position bias or rotary positions")
        q, k, v = split_differential(self.qkv(x).chunk(3, dim=-1), self.num_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        explicit = return_attention or self._explicit(x)
        x, attn = differential_mix(self, q, k, v, explicit, self.attn_drop if self.training else 0.0)
        return self.finish(x), attn if return_attention else None

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, half_head_dim={self.head_dim}, lambda_init={self.lambda_init:.4f}"


__all__ = ["DiffAttention", "lambda_init_at", "add_differential_parts", "differential_lambda", "differential_mix",
           "split_differential"]
