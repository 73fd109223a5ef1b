"""Registers ("Vision Transformers Need Registers", Darcet et al., ICLR 2024): do the default model's
tokens grow high-norm outliers without registers, and do registers take them away?

    vitkit study registers            # 0 and 4 registers x 3 seeds, recipe fmnist-adamw: about 2 h on a
                                      # 2-core AVX2 CPU in fp32 (about 35 min where bf16 is native)
    vitkit study registers --smoke    # one seed, 20 steps a run: about a minute

The paper finds that large ViTs trained long (DINOv2, OpenCLIP, DeiT III; ViT-L and bigger) grow a
few patch tokens, in low-information background regions, whose norms are about 10x the others' and
which hold global information; attention maps show them as artifacts. Appending a few learned tokens
that no output reads (registers) gives that information a place: the outliers vanish, attention maps
are smoother, and dense tasks improve. Here the default model of ``vitkit train`` (the hybrid
``vit_fmnist_hybrid``: a conv stem, one transformer layer of width 96, 7x7 tokens, mean pooling) is
trained with the recipe fmnist-adamw (the default run's until 2026-12-06: AdamW, 9 epochs) with 0 and with 4
registers, 3 seeds each; on 500 test images each model is measured for: the share of patch tokens whose norm
after the last block is an outlier (above Q3 + 3 IQR of its patch norms; ``vitkit.inspect.token_norms``), the
largest norm against the median, how much of the patches' attention goes to the registers
(``vitkit.inspect.prefix_attention``), and how smooth its attention rollout is (the mean absolute difference
between neighbouring cells of the map, normalised to mean 1: lower is smoother).

Result (the committed ``docs/studies/registers.json``, where it has been run): see docs/paper.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from .base import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Arm, Options, Spread, Study, differ, verdict

REGISTERS = (0, 4)
IMAGES = 500
#: an outlier share below this (per mille of patch tokens) is "none": Tukey's fence lets a few through
#: in any distribution with a long tail
NONE_SHARE = 0.005
#: the model of `vitkit train` and the recipe it had when the study was measured (fmnist-adamw: 9 epochs)
TRAIN: Dict[str, Any] = {}


class Registers(Study):
    name = "registers"
    title = "Registers: high-norm tokens and smoother attention"
    claim = ("Without registers, ViTs grow high-norm outlier tokens that hold global information and spoil "
             "attention maps; a few register tokens remove the outliers and smooth the maps, at no cost in "
             "accuracy (Darcet et al. 2024)")
    setting = ("the default model of `vitkit train` (vit_fmnist_hybrid: a conv stem, one transformer layer of width "
               "96, 7x7 tokens, mean pooling) with recipe fmnist-adamw (AdamW, 9 epochs), 0 and 4 registers; 500 "
               "Fashion-MNIST test images: the share of outlier patch norms (above Q3 + 3 IQR), max/median norm, the "
               "patches' attention to the registers, and the roughness of the attention rollout")
    paper = {"source": "Darcet et al. 2024, Fig. 2-4 and Table 2: DINOv2 ViT-g, OpenCLIP ViT-L, DeiT III ViT-B/L",
             "outlier_share": "about 2% of patch tokens with norm > 150 (DINOv2 ViT-g), none with registers"}
    notes = ("The paper sees the outliers only in models large and long-trained enough (ViT-L and bigger, after "
             "about a third of training); a model of one layer of width 96 on 28-px images may have no room for "
             "them: then the claim is not tested here, and says so.")

    def arms(self, options: Options) -> List[Arm]:
        return [Arm(f"reg{r}", f"{r} registers", {**TRAIN, "model_args": {"reg_tokens": r}}, {"registers": r})
                for r in REGISTERS]

    def extra(self, results: Dict[str, Any], options: Options) -> None:
        import torch

        import vitkit

        from ..inspect import attention_rollout, prefix_attention, token_norms
        from .attention_distance import test_images

        settings = results["settings"]
        images = None
        for key, run in results["runs"].items():
            if "run_dir" not in run:
                continue
            model = vitkit.from_pretrained(Path(run["run_dir"]) / "model").eval()
            if images is None:
                images = test_images(settings["dataset"], settings.get("data_dir"), model, 64 if options.smoke
                                     else IMAGES)
            with torch.no_grad():
                norms = token_norms(model, images)
                shares = prefix_attention(model, images)
                rollout = attention_rollout(model, images)
            median = float(norms.patches.median())
            run.update(outlier_share=norms.outlier_share, max_norm_ratio=float(norms.patches.max()) / median,
                       register_attention=float(shares["registers"][-1]), rollout_roughness=roughness(rollout))

    def verdicts(self, results: Dict[str, Any]) -> List[Dict[str, Any]]:
        none, reg = (_spread(results, "reg0", "outlier_share"), _spread(results, "reg4", "outlier_share"))
        out = []
        claim = "without registers, a share of patch tokens has outlier norms; with registers they vanish"
        if not none.n or not reg.n:
            out.append(verdict(claim, INCONCLUSIVE, "no runs measured"))
        elif none.mean < NONE_SHARE:
            out.append(verdict(claim, INCONCLUSIVE, f"no outliers to remove: {1000 * none.mean:.1f} per mille of patch "
                                                    f"tokens without registers ({1000 * reg.mean:.1f} with); the paper "
                                                    f"sees them in ViT-L and larger after long training"))
        elif reg.mean < none.mean and (differ(none, reg) or reg.mean < NONE_SHARE):
            out.append(verdict(claim, REPRODUCED, f"{1000 * none.mean:.1f} per mille without registers, "
                                                  f"{1000 * reg.mean:.1f} with"))
        else:
            out.append(verdict(claim, NOT_REPRODUCED if reg.mean >= none.mean else INCONCLUSIVE,
                               f"{1000 * none.mean:.1f} per mille without registers, {1000 * reg.mean:.1f} with"))
        rough0, rough4 = (_spread(results, "reg0", "rollout_roughness"), _spread(results, "reg4", "rollout_roughness"))
        claim = "registers make attention maps smoother (rollout roughness)"
        if rough0.n < 2 or rough4.n < 2:
            out.append(verdict(claim, INCONCLUSIVE, "one seed: no spread to judge differences by"))
        else:
            text = f"roughness {rough0.mean:.3f} without registers, {rough4.mean:.3f} with"
            outcome = REPRODUCED if rough4.mean < rough0.mean and differ(rough0, rough4) else \
                NOT_REPRODUCED if rough4.mean > rough0.mean and differ(rough0, rough4) else INCONCLUSIVE
            spread_note = ", within the seeds' spread" if outcome == INCONCLUSIVE else ""
            out.append(verdict(claim, outcome, text + spread_note))
        top0, top4 = _spread(results, "reg0", "test_top1"), _spread(results, "reg4", "test_top1")
        claim = "registers cost no accuracy"
        if top0.n < 2 or top4.n < 2:
            out.append(verdict(claim, INCONCLUSIVE, "one seed: no spread to judge differences by"))
        else:
            text = f"test top-1 {top0.text()}% without registers, {top4.text()}% with"
            worse = top4.mean < top0.mean and differ(top0, top4)
            out.append(verdict(claim, NOT_REPRODUCED if worse else REPRODUCED, text))
        return out

    def table(self, results: Dict[str, Any]) -> str:
        lines = ["| registers | test top-1 | outlier patch norms (per mille) | max / median norm | attention to "
                 "registers | rollout roughness |", "|---|---:|---:|---:|---:|---:|"]
        for r in REGISTERS:
            key = f"reg{r}"
            cells = [_spread(results, key, "test_top1").text(),
                     _spread(results, key, "outlier_share").text(scale=1000.0),
                     _spread(results, key, "max_norm_ratio").text(scale=1.0, digits=2),
                     _spread(results, key, "register_attention").text(scale=100.0) + "%" if r else "–",
                     _spread(results, key, "rollout_roughness").text(scale=1.0, digits=3)]
            lines.append(f"| {r} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def figure(self, results: Dict[str, Any], path: Path) -> Optional[Path]:
        """Per arm, each seed's outlier share and rollout roughness (the two claims side by side)."""
        from ..utils import pyplot, save_png

        runs = [r for r in results.get("runs", {}).values() if "outlier_share" in r]
        if not runs:
            return None
        plt = pyplot()
        fig, axes = plt.subplots(1, 2, figsize=(7, 3), dpi=120)
        for ax, metric, label in ((axes[0], "outlier_share", "outlier patch norms (per mille)"),
                                  (axes[1], "rollout_roughness", "rollout roughness (lower: smoother)")):
            for i, r in enumerate(REGISTERS):
                values = [run[metric] * (1000 if metric == "outlier_share" else 1) for run in runs
                          if run["arm"] == f"reg{r}"]
                ax.scatter([i] * len(values), values, s=30)
            ax.set_xticks(range(len(REGISTERS)), [f"{r} registers" for r in REGISTERS])
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        fig.suptitle("Each dot a seed: the default model with and without registers", fontsize=9)
        fig.tight_layout()
        return save_png(fig, path)


def roughness(maps) -> float:
    """The mean absolute difference between neighbouring cells of each map (B, gh, gw), each map scaled to
    mean 1 first, averaged over the maps: 0 for a flat map, large for a speckled one."""
    maps = maps / maps.mean(dim=(-2, -1), keepdim=True).clamp_min(1e-12)
    steps = [(maps[:, 1:] - maps[:, :-1]).abs().flatten(1), (maps[:, :, 1:] - maps[:, :, :-1]).abs().flatten(1)]
    import torch

    return float(torch.cat(steps, dim=1).mean())


def _spread(results: Dict[str, Any], arm: str, metric: str) -> Spread:
    return Spread(tuple(r[metric] for r in results.get("runs", {}).values() if r.get("arm") == arm and metric in r))


STUDY = Registers()
