"""The parallel transformer block of "Scaling Vision Transformers to 22 Billion Parameters" (Dehghani et
al., 2023), as timm builds it (``ParallelScalingBlock``: ``vit_pwee``; with differential attention,
``DiffParallelScalingBlock``: ``vit_dpwee``).

Attention and MLP read the same normalised tokens and their sum is added once:
``x + LS(attn(LN(x)) + mlp(LN(x)))``. One input projection ``in_proj`` computes the MLP's hidden layer and
q, k, v together (rows ``[mlp | q | k | v]``); without q/k/v biases the MLP keeps its own (``mlp_bias``).
The outputs are projected by ``attn_out_proj`` and ``mlp_out_proj``, or, with differential attention, by
one ``out_proj`` over both (timm's layouts, the same names).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .diff_attention import add_differential_parts, differential_mix, split_differential
from .layers import LayerScale, drop_path, explicit_attention, mix_values, xavier_uniform_fan
from .mlp import Linear
from .norms import NormFactory, gelu_layer


class ParallelBlock(nn.Module):
    """``x + DropPath(LS(attn(n) + mlp(n)))`` with ``n = in_norm(x)``. ``depth`` (the block's index) is
    given for differential attention (``differential=True``), which sets its lambda_init."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, norm: NormFactory, qkv_bias: bool = True,
                 gelu: str = "exact", drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 init_values: Optional[float] = None, attn_impl: str = "auto", qk_norm: Optional[NormFactory] = None,
                 proj_bias: bool = True, differential: bool = False, depth: int = 0):
        super().__init__()
        parts = 2 * num_heads if differential else num_heads
        if dim % parts:
            raise ValueError(f"width {dim} is not divisible by {parts} {'half-' if differential else ''}heads")
        self.num_heads, self.mlp_dim, self.impl, self.differential = num_heads, mlp_dim, attn_impl, differential
        self.head_dim = dim // parts
        self.in_norm = norm(dim)
        self.in_proj = Linear(dim, mlp_dim + 3 * dim, bias=qkv_bias)
        self.mlp_bias = None if qkv_bias else nn.Parameter(torch.zeros(mlp_dim))
        self.q_norm = qk_norm(self.head_dim) if qk_norm is not None else None
        self.k_norm = qk_norm(self.head_dim) if qk_norm is not None else None
        self.attn_drop = float(attn_drop)
        self.mlp_act = gelu_layer(gelu)
        self.mlp_drop = nn.Dropout(drop) if drop > 0 else None
        if differential:
            add_differential_parts(self, self.head_dim, depth)
            self.out_proj = Linear(dim + mlp_dim, dim, bias=proj_bias)
        else:
            self.attn_out_proj = Linear(dim, dim, bias=proj_bias)
            self.mlp_out_proj = Linear(mlp_dim, dim, bias=proj_bias)
        self.ls = LayerScale(dim, init_values) if init_values is not None else None
        self.drop_path = float(drop_path)

    def forward(self, x: torch.Tensor, return_attention: bool = False, attn_bias: Optional[torch.Tensor] = None,
                rope=None):
        if attn_bias is not None or rope is not None:
            raise ValueError("the parallel block takes no relative position bias or rotary positions")
        B, N, D = x.shape
        h, q, k, v = self.in_proj(self.in_norm(x)).split([self.mlp_dim, D, D, D], dim=-1)
        if self.mlp_bias is not None:
            h = h + self.mlp_bias
        explicit = return_attention or explicit_attention(self.impl, x, self.in_proj.weight)
        dropout = self.attn_drop if self.training else 0.0
        if self.differential:
            q, k, v = split_differential((q, k, v), self.num_heads)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            a, attn = differential_mix(self, q, k, v, explicit, dropout)
        else:
            q, k, v = (t.reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            a, attn = mix_values(q, k, v, explicit, dropout)
            a = a.transpose(1, 2).reshape(B, N, D)
        h = self.mlp_act(h)
        if self.mlp_drop is not None:
            h = self.mlp_drop(h)
        y = self.out_proj(torch.cat((a, h), dim=-1)) if self.differential \
            else self.attn_out_proj(a) + self.mlp_out_proj(h)
        if self.ls is not None:
            y = self.ls(y)
        return x + drop_path(y, self.drop_path, self.training), attn if return_attention else None

    @torch.no_grad()
    def init_weights_(self) -> None:
        """The official ViT rule of :func:`~vitkit.models.layers.init_block_` on this layout: Xavier-uniform
        kernels per part (the MLP's hidden rows, then q, k and v as D x D each; each output projection),
        zero attention biases, N(0, 1e-6) MLP biases."""
        D = self.in_proj.in_features
        hidden, *qkv = self.in_proj.weight.split([self.mlp_dim, D, D, D])
        xavier_uniform_fan(hidden, D, self.mlp_dim)
        for part in qkv:
            xavier_uniform_fan(part, D, D)
        if self.in_proj.bias is not None:
            nn.init.normal_(self.in_proj.bias[:self.mlp_dim], std=1e-6)
            nn.init.zeros_(self.in_proj.bias[self.mlp_dim:])
        if self.mlp_bias is not None:
            nn.init.normal_(self.mlp_bias, std=1e-6)
        outs = [self.out_proj] if self.differential else [self.attn_out_proj, self.mlp_out_proj]
        for out in outs:
            xavier_uniform_fan(out.weight, out.in_features, D)
            if out.bias is not None:
                nn.init.zeros_(out.bias)


__all__ = ["ParallelBlock"]
