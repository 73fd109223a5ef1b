"""An in-memory split as tensors: the uint8 images in the layout the models read, and labels.

Below train/ and evaluate/ alike: a run's splits and ``vitkit eval``'s scoring read the same arrays.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from . import datasets


def to_tensors(images: np.ndarray, labels: np.ndarray, device: torch.device):
    """uint8 (N, H, W[, C]) arrays -> uint8 (N, C, H, W) and int64 label tensors on ``device``."""
    x = torch.from_numpy(images)
    x = x[:, None] if x.dim() == 3 else x.permute(0, 3, 1, 2)
    return x.contiguous().to(device), torch.from_numpy(labels).to(device)


def load_split_tensors(dataset: str, split: str, data_dir: Optional[str] = None):
    """(uint8 images (N, C, H, W), int64 labels, class names) of an in-memory split, on the CPU."""
    data = datasets.load_split(dataset, split, data_dir)
    images, labels = to_tensors(data.images, data.labels, torch.device("cpu"))
    return images, labels, data.classes
