"""Make the README's inspection figures from a trained model (by default the newest `make demo` run).

    python scripts/readme_figures.py [--weights runs/<name>/model] [--out docs/figures]

Runs `vitkit inspect` on the first Fashion-MNIST test images, copies the figures the README
shows into ``--out``, and measures on ``--images`` test images what the README says of them:
mean attention distance per layer (least and most local head), and how position-embedding
similarity falls with grid distance. The numbers go to ``--out/inspect_stats.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

import vitkit
from vitkit.evaluate.metrics import prepare_batch
from vitkit.inspect import inspect_model, mean_attention_distance, patch_distances, pos_embed_similarity
from vitkit.train.data import load_split_tensors

FIGURES = ("rollout_1", "rollout_2", "attention_per_layer", "attention_distance",
           "position_embedding_similarity", "filter_pca")


def newest_run_model(runs: Path) -> Path:
    models = sorted(runs.glob("*/model/config.json"), key=lambda p: p.stat().st_mtime)
    if not models:
        raise SystemExit(f"no trained model under {runs}/*/model: run `make demo` first, or pass --weights")
    return models[-1].parent


def similarity_by_grid_distance(sim: torch.Tensor) -> dict:
    """Mean cosine similarity of position embeddings by (row offset, column offset) class."""
    gh, gw = sim.shape[:2]
    rows = torch.arange(gh).view(gh, 1, 1, 1).expand(gh, gw, gh, gw)
    cols = torch.arange(gw).view(1, gw, 1, 1).expand(gh, gw, gh, gw)
    dr = (rows - rows.permute(2, 3, 0, 1)).abs()
    dc = (cols - cols.permute(2, 3, 0, 1)).abs()
    out = {}
    for name, mask in {"same_row_or_column": (dr == 0) ^ (dc == 0),
                       "neighbours": (dr + dc) == 1,
                       "diagonal_neighbours": (dr == 1) & (dc == 1),
                       "far (>= half the grid)": (dr + dc) >= (gh + gw) // 2,
                       "other rows and columns": (dr > 0) & (dc > 0)}.items():
        out[name] = round(float(sim[mask].mean()), 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=Path, help="a trained model (default: the newest runs/*/model)")
    ap.add_argument("--runs", type=Path, default=Path("runs"))
    ap.add_argument("--out", type=Path, default=Path("docs/figures"))
    ap.add_argument("--images", type=int, default=500, help="test images for the attention distances")
    args = ap.parse_args(argv)

    weights = args.weights or newest_run_model(args.runs)
    model = vitkit.from_pretrained(weights).eval()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        result = inspect_model(model, tmp, title=f"{model.config.name or 'ViT'} ({weights})")
        for name in FIGURES:
            if name in result.figures:
                shutil.copyfile(result.figures[name], args.out / f"{name}.png")

    images, labels, _ = load_split_tensors("fashion-mnist", "test")
    with torch.no_grad():
        x = prepare_batch(images[:args.images], model.config)
        distance = mean_attention_distance(model, x)  # (layers, heads), pixels
    stats = {
        "weights": str(weights),
        "images": len(x),
        "mean_attention_distance_px": {
            f"layer {i + 1}": {"min_head": round(float(d.min()), 2), "max_head": round(float(d.max()), 2),
                               "mean": round(float(d.mean()), 2)} for i, d in enumerate(distance)},
        # the reference point: what attention spread evenly over every patch would give
        "uniform_attention_px": round(float(patch_distances(model.patch_embed.grid_size,
                                                             model.patch_embed.patch_size).mean()), 2),
        "image_size_px": list(model.config.img_size),
        "patch_size_px": list(model.config.patch_size),
        "pos_embed": model.config.pos_embed,
    }
    if model.config.pos_embed != "none":
        stats["pos_embed_similarity"] = similarity_by_grid_distance(pos_embed_similarity(model))
    (args.out / "inspect_stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    json.dump(stats, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
