"""`make tour`: build, save, convert and run a ViT end to end.

The weights are untrained: the prediction shows the whole pipeline (config-driven
preprocessing, official-layout round trip, class names), not knowledge. The classifier is
given random weights first: a freshly built model's head is zero-initialised, so its logits
are all zero and any round trip would look exact. Output goes to demo_out/. `make demo`
trains a model instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import vitkit
from vitkit.cli import main as cli


def photos(out: Path) -> list:
    """Photos that ship inside scikit-image (no download)."""
    from PIL import Image
    from skimage import data

    paths = []
    for name in ("astronaut", "chelsea", "coffee"):
        path = out / f"{name}.png"
        Image.fromarray(getattr(data, name)()).save(path)
        paths.append(str(path))
    return paths


def main() -> int:
    out = Path("demo_out")
    out.mkdir(exist_ok=True)
    print("== the model family (vitkit models) ==")
    cli(["models"])
    print("\n== one model in detail (vitkit info vit_base_patch16_224) ==")
    cli(["info", "vit_base_patch16_224"])

    print("\n== save -> official JAX npz -> reload -> predict ==")
    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", num_classes=3,
                                label_names=["astronaut", "cat", "coffee"])
    with torch.no_grad():  # a random head: zero logits (the default init) would compare equal anyway
        torch.nn.init.normal_(model.head.weight, std=0.1)
        torch.nn.init.normal_(model.head.bias, std=0.1)
    model.save_pretrained(out / "vit_tiny")
    cli(["convert", str(out / "vit_tiny"), str(out / "vit_tiny.npz"), "--to", "npz"])
    back = vitkit.from_pretrained(out / "vit_tiny.npz", gelu="exact")
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        reference = model.eval()(x)
        diff = (back(x) - reference).abs().max().item()
    same = " (bit-identical)" if diff == 0 else ""
    print(f"max |logit difference| after the npz round trip: {diff:.2e}{same}, "
          f"logits up to {reference.abs().max().item():.2f}")
    cli(["predict", "--weights", str(out / "vit_tiny"), "--top-k", "3", *photos(out)])
    print("\n(untrained weights with a random head: the probabilities are noise; "
          "`make demo` trains a model)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
