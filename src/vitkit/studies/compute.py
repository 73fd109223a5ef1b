"""The compute frontier (the paper's Figure 5): accuracy against training compute for ViTs,
hybrids and ResNets of three sizes each.

    vitkit study compute            # 9 models x 3 seeds, 2 epochs each: about 45 min on 2 CPU cores
    vitkit study compute --smoke    # the two smaller sizes of each family, one seed, 20 steps: a minute

The paper pre-trains ViTs, ResNets and hybrids of many sizes on JFT-300M and plots transfer
accuracy against pre-training compute: hybrids are ahead of plain ViTs at small compute, the gap
vanishes for larger models, and ViTs reach a given accuracy with 2-4x less compute than ResNets.
Here each model trains on Fashion-MNIST for the same two epochs (batch 128, recipe fmnist-adamw),
so its compute is its training FLOPs per image (3x the forward pass, from vitkit's counter: ``vitkit
info``) times the images seen; the score is test top-1, and wall time is recorded beside it.
Families, small to large: the plain ViT (patch 4: width 64 / 96 / 160, depth 2 / 4 / 6), the
conv-stem hybrid (3 to 5 convolutions, then 1 to 4 transformer layers) and the hybrids' ResNetV2
as a classifier (stages [1], [1, 1], [2, 2]).

Result (the committed ``docs/studies/compute.json``): see docs/paper.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .base import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Arm, Options, Study, spread, too_few_seeds, verdict

STEPS = 860  # two epochs of 55,000 images at batch 128
FAMILIES = ("vit", "hybrid", "resnet")
FAMILY_LABELS = {"vit": "ViT", "hybrid": "hybrid (conv stem + ViT)", "resnet": "ResNetV2"}
#: (arm key, family, model, model_args, label)
MODELS: List[Tuple[str, str, str, Dict[str, Any], str]] = [
    ("vit-s", "vit", "vit_fmnist", {"embed_dim": 64, "depth": 2, "num_heads": 2, "mlp_dim": 128}, "ViT 64x2"),
    ("vit-m", "vit", "vit_fmnist", {}, "ViT 96x4"),
    ("vit-l", "vit", "vit_fmnist", {"embed_dim": 160, "depth": 6, "num_heads": 5, "mlp_dim": 320}, "ViT 160x6"),
    ("hybrid-s", "hybrid", "vit_fmnist_hybrid",
     {"backbone": {"type": "conv", "channels": [16, 32, 48], "strides": [1, 2, 2]}, "embed_dim": 48,
      "num_heads": 2, "mlp_dim": 96}, "hybrid 3 conv + 48x1"),
    ("hybrid-m", "hybrid", "vit_fmnist_hybrid", {}, "hybrid 5 conv + 96x1"),
    ("hybrid-l", "hybrid", "vit_fmnist_hybrid",
     {"backbone": {"type": "conv", "channels": [32, 64, 64, 128, 128], "strides": [1, 2, 1, 2, 1]},
      "embed_dim": 128, "depth": 4, "num_heads": 4, "mlp_dim": 256}, "hybrid 5 conv + 128x4"),
    ("resnet-s", "resnet", "resnetv2_50_nopreact", {"img_size": 28, "layers": [1]}, "ResNetV2 [1]"),
    ("resnet-m", "resnet", "resnetv2_50_nopreact", {"img_size": 28, "layers": [1, 1]}, "ResNetV2 [1, 1]"),
    ("resnet-l", "resnet", "resnetv2_50_nopreact", {"img_size": 28, "layers": [2, 2]}, "ResNetV2 [2, 2]"),
]


def training_flops(model: str, model_args: Dict[str, Any], images: int) -> float:
    """3 x the forward FLOPs of one 28x28 grey image (forward + backward) x images."""
    import vitkit
    from vitkit.models.complexity import complexity

    config = vitkit.create_model(model, in_chans=1, num_classes=10, **model_args).config
    return 3.0 * complexity(config).flops * images


class ComputeFrontier(Study):
    name = "compute"
    title = "Compute frontier: ViT, hybrid and ResNet at three sizes"
    claim = ("Hybrids beat plain ViTs at small compute, the gap vanishes as models grow, and ViTs need less "
             "compute than ResNets for the same accuracy (Figure 5)")
    setting = ("Fashion-MNIST, every model 2 epochs (860 steps of 128) with recipe fmnist-adamw; compute = 3 x "
               "forward FLOPs x images seen; test top-1 over 3 seeds")
    paper = {"source": "Dosovitskiy et al. 2021, section 4.4 and Figure 5",
             "vit_compute_advantage_over_resnet": "2-4x less compute for the same performance"}
    fewshot = True  # the few-shot proxy study ranks these models too

    def arms(self, options: Options) -> List[Arm]:
        keep = [m for m in MODELS if not options.smoke or not m[0].endswith("-l")]  # smoke: two sizes each
        out = []
        for key, family, model, model_args, label in keep:
            train = {"model": model, "model_args": model_args, "recipe": "fmnist-adamw", "max_steps": STEPS,
                     "val_every": STEPS, "checkpoint_every": STEPS // 2, "warmup_steps": 100}
            out.append(Arm(key, label, train, {"family": family}))
        return out

    def extra(self, results: Dict[str, Any], options: Options) -> None:
        """Each arm's training FLOPs (from its steps and batch) and the seeds' mean wall time."""
        for key, arm in results["arms"].items():
            rows = [r for r in results["runs"].values() if r["arm"] == key]
            if not rows:
                continue
            batch = json.loads((Path(rows[0]["run_dir"]) / "config.json").read_text())["batch_size"]
            images = rows[0]["steps"] * batch
            arm["train_gflops"] = training_flops(arm["train"]["model"], arm["train"]["model_args"], images) / 1e9
            arm["seconds"] = sum(r["seconds"] for r in rows) / len(rows)
            arm["params"] = rows[0]["params"]

    # ---------------------------------------------------------------------------- deciding

    def _points(self, results: Dict[str, Any], family: str) -> List[Tuple[float, float, str]]:
        """(training GFLOPs, mean test top-1, arm) of a family, by compute."""
        pts = [(a["train_gflops"], spread(results, k).mean, k) for k, a in results["arms"].items()
               if a["family"] == family and "train_gflops" in a]
        return sorted(pts)

    def verdicts(self, results: Dict[str, Any]) -> List[Dict[str, Any]]:
        if too_few_seeds(results) or any(len(self._points(results, f)) < 2 for f in FAMILIES):
            why = "one seed" if too_few_seeds(results) else "fewer than two sizes per family"
            return [verdict(c, INCONCLUSIVE, why) for c in (
                "hybrids beat ViTs at small compute", "the hybrids' advantage vanishes as models grow",
                "ViTs need less compute than ResNets for the same accuracy")]
        vit, hybrid, resnet = (self._points(results, f) for f in FAMILIES)
        out = []
        # 1. at the smallest compute, the hybrid above the ViT (the frontiers read at the same FLOPs)
        low = max(vit[0][0], hybrid[0][0])
        gap_low = _at(hybrid, low) - _at(vit, low)
        out.append(verdict("hybrids beat ViTs at small compute", REPRODUCED if gap_low > 0 else NOT_REPRODUCED,
                           f"at {low:.0f} GFLOPs the hybrid frontier is {100 * gap_low:+.1f} points from the ViT's"))
        high = min(vit[-1][0], hybrid[-1][0])
        gap_high = _at(hybrid, high) - _at(vit, high)
        gaps = f"{100 * gap_low:+.1f} points at {low:.0f} GFLOPs, {100 * gap_high:+.1f} at {high:.0f}"
        if gap_low <= 0:
            out.append(verdict("the hybrids' advantage vanishes as models grow", NOT_REPRODUCED,
                               f"no advantage at small compute to vanish: {gaps}"))
        else:
            outcome = REPRODUCED if gap_high < gap_low else NOT_REPRODUCED
            out.append(verdict("the hybrids' advantage vanishes as models grow", outcome, gaps))
        # 3. the compute each family needs for the best accuracy both reach
        target = min(vit[-1][1], resnet[-1][1])
        need_vit, need_resnet = _compute_for(vit, target), _compute_for(resnet, target)
        if need_vit is None or need_resnet is None:
            out.append(verdict("ViTs need less compute than ResNets for the same accuracy", INCONCLUSIVE,
                               "the frontiers do not both reach a common accuracy"))
        else:
            ratio = need_resnet / need_vit
            outcome = REPRODUCED if ratio > 1 else NOT_REPRODUCED
            out.append(verdict("ViTs need less compute than ResNets for the same accuracy", outcome,
                               f"for {100 * target:.1f}% the ViT frontier needs {need_vit:.0f} GFLOPs, the ResNet's "
                               f"{need_resnet:.0f} ({ratio:.2f}x)"))
        return out

    # ---------------------------------------------------------------------------- showing

    def table(self, results: Dict[str, Any]) -> str:
        lines = ["| model | family | params | training GFLOPs | wall time | test top-1 |",
                 "|---|---|---:|---:|---:|---:|"]
        for key, arm in results["arms"].items():
            gflops = f"{arm['train_gflops']:,.0f}" if "train_gflops" in arm else "–"
            seconds = f"{arm['seconds']:.0f} s" if "seconds" in arm else "–"
            params = f"{arm['params'] / 1e6:.2f}M" if "params" in arm else "–"
            lines.append(f"| {arm['label']} | {FAMILY_LABELS[arm['family']]} | {params} | {gflops} | {seconds} | "
                         f"{spread(results, key).text()} |")
        return "\n".join(lines)

    def figure(self, results: Dict[str, Any], path: Path) -> Optional[Path]:
        from ..utils import pyplot, save_png

        plt = pyplot()
        fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
        for family in FAMILIES:
            arms = [(k, a) for k, a in results["arms"].items() if a["family"] == family and "train_gflops" in a]
            stats = [spread(results, k) for k, _ in arms]
            ys = [100 * s.mean for s in stats]
            errs = [100 * s.std if s.n > 1 else 0.0 for s in stats]
            for ax, x in zip(axes, ([a["train_gflops"] for _, a in arms], [a["seconds"] for _, a in arms])):
                ax.errorbar(x, ys, yerr=errs, marker="o", capsize=3, label=FAMILY_LABELS[family])
        axes[0].set_xlabel("training compute (GFLOPs, log scale)")
        axes[1].set_xlabel("training wall time on this machine (s, log scale)")
        from matplotlib.ticker import FuncFormatter, LogLocator

        plain = FuncFormatter(lambda v, _: f"{v:,.0f}")  # 2,000 5,000 10,000: not 2x10^3 labels that overlap
        for ax in axes:
            ax.set_xscale("log")
            ax.xaxis.set_minor_locator(LogLocator(subs=(2, 5)))
            ax.xaxis.set_major_formatter(plain)
            ax.xaxis.set_minor_formatter(plain)
            ax.set_ylabel("test top-1 (%)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
        seeds = len(results["settings"]["seeds"])
        fig.suptitle(f"Fashion-MNIST, 2 epochs per model (mean ± std over {seeds} seed{'s' * (seeds > 1)})", fontsize=9)
        fig.tight_layout()
        return save_png(fig, path)


def _at(points: List[Tuple[float, float, str]], flops: float) -> float:
    """A frontier's accuracy at ``flops``: linear in log-compute between its points, flat past its ends."""
    xs = [math.log(p[0]) for p in points]
    x = math.log(flops)
    if x <= xs[0]:
        return points[0][1]
    for (x0, p0), (x1, p1) in zip(zip(xs, points), zip(xs[1:], points[1:])):
        if x <= x1:
            return p0[1] + (p1[1] - p0[1]) * (x - x0) / (x1 - x0)
    return points[-1][1]


def _compute_for(points: List[Tuple[float, float, str]], accuracy: float) -> Optional[float]:
    """The least compute at which a frontier (its running best) reaches ``accuracy``, interpolated
    in log-compute; None when it never does."""
    best, prev = -1.0, None
    for flops, acc, _ in points:
        if acc >= accuracy:
            if prev is None or best >= accuracy:
                return flops
            (f0, a0) = prev
            t = (accuracy - a0) / (acc - a0)
            return math.exp(math.log(f0) + t * (math.log(flops) - math.log(f0)))
        if acc > best:
            best, prev = acc, (flops, acc)
    return None


STUDY = ComputeFrontier()
