"""Muon (Jordan et al. 2024): the hidden layers' weight matrices step along their momentum made
orthogonal (a Newton-Schulz iteration), everything else along AdamW's step, in one optimiser so
that the schedule, layer-wise decay, checkpoints and resume treat it like the others.

The matrices' step is scaled to AdamW's RMS (0.2 sqrt(max(rows, cols)), Liu et al. 2025, "Muon is
Scalable for LLM Training"), so one ``lr`` and one ``weight_decay`` serve both kinds of parameter.
A convolution's kernel is one matrix (out channels x the rest), as in Muon's CIFAR-10 runs. Which
parameters are the hidden matrices is :func:`vitkit.train.optim.hidden_matrices`'s rule."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, Iterable, List, Sequence, Tuple

import torch
from torch import Tensor
from torch.optim.adamw import adamw

#: the quintic Newton-Schulz coefficients Muon's authors tuned (torch.optim.Muon's defaults too)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


def orthogonalize(update: Tensor, steps: int = NS_STEPS, eps: float = 1e-7) -> Tensor:
    """``update`` (any shape, read as rows = its first dimension) pushed towards the nearest
    semi-orthogonal matrix, U V^T of its SVD, by ``steps`` quintic iterations (singular values end
    near 1, not at it: the coefficients trade exactness for speed)."""
    x = update.reshape(update.shape[0], -1).float()
    wide = x.shape[0] <= x.shape[1]
    x = x if wide else x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm <= 1 before iterating
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):  # x <- a x + (b G + c G^2) x with G = x x^T, in two fused products
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return (x if wide else x.T).reshape(update.shape).to(update.dtype)


def rms_scale(shape: torch.Size) -> float:
    """The factor that gives an orthogonal step AdamW's typical RMS (0.2) for a matrix of ``shape``."""
    rows, cols = shape[0], math.prod(shape[1:])
    return 0.2 * math.sqrt(max(rows, cols))


class Muon(torch.optim.Optimizer):
    """Groups with ``muon=True`` take Muon's step (Nesterov momentum ``momentum``), the others AdamW's
    (``betas``, ``eps``); both decay their weights by ``lr * weight_decay`` (decoupled)."""

    def __init__(self, params: Iterable[Dict[str, Any]], lr: float, betas: Tuple[float, float] = (0.9, 0.999),
                 momentum: float = 0.95, eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "momentum": momentum, "eps": eps,
                                  "weight_decay": weight_decay, "muon": False})
        #: how the matrices' orthogonalisations run: ``spread(orthogonalize, momenta, costs)`` -> their results in
        #: order. One after another here; a run split over batch parts (vitkit.parallel.BatchParallel.spread)
        #: hands them to its single-threaded workers, where one thread did all of them (ViT-S/16's 48 took 5.8 s of a
        #: step on a family-23 EPYC). Each matrix's result is the same on any thread: a run's numbers do not change.
        self.spread: Callable[..., List[Tensor]] = in_turn

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 (torch's signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        matrices = []
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["muon"]:
                matrices += [(p, group) for p in params]
            elif params:
                self._adamw_step(params, group)
        if matrices:
            momenta = [self._nesterov(p, group["momentum"]) for p, group in matrices]
            for (p, group), update in zip(matrices, self.spread(orthogonalize, momenta, list(map(_cost, momenta)))):
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"] * rms_scale(p.shape))
        return loss

    def orthogonalisation_seconds(self) -> float:
        """The seconds one step's orthogonalisations take, as the step runs them (``spread``), timed on stand-ins of
        its matrices' shapes: the parameters and state are untouched. The cost line counts them, since they are no
        part of a forward and backward pass (ViT-S/16's 48 took 3 s of a step on a family-23 EPYC)."""
        stand_ins = [torch.ones_like(p) for group in self.param_groups if group["muon"]
                     for p in group["params"] if p.requires_grad]
        if not stand_ins:
            return 0.0
        start = time.perf_counter()
        self.spread(orthogonalize, stand_ins, list(map(_cost, stand_ins)))
        if stand_ins[0].is_cuda:
            torch.cuda.synchronize(stand_ins[0].device)
        return time.perf_counter() - start

    def _nesterov(self, p: Tensor, mu: float) -> Tensor:
        """The momentum buffer moved to ``p``'s gradient, and the gradient looked one step ahead along it."""
        grad = p.grad
        buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(grad))
        buf.lerp_(grad, 1 - mu)
        return grad.lerp(buf, mu)

    def _adamw_step(self, params: List[Tensor], group: Dict[str, Any]) -> None:
        """torch's own AdamW update (its foreach kernels where the tensors allow), on this group's
        state, which is laid out as torch.optim.AdamW lays it out."""
        for p in params:
            if not self.state[p]:
                self.state[p].update(step=torch.zeros(()), exp_avg=torch.zeros_like(p),
                                     exp_avg_sq=torch.zeros_like(p))
        states = [self.state[p] for p in params]
        (b1, b2) = group["betas"]
        adamw(params, [p.grad for p in params], [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
              [], [s["step"] for s in states], amsgrad=False, beta1=b1, beta2=b2, lr=group["lr"],
              weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)

def _cost(m: Tensor) -> int:
    """A matrix's orthogonalisation cost, for handing the costliest out first: its size times its shorter side."""
    return m.numel() * min(m.shape[0], m.numel() // m.shape[0])


def in_turn(fn: Callable[[Tensor], Tensor], items: Sequence[Tensor], costs: Sequence[int] = ()) -> List[Tensor]:
    """``fn`` of each item, one after another on this thread (``costs`` unused: the order is the items')."""
    return [fn(item) for item in items]


__all__ = ["Muon", "NS_COEFFICIENTS", "in_turn", "orthogonalize", "rms_scale"]
