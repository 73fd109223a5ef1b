"""Figures of the analyses (matplotlib, off-screen): each function writes one PNG and returns its path."""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..files import PathLike
from ..utils import pyplot, save_png


def _save(fig, path: PathLike) -> Path:
    """Figures here are trimmed to their content (``bbox_inches='tight'``)."""
    return save_png(fig, path, bbox_inches="tight")


#: a map whose spread is within this share of its largest value is drawn flat: stretched to the full colour
#: range, rounding noise (a spread of 6e-7 of a uniform rollout) was drawn as a strong pattern
FLAT = 1e-3


def is_flat(grid_map: torch.Tensor) -> bool:
    """Whether a map's values are all alike (within :data:`FLAT` of its largest)."""
    high, low = grid_map.max().item(), grid_map.min().item()
    return high - low <= FLAT * max(abs(high), abs(low), 1e-12)


def _upsample(grid_map: torch.Tensor, size: Sequence[int]) -> np.ndarray:
    """The map at ``size``, stretched to [0, 1] (all ones where it is flat)."""
    m = torch.nn.functional.interpolate(grid_map[None, None].float(), size=tuple(size), mode="bilinear",
                                        align_corners=False)[0, 0]
    if is_flat(grid_map):
        return np.ones(tuple(size), dtype=np.float32)
    m = m - m.min()
    return (m / m.max().clamp_min(1e-12)).numpy()


def covered_pixels(config, grid: Sequence[int]) -> Optional[Tuple[int, int]]:
    """The top-left pixels a model's patches read (``crop_remainder``: the last partial row and column of patches
    are dropped), or None where they cover the image."""
    if not getattr(config, "crop_remainder", False) or getattr(config, "backbone", None) is not None:
        return None  # (a hybrid takes the flag and reads every pixel through its CNN)
    return grid[0] * config.patch_size[0], grid[1] * config.patch_size[1]


def rollout_overlay(image: np.ndarray, rollout: torch.Tensor, path: PathLike, title: str = "",
                    covered: Optional[Tuple[int, int]] = None) -> Path:
    """The image, the rollout map, and the image weighted by the map (the paper's Fig. 6); ``covered``: the
    pixels the patches read (:func:`covered_pixels`): the map is placed over them, the margin shown unread."""
    plt = pyplot()
    h, w = image.shape[:2]
    ch, cw = covered or (h, w)
    heat = np.full((h, w), np.nan, dtype=np.float32)
    heat[:ch, :cw] = _upsample(rollout, (ch, cw))
    fig, axes = plt.subplots(1, 3, figsize=(9, 3.2))
    cmap = "gray" if image.ndim == 2 else None
    axes[0].imshow(image, cmap=cmap)
    axes[0].set_title("input")
    shown = plt.get_cmap("inferno").copy()
    shown.set_bad("#9a9a9a")  # (a margin no patch reads)
    axes[1].imshow(np.ma.masked_invalid(heat), cmap=shown, vmin=0, vmax=1)
    flat = is_flat(rollout)
    axes[1].set_title("attention rollout" + (" (flat: every patch alike)" if flat else "")
                      + ("\n(grey: pixels no patch reads)" if (ch, cw) != (h, w) else ""), fontsize=9)
    weight = np.nan_to_num(heat, nan=0.0)
    weighted = image.astype(np.float32) / 255.0 * (weight if image.ndim == 2 else weight[..., None])
    axes[2].imshow(weighted, cmap=cmap)
    axes[2].set_title("input x rollout")
    for ax in axes:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def class_attention_per_layer(maps: List[torch.Tensor], grid: Sequence[int], prefix: int, class_row: bool,
                              path: PathLike, image: int = 0) -> Path:
    """Per layer, where the class token (``class_row``; else the average patch) looks, heads averaged.

    A layer whose map has no prefix tokens (ConViT's GPSA layers, before the class token
    joins) shows its average patch row, titled "(patches)".
    """
    plt = pyplot()
    L = len(maps)
    cols = min(L, 6)
    rows = math.ceil(L / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2 * cols, 2.1 * rows), squeeze=False, layout="constrained")
    for layer, attn in enumerate(maps):
        a = attn[image].mean(dim=0)  # heads averaged: (N, N)
        own = min(prefix, a.shape[-1] - grid[0] * grid[1])  # this layer's prefix tokens
        by_class = class_row and own > 0
        row = a[0, own:] if by_class else a[own:, own:].mean(dim=0)
        ax = axes[layer // cols][layer % cols]
        ax.imshow(row.reshape(*grid).numpy(), cmap="viridis")
        ax.set_title(f"layer {layer + 1}" + ("" if by_class or not class_row else " (patches)"), fontsize=9)
    for ax in axes.flat:
        ax.axis("off")
    fig.suptitle("class-token attention per layer" if class_row else "mean patch attention per layer")
    return _save(fig, path)


def attention_distance_scatter(distance: torch.Tensor, path: PathLike, image_size: int = 0,
                               uniform: float = 0.0) -> Path:
    """Mean attention distance of every head against depth (the paper's Fig. 7 right); with
    ``uniform``, a dashed line where attention spread evenly over all patches would sit."""
    plt = pyplot()
    L, H = distance.shape
    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    for head in range(H):
        ax.scatter(np.arange(1, L + 1), distance[:, head].numpy(), s=14, label=f"head {head + 1}")
    if uniform:
        ax.axhline(uniform, color="gray", linestyle="--", linewidth=1, label="uniform attention")
    ax.set_xticks(range(1, L + 1))
    ax.set_xlabel("network depth (layer)")
    ax.set_ylabel("mean attention distance (pixels)")
    if image_size:
        ax.set_ylim(0, image_size)
    if H <= 16:
        ax.legend(fontsize=6, ncol=2, loc="lower right")
    ax.set_title("attention distance by head and layer")
    return _save(fig, path)


def convit_gates_plot(gates: torch.Tensor, path: PathLike) -> Path:
    """Gate value lambda of every head against the GPSA layer (the ConViT paper's Fig. 6):
    1 = attends by position (the convolutional prior), 0 = by content; dashed at the
    initial sigmoid(1)."""
    plt = pyplot()
    L, H = gates.shape
    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    layers = np.arange(1, L + 1)
    for head in range(H):
        ax.plot(layers, gates[:, head].numpy(), marker="o", markersize=4, linewidth=0.8, label=f"head {head + 1}")
    ax.plot(layers, gates.mean(dim=1).numpy(), color="black", linewidth=2, label="mean")
    ax.axhline(1 / (1 + math.exp(-1)), color="gray", linestyle="--", linewidth=1, label="at initialisation")
    ax.set_xticks(range(1, L + 1))
    ax.set_ylim(0, 1)
    ax.set_xlabel("GPSA layer")
    ax.set_ylabel("gate $\\lambda$ = sigmoid(gating_param)")
    if H <= 16:
        ax.legend(fontsize=6, ncol=2, loc="lower left")
    ax.set_title("positional vs content attention per head")
    return _save(fig, path)


#: the most tiles a side of the position-similarity figure draws (a 64 x 64 grid, SAM's at 1,024 px, drew 4,096
#: tiles into a 59-inch figure, most of a 10-minute inspection and a report of tens of megabytes)
MAX_TILES = 16


def pos_embed_similarity_grid(sim: torch.Tensor, path: PathLike) -> Path:
    """For each patch position, its cosine similarity to every other (the paper's Fig. 7 centre): one tile a
    position, the tiles laid out as the grid, drawn as one image (a subplot a tile took 0.4 s at 7x7 and
    seconds at ViT-B/16's 14x14); past :data:`MAX_TILES` a side, tiles of evenly spaced positions."""
    plt = pyplot()
    gh, gw = sim.shape[:2]
    rows, cols = (np.unique(np.linspace(0, n - 1, min(n, MAX_TILES)).round().astype(int)) for n in (gh, gw))
    gap = max(1, round(0.15 * max(gh, gw)))  # pixels of background between tiles
    mosaic = np.full((len(rows) * (gh + gap) - gap, len(cols) * (gw + gap) - gap), np.nan, dtype=np.float32)
    for a, i in enumerate(rows):
        for b, j in enumerate(cols):
            top, left = a * (gh + gap), b * (gw + gap)
            mosaic[top:top + gh, left:left + gw] = sim[i, j].numpy()
    fig, ax = plt.subplots(figsize=(0.9 * len(cols) + 1.6, 0.9 * len(rows)))
    # one colour scale for all tiles, from the lowest similarity to 1: a fixed -1..1 scale
    # shows smooth (e.g. sine-cosine) embeddings, all above ~0.7, as one flat colour
    low = min(float(sim.min()), 0.99)
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_bad("white")  # the gaps
    shown = ax.imshow(np.ma.masked_invalid(mosaic), cmap=cmap, vmin=low, vmax=1, interpolation="nearest")
    ax.axis("off")
    fig.colorbar(shown, ax=ax, shrink=0.8, label="cosine similarity")
    shown_of = "" if (len(rows), len(cols)) == (gh, gw) else f" ({len(rows)}x{len(cols)} of {gh}x{gw} positions)"
    ax.set_title(f"position embedding similarity{shown_of}")  # (above the tiles: a suptitle sat far above a grid)
    return _save(fig, path)


def filter_pca_grid(components: torch.Tensor, explained: torch.Tensor, path: PathLike,
                    what: str = "the patch-embedding filters") -> Path:
    """The principal components of the patch-embedding filters as images (the paper's Fig. 7 left)."""
    plt = pyplot()
    k = components.shape[0]
    cols = min(k, 7)
    rows = math.ceil(k / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.3 * cols, 1.4 * rows), squeeze=False)
    for n in range(k):
        c = components[n]
        img = c.permute(1, 2, 0).numpy() if c.shape[0] == 3 else c[0].numpy()
        img = (img - img.min()) / max(float(img.max() - img.min()), 1e-12)
        ax = axes[n // cols][n % cols]
        ax.imshow(img, cmap=None if c.shape[0] == 3 else "gray")
        ax.set_title(f"{100 * explained[n]:.1f}%", fontsize=7)
    for ax in axes.flat:
        ax.axis("off")
    fig.suptitle(f"principal components of {what}")
    return _save(fig, path)


def reconstruction_grid(views: dict, path: PathLike, objective: str, names: Sequence[str] = (),
                        note: str = "") -> Path:
    """A pre-training model at work, one image a row: the image, what the model saw (masked patches
    grey) and its prediction (visible patches as they are, masked ones as predicted)."""
    plt = pyplot()
    rows = len(views["image"])
    fig, axes = plt.subplots(rows, 3, figsize=(6.6, 2.25 * rows), squeeze=False)
    what = {"mae": "reconstruction", "simmim": "reconstruction", "mpp": "predicted 3-bit mean colours"}
    for r in range(rows):
        for c, (key, title) in enumerate((("image", "image"), ("masked", "masked input"),
                                          ("prediction", what.get(objective, "prediction")))):
            img = views[key][r].permute(1, 2, 0).cpu().numpy()
            ax = axes[r, c]
            ax.imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap="gray" if img.shape[-1] == 1 else None,
                      vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(title, fontsize=10)
        share = 100 * float(views["mask"][r].float().mean())
        axes[r, 0].set_ylabel(f"{names[r] if r < len(names) else ''}\n{share:.0f}% masked", fontsize=8)
    fig.suptitle(f"{objective}: masked patches and the model's prediction" + (f"\n{note}" if note else ""),
                 fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def token_norm_map(image: np.ndarray, norms: torch.Tensor, outliers: torch.Tensor, all_norms: torch.Tensor,
                   prefix_norms: Sequence[float], prefix_labels: Sequence[str], fence: float, path: PathLike,
                   title: str = "", covered: Optional[Tuple[int, int]] = None) -> Path:
    """"Vision Transformers Need Registers" (Darcet et al. 2024), Fig. 2-3 in one figure: the norm of every
    patch token over the (first) image, on a stated scale, outliers (above ``fence``) crossed out, and the
    histogram of the patch norms of every image with the fence and the first image's prefix tokens' (class,
    registers) norms marked. ``covered``: the pixels the patches read (:func:`covered_pixels`)."""
    plt = pyplot()
    from matplotlib import ticker

    h, w = image.shape[:2]
    ch, cw = covered or (h, w)
    gh, gw = norms.shape
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6))
    axes[0].imshow(image, cmap="gray" if image.ndim == 2 else None)
    drawn = axes[0].imshow(norms.numpy(), cmap="inferno", alpha=0.6, extent=(0, cw, ch, 0), interpolation="nearest")
    axes[0].set_xlim(0, w)
    axes[0].set_ylim(h, 0)
    fig.colorbar(drawn, ax=axes[0], fraction=0.046, pad=0.02).set_label("L2 norm", fontsize=8)  # (autoscaled)
    ys, xs = np.nonzero(outliers.numpy())
    axes[0].scatter((xs + 0.5) * cw / gw, (ys + 0.5) * ch / gh, marker="x", s=60, c="cyan", linewidths=2)
    axes[0].set_title(f"patch token norms, first image ({len(xs)} outlier{'s' if len(xs) != 1 else ''})",
                      fontsize=9)
    axes[0].axis("off")
    counts = axes[1].hist(all_norms.flatten().numpy(), bins=50, color="#555")[0]
    axes[1].axvline(fence, color="cyan", linestyle="--", label=f"outlier fence {fence:.3g}")
    for value, label in zip(prefix_norms, prefix_labels):
        axes[1].axvline(value, color="#d62728" if label.startswith("reg") else "#1f77b4", linewidth=1,
                        label=f"{label} (first image)")
    if counts.max() >= 100 * max(counts[counts > 0].min(), 1):  # rare outliers beside many tokens: a log scale
        axes[1].set_yscale("log")  # spanning two decades or more, its counts as plain numbers ("6 x 10^0" ran
        # into the colorbar; within one decade a log axis has no major tick to label)
        axes[1].yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axes[1].yaxis.set_minor_formatter(ticker.NullFormatter())
    else:  # counts of one or two decades: whole numbers
        axes[1].yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    axes[1].set_xlabel("L2 norm after the last block")
    axes[1].set_ylabel("patch tokens")
    handles, labels = axes[1].get_legend_handles_labels()
    seen = dict(zip(labels, handles))  # one legend entry per kind of token
    axes[1].legend(seen.values(), seen.keys(), fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)
