"""The model behind the endpoint: image bytes to its input, and batches to answers.

Decoding and preprocessing run per request (in the server's thread pool, beside the model);
the model sees whole batches. Image bytes only: no request can name a file on the server.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import re
import tempfile
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Deque, Iterator, List, Optional, Sequence

import torch
from PIL import Image
from torch import nn

from ..data.images import BadImageError, decode_image
from ..data.transforms import ImageShapeError, transform_for
from ..deploy.choose import runtime_of
from ..evaluate.predict import label_for
from ..models.config_base import no_classes
from ..models.layers import fast_inference
from ..progress import track

#: The largest image accepted, in pixels (a 16-bit or paletted file decodes far larger than its bytes).
MAX_PIXELS = 40_000_000
_FIGURE_LOCK = threading.Lock()


#: an image at least this large returns its decoding's memory to the system once done (:func:`_trim`)
TRIM_PIXELS = 4_000_000


def _trim() -> None:
    """glibc's malloc_trim: the arenas of the decode threads kept what a large image had used (four 40M-pixel
    decodes, one after the other on four threads, held 2.9 GB after them; trimmed, 0.5 GB). Elsewhere nothing."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=None)
def _malloc_trim() -> Optional[Callable[[int], int]]:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl and other C libraries have none)
        return None


class PixelBudget:
    """The pixels decoded at once, at most ``limit``, handed out in arrival order: an image waits while the
    images before it hold the budget. A 40M-pixel RGBA PNG is 170 kB of upload and about 1.7 GB while it is
    decoded and flattened onto white; eight at once took 5.2 GB, and the decode threads number up to 32.
    A small image passes beside a large one that holds the budget; one that waits past its request's
    ``deadline`` gives up (its request has had its 504), so no worker thread waits for nobody."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0
        self._free = threading.Condition()
        self._waiting: Deque[object] = deque()

    @contextlib.contextmanager
    def hold(self, pixels: int, deadline: Optional[float] = None) -> Iterator[None]:
        """``pixels`` of the budget while the block runs (waited for first, until ``deadline``, a
        ``time.monotonic()``; past it :class:`TimeoutError`)."""
        pixels, turn = min(max(int(pixels), 0), self.limit), object()
        with self._free:
            self._waiting.append(turn)
            try:
                while not (self._waiting[0] is turn and self.used + pixels <= self.limit):
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError("the image waited past its request's deadline for the pixels to decode it")
                    self._free.wait(left)
            finally:
                self._waiting.remove(turn)
                self._free.notify_all()  # (the next in line may fit now)
            self.used += pixels
        try:
            yield
        finally:
            with self._free:
                self.used -= pixels
                self._free.notify_all()


#: the most input shapes a server gives OpenVINO: past it, batches are padded up to common sizes
OPENVINO_SHAPES = 32


def padded_size(runtime: str, size: int, max_batch: int) -> int:
    """The batch size the runtime is given for ``size`` images. OpenVINO keeps kernels and a memory
    plan for every input shape it meets (ViT-S/16 int8: 10-28 MiB for each batch size up to 32,
    more for larger ones), so with ``max_batch`` above :data:`OPENVINO_SHAPES` a batch is padded
    with blank images to a multiple of ``ceil(max_batch / 32)``: at most 32 shapes, whatever the
    limit. Every other runtime, and OpenVINO up to 32, gets the batch as it is."""
    if runtime != "openvino" or max_batch <= OPENVINO_SHAPES:
        return size
    step = -(-max_batch // OPENVINO_SHAPES)
    return min(-(-size // step) * step, max_batch)


def warm_sizes(runtime: str, max_batch: int) -> List[int]:
    """The batch sizes a server runs once before it takes requests, so that its memory is flat from
    the first request and no request pays for a shape the runtime has not seen: on OpenVINO every
    size it can be given (:func:`padded_size`; a server that met a rare size late grew late: 864 ->
    1,168 MiB over 48,000 requests), on ONNX Runtime one image and the largest (each of its two
    sessions' arena, the lone image's and the parts', grows to its largest input once), on PyTorch
    none (it keeps nothing per shape on the CPU)."""
    if runtime == "openvino":
        return sorted({padded_size(runtime, n, max_batch) for n in range(1, max_batch + 1)})
    return sorted({1, max_batch}) if runtime == "onnxruntime" else []


@dataclass
class Answer:
    """One image's top-k classes: (index, label, probability) by falling probability."""
    top: List[tuple]

    def to_dict(self, image: str) -> dict:
        return {"image": image, "top": [{"index": i, "label": name, "probability": p} for i, name, p in self.top]}


class ServedModel:
    """A classifier ready for batches of image bytes, on the runtime it was loaded for (``runtime``:
    torch, onnxruntime or openvino; None: read off the model). ``max_batch``: the largest batch it will be
    given; batches are then padded as :func:`padded_size` says, and :meth:`warm` readies every size (None:
    batches are run as they come)."""

    def __init__(self, model: nn.Module, runtime: Optional[str] = None, max_pixels: int = MAX_PIXELS,
                 max_batch: Optional[int] = None):
        config = model.config
        if why := no_classes(config):
            raise ValueError(f"these weights have {why}: nothing to serve; fine-tune them first "
                             f"(vitkit train --init WEIGHTS)")
        self.model, self.runtime, self.config = model.eval(), runtime or runtime_of(model), config
        self.transform = transform_for(model)
        self.channels = len(self.transform.mean)
        self.max_pixels = max_pixels
        self.decoding = PixelBudget(max_pixels)
        self.labels = list(config.label_names or [])
        self.device = next(model.parameters(), torch.empty(0)).device
        self.max_batch = max_batch

    @property
    def can_embed(self) -> bool:
        """Pooled features need the model's own layers (an exported graph ends in the logits)."""
        return self.runtime == "torch" and hasattr(self._encoder(), "forward_features")

    def _encoder(self) -> nn.Module:
        return getattr(self.model, "model", self.model)  # a CPU's batch-parallel wrapper holds the model

    def image(self, data: bytes, name: str = "upload", deadline: Optional[float] = None) -> torch.Tensor:
        """Image bytes -> the model's (C, H, W) input; BadImageError for anything that is not a usable image
        (``deadline``: how long it may wait for the pixel budget, :class:`PixelBudget`)."""
        if not data:
            raise BadImageError(name, "the request has no image bytes")
        pixels = self._check_size(data, name)
        with self.decoding.hold(pixels, deadline):
            try:
                return self._decoded(data, name)
            finally:  # (a large image that failed to decode had taken its memory too)
                if pixels >= TRIM_PIXELS:
                    _trim()

    def _decoded(self, data: bytes, name: str) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            try:
                im = decode_image(data, self.channels, name)
            except Image.DecompressionBombWarning as e:
                raise BadImageError(name, self._too_many(e)) from None
        try:
            return self.transform(im)
        except ImageShapeError as e:  # a long thin image: its resize would take gigabytes
            raise BadImageError(name, str(e)) from None

    def _check_size(self, data: bytes, name: str) -> int:
        """The pixel count from the header, before any pixel is decoded (a decompression bomb); 0 where the header
        is unreadable (decode_image then names what is wrong)."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # judged below, by our limit
                with Image.open(io.BytesIO(data)) as im:
                    w, h = im.size
        except Image.DecompressionBombError as e:
            raise BadImageError(name, self._too_many(e)) from None
        except Exception:  # decode_image names what is wrong with it
            return 0
        if w * h > self.max_pixels:
            raise BadImageError(name, f"{w} x {h} pixels is more than the {self.max_pixels:,} this server takes")
        return w * h

    def _too_many(self, error: Exception) -> str:
        """Pillow's refusal of a decompression bomb in the server's words: its pixels against the server's limit
        (Pillow's own limit, quoted beside it, read as a second rule)."""
        found = re.search(r"\((\d+) pixels\)", str(error))
        many = f"{int(found.group(1)):,} pixels" if found else "its pixels"
        return f"{many} is more than the {self.max_pixels:,} this server takes"

    def warm(self, progress: bool = True) -> int:
        """Runs every batch size :func:`warm_sizes` names for ``max_batch`` once, on blank images (the
        runtime's kernels and memory for each, before the first request); how many."""
        if not self.max_batch:
            return 0
        max_batch = self.max_batch
        sizes = warm_sizes(self.runtime, max_batch)
        if sizes:
            h, w = (int(v) for v in self.config.img_size)
            blank = torch.zeros(max(sizes), self.channels, h, w)
            for size in track(sizes, f"warming batch sizes up to {max_batch}", enabled=progress, unit="sizes"):
                self.probabilities(list(blank[:size]))
        return len(sizes)

    @torch.inference_mode()
    def probabilities(self, inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """Class probabilities of each input, one batched forward pass."""
        x = torch.stack(list(inputs))
        size = padded_size(self.runtime, len(x), self.max_batch) if self.max_batch else len(x)
        if size > len(x):  # blank images up to one of the few shapes the runtime is given
            x = torch.cat([x, x.new_zeros(size - len(x), *x.shape[1:])])
        with fast_inference(self.model):
            probs = self.model(x.to(self.device)).float().softmax(-1).cpu()
        return list(probs[:len(inputs)])

    @torch.inference_mode()
    def embeddings(self, inputs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """The pooled pre-logits features of each input (what a linear probe or a retrieval index reads)."""
        encoder = self._encoder()
        x = torch.stack(list(inputs)).to(self.device)
        with fast_inference(encoder):
            feats = encoder.forward_head(encoder.forward_features(x), pre_logits=True).float().cpu()
        return list(feats)

    def answer(self, probs: torch.Tensor, top_k: int) -> Answer:
        values, indices = probs.topk(min(top_k, len(probs)))
        return Answer([(i, label_for(i, self.labels), v) for i, v in zip(indices.tolist(), values.tolist())])

    def no_rollout(self) -> Optional[str]:
        """Why this model has no attention rollout to draw (None: it has one): maps that are no distributions, or
        maps of one image that the free memory cannot hold (``vitkit inspect``'s refusal)."""
        from ..inspect.analysis import maps_not_distributions
        from ..inspect.report import images_a_pass

        encoder = self._encoder()
        try:
            images_a_pass(encoder.config, "serve a smaller --img-size")
        except ValueError as e:
            return str(e)
        return maps_not_distributions(encoder)

    def rollout_png(self, data: bytes, name: str = "upload", deadline: Optional[float] = None) -> bytes:
        """The paper's attention rollout over the image, as a PNG (the PyTorch runtime only)."""
        from ..inspect.analysis import attention_rollout
        from ..inspect.figures import covered_pixels, rollout_overlay

        x = self.image(data, name, deadline)
        pixels = _display(x, self.transform)
        with torch.inference_mode():
            rollout = attention_rollout(self._encoder(), x[None].to(self.device))[0].cpu()
        with _FIGURE_LOCK, tempfile.TemporaryDirectory(prefix="vitkit-rollout-") as tmp:  # pyplot: one at a time
            return rollout_overlay(pixels, rollout, Path(tmp) / "rollout.png",
                                   covered=covered_pixels(self._encoder().config, rollout.shape)).read_bytes()


def _display(x: torch.Tensor, transform: Any) -> Any:
    """The model's input back to uint8 pixels (what the model saw: resized, cropped)."""
    mean = torch.tensor(transform.mean).view(-1, 1, 1)
    std = torch.tensor(transform.std).view(-1, 1, 1)
    pixels = ((x * std + mean).clamp(0, 1) * 255).round().byte()
    return (pixels[0] if pixels.shape[0] == 1 else pixels.permute(1, 2, 0)).numpy()


def load_served(weights: str, runtime: Optional[str], quantize: Optional[str], model_name: Optional[str],
                say: Callable[[str], None], calibration: Optional[str], max_batch: int,
                progress: bool = True, **stand_ins: Any) -> ServedModel:
    """The classifier ``weights`` name loaded on its runtime (as ``vitkit predict`` picks it), ready for batches
    of up to ``max_batch``: every batch size its runtime keeps state for has run once, so the server's memory is
    flat from the first request (``vitkit serve`` and each Ray replica)."""
    from ..deploy.choose import load_classifier

    # an export on the fly runs in a child: the server would keep the exporter's memory (ViT-S/16, OpenVINO int8:
    # 1.6 GiB after warm-up against 1.1)
    served = ServedModel(load_classifier(weights, runtime, quantize, model_name, say, calibration, apart=True,
                                         **stand_ins), max_batch=max_batch)
    served.warm(progress)
    return served
