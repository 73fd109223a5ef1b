"""A trained model at other patch sizes: FlexiViT's pseudo-inverse resize against a plain resize.

Loads a Fashion-MNIST model with 4 px patches (a ``vitkit train --model vit_fmnist`` run) at
other patch sizes with ``vitkit.from_pretrained(RUN, patch_size=P)`` -- the patch filters
resampled by FlexiViT's pseudo-inverse resize, the position grid by interpolation -- and scores
each on the 10,000 test images, beside the same model whose filters were only interpolated
(bicubic, the naive way). First with the image resized with the patch (2 px patches on 14 px
images, 7 on 49, 8 on 56: the trained 7x7 grid, the setting in which FlexiViT's resize keeps a
token's value -- exactly when upsampling), then at the trained 28 px, where 2 px patches give a
14x14 grid and 7 px patches a 4x4 one: tokens that see another scale, which a model trained at
one patch size has never met (FlexiViT trains with random patch sizes for that).

    python benchmarks/patch_resize.py --weights runs/vit_fmnist-RUN   # about a minute on 2 cores

Results: ``benchmarks/results/patch_resize_<device>_<date>.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_inference import dated_name, machine_info, results_path, write_json_atomic  # noqa: E402

#: (patch size, image size) pairs scored: the same 7x7 grid with the image resized with the patch
#: (FlexiViT's setting), then other grids at the trained 28 px
SETTINGS = ((4, 28), (2, 14), (7, 49), (8, 56), (2, 28), (7, 28), (14, 28))


def score(model, images: torch.Tensor, labels: torch.Tensor) -> float:
    from vitkit.evaluate.metrics import classification_report

    return classification_report(model, images, labels, progress=False).top1


def naive(model, source) -> Any:
    """``model`` with its patch filters replaced by ``source``'s, only interpolated (bicubic) to its size."""
    weight = source.patch_embed.proj.weight.detach()
    size = tuple(model.patch_embed.proj.weight.shape[-2:])
    with torch.no_grad():
        model.patch_embed.proj.weight.copy_(F.interpolate(weight, size=size, mode="bicubic", align_corners=False)
                                            * (weight.shape[-1] ** 2 / size[-1] ** 2))
    return model


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", required=True, help="a trained model with 4 px patches (a run folder)")
    ap.add_argument("--out", help="results file, or a folder for the default name")
    args = ap.parse_args(argv)
    import vitkit
    from vitkit.data import fashion_mnist

    device = torch.device("cpu")
    info = machine_info(device, limits=False)
    out = results_path(args.out, dated_name("patch_resize", device, info))  # (an unwritable --out: said first)
    base = vitkit.from_pretrained(args.weights)
    if tuple(base.config.patch_size) != (4, 4) or tuple(base.config.img_size) != (28, 28):
        raise SystemExit(f"--weights: expected a 28 px model with 4 px patches, got {base.config.img_size} px, "
                         f"patches {base.config.patch_size}")
    test = fashion_mnist.load_split("test")
    images, labels = torch.from_numpy(test.images)[:, None], torch.from_numpy(test.labels).long()
    rows: Dict[str, Dict[str, Any]] = {}
    for patch, size in SETTINGS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = vitkit.from_pretrained(args.weights, patch_size=patch, img_size=size)
        row = {"patch": patch, "img_size": size, "grid": list(model.patch_embed.grid_size),
               "pinv_top1": score(model, images, labels)}
        if patch != 4:
            row["interpolated_top1"] = score(naive(model, base), images, labels)
        rows[f"{patch}px@{size}"] = row
        print(f"patch {patch:2d} px, {size} px images: pseudo-inverse {100 * row['pinv_top1']:.2f}%"
              + (f", interpolated {100 * row['interpolated_top1']:.2f}%" if "interpolated_top1" in row else ""))
    write_json_atomic(out, {"benchmark": "patch_resize", "machine": info, "weights": args.weights, "rows": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
