"""The ViT paper's analyses (section 4.5, Fig. 6, 7, 11) as functions of a model.

Every function works for any ViT-family model of vitkit: with or without prefix tokens
(class, distillation), square or not, with fused attention on -- the attention weights come
from the explicit path, which runs only inside these calls (``model(x, return_attention=True)``)
and computes the same logits. Layers that run before the prefix tokens join (ConViT's GPSA
layers, whose class token is concatenated after them) give patch-only maps: their prefix count
is the map's size minus the patches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from ..models.layers import in_eval_mode
from ..utils import positive_whole

HEAD_FUSIONS = ("mean", "max", "min")


@in_eval_mode
@torch.no_grad()
def attention_maps(model: nn.Module, images: torch.Tensor) -> List[torch.Tensor]:
    """Per layer, the attention weights (B, heads, N, N) over [prefix tokens + patches].

    N is the layer's own token count: patches only for layers that run before the prefix
    tokens are added (ConViT's GPSA layers), prefix tokens first otherwise.

    Rows are queries, columns keys; each row sums to 1. The model is put in eval mode for
    the call (no attention dropout) and restored afterwards. A model whose maps are no distributions
    (:func:`maps_not_distributions`: differential attention, CaiT's talking heads) is refused: the
    analyses built on these maps would misread them (CaiT's attention distance came out at 1e12 px).
    """
    if why := maps_not_distributions(model):
        raise ValueError(f"the attention analyses need maps whose rows are distributions; {why}")
    _check_batch(images)
    _, attns = model(images, return_attention=True)
    return [a.float() for a in attns]


def _check_batch(images: Any) -> None:
    """A batch of at least one image: none gave 0 px of attention distance, NaN shares, or torch's reshape error."""
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.shape[0] == 0:
        got = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"images must be a (batch, channels, height, width) tensor of one image or more, got {got}")


def maps_not_distributions(model: nn.Module) -> Optional[str]:
    """Why the model's attention maps are no distributions (None: they are): differential attention mixes values
    by a difference of two softmax maps; talking heads (CaiT) mix the heads' weights after the softmax."""
    if any(hasattr(m, "lambda_q1") for m in model.modules()):
        return ("this model's differential attention mixes values by a difference of two softmax maps (rows sum "
                "to 1 - lambda, some weights negative)")
    if any(hasattr(m, "proj_w") and hasattr(m, "proj_l") for m in model.modules()):
        return ("this model's talking-heads attention (CaiT's) mixes the heads' weights after the softmax (rows "
                "do not sum to 1, some weights negative)")
    return None


def _fuse_heads(attn: torch.Tensor, head_fusion: str) -> torch.Tensor:
    if head_fusion == "mean":
        return attn.mean(dim=1)
    if head_fusion == "max":
        return attn.amax(dim=1)
    return attn.amin(dim=1)


@torch.no_grad()
def attention_rollout(model: nn.Module, images: torch.Tensor, head_fusion: str = "mean",
                      discard_ratio: float = 0.0, maps: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
    """Abnar & Zuidema's attention rollout -> (B, grid_h, grid_w), as the ViT paper used it.

    Per layer: fuse the heads, drop the weakest ``discard_ratio`` of each row's weights (the
    query's own weight is kept), add the identity for the residual path, renormalise rows;
    then multiply the layers from first to last. The map is the row of what the readout reads over
    the patches: the class token's (a distilled DeiT's: the mean of its class and distillation tokens' rows,
    as its two heads are averaged), or with global average pooling (and a MAP head, whose learned query
    is not in the rollout) the mean of the patch rows: the pooled representation draws on every patch
    token equally. Each map is normalised to sum 1 over the patches that the rollout reaches (prefix
    mass removed). ``maps``: the images' :func:`attention_maps`, where the caller has them (one forward pass
    for the rollout and the distance: 31 s an image for SAM's ViT-B at 1,024 px).
    """
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}")
    if not isinstance(discard_ratio, (int, float)) or isinstance(discard_ratio, bool) or not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1), got {discard_ratio}")
    attns = attention_maps(model, images) if maps is None else maps
    B, N = attns[-1].shape[0], attns[-1].shape[-1]
    eye = torch.eye(N, device=attns[-1].device)
    rollout = eye.expand(B, N, N).clone()
    for attn in attns:
        a = _fuse_heads(attn, head_fusion)
        if a.shape[-2] != a.shape[-1]:
            # Class attention (CaiT): only the class token's row is updated; with the
            # residual path and renormalised, the other tokens carry themselves through.
            row = a[:, 0] + eye[0, N - a.shape[-1]:]
            full = eye.expand(B, N, N).clone()
            full[:, 0, N - a.shape[-1]:] = row / row.sum(dim=-1, keepdim=True)
            rollout = full @ rollout
            continue
        n = a.shape[-1]
        own_eye = eye[N - n:, N - n:]
        if discard_ratio > 0:
            k = int(n * discard_ratio)
            if k:
                threshold = a.kthvalue(k, dim=-1, keepdim=True).values
                a = torch.where((a <= threshold) & (own_eye == 0), torch.zeros_like(a), a)
        a = a + own_eye
        a = a / a.sum(dim=-1, keepdim=True)
        if n < N:
            # A layer before the prefix tokens join (ConViT's GPSA): they are not in the
            # sequence yet, so they carry only themselves (identity rows) through it.
            full = eye.expand(B, N, N).clone()
            full[:, N - n:, N - n:] = a
            a = full
        rollout = a @ rollout
    prefix = model.num_prefix_tokens
    gh, gw = model.patch_embed.grid_for(images.shape[-2:])
    patches = _readout_rows(model, rollout)[:, prefix:]
    patches = patches / patches.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    return patches.reshape(B, gh, gw)


def _readout_rows(model: nn.Module, rollout: torch.Tensor) -> torch.Tensor:
    """The rollout's rows of the tokens the model's readout reads (B, N): the class token's, the mean of the
    patch tokens' (global average pooling, with the prefix tokens where it includes them; a patch mean beside a
    class token was read as the class token's: CLIPA's towers), both halves of a class token beside the mean, and
    a distilled DeiT's class and distillation tokens' rows averaged, as its heads are."""
    prefix, config = model.num_prefix_tokens, getattr(model, "config", None)
    pool = getattr(config, "global_pool", "token")
    mean = rollout[:, (0 if getattr(config, "pool_include_prefix", False) else prefix):].mean(dim=1)
    if getattr(model, "head_dist", None) is not None:  # DeiT: the class and distillation tokens' heads, averaged
        return (rollout[:, 0] + rollout[:, 1]) / 2
    if model.cls_token is None or pool in ("avg", "map"):
        return mean
    return (rollout[:, 0] + mean) / 2 if pool == "token_avg" else rollout[:, 0]


def patch_distances(grid: Tuple[int, int], patch_size: Tuple[int, int]) -> torch.Tensor:
    """(gh*gw, gh*gw) Euclidean distances in pixels between patch centres."""
    gh, gw = grid
    ys, xs = torch.meshgrid(torch.arange(gh) * float(patch_size[0]), torch.arange(gw) * float(patch_size[1]),
                            indexing="ij")
    centres = torch.stack([ys.reshape(-1), xs.reshape(-1)], dim=-1)
    return torch.cdist(centres, centres)


@torch.no_grad()
def mean_attention_distance(model: nn.Module, images: torch.Tensor,
                            maps: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
    """(layers, heads) mean attention distance in pixels (the paper's Fig. 7 right, Fig. 11).

    For each patch query, the distance in the image to every patch key weighted by the
    attention, averaged over queries and images. Prefix tokens have no place in the image:
    their rows and columns are dropped and each patch row renormalised over the patches (in
    float64: a query that gives a register almost all its attention still has a distance; one
    that gives the patches none is left out).
    CaiT's class-attention layers have no patch queries and are left out (one row per
    self-attention layer). ``maps``: the images' :func:`attention_maps`, where the caller has them.
    """
    grid = model.patch_embed.grid_for(images.shape[-2:])
    dist = patch_distances(grid, model.patch_embed.patch_size).to(images.device)
    out = []
    for attn in attention_maps(model, images) if maps is None else maps:
        if attn.shape[-2] != attn.shape[-1]:
            continue  # class attention (CaiT): no patch queries, no distance to measure
        prefix = attn.shape[-1] - grid[0] * grid[1]  # 0 for layers before the prefix tokens join
        a = attn[:, :, prefix:, prefix:].double()  # float64: a row's patch mass can be 1e-13 (a register sink)
        mass = a.sum(dim=-1, keepdim=True)
        held = (mass > 0).squeeze(-1)  # a query attending to no patch at all has no distance: left out
        each = (a * dist).sum(dim=-1) / mass.squeeze(-1).clamp_min(torch.finfo(torch.float64).tiny)
        out.append(((each * held).sum(dim=(0, 2)) / held.sum(dim=(0, 2)).clamp_min(1)).float())
    return torch.stack(out)


def no_table_why(model: nn.Module) -> str:
    """How a model without a position table knows where its patches are, in words (a RoPE model was said to have
    pos_embed='none', as if it knew nothing of position)."""
    config = getattr(model, "config", None)
    rope, kind = getattr(config, "rope", None), getattr(config, "pos_embed", None)
    if rope not in (None, "none"):
        return f"its positions are rotary ({rope} RoPE), applied to queries and keys inside attention"
    if kind in ("relative", "relative_mlp"):
        return f"its positions are relative biases ({kind}) added inside attention"
    return f"it has no position embedding (pos_embed={kind or getattr(model, 'pos_embed_kind', 'none')!r})"


@torch.no_grad()
def pos_embed_similarity(model: nn.Module) -> torch.Tensor:
    """(gh, gw, gh, gw) cosine similarity between the position embeddings of patches (Fig. 7 centre).

    ``[i, j]`` is the map of patch (i, j)'s similarity to every patch. Works for learned
    (1D table), learned 2D and sine-cosine embeddings; a model without position embeddings
    has nothing to compare and raises.
    """
    grid = tuple(model.patch_embed.grid_size)
    pos = model.patch_pos_embed(grid)
    if pos is None:
        raise ValueError(f"the model has no position embedding table to compare: {no_table_why(model)}")
    pos = pos.reshape(-1, pos.shape[-1]).float()
    pos = pos / pos.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    sim = pos @ pos.T
    return sim.reshape(*grid, *grid)


@torch.no_grad()
def embedding_filters(model: nn.Module) -> torch.Tensor:
    """The filters that look at pixels: the patch projection (D, C, P, P) of a plain ViT; for a
    hybrid, whose projection sees CNN features, the CNN's first convolution (as it is applied:
    weight-standardised where the layer standardises)."""
    backbone, own = getattr(model.patch_embed, "backbone", None), getattr(model.patch_embed, "filters", None)
    if own is not None:  # (a linear projection over the flattened patches: Gemma 4's, as filters)
        return own().detach().float()
    if backbone is None:
        return model.patch_embed.proj.weight.detach().float()
    first = next(m for m in backbone.modules() if isinstance(m, nn.Conv2d))
    weight = first.standardized_weight() if hasattr(first, "standardized_weight") else first.weight
    return weight.detach().float()


def embedding_filters_pca(model: nn.Module, k: int = 28) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-k principal components of the patch-embedding filters (Fig. 7 left).

    The filters (:func:`embedding_filters`), each a flattened C x P x P vector, are centred
    and decomposed; returns the components as (k, C, P, P) images (unit norm, orthogonal)
    and the fraction of the variance each explains (sorted, summing to <= 1).
    """
    if not positive_whole(k):  # (-1 sliced from the end, 0 gave nothing)
        raise ValueError(f"k (the components shown) must be a positive integer, not {k!r}")
    weight = embedding_filters(model)  # (D, C, P, P)
    D = weight.shape[0]
    flat = weight.reshape(D, -1)
    flat = flat - flat.mean(dim=0, keepdim=True)
    k = min(k, flat.shape[0], flat.shape[1])
    _, s, vh = torch.linalg.svd(flat, full_matrices=False)
    variance = s ** 2
    explained = variance / variance.sum().clamp_min(1e-12)
    return vh[:k].reshape(k, *weight.shape[1:]), explained[:k]


@torch.no_grad()
def convit_gates(model: nn.Module) -> torch.Tensor:
    """(GPSA layers, heads) gate values lambda = sigmoid(gating_param) of a ConViT.

    lambda near 1: the head attends by position (the convolution-like prior); near 0: by
    content. The ConViT paper's Fig. 6 plots them against depth: late GPSA layers escape
    locality. Raises for models without gated positional attention.
    """
    params = [blk.attn.gating_param for blk in getattr(model, "blocks", [])
              if hasattr(getattr(blk, "attn", None), "gating_param")]
    if not params:
        raise ValueError(f"{type(model).__name__} has no gated positional self-attention (GPSA) layers: "
                         f"gates exist in ConViT models only")
    return torch.stack([torch.sigmoid(p.detach().float()) for p in params]).cpu()


# ----------------------------------------------------------------------------- registers (Darcet et al. 2024)

#: Tukey's "far out" fence: a token norm above Q3 + 3 IQR of the patch tokens' norms is an outlier
OUTLIER_IQR = 3.0


@dataclass
class TokenNorms:
    """The L2 norm of every token after the last block (before the final norm), the quantity "Vision
    Transformers Need Registers" plots: ``patches`` (B, gh, gw), ``prefix`` (B, P) for the class,
    distillation and register tokens (in that order), the fence above which a patch is an outlier and
    the outlier mask (B, gh, gw)."""

    patches: torch.Tensor
    prefix: torch.Tensor
    fence: float
    outliers: torch.Tensor

    @property
    def outlier_share(self) -> float:
        return float(self.outliers.float().mean())


@in_eval_mode
@torch.no_grad()
def token_norms(model: nn.Module, images: torch.Tensor, fence: float = None) -> TokenNorms:
    """Token norms of ``images`` after the last block (:class:`TokenNorms`). Darcet et al. found a few
    patch tokens with norms ~10x the rest in large ViTs trained without registers, holding global
    information, and none with registers. The fence is Q3 + 3 IQR of these images' patch norms unless
    given (compare models by one fence)."""
    _check_batch(images)
    if fence is not None and (not isinstance(fence, (int, float)) or isinstance(fence, bool)
                              or not math.isfinite(fence)):
        raise ValueError(f"fence must be a finite number (a token norm), not {fence!r}")  # (NaN: no outlier, ever)
    out, = model.forward_intermediates(images, indices=[len(model.blocks) - 1], norm=False, output_fmt="NCHW",
                                       return_prefix_tokens=True, intermediates_only=True)
    # a model without prefix tokens gives the maps alone, as timm's does
    tokens, prefix = out if isinstance(out, tuple) else (out, out.new_zeros(out.shape[0], 0, out.shape[1]))
    norms = tokens.float().norm(dim=1)  # (B, gh, gw)
    if fence is None:
        q1, q3 = torch.quantile(norms.flatten(), torch.tensor([0.25, 0.75], device=norms.device)).tolist()
        fence = q3 + OUTLIER_IQR * (q3 - q1)
    return TokenNorms(norms.cpu(), prefix.float().norm(dim=-1).cpu(), float(fence), (norms > fence).cpu())


@torch.no_grad()
def prefix_attention(model: nn.Module, images: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Per layer, the share of the patch queries' attention (heads and images averaged) that goes to the
    class token (``class``) and to the register tokens (``registers``), (layers,) each: where attention
    parks what the registers are for. Layers without those tokens (ConViT's GPSA) give 0."""
    cls = int(getattr(model, "cls_token", None) is not None)
    dist = int(getattr(model, "dist_token", None) is not None)
    regs = int(getattr(getattr(model, "config", None), "reg_tokens", 0) or 0)
    grid = model.patch_embed.grid_for(images.shape[-2:])
    out = {"class": [], "registers": []}
    for attn in attention_maps(model, images):
        if attn.shape[-2] != attn.shape[-1]:
            continue  # class attention (CaiT): no patch queries
        prefix = attn.shape[-1] - grid[0] * grid[1]
        rows = attn[:, :, prefix:]  # patch queries
        out["class"].append(rows[..., :cls].sum(-1).mean() if prefix and cls else torch.zeros(()))
        start = cls + dist
        out["registers"].append(rows[..., start:start + regs].sum(-1).mean() if prefix and regs else torch.zeros(()))
    return {k: torch.stack(v).cpu() for k, v in out.items()}
