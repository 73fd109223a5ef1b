"""The studies' figures (matplotlib, drawn from the results and the runs' saved models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..utils import pyplot, save_png
from .base import spread


def _seed0_model(results: Dict[str, Any], arm: str):
    """The saved model of ``arm``'s first seed (None when that run is not there)."""
    import vitkit

    row = next((r for r in results["runs"].values() if r["arm"] == arm), None)
    if row is None or not row.get("run_dir") or not (Path(row["run_dir"]) / "model").is_dir():
        return None
    return vitkit.from_pretrained(Path(row["run_dir"]) / "model").eval()


def _mosaic(sim: np.ndarray) -> np.ndarray:
    """(gh, gw, gh, gw) similarities -> one image: patch (i, j)'s map at block (i, j), NaN gaps between."""
    gh, gw = sim.shape[:2]
    out = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan)
    for i in range(gh):
        for j in range(gw):
            out[i * (gh + 1):i * (gh + 1) + gh, j * (gw + 1):j * (gw + 1) + gw] = sim[i, j]
    return out


def _what_it_knows(model) -> Optional[tuple]:
    """(image, caption) of a model's positions: the similarity mosaic of an absolute kind, the first
    layer's relative bias per offset (heads averaged), None without positions."""
    from ..inspect import pos_embed_similarity

    if model is None or model.pos_embed_kind == "none":
        return None
    if model.pos_embed_kind == "relative":
        rel = model.blocks[0].attn.rel_pos
        gh, gw = rel.grid
        table = rel.relative_position_bias_table.detach().float().mean(-1)
        offsets = table[:(2 * gh - 1) * (2 * gw - 1)].reshape(2 * gh - 1, 2 * gw - 1).numpy()
        return offsets, "layer 1 bias by offset"
    return _mosaic(pos_embed_similarity(model).numpy()), "cosine similarity"


def positions_figure(results: Dict[str, Any], path: Path, kinds: Sequence[str], labels: Dict[str, str],
                     grids: List[str]) -> Path:
    plt = pyplot()
    fig = plt.figure(figsize=(2.3 * len(kinds), 5.2), dpi=120)
    grid = fig.add_gridspec(2, len(kinds), height_ratios=[1.0, 0.9], hspace=0.45)
    for col, kind in enumerate(kinds):
        ax = fig.add_subplot(grid[0, col])
        shown = _what_it_knows(_seed0_model(results, f"{kind}-{grids[0]}"))
        if shown is None:
            ax.text(0.5, 0.5, "no positions", ha="center", va="center", fontsize=9, color="0.4")
        else:
            image, caption = shown
            ax.imshow(image, cmap="viridis")
            ax.set_xlabel(caption, fontsize=7)
        ax.set_title(labels[kind], fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    ax = fig.add_subplot(grid[1, :])
    width = 0.8 / len(grids)
    for g, name in enumerate(grids):
        stats = [spread(results, f"{kind}-{name}") for kind in kinds]
        xs = np.arange(len(kinds)) + (g - (len(grids) - 1) / 2) * width
        means = [100 * s.mean for s in stats]
        errs = [100 * s.std if s.n > 1 else 0.0 for s in stats]
        ax.bar(xs, means, width, yerr=errs, capsize=3, label=f"{name} tokens")
    lows = [100 * spread(results, f"{k}-{g}").mean for k in kinds for g in grids]
    lows = [v for v in lows if np.isfinite(v)]
    if lows:
        ax.set_ylim(max(0.0, min(lows) - 3), min(100.0, max(lows) + 2))
    ax.set_xticks(np.arange(len(kinds)))
    ax.set_xticklabels([labels[k] for k in kinds], fontsize=7)
    ax.set_ylabel("test top-1 (%)")
    # above the bars, never over one (the lowest bar of a harder grid sits at the bottom right)
    ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(grids), frameon=False)
    seeds = len(results["settings"]["seeds"])
    fig.suptitle(f"Position embeddings on Fashion-MNIST (mean ± std over {seeds} seed{'s' * (seeds > 1)}; "
                 f"top: the {grids[0]} models of seed {results['settings']['seeds'][0]})", fontsize=9)
    return save_png(fig, path)
