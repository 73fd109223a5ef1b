"""Training figures: one run's curves (loss and accuracy against steps), and several runs'
validation accuracy side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Optional, Sequence

from ..utils import pyplot, save_png


def plot_curves(metrics_path: Path, out_path: Path) -> Path:
    """Loss, and top-1 accuracy where the run measures one (a pre-training objective without
    accuracy shows its learning rate there instead)."""
    plt = pyplot()
    rows = [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line.strip()]
    train = [r for r in rows if "train_loss" in r]
    val = [r for r in rows if "val_loss" in r]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot([r["step"] for r in train], [r["train_loss"] for r in train], label="train")
    if val:
        ax1.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="validation")
    ax1.set(xlabel="step", ylabel="loss", title="loss")
    ax1.legend()
    if any("train_acc" in r for r in train):
        ax2.plot([r["step"] for r in train], [100 * r["train_acc"] for r in train], label="train (augmented)")
        if any("val_acc" in r for r in val):
            ax2.plot([r["step"] for r in val], [100 * r["val_acc"] for r in val], "o-", label="validation")
        ax2.set(xlabel="step", ylabel="accuracy (%)", title="top-1 accuracy")
        ax2.legend()
    else:
        ax2.plot([r["step"] for r in train], [r["lr"] for r in train])
        ax2.set(xlabel="step", ylabel="learning rate", title="learning rate")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    # fixed margins (room for a 6-character tick label and the axis label) instead of
    # tight_layout, which draws the figure once more to measure it: half of the plot's time
    fig.subplots_adjust(left=0.075, right=0.985, bottom=0.13, top=0.92, wspace=0.27)
    return save_png(fig, out_path)


def plot_val_curves(curves: Mapping[str, Sequence[Sequence[float]]], out_path: Path,
                    goal: Optional[float] = None, title: str = "validation top-1",
                    goal_label: str = "goal") -> Path:
    """Validation accuracy against epochs for several runs on one axis, so recipes of different
    lengths compare at a glance. ``curves`` maps a label to ``[(epoch, accuracy 0..1), ...]``;
    ``goal`` (0..1) draws a dashed target line, named by ``goal_label``."""
    if not curves:
        raise ValueError("no runs to plot")
    for label, points in curves.items():
        if not points:
            raise ValueError(f"run {label!r} has no validation points")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    finals = []
    for label, points in curves.items():
        epochs, accs = zip(*[(p[0], 100 * p[1]) for p in points])
        line, = ax.plot(epochs, accs, label=f"{label} (val {accs[-1]:.2f})")
        ax.plot(epochs[-1], accs[-1], "o", color=line.get_color())
        finals.append(accs[-1])
    top = max(finals)
    if goal is not None:
        ax.axhline(100 * goal, color="black", linestyle="--", linewidth=1, label=f"{goal_label} {100 * goal:g}%")
        top = max(top, 100 * goal)
    ax.set_ylim(min(finals) - 4, top + 1)
    ax.set(xlabel="epoch", ylabel="accuracy (%)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return save_png(fig, out_path)
