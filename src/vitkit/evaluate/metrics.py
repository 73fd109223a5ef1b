"""Classification metrics on an in-memory split: top-1, top-5, per-class accuracy, confusion."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..models.layers import in_eval_mode
from ..progress import track
from ..utils import positive_whole, pyplot, save_png
from .tta import check_mode, probabilities


@dataclass
class ClassificationReport:
    top1: float
    top5: float
    per_class: Dict[str, Optional[float]]  # None: the class has no images here
    confusion: np.ndarray  # rows: true class, columns: predicted class
    classes: List[str] = field(default_factory=list)
    count: int = 0

    def to_dict(self) -> dict:
        # top-5 of five classes or fewer is 1.0 whatever the model: null, as the printed line's "n/a"
        return {"top1": self.top1, "top5": self.top5 if len(self.confusion) > 5 else None, "count": self.count,
                "per_class": self.per_class,
                "confusion": self.confusion.tolist(), "classes": self.classes}


def prepare_batch(images_uint8: torch.Tensor, config) -> torch.Tensor:
    """uint8 (B, C, H, W) -> the model's input: channels, size and normalisation of its config. The whole image
    is resized (bicubic), as the in-memory training pipeline resizes it: the config's ``crop_pct`` and
    ``interpolation``, which the image-file pipelines apply (:func:`vitkit.preprocess`, ``predict_images``), are
    not, so in-memory data (Fashion-MNIST, CIFAR) is scored as it is trained on. The bicubic is PIL's (torch's
    antialiased kernel, a = -0.5), the one ``vitkit predict`` and ``serve`` resize files with: torch's plain
    bicubic (a = -0.75, no antialiasing) put Fashion-MNIST's pixels 0.003-0.02 apart from them on average and up
    to 0.32 (at 20x20); now 0.0008 on average (PIL rounds and clips its first pass to 8 bits)."""
    if not isinstance(images_uint8, torch.Tensor) or images_uint8.dtype != torch.uint8 or images_uint8.ndim != 4:
        what = f"{images_uint8.dtype} {tuple(images_uint8.shape)}" if isinstance(images_uint8, torch.Tensor) else \
            type(images_uint8).__name__
        raise ValueError(f"images must be uint8 pixels (N, C, H, W) in 0-255, as the datasets hold them, not {what} "
                         f"(a float batch was divided by 255 again; one already normalised goes to model(x))")
    x = images_uint8.float() / 255.0
    if x.shape[1] != config.in_chans:
        if x.shape[1] == 1:
            x = x.expand(-1, config.in_chans, -1, -1)
        else:
            raise ValueError(f"images have {x.shape[1]} channels, the model expects {config.in_chans}")
    if tuple(x.shape[-2:]) != tuple(config.img_size):
        x = F.interpolate(x, size=tuple(config.img_size), mode="bicubic", align_corners=False,
                          antialias=True).clamp(0, 1)
    mean = torch.tensor(config.mean, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(config.std, device=x.device).view(1, -1, 1, 1)
    return (x - mean) / std


def classification_report(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                          classes: Optional[List[str]] = None, batch_size: int = 500, progress: bool = True,
                          label: str = "evaluating", tta: str = "none") -> ClassificationReport:
    """Evaluate ``model`` on uint8 images (N, C, H, W) with integer labels.

    ``progress``: a ``label`` line on stderr with the batches done and the ETA, once the
    evaluation has run 5 s (:func:`vitkit.progress.track`). ``tta``: score the mean
    probabilities of each image's views (:mod:`vitkit.evaluate.tta`).
    """
    from ..data.datasets import class_difference

    check_batch_size(batch_size)
    n_classes = model.config.num_classes
    if classes is not None and (why := class_difference(model.config.label_names, classes,
                                                        ("the model", "classes="))):
        raise ValueError(f"classes= are not the model's label_names: {why}; label i is scored against the model's "
                         f"output i, so give the labels in the model's order")
    classes = list(classes or model.config.label_names or [str(i) for i in range(n_classes)])
    if not len(images):
        raise ValueError("no images given")
    labels = checked_labels(labels, len(images), "labels")
    data_classes = max(len(classes), int(labels.max()) + 1 if len(labels) else 0)
    if data_classes != n_classes:
        raise ValueError(f"the model predicts {n_classes} classes and the data has {data_classes}: "
                         f"evaluate it on the data it was trained for")
    batches = ((prepare_batch(images[i:i + batch_size], model.config), labels[i:i + batch_size])
               for i in range(0, len(labels), batch_size))
    return report_over(model, batches, classes, -(-len(labels) // batch_size), progress, label, tta)


def check_batch_size(batch_size: Any) -> None:
    """A batch size is a whole number >= 1 (a negative one scored nothing, as 0% of 0 images); numpy's too."""
    if not positive_whole(batch_size):
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")


def checked_labels(labels: Any, count: int, what: str) -> torch.Tensor:
    """``labels`` as an int64 tensor of ``count`` class numbers (>= 0), or a ValueError naming ``what``."""
    y = torch.as_tensor(labels)
    if y.ndim != 1 or len(y) != count:
        raise ValueError(f"{what}: {count} images need {count} labels in one dimension, not {tuple(y.shape)}")
    if y.is_floating_point() or y.dtype == torch.bool or y.is_complex():
        raise ValueError(f"{what} must be integer class numbers, not {y.dtype}")
    if len(y) and int(y.min()) < 0:
        raise ValueError(f"{what} must be class numbers >= 0, not {int(y.min())} (an unlabelled image has no score)")
    return y.long()


@in_eval_mode
@torch.inference_mode()
def report_over(model: nn.Module, batches: Iterable[Tuple[torch.Tensor, torch.Tensor]], classes: List[str],
                total: Optional[int] = None, progress: bool = True, label: str = "evaluating",
                tta: str = "none") -> ClassificationReport:
    """The report over (model input, labels) batches: inputs already at the model's size and
    normalisation (an image file pipeline's, or :func:`prepare_batch`'s); ``classes`` are the data's."""
    check_mode(tta)
    n_classes = model.config.num_classes
    if len(classes) != n_classes:
        raise ValueError(f"the model predicts {n_classes} classes and the data has {len(classes)}: "
                         f"evaluate it on the data it was trained for")
    confusion = np.zeros((n_classes, n_classes), dtype=np.int64)
    top5_hits = 0
    for x, y in track(batches, label, total, enabled=progress, unit="batches"):
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= n_classes):  # numpy reads -1 as the last class
            raise ValueError(f"labels must be class numbers 0-{n_classes - 1}, not {int(y.min())}-{int(y.max())}")
        logits = model(x).float() if tta == "none" else probabilities(model, x, tta, model.config)
        k = min(5, n_classes)
        top5_hits += (logits.topk(k, dim=-1).indices == y[:, None]).any(-1).sum().item()
        pred = logits.argmax(-1)
        np.add.at(confusion, (y.cpu().numpy(), pred.cpu().numpy()), 1)
    count = int(confusion.sum())
    support = confusion.sum(1)
    per_class = {c: float(confusion[i, i] / support[i]) if support[i] else None  # no images: no score (JSON null)
                 for i, c in enumerate(classes)}
    return ClassificationReport(float(np.trace(confusion) / max(count, 1)), top5_hits / max(count, 1),
                                per_class, confusion, list(classes), count)


def plot_confusion(report: ClassificationReport, path: Path, title: str = "") -> Path:
    """Row-normalised confusion matrix as a PNG (true class down, prediction across)."""
    plt = pyplot()
    cm = report.confusion.astype(float)
    rows = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    n = len(report.classes)
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * n, 0.8 + 0.55 * n))
    ax.imshow(rows, cmap="Blues", vmin=0, vmax=1)
    for i in range(n):
        for j in range(n):
            if cm[i, j]:
                ax.text(j, i, f"{100 * rows[i, j]:.0f}", ha="center", va="center", fontsize=8,
                        color="white" if rows[i, j] > 0.5 else "black")
    ax.set_xticks(range(n), report.classes, rotation=45, ha="right")
    ax.set_yticks(range(n), report.classes)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title or f"top-1 {100 * report.top1:.2f}% on {report.count:,} images (row %)")
    fig.tight_layout()
    return save_png(fig, path)
