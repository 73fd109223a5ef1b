"""CoCa's image tower (Yu et al. 2022, "CoCa: Contrastive Captioners are Image-Text Foundation Models"), as
open_clip builds it: a CLIP ViT whose readout is an attentional pooler.

open_clip's ``AttentionalPooler`` reads the last block's tokens (the class token too) with ``coca_queries``
learned queries (256) of the joint width (``coca_dim``: 512 for ViT-B/32, 768 for ViT-L/14) through one
cross-attention layer (``nn.MultiheadAttention`` with ``kdim``/``vdim`` the tower's width, LayerNorms on the
queries, ``ln_q``, and on the tokens, ``ln_k``). Its ``ln_post`` normalises the pooled queries, and the first
one, times ``proj``, is the image embedding. The queries do not attend to each other, so the first query's
output is computed alone here. The other 255 feed CoCa's text decoder, which vitkit does not build. All of them
are kept, so a checkpoint loads and saves whole.

vitkit's names: ``attn_pool.query``, ``attn_pool.ln_q``, ``attn_pool.ln_k``, ``attn_pool.q`` / ``k`` / ``v``
(open_clip's ``q_proj_weight``, ... and ``in_proj_bias``), ``attn_pool.proj`` (its ``out_proj``), ``fc_norm``
(``ln_post``, of the joint width) and ``head`` (``proj``, with a zero bias). No timm or transformers class
holds this pooler: the family is written as vitkit's own layout only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Collection, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .complexity import count_params
from .config_base import _is_int
from .layers import norm_factory, to_2tuple
from .registry import Family, register_family
from .vit import HEADS_BY_WIDTH, VisionTransformer, ViTConfig, vit_complexity, vit_fields
from .vit_names import CLIP


@dataclass
class CoCaConfig(ViTConfig):
    """A ViT read out by CoCa's attentional pooler (see the module notes)."""

    KIND: ClassVar[str] = "CoCa"
    POOLS: ClassVar[Tuple[str, ...]] = ("coca",)

    architecture: str = "coca"
    global_pool: str = "coca"
    #: open_clip's LayerNorm and CLIP's statistics, whole images (every CoCa tower is open_clip's)
    norm_eps: float = 1e-5
    mean: Tuple[float, ...] = CLIP["mean"]
    std: Tuple[float, ...] = CLIP["std"]
    crop_pct: float = 1.0
    #: the pooler reads every token, the class token too
    pool_include_prefix: bool = True
    #: the queries' width (open_clip's ``embed_dim``, the joint space's); None: the tower's width
    coca_dim: Optional[int] = None
    #: open_clip's ``attn_pooler_queries`` and ``attn_pooler_heads``
    coca_queries: int = 256
    coca_heads: int = 8

    @property
    def pool_width(self) -> int:
        return self.coca_dim or self.embed_dim

    def family_problems(self) -> List[str]:
        problems = super().family_problems()
        for name in ("coca_queries", "coca_heads"):
            value = getattr(self, name)
            if not (_is_int(value) and value > 0):
                problems.append(f"{name} must be a positive integer, got {value!r}")
        dim = self.coca_dim
        if dim is not None and not (_is_int(dim) and dim > 0):
            problems.append(f"coca_dim must be a positive integer or null, got {dim!r}")
        elif _is_int(self.coca_heads) and self.coca_heads > 0 and isinstance(self.pool_width, int) \
                and self.pool_width % self.coca_heads:
            problems.append(f"coca_dim {self.pool_width} is not divisible by the pooler's {self.coca_heads} heads")
        if self.distill_token or self.representation_size or self.reg_tokens or not self.class_token:
            problems.append("CoCa's tower has a class token and no distillation token, registers or pre-logits")
        if not self.pool_include_prefix:
            problems.append("CoCa's pooler reads every token (pool_include_prefix=True)")
        return problems


class QueryPool(nn.Module):
    """open_clip's ``AttentionalPooler``, its first query's output only: (B, N, C) tokens -> (B, dim)."""

    def __init__(self, dim: int, context_dim: int, num_heads: int, num_queries: int, eps: float):
        super().__init__()
        self.num_heads = num_heads
        self.query = nn.Parameter(torch.zeros(num_queries, dim))
        self.ln_q, self.ln_k = nn.LayerNorm(dim, eps=eps), nn.LayerNorm(context_dim, eps=eps)
        self.q, self.proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.k, self.v = nn.Linear(context_dim, dim), nn.Linear(context_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        h = self.num_heads
        x = self.ln_k(x)
        q = self.q(self.ln_q(self.query[:1])).expand(B, -1, -1)  # each query is normalised on its own
        q = q.reshape(B, 1, h, -1).transpose(1, 2)
        k, v = (proj(x).reshape(B, N, h, -1).transpose(1, 2) for proj in (self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(B, -1))


class CoCa(VisionTransformer):
    """A ViT whose pooled output is CoCa's first query (see the module notes)."""

    config_cls = CoCaConfig

    def __init__(self, config: Optional[CoCaConfig] = None, **overrides: Any):
        super().__init__(config, **overrides)
        cfg = self.config
        self.attn_pool = QueryPool(cfg.pool_width, cfg.embed_dim, cfg.coca_heads, cfg.coca_queries, cfg.norm_eps)
        self.fc_norm = norm_factory(cfg.norm, cfg.norm_eps)(cfg.pool_width) if cfg.final_norm else nn.Identity()
        self.norm = nn.Identity()  # ln_post comes after the pooler
        if next(self.patch_embed.parameters()).device.type != "meta":
            nn.init.trunc_normal_(self.attn_pool.query, std=cfg.pool_width ** -0.5)

    def pooled_width(self, global_pool: str) -> int:
        return self.config.pool_width

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        if global_pool not in (None, "coca"):
            raise ValueError("CoCa's readout is its attentional pooler (global_pool='coca'); it cannot be changed")
        super().reset_classifier(num_classes)


# ----------------------------------------------------------------------------- the family description


def is_coca_state_dict(keys: Collection[str]) -> bool:
    return "attn_pool.query" in keys and "attn_pool.ln_k.weight" in keys and "patch_embed.proj.weight" in keys


def infer_coca_config(sd: Mapping[str, Any], **overrides: Any) -> CoCaConfig:
    """The tower off its shapes, with open_clip's defaults for what no tensor holds (said by
    :func:`vitkit.weights.guesses.note_guesses`): the pooler's 8 heads, eps 1e-5, exact GELU. A head of the
    queries' width is the image-text projection."""
    size = overrides.get("img_size")
    kw = vit_fields(sd, to_2tuple(size) if size is not None else None)
    queries, dim = (int(s) for s in sd["attn_pool.query"].shape)
    kw.update(global_pool="coca", fc_norm=None, final_norm="fc_norm.weight" in sd, coca_dim=dim, coca_queries=queries,
              num_heads=HEADS_BY_WIDTH.get(kw["embed_dim"], max(1, kw["embed_dim"] // 64)), norm_eps=1e-5,
              head_kind="projection" if kw["num_classes"] == dim else "classes")
    kw.update(overrides)
    return CoCaConfig(**kw)


def coca_complexity(config: CoCaConfig):
    """The ViT's cost read out by its class token, with the pooler's (its first query: the tokens' keys and
    values, one query) and the head's input width for it; the parameters counted on CoCa's own model."""
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(ViTConfig) if f.name != "architecture"}
    base = vit_complexity(ViTConfig(**{**fields, "global_pool": "token", "pool_include_prefix": False}))
    n, C, d = base.tokens, config.embed_dim, config.pool_width
    pool = 2 * n * C * d + 2 * n * d + 2 * d * d + config.num_classes * (d - C)
    return dataclasses.replace(base, macs=base.macs + pool, params=count_params(config),
                               attn_macs_share=base.attn_macs_share * base.macs / (base.macs + pool))


FAMILY = register_family(Family(
    name="coca", config_cls=CoCaConfig, model_cls=CoCa, complexity=coca_complexity, matches=is_coca_state_dict,
    infer_config=infer_coca_config, detect_priority=6, layouts=()))


def check_open_clip_pool(vision: Mapping[str, Any]) -> Optional[str]:
    """Why an open_clip ``vision_cfg``'s attentional pool is not CoCa's original one (None: it is)."""
    kind = vision.get("attentional_pool")
    if isinstance(kind, str):
        return (f"an open_clip vision_cfg with attentional_pool {kind!r} (a second, contrastive pooler: open_clip "
                f"calls it untested, and no pre-trained config sets it) is not one vitkit reads")
    return None


__all__ = ["CoCa", "CoCaConfig", "QueryPool", "check_open_clip_pool"]
