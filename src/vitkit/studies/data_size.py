"""Data size (the paper's Figures 3 and 4): a CNN's inductive bias against a ViT's, from 1% of
the labels to all of them, with the hybrid between.

    vitkit study data-size            # 3 models x 4 label fractions x 3 seeds: about 40 min on 2 CPU cores
    vitkit study data-size --smoke    # 1% and 100%, one seed, 20 steps a run: a minute

The paper pre-trains on growing subsets of JFT-300M and ImageNet-21k: ResNets are ahead on the
smaller ones, ViTs overtake them on the larger (a ViT "overfits more than ResNets with
comparable computational cost on smaller datasets"). Here, at CPU scale, the same models as
``benchmarks/small_data.py`` (its arm definitions live here and that benchmark reads them) train
on 1%, 10%, 30% and 100% of Fashion-MNIST's labels for the same 800 steps of 128: the Ti-like ViT,
the hybrids' ResNetV2 as a classifier, and the conv-stem hybrid with 3 transformer layers, all
0.43-0.46M parameters. The labelled subsets are fixed, class-balanced and nested
(``train_fraction``); the score is test top-1 (and the frozen features' few-shot accuracy).

Result (the committed ``docs/studies/data-size.json``): see docs/paper.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from .base import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Arm, Options, Study, differ, spread, too_few_seeds, verdict

#: the Ti-like ViT of the small-data comparison: a 7x7 grid of 4x4-pixel patches
VIT_TI_LIKE = {"img_size": 28, "patch_size": 4, "embed_dim": 96, "depth": 4, "num_heads": 4, "mlp_dim": 384}
#: DeiT's regularisers (Touvron et al. 2021, Table 9)
DEIT_REGULARISERS = {"randaugment": "m9-mstd0.5", "mixup": 0.8, "cutmix": 1.0, "mixup_switch_prob": 0.5,
                     "random_erasing": 0.25, "repeated_aug": 3, "label_smoothing": 0.1}
#: arm -> model name, model_args, extra training options, label (``benchmarks/small_data.py`` runs these too)
ARMS: Dict[str, Dict[str, Any]] = {
    "vit": {"model": "vit_tiny_patch16_224", "model_args": dict(VIT_TI_LIKE), "train": {},
            "label": "ViT (Ti-like)"},
    "convit": {"model": "convit_tiny", "model_args": dict(VIT_TI_LIKE, local_up_to_layer=3), "train": {},
               "label": "ConViT (Ti-like)"},
    "deit": {"model": "vit_tiny_patch16_224", "model_args": dict(VIT_TI_LIKE, drop_path_rate=0.1),
             "train": dict(DEIT_REGULARISERS), "label": "ViT, DeiT recipe"},
    "resnet": {"model": "resnetv2_50_nopreact", "model_args": {"img_size": 28, "layers": [1, 1]}, "train": {},
               "label": "ResNetV2 (CNN)"},
    "hybrid": {"model": "vit_fmnist_hybrid", "model_args": {"depth": 3}, "train": {},
               "label": "hybrid (conv stem + 3 layers)"},
    "deit_distilled": {"model": "deit_tiny_distilled_patch16_224",
                       "model_args": dict(VIT_TI_LIKE, drop_path_rate=0.1),
                       "train": dict(DEIT_REGULARISERS, distill="hard"), "teacher_arm": "resnet",
                       "label": "ViT, DeiT recipe + CNN teacher"},
}
#: the shared optimiser and budget: every run the same number of steps, whatever its labels
COMMON = {"dataset": "fashion-mnist", "batch_size": 128, "lr": 2e-3, "min_lr": 1e-5, "weight_decay": 0.05,
          "schedule": "cosine", "warmup_epochs": None, "clip_grad": 1.0}
STEPS, WARMUP = 800, 80
FRACTIONS = (0.01, 0.1, 0.3, 1.0)
STUDY_ARMS = ("vit", "hybrid", "resnet")


def train_config(arm: str, fraction: float, steps: int = STEPS, warmup: int = WARMUP) -> Dict[str, Any]:
    """The TrainConfig fields of one small-data run (the seed, folders and teacher are the caller's)."""
    spec = ARMS[arm]
    return {**COMMON, "model": spec["model"], "model_args": spec["model_args"], "max_steps": steps,
            "warmup_steps": warmup, "train_fraction": fraction, "val_every": max(steps // 3, 1),
            "checkpoint_every": steps, "keep_checkpoints": 1, **spec["train"]}


class DataSize(Study):
    name = "data-size"
    title = "Data size: ViT, hybrid and ResNet from 1% to 100% of the labels"
    claim = ("With little data the CNN's inductive bias wins; the ViT catches up as data grows and overtakes it "
             "with enough (Figures 3 and 4)")
    setting = ("Fashion-MNIST at 1%, 10%, 30% and 100% of the labels (555 to 55,000 images), every run 800 steps "
               "of 128 with the same optimiser; a Ti-like ViT, a ResNetV2 and a conv-stem hybrid of 0.43-0.46M "
               "parameters; test top-1 over 3 seeds")
    paper = {"source": "Dosovitskiy et al. 2021, section 4.2, Figures 3 and 4",
             "words": "ResNets perform better with smaller pre-training datasets but plateau sooner than ViT"}
    fewshot = True

    def arms(self, options: Options) -> List[Arm]:
        fractions = (FRACTIONS[0], FRACTIONS[-1]) if options.smoke else FRACTIONS
        return [Arm(f"{arm}-f{f:g}", f"{ARMS[arm]['label']}, {100 * f:g}%", train_config(arm, f),
                    {"model_arm": arm, "fraction": f}) for f in fractions for arm in STUDY_ARMS]

    def _fractions(self, results: Dict[str, Any]) -> List[float]:
        return sorted({a["fraction"] for a in results["arms"].values()})

    def verdicts(self, results: Dict[str, Any]) -> List[Dict[str, Any]]:
        fractions = self._fractions(results)
        claims = ("with few labels the CNN leads the ViT", "the ViT gains on the CNN as labels grow",
                  "with all the labels the ViT overtakes the CNN (a crossover)")
        if too_few_seeds(results):
            return [verdict(c, INCONCLUSIVE, "one seed: no spread to judge differences by") for c in claims]
        vit = {f: spread(results, f"vit-f{f:g}") for f in fractions}
        cnn = {f: spread(results, f"resnet-f{f:g}") for f in fractions}
        low, high = fractions[0], fractions[-1]
        gap = {f: cnn[f].mean - vit[f].mean for f in fractions}
        gaps = ", ".join(f"{100 * f:g}%: {100 * gap[f]:+.1f}" for f in fractions)
        out = []
        if gap[low] > 0 and differ(cnn[low], vit[low]):
            out.append(verdict(claims[0], REPRODUCED,
                               f"the CNN leads by {100 * gap[low]:.1f} points at {100 * low:g}%"))
        elif gap[low] > 0:
            out.append(verdict(claims[0], INCONCLUSIVE, f"the CNN leads by {100 * gap[low]:.1f} points at "
                                                        f"{100 * low:g}%, within the seeds' spread"))
        else:
            out.append(verdict(claims[0], NOT_REPRODUCED, f"the ViT leads by {-100 * gap[low]:.1f} points at "
                                                          f"{100 * low:g}%"))
        out.append(verdict(claims[1], REPRODUCED if gap[high] < gap[low] else NOT_REPRODUCED,
                           f"CNN minus ViT, points: {gaps}"))
        if gap[high] < 0 and differ(vit[high], cnn[high]):
            out.append(verdict(claims[2], REPRODUCED, f"the ViT leads by {-100 * gap[high]:.1f} points at "
                                                      f"{100 * high:g}%"))
        elif gap[high] > 0 and differ(vit[high], cnn[high]):
            out.append(verdict(claims[2], NOT_REPRODUCED, f"the CNN still leads by {100 * gap[high]:.1f} points at "
                                                          f"{100 * high:g}% ({STEPS} steps: under two epochs)"))
        else:
            out.append(verdict(claims[2], INCONCLUSIVE, f"{100 * gap[high]:+.1f} points at {100 * high:g}%, within "
                                                        f"the seeds' spread"))
        return out

    def table(self, results: Dict[str, Any]) -> str:
        fractions = self._fractions(results)
        lines = ["| model | params | " + " | ".join(f"{100 * f:g}% of the labels" for f in fractions) + " |",
                 "|---|---:|" + "---:|" * len(fractions)]
        for arm in STUDY_ARMS:
            rows = [r for r in results["runs"].values() if r["arm"].startswith(f"{arm}-f")]
            params = f"{rows[0]['params'] / 1e6:.2f}M" if rows else "–"
            cells = [spread(results, f"{arm}-f{f:g}").text() for f in fractions]
            lines.append(f"| {ARMS[arm]['label']} | {params} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def figure(self, results: Dict[str, Any], path: Path) -> Optional[Path]:
        from ..utils import pyplot, save_png

        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
        fractions = self._fractions(results)
        for arm in STUDY_ARMS:
            stats = [spread(results, f"{arm}-f{f:g}") for f in fractions]
            labels = [next((r["train_images"] for r in results["runs"].values()
                            if r["arm"] == f"{arm}-f{f:g}" and r.get("train_images")), None) for f in fractions]
            xs = [n if n else 55_000 * f for n, f in zip(labels, fractions)]
            ax.errorbar(xs, [100 * s.mean for s in stats], yerr=[100 * s.std if s.n > 1 else 0.0 for s in stats],
                        marker="o", capsize=3, label=ARMS[arm]["label"])
        ax.set_xscale("log")
        ax.set_xlabel("labelled training images (log scale)")
        ax.set_ylabel("test top-1 (%)")
        seeds = len(results["settings"]["seeds"])
        ax.set_title(f"Fashion-MNIST, {STEPS} steps of 128 every run (mean ± std over {seeds} "
                     f"seed{'s' * (seeds > 1)})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        return save_png(fig, path)


STUDY = DataSize()
