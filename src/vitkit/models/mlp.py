"""The token-wise layers: :class:`Linear` (which may keep its autocast copy), the MLP kinds built from it,
and the inference switches that act on both (:func:`fast_inference`, :func:`compile_for_inference`) or on the
whole model (:func:`in_eval_mode`)."""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from .norms import NormFactory, gelu_layer

# ----------------------------------------------------------------------------- linear


class Linear(nn.Linear):
    """``nn.Linear`` that, inside :func:`fast_inference`, keeps its autocast copy between calls.

    Under autocast PyTorch casts every fp32 weight to bf16/fp16 on every forward; at batch 1
    that cast is most of a ViT's time on a CPU. Inside ``fast_inference`` -- a promise that the
    weights do not change within the block -- with autograd off this layer keeps the cast
    weight and bias and reuses them, so results are bitwise those of plain autocast. Outside
    it, it is plain ``nn.Linear``: a weight may change in ways no counter sees (a fused
    optimiser, a write through ``.data``), so no copy is kept. Costs one low-precision copy of
    the weights while used.
    """

    keep_cast = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        if not self.keep_cast or torch.is_grad_enabled() or not torch.is_autocast_enabled(device) \
                or self.weight.is_inference():
            # Inference tensors (a model built under inference_mode) have no version counter,
            # so a change to them could not be seen: no cache for them.
            return F.linear(x, self.weight, self.bias)
        dtype = torch.get_autocast_dtype(device)
        w = self.weight
        key = (w.data_ptr(), w._version, w.device, dtype,
               None if self.bias is None else (self.bias.data_ptr(), self.bias._version))
        cached = self.__dict__.get("_autocast_cache")
        if cached is None or cached[0] != key:
            bias = None if self.bias is None else self.bias.detach().to(dtype)
            cached = (key, w.detach().to(dtype), bias)
            self.__dict__["_autocast_cache"] = cached
        return F.linear(x, cached[1], cached[2])


@contextlib.contextmanager
def fast_inference(model: nn.Module) -> Iterator[nn.Module]:
    """Inference with weights that stay fixed inside the block: each :class:`Linear` keeps its
    autocast (bf16/fp16) copy of weight and bias between calls instead of casting them on every
    forward (at batch 1 on a CPU that cast was ~2/3 of ViT-B's time), and each :class:`Mlp` runs
    GELU in place on its hidden tensor when no hook watches ``fc1`` or ``act``. Results are
    bitwise those of plain inference (tested). Changing a weight inside the block is not seen;
    the copies are dropped on exit."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    mlps = [m for m in model.modules() if isinstance(m, Mlp)]
    before = [(m, m.keep_cast) for m in linears] + [(m, m.gelu_in_place) for m in mlps]
    for m in linears:
        m.keep_cast = True
    for m in mlps:
        m.gelu_in_place = True
    try:
        yield model
    finally:
        for m, value in before:
            if isinstance(m, Linear):
                m.keep_cast = value
                m.__dict__.pop("_autocast_cache", None)
            else:
                m.gelu_in_place = value


F_ = TypeVar("F_", bound=Callable[..., Any])


#: the models inside an :func:`in_eval_mode` call, with how many calls and the modes to put back after the last
_EVALUATING: "weakref.WeakKeyDictionary[nn.Module, list]" = weakref.WeakKeyDictionary()
_EVALUATING_LOCK = threading.Lock()


def in_eval_mode(fn: F_) -> F_:
    """``fn(model, ...)`` with ``model`` in eval mode (no dropout, no drop-path) and each of its modules put back in
    the mode it was in after (a frozen part kept in eval stays so): evaluating inside one's own training loop went
    on training without dropout, in silence. Calls that overlap (threads, or one inside another) share one eval
    mode, put back when the last ends. A model that is no ``nn.Module`` (an ONNX Runtime or OpenVINO model) is
    only told ``eval()``."""

    @functools.wraps(fn)
    def wrapped(model, *args, **kwargs):
        if not isinstance(model, nn.Module):
            if hasattr(model, "eval"):
                model.eval()
            return fn(model, *args, **kwargs)
        with _EVALUATING_LOCK:
            entry = _EVALUATING.get(model)
            if entry is None:
                entry = _EVALUATING[model] = [0, [(m, m.training) for m in model.modules()]]
                model.eval()
            entry[0] += 1
        try:
            return fn(model, *args, **kwargs)
        finally:
            with _EVALUATING_LOCK:
                entry[0] -= 1
                if entry[0] == 0:
                    del _EVALUATING[model]
                    for module, training in entry[1]:
                        module.training = training

    return wrapped  # type: ignore[return-value]


def compile_for_inference(model: nn.Module) -> nn.Module:
    """``torch.compile`` for inference with inductor's freezing: the weights become constants of
    the compiled graph, so their bf16 casts are folded away and linear layers run on weights
    prepacked for oneDNN; norms and GELU are fused as in any compile. On this project's 2-core
    CPU it gains little over :func:`fast_inference` (ViT-B/16 bf16, batch 32, interleaved runs:
    -2% to +8%; ViT-Ti/16: +8%; ``benchmarks/bench_onnx.py --compile``), the GEMMs being
    oneDNN's either way; it is the PyTorch path's last lever before ONNX Runtime's int8.
    Call it under ``torch.inference_mode()`` (freezing applies only without autograd). Weights
    changed after the first call are not seen: compile again. Each new input shape compiles once
    (seconds to a minute)."""
    return torch.compile(model, dynamic=False, options={"freezing": True})


# ----------------------------------------------------------------------------- MLPs

#: MLP kinds (``mlp`` field): Linear -> GELU -> Linear; SwiGLU with two input projections (``fc1_g``,
#: ``fc1_x``: EVA-02, AIMv2); SwiGLU with one packed projection (``fc1`` rows [gate | value]: DINOv2-g,
#: EVA-02 Ti/S)
MLPS = ("mlp", "swiglu", "swiglu_packed")


class Mlp(nn.Module):
    """The transformer MLP: Linear -> GELU -> Linear (dropout after each when asked). Hooks on
    ``fc1`` see its output and hooks on ``act`` fire, as in timm (in place only inside
    :func:`fast_inference`, and only while nothing watches). ``norm``: a norm of the hidden
    activations before ``fc2`` (EVA-02's and BEiT-3's sub-LN, timm's ``mlp.norm``)."""

    def __init__(self, dim: int, hidden: int, gelu: str = "exact", drop: float = 0.0, bias: bool = True,
                 norm: Optional[NormFactory] = None):
        super().__init__()
        self.fc1 = Linear(dim, hidden, bias=bias)
        self.act = gelu_layer(gelu)
        self.norm = norm(hidden) if norm is not None else None
        self.fc2 = Linear(hidden, dim, bias=bias)
        self.drop = nn.Dropout(drop) if drop > 0 else None

    gelu_in_place = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc1(x)
        if self.gelu_in_place and isinstance(self.act, nn.GELU) \
                and not (x.requires_grad and torch.is_grad_enabled()) and not self._watched():
            # fast_inference: GELU in place on the 4x-wide hidden tensor saves one allocation
            # and one pass over the largest activation of the block.
            x = torch.ops.aten.gelu_(x, approximate=self.act.approximate)
        else:
            x = self.act(x)
        return self.finish(x)

    def finish(self, h: torch.Tensor) -> torch.Tensor:
        """The hidden activations -> the output: dropout, the hidden norm, ``fc2``, dropout."""
        if self.drop is not None:
            h = self.drop(h)
        if self.norm is not None:
            h = self.norm(h)
        h = self.fc2(h)
        return h if self.drop is None else self.drop(h)

    def _watched(self) -> bool:
        """Whether a hook sees fc1's output or act: then they must be what their names say."""
        return bool(self.fc1._forward_hooks or self.act._forward_hooks or self.act._forward_pre_hooks
                    or nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks)


class SwiGLU(nn.Module):
    """SiLU(x W_g) * (x W_x), then ``fc2`` (Shazeer 2020's SwiGLU): ``hidden`` is the width of the gated
    product. ``packed``: one ``fc1`` whose rows are [gate | value] (timm's ``SwiGLUPacked``); otherwise
    ``fc1_g`` and ``fc1_x`` (timm's ``SwiGLU``). ``norm`` as in :class:`Mlp`."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.0, bias: bool = True,
                 norm: Optional[NormFactory] = None, packed: bool = False):
        super().__init__()
        self.packed = packed
        if packed:
            self.fc1 = Linear(dim, 2 * hidden, bias=bias)
        else:
            self.fc1_g = Linear(dim, hidden, bias=bias)
            self.fc1_x = Linear(dim, hidden, bias=bias)
        self.act = nn.SiLU()
        self.norm = norm(hidden) if norm is not None else None
        self.fc2 = Linear(hidden, dim, bias=bias)
        self.drop = nn.Dropout(drop) if drop > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            gate, x = self.fc1(x).chunk(2, dim=-1)
        else:
            gate, x = self.fc1_g(x), self.fc1_x(x)
        return self.finish(self.act(gate) * x)

    finish = Mlp.finish


def make_mlp(kind: str, dim: int, hidden: int, gelu: str = "exact", drop: float = 0.0, bias: bool = True,
             norm: Optional[NormFactory] = None) -> nn.Module:
    """The MLP of a kind (:data:`MLPS`); ``hidden``: the width ``fc2`` reads."""
    if kind == "mlp":
        return Mlp(dim, hidden, gelu, drop, bias, norm)
    if kind in ("swiglu", "swiglu_packed"):
        return SwiGLU(dim, hidden, drop, bias, norm, packed=kind == "swiglu_packed")
    raise ValueError(f"mlp must be one of {MLPS}, got {kind!r}")
