"""Few-shot linear evaluation as in the ViT paper: a frozen representation, then closed-form
ridge regression onto {-1, 1} targets, one output per class.

For each seed, ``shots`` training images per class form the support set. The ridge
regulariser is chosen on a held-out split drawn from the rest of the training pool
(disjoint from the support set), then the fit is scored on the test split. Reported:
mean and standard deviation of test accuracy over seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..models.layers import in_eval_mode
from ..progress import track, waiting_bar
from ..utils import positive_whole
from .metrics import check_batch_size, checked_labels, prepare_batch

#: Ridge regularisers tried (powers of two, as big_vision's few-shot evaluator does).
LAMBDAS = tuple(2.0 ** k for k in range(-10, 11, 2))


def extract_features(model: nn.Module, images: torch.Tensor, batch_size: int = 500, progress: bool = True,
                     label: str = "extracting features") -> torch.Tensor:
    """The pre-logits representation (what the head would see) of uint8 images, as float64.

    ``progress``: a ``label`` line on stderr with the batches done and the ETA, once the
    extraction has run 5 s (10,000 images through a ViT-S/16 on a CPU: tens of seconds).
    """
    check_batch_size(batch_size)
    if not len(images):
        raise ValueError("no images given")
    batches = (prepare_batch(images[i:i + batch_size], model.config) for i in range(0, len(images), batch_size))
    return features_over(model, batches, -(-len(images) // batch_size), progress, label)


@in_eval_mode
@torch.inference_mode()
def features_over(model: nn.Module, batches: Iterable[torch.Tensor], total: Optional[int] = None,
                  progress: bool = True, label: str = "extracting features") -> torch.Tensor:
    """:func:`extract_features` over model inputs already at the model's size and normalisation."""
    if not hasattr(model, "forward_head"):  # an ONNX Runtime or OpenVINO model: logits only
        hint = ": load the weights it was exported from (vitkit.from_pretrained)" if hasattr(model, "runtime") else \
            " (a backbone's maps or a wrapper: pass the vitkit model itself)"
        raise ValueError(f"features are a vitkit model's pre-logits (its forward_head); {type(model).__name__} has "
                         f"none{hint}")
    out = [model.forward_head(model.forward_features(x), pre_logits=True).double()
           for x in track(batches, label, total, enabled=progress, unit="batches")]
    if not out:
        raise NoImages(f"{label}: no images to extract features from")
    return torch.cat(out)


class NoImages(ValueError):
    """Features asked of no images (every file of a split unreadable, or an empty batch list)."""


def ridge_fit(x: torch.Tensor, targets: torch.Tensor, lam: float):
    """Closed-form ridge with an unregularised bias (by centring); dual form when features > samples."""
    mu, t_mu = x.mean(0), targets.mean(0)
    xc, tc = x - mu, targets - t_mu
    n, d = xc.shape
    if d > n:
        w = xc.T @ torch.linalg.solve(xc @ xc.T + lam * torch.eye(n, dtype=x.dtype), tc)
    else:
        w = torch.linalg.solve(xc.T @ xc + lam * torch.eye(d, dtype=x.dtype), xc.T @ tc)
    return w, t_mu - mu @ w


def ridge_accuracy(w, b, x: torch.Tensor, labels: torch.Tensor) -> float:
    return ((x @ w + b).argmax(-1) == labels).double().mean().item()


@dataclass
class FewShotResult:
    """One shot count's accuracy over the seeds' draws of the shots: their mean, and their sample standard deviation
    (n - 1, as the studies' spreads; 0 for one seed, which has no spread)."""
    shots: int
    mean: float
    std: float
    per_seed: List[float]
    lambdas: List[float]

    def to_dict(self) -> dict:
        return {"shots": self.shots, "mean": self.mean, "std": self.std, "per_seed": self.per_seed,
                "lambdas": self.lambdas}


#: images per class the ridge's regulariser is chosen on, beside each shot count's
HOLDOUT_PER_CLASS = 50


class TooFewImages(ValueError):
    """The training images hold too few classes, or too few images of one, for the shots asked (what a larger
    pool can mend; other errors of a fit are not the pool's)."""


def _check_fits(by_class: List[torch.Tensor], shots: Sequence[int], holdout: int,
                class_names: Optional[Sequence[str]] = None) -> None:
    """At least two classes, each with the images the largest shot count draws (said for that one, which decides;
    by its name where the data has names: "class 0" told a folder's user nothing)."""
    present = sum(len(idx) > 0 for idx in by_class)
    if present < 2:
        raise TooFewImages(f"few-shot classification needs at least 2 classes; the training split has {present}")
    need = max(shots) + holdout
    short = [c for c, idx in enumerate(by_class) if len(idx) < need]
    if short:
        fewest = min(short, key=lambda c: len(by_class[c]))
        fits = [k for k in shots if k + holdout <= len(by_class[fewest])]
        named = f"{class_names[fewest]!r}" if class_names is not None and fewest < len(class_names) else str(fewest)
        raise TooFewImages(f"{max(shots)} shots + {holdout} held out (the ridge's regulariser is chosen on them) need "
                         f"{need} training images per class; {len(short)} of {len(by_class)} classes have fewer "
                         f"(class {named}: {len(by_class[fewest])}): give the probe a training split with more "
                         f"images per class" + (f", or only --shots {' '.join(map(str, fits))}" if fits else ""))


def fewshot_from_features(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor,
                          test_y: torch.Tensor, shots: Sequence[int], seeds: int = 3,
                          holdout_per_class: int = HOLDOUT_PER_CLASS, progress: bool = True,
                          class_names: Optional[Sequence[str]] = None) -> Dict[int, FewShotResult]:
    """Few-shot accuracy for each shot count, from precomputed features (``class_names``: the labels' names, for a
    class too small to be said by name).

    ``progress``: a line on stderr with the (shots, seed) fits done, once they have run 5 s
    (100 classes of 768-d features: about 10 s on one CPU thread).
    """
    if isinstance(shots, int) or not all(isinstance(k, int) and not isinstance(k, bool) for k in shots):
        raise ValueError(f"shots must be a list of whole numbers (shots=[1, 5]), not {shots!r}")
    if not shots or min(shots) < 1 or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"shots must be whole numbers >= 1 and seeds >= 1, not shots {list(shots)} and seeds {seeds}")
    if not positive_whole(holdout_per_class):  # (0 chose the ridge's strength on no images at all)
        raise ValueError(f"holdout_per_class (the images per class the ridge's strength is chosen on) must be a whole "
                         f"number >= 1, not {holdout_per_class!r}")
    train_x, test_x = torch.as_tensor(train_x).double(), torch.as_tensor(test_x).double()  # a model's float32 too
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"features must be (images, width) matrices of one width, not train {tuple(train_x.shape)} "
                         f"and test {tuple(test_x.shape)}")
    train_y = checked_labels(train_y, len(train_x), "train_y")
    test_y = checked_labels(test_y, len(test_x), "test_y")
    classes = int(max(train_y.max(), test_y.max()).item()) + 1
    by_class = [torch.nonzero(train_y == c).flatten() for c in range(classes)]
    _check_fits(by_class, shots, holdout_per_class, class_names)
    if not (torch.isfinite(train_x).all() and torch.isfinite(test_x).all()):  # chance, said as a score before
        raise ValueError("the model's features are not finite (NaN or inf): its weights overflow")
    results: Dict[int, FewShotResult] = {}
    with waiting_bar(len(shots) * seeds, "fitting few-shot ridge", progress, unit="fits") as bar:
        for k in shots:
            need = k + holdout_per_class
            accs, chosen = [], []
            for seed in range(seeds):
                g = torch.Generator().manual_seed(seed)
                support, holdout = [], []
                for idx in by_class:
                    perm = idx[torch.randperm(len(idx), generator=g)]
                    support.append(perm[:k])
                    holdout.append(perm[k:need])
                s, h = torch.cat(support), torch.cat(holdout)
                targets = 2.0 * torch.nn.functional.one_hot(train_y[s], classes).double() - 1.0
                fits = {lam: ridge_fit(train_x[s], targets, lam) for lam in LAMBDAS}
                best = max(LAMBDAS, key=lambda lam: (ridge_accuracy(*fits[lam], train_x[h], train_y[h]), lam))
                accs.append(ridge_accuracy(*fits[best], test_x, test_y))
                chosen.append(best)
                bar.advance()
            spread = float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0
            results[k] = FewShotResult(k, float(np.mean(accs)), spread, accs, chosen)
    return results
