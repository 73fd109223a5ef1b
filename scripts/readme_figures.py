"""Make the README's inspection figures, and the numbers its text quotes, from one named model.

    python scripts/readme_figures.py --weights runs/NAME [--out docs/figures] [--images 500]
    make figures MODEL=runs/NAME

``docs/figures`` is committed, so the model is never guessed: ``--weights`` is a training run's
folder (``runs/NAME``, standing for ``runs/NAME/model``) or any weights vitkit loads. The
script prints which model it used and records it, with its test top-1 from the run's
``summary.json``, in ``--out/inspect_stats.json``.

Every figure is drawn from the data its numbers are measured on:

- ``attention_distance.png`` and the per-layer distances: the first ``--images`` test images;
- ``rollout_1.png``, ``rollout_2.png`` and their facts (share of the rollout on garment
  pixels, where its brightest pixel is): test images #0 and #1, the rollout upsampled to
  pixels as the figure draws it; the same facts averaged over the ``--images`` images;
- ``attention_per_layer.png``: test image #0;
- ``position_embedding_similarity.png`` and ``filter_pca.png``: the weights alone.

Numbers are stored rounded as the README quotes them: pixels to 0.1, percentages to 0.1,
cosine similarities to 0.01.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

import vitkit
from vitkit.evaluate.metrics import prepare_batch
from vitkit.inspect import (
    attention_maps,
    attention_rollout,
    embedding_filters,
    embedding_filters_pca,
    figures,
    mean_attention_distance,
    patch_distances,
    pos_embed_similarity,
)
from vitkit.train.data import load_split_tensors
from vitkit.weights.pretrained import weights_path

FIGURES = ("rollout_1", "rollout_2", "attention_per_layer", "attention_distance",
           "position_embedding_similarity", "filter_pca")
SHOWN = 2  # test images #0 and #1: rollout_1.png, rollout_2.png
#: a pixel brighter than this (of 255) is garment; Fashion-MNIST's background is 0
GARMENT_THRESHOLD = 25
BATCH = 100  # images per forward pass: 500 at once hold ~0.5 GB of attention maps


def resolve_model(weights: Path) -> tuple[Path, Optional[Path], Optional[float]]:
    """(model folder or file, the run's summary.json, its test top-1 in %) for ``--weights``.

    A run folder stands for its ``model/``; the summary is the run's, next to ``model/`` (its
    ``test_top1``) or ``model_ema/`` (its ``test_top1_ema``)."""
    path = weights_path(weights)
    if not path.exists():
        raise FileNotFoundError(f"--weights {weights}: no such file or folder (a run folder runs/NAME, "
                                f"or weights vitkit loads)")
    key = {"model": "test_top1", "model_ema": "test_top1_ema"}.get(path.name)
    summary = path.parent / "summary.json"
    if key is None or not summary.is_file():
        return path, None, None
    top1 = json.loads(summary.read_text()).get(key)
    return path, summary, None if top1 is None else round(100 * top1, 1)


def attention_distance(model, x: torch.Tensor) -> torch.Tensor:
    """(layers, heads) mean attention distance over all of ``x``, in batches of ``BATCH``
    (a mean of batch means weighted by their sizes: the same number as one pass)."""
    total = sum(mean_attention_distance(model, chunk) * len(chunk) for chunk in x.split(BATCH))
    return total / len(x)


def distance_stats(distance: torch.Tensor, uniform: float) -> dict:
    """What the README says of the attention-distance figure: each layer's least and most local
    head, the uniform-attention line, whether the layer mean grows with depth."""
    means = distance.mean(dim=1)
    return {
        "attention_distance_px": {
            f"layer {i + 1}": {"min_head": round(float(d.min()), 1), "max_head": round(float(d.max()), 1),
                               "mean": round(float(d.mean()), 1)} for i, d in enumerate(distance)},
        # the dashed line: what attention spread evenly over every patch would give
        "uniform_attention_px": round(uniform, 1),
        "heads_below_uniform": int((distance < uniform).sum()),
        "heads": distance.numel(),
        # one layer has no depth to grow over: None, not a vacuous True
        "mean_grows_with_depth": bool((means[1:] > means[:-1]).all()) if len(means) > 1 else None,
    }


def rollout_pixels(rollout: torch.Tensor, size) -> torch.Tensor:
    """(B, gh, gw) rollout -> (B, H, W) upsampled as ``figures.rollout_overlay`` draws it
    (bilinear), each map summing to 1."""
    up = F.interpolate(rollout[:, None].float(), size=tuple(size), mode="bilinear", align_corners=False)[:, 0]
    up = up.clamp_min(0)
    return up / up.sum(dim=(1, 2), keepdim=True).clamp_min(1e-12)


def garment_facts(views: torch.Tensor, heat: torch.Tensor) -> list[dict]:
    """Per image (uint8 (B, H, W) pixels, (B, H, W) rollout summing to 1): the share of the
    image that is garment, the share of the rollout on it, and where its brightest pixel is."""
    garment = views > GARMENT_THRESHOLD
    out = []
    for g, h in zip(garment, heat):
        row, col = divmod(int(h.argmax()), h.shape[1])
        out.append({"garment_pixels_pct": round(100 * float(g.float().mean()), 1),
                    "rollout_on_garment_pct": round(100 * float(h[g].sum()), 1),
                    "brightest_pixel": [row, col], "brightest_on_garment": bool(g[row, col])})
    return out


def similarity_by_grid_distance(sim: torch.Tensor) -> dict:
    """Mean cosine similarity of position embeddings by (row offset, column offset) class."""
    gh, gw = sim.shape[:2]
    rows = torch.arange(gh).view(gh, 1, 1, 1).expand(gh, gw, gh, gw)
    cols = torch.arange(gw).view(1, gw, 1, 1).expand(gh, gw, gh, gw)
    dr = (rows - rows.permute(2, 3, 0, 1)).abs()
    dc = (cols - cols.permute(2, 3, 0, 1)).abs()
    masks = {"same_row_or_column": (dr == 0) ^ (dc == 0),  # the patch itself excluded
             "neighbours": (dr + dc) == 1,
             "diagonal_neighbours": (dr == 1) & (dc == 1),
             "other_rows_and_columns": (dr > 0) & (dc > 0),
             "half_the_grid_or_more_apart": (dr + dc) >= (gh + gw) // 2}
    return {name: round(float(sim[mask].mean()), 2) for name, mask in masks.items()}


def model_record(model, path: Path, summary: Optional[Path], top1: Optional[float]) -> dict:
    cfg = model.config
    return {"weights": str(path), "architecture": cfg.name or type(model).__name__, "layers": cfg.depth,
            "heads": cfg.num_heads, "parameters": sum(p.numel() for p in model.parameters()),
            "summary": None if summary is None else str(summary), "test_top1_pct": top1}


def rollout_section(model, x: torch.Tensor, views: torch.Tensor, labels: torch.Tensor, classes, grid,
                    out: Path) -> dict:
    """rollout_1.png, rollout_2.png (test images #0, #1) and the rollout facts: theirs, and the
    same averaged over every image of ``x``."""
    rollout = torch.cat([attention_rollout(model, chunk) for chunk in x.split(BATCH)])
    facts = garment_facts(views, rollout_pixels(rollout, x.shape[-2:]))
    probs = model(x[:SHOWN]).float().softmax(-1)
    shown = []
    for i in range(SHOWN):
        label, predicted = classes[int(labels[i])], classes[int(probs[i].argmax())]
        figures.rollout_overlay(views[i].numpy(), rollout[i], out / f"rollout_{i + 1}.png",
                                title=f"test #{i}: {label} (predicted {predicted})")
        # the figure stretches its colours from the least to the most attended token: how far apart they are
        spread = {"token_share_min_pct": round(100 * float(rollout[i].min()), 1),
                  "token_share_max_pct": round(100 * float(rollout[i].max()), 1)}
        shown.append({"figure": f"rollout_{i + 1}.png", "test_image": i, "label": label, "predicted": predicted,
                      "probability_pct": round(100 * float(probs[i].max()), 1), **facts[i], **spread})
    mean = {k: round(sum(f[k] for f in facts) / len(facts), 1)
            for k in ("garment_pixels_pct", "rollout_on_garment_pct")}
    on_garment = round(100 * sum(f["brightest_on_garment"] for f in facts) / len(facts), 1)
    return {"garment_threshold": GARMENT_THRESHOLD, "shown": shown,
            "uniform_token_share_pct": round(100 / (grid[0] * grid[1]), 1),
            "all_images": {**mean, "brightest_on_garment_pct": on_garment}}


def weights_section(model, out: Path) -> dict:
    """position_embedding_similarity.png, filter_pca.png and their numbers: the weights alone."""
    stats = {"pos_embed": model.config.pos_embed}
    if model.patch_pos_embed(model.patch_embed.grid_size) is not None:
        sim = pos_embed_similarity(model)
        figures.pos_embed_similarity_grid(sim, out / "position_embedding_similarity.png")
        stats["pos_embed_similarity"] = similarity_by_grid_distance(sim)
    filters = embedding_filters(model)
    comps, explained = embedding_filters_pca(model)
    hybrid = getattr(model.patch_embed, "backbone", None) is not None
    figures.filter_pca_grid(comps, explained, out / "filter_pca.png",
                            "the CNN's first filters (hybrid)" if hybrid else "the patch-embedding filters")
    stats["filter_pca"] = {"filters": filters.shape[0], "filter_shape": list(filters.shape[1:]),
                           "explained_pct": [round(100 * float(e), 1) for e in explained]}
    return stats


@torch.no_grad()
def measure_and_draw(model, images: torch.Tensor, labels: torch.Tensor, classes, out: Path) -> dict:
    """Draw the figures into ``out`` and return the numbers measured on the same data
    (uint8 test ``images`` (N, 1, H, W), their ``labels`` and the class names)."""
    cfg = model.config
    x = prepare_batch(images, cfg)
    # what the model sees, as uint8 pixels: the first channel de-normalised
    views = ((x[:, 0] * cfg.std[0] + cfg.mean[0]) * 255).round().clamp(0, 255).to(torch.uint8)
    grid, token = model.patch_embed.grid_for(x.shape[-2:]), model.patch_embed.patch_size
    uniform = float(patch_distances(grid, token).mean())
    distance = attention_distance(model, x)
    figures.attention_distance_scatter(distance, out / "attention_distance.png", image_size=max(cfg.img_size),
                                       uniform=uniform)
    figures.class_attention_per_layer([m.cpu() for m in attention_maps(model, x[:1])], grid,
                                      model.num_prefix_tokens, model.cls_token is not None,
                                      out / "attention_per_layer.png")
    return {"image_size_px": list(cfg.img_size), "token_size_px": list(token), "grid": list(grid),
            **distance_stats(distance, uniform),
            "rollout": rollout_section(model, x, views, labels, classes, grid, out),
            **weights_section(model, out)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=Path,
                    help="the model the figures show: a run folder (runs/NAME) or weights vitkit loads; required")
    ap.add_argument("--out", type=Path, default=Path("docs/figures"))
    ap.add_argument("--images", type=int, default=500, help="first test images the statistics are measured on")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.weights is None:  # not argparse's required=True: its message does not say what to pass
        ap.error("--weights is required: the figures are committed, so name the model they show, "
                 "e.g. --weights runs/NAME (a `vitkit train` run; `make figures MODEL=runs/NAME`)")
    if args.images < SHOWN:
        ap.error(f"--images must be at least {SHOWN} (the rollout figures' images)")
    if args.threads:
        torch.set_num_threads(args.threads)

    try:
        path, summary, top1 = resolve_model(args.weights)
        model = vitkit.from_pretrained(path).eval()
    except (OSError, ValueError) as e:  # one line, exit 2, as vitkit's own verbs
        ap.error(str(e))
    record = model_record(model, path, summary, top1)
    print(f"model: {path} ({record['architecture']}, {record['parameters']:,} parameters, test top-1 "
          + (f"{top1}% from {summary})" if top1 is not None else "unknown: no run summary.json beside it)"),
          file=sys.stderr)
    images, labels, classes = load_split_tensors("fashion-mnist", "test")
    args.out.mkdir(parents=True, exist_ok=True)
    stats = {"model": record, "images": min(args.images, len(images)),
             "data": f"fashion-mnist test images #0-#{min(args.images, len(images)) - 1}",
             **measure_and_draw(model, images[:args.images], labels[:args.images], classes, args.out)}
    (args.out / "inspect_stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    json.dump(stats, sys.stdout, indent=1)
    print()
    print(f"wrote {', '.join(f'{n}.png' for n in FIGURES)} and inspect_stats.json to {args.out}/ "
          f"({stats['images']:,} images)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
