"""The training-curve figure of a run (loss and accuracy against steps)."""

from __future__ import annotations

import json
from pathlib import Path

from ..utils import atomic_path


def plot_curves(metrics_path: Path, out_path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line.strip()]
    train = [r for r in rows if "train_loss" in r]
    val = [r for r in rows if "val_acc" in r]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot([r["step"] for r in train], [r["train_loss"] for r in train], label="train")
    if val:
        ax1.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="validation")
    ax1.set(xlabel="step", ylabel="loss", title="loss")
    ax1.legend()
    ax2.plot([r["step"] for r in train], [100 * r["train_acc"] for r in train], label="train (augmented)")
    if val:
        ax2.plot([r["step"] for r in val], [100 * r["val_acc"] for r in val], "o-", label="validation")
    ax2.set(xlabel="step", ylabel="accuracy (%)", title="top-1 accuracy")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(out_path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out_path
