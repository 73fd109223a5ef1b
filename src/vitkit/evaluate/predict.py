"""Top-k prediction on image files with the preprocessing the weights' config prescribes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..data.folder import image_files
from ..data.images import BadImageError
from ..data.transforms import preprocess
from ..models.config_base import no_classes
from ..models.layers import fast_inference, in_eval_mode
from ..progress import track
from .metrics import check_batch_size

#: a :class:`Prediction`'s error where the model gave NaN or inf (no probability to state: JSON has none)
NOT_FINITE = "the model's output is not finite (NaN or inf): its weights overflow"


@dataclass
class Prediction:
    image: str
    top: List[Tuple[int, str, float]] = field(default_factory=list)  # (index, label, probability)
    #: why the image has no answer (it could not be read, or :data:`NOT_FINITE`; then ``top`` is empty)
    error: Optional[str] = None

    def to_dict(self) -> dict:
        out = {"image": self.image, "top": [{"index": i, "label": name, "probability": p} for i, name, p in self.top]}
        return {**out, "error": self.error} if self.error else out


def label_for(index: int, names: Optional[Sequence[str]]) -> str:
    return names[index] if names and index < len(names) else f"class {index}"


@in_eval_mode
@torch.inference_mode()
def predict_images(model: nn.Module, images: Iterable[Union[str, Path]], top_k: int = 5,
                   batch_size: int = 16, progress: bool = True) -> List[Prediction]:
    """Classify image files (a folder: the images under it, :func:`~vitkit.data.folder.image_files`);
    probabilities are the softmax of the logits. A file that does not decode as an image gets its
    :class:`Prediction` with ``error`` saying why, and the others are still classified (one broken
    photo in a folder of thousands loses nothing); a path that is no file is refused before any
    work. ``progress``: a bar on stderr once it takes a while."""
    config = model.config
    if why := no_classes(config):
        raise ValueError(f"these weights have {why}: nothing to predict")
    paths = image_files(list(images))
    if not paths:
        raise ValueError("no images given")
    device = next(model.parameters(), torch.empty(0)).device  # an ONNX Runtime model has none: the CPU
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    check_batch_size(batch_size)
    k = min(top_k, config.num_classes)
    out: List[Prediction] = []
    with fast_inference(model):
        for start in track(range(0, len(paths), batch_size), f"predicting {len(paths):,} images", enabled=progress,
                           unit="batches"):
            chunk = paths[start:start + batch_size]
            inputs, broken = _inputs(config, chunk)
            done = iter(())
            if inputs:
                logits = model(torch.stack(inputs).to(device)).float()
                values, indices = logits.softmax(dim=-1).topk(k, dim=-1)
                done = zip(values.tolist(), indices.tolist(), logits.isfinite().all(dim=-1).tolist())
            for n, p in enumerate(chunk):
                if n in broken:
                    out.append(Prediction(p, error=broken[n]))
                    continue
                vals, idxs, finite = next(done)
                out.append(Prediction(p, [(i, label_for(i, config.label_names), v) for i, v in zip(idxs, vals)])
                           if finite else Prediction(p, error=NOT_FINITE))
    return out


def _inputs(config, chunk: List[str]) -> Tuple[List[torch.Tensor], Dict[int, str]]:
    """The model's input of each image of ``chunk`` that decodes, in order, and why each other one
    (by its place in ``chunk``) does not. One image at a time: a batch that failed on one image was
    decoded again image by image."""
    inputs, broken = [], {}
    for n, path in enumerate(chunk):
        if not os.path.isfile(path):  # found in a folder (given paths were checked): a dangling link, a FIFO
            broken[n] = "not a regular file (a link to nothing, a FIFO or a device)" if os.path.lexists(path) \
                else "gone since the folder was listed"
            continue
        try:
            inputs.append(preprocess(config, path)[0])
        except BadImageError as e:
            broken[n] = e.reason
    return inputs, broken
