"""Named recipes: overrides of TrainConfig's defaults, each with the command that runs it, its cost
and its measured result where one was measured (docs/training.md, docs/selfsup.md), as big_vision's
configs say theirs, and which one a run takes. Apart from the fields and their checks (:mod:`.config`), which
read them."""

from __future__ import annotations

import warnings
from typing import Any, Dict, Mapping, Optional, Tuple

from .config_types import CHOICES, ConfigNote, _show

#: Self-supervised pre-training on Fashion-MNIST's training images without their labels
#: (``vitkit pretrain --objective X`` takes recipe ``X-fmnist``), about 10 minutes each on 2 CPU
#: cores: the plain ViT (the hybrid's CNN would see masked pixels), every training image
#: (val_size 0: validation rows score the test images), AdamW with MAE's betas (0.9, 0.95) and
#: weight decay 0.05, crop + flip. MAE's encoder sees a quarter of the patches, so it runs
#: twice as many epochs in the same time (~1,500 against ~780 img/s in fp32).
_PRETRAIN_FMNIST: Dict[str, Any] = {
    "model": "vit_fmnist", "val_size": 0, "epochs": 8.0, "batch_size": 256, "lr": 1.5e-3, "min_lr": 1e-5,
    "betas": (0.9, 0.95), "weight_decay": 0.05, "warmup_steps": 200, "crop_pad": 2, "hflip": True}

#: Named recipes: overrides of the defaults of TrainConfig.
RECIPES: Dict[str, Dict[str, Any]] = {
    # `vitkit train` (no recipe named, where the run trains in bf16) or `vitkit train --recipe fmnist`.
    # Cost: 5 epochs, 0.56x the steps of fmnist-adamw's 9 (docs/training.md, Muon in bf16).
    # Result: 92.69 / 92.91 / 92.87% test top-1, seeds 0-2, mean 92.82% (validation 93.31%), where fmnist-adamw gave
    # 92.80% in 9 epochs and AdamW in 5 92.15% (seeds 0-1) (Zen 4, bf16, one thread per run, two at a time;
    # benchmarks/results/fmnist_bf16_muon_cpu-amd-epyc-zen4_2026-12-06.json).
    # The default run where it trains in bf16: fmnist-adamw's augmentation with Muon on the hidden matrices, as
    # in fmnist-fp32. 4 epochs gave 92.78% (validation 93.05%): 5 chosen on the validation images.
    "fmnist": {"label_smoothing": 0.1, "random_erasing": 0.25, "epochs": 5.0, "optimizer": "muon", "momentum": 0.95,
               "muon_lr_scale": 4.0},
    # `vitkit train --init WEIGHTS` (no recipe named, where the run trains in bf16), `vitkit train --recipe
    # fmnist-adamw`, and the studies (each measured with it).
    # Cost: 3 min 20-25 s on 2 CPU cores (AMD EPYC, Zen 4, AVX-512 bf16), bf16, ~2,600 img/s.
    # Result: 92.95 / 93.10 / 92.35% test top-1, seeds 0-2, mean 92.80% (docs/training.md, The
    # default run; benchmarks/results/fmnist_default_re_cpu-amd-epyc_2026-11-25.json).
    # The bf16 default run before Muon (until 2026-12-06). Label smoothing 0.1 (+0.07 points after 4 epochs
    # on the earlier default model, within one seed's noise; every run of the search that chose
    # the 5-convolution model used it). Random erasing 0.25 is what lets more epochs pay: 9 with
    # it gave 92.90 / 92.91 / 92.56% (seeds 0-2, one thread each) where 6 without gave 92.37 /
    # 91.99 / 91.84 and 7 without overfit (benchmarks/results/fmnist_default_re_*.json).
    "fmnist-adamw": {"label_smoothing": 0.1, "random_erasing": 0.25, "epochs": 9.0},
    # `vitkit train` (no recipe named, where the run trains in fp32) or `vitkit train --recipe fmnist-fp32`.
    # Cost: 3 epochs; with AdamW 4 min 36 s (mean of seeds 0-2) on 2 CPU cores (AMD EPYC, Zen 3, AVX2, no
    # bf16), fp32, 650 img/s; Muon's step costs no measurable time more (Zen 4 in fp32, 2 threads, 5
    # interleaved rounds).
    # Result: 92.66 / 92.59 / 92.62% test top-1, seeds 0-2, mean 92.62%, where AdamW gave 91.96 / 91.20 /
    # 91.06% (mean 91.41%) on the same machine (Zen 4 in fp32; Zen 3: 91.87 / 90.98 / 91.11%) (docs/training.md,
    # On a CPU without bf16; benchmarks/results/fmnist_fp32_muon_cpu-amd-epyc-zen4_2026-12-05.json).
    # The default run where it trains in fp32 (no native bf16: most laptops and cloud VMs). Muon on the
    # hidden matrices at 4x the lr (1x, 2x, 8x: 92.22, 92.53, 92.24% on seed 0; chosen on validation images).
    "fmnist-fp32": {"label_smoothing": 0.1, "epochs": 3.0, "optimizer": "muon", "momentum": 0.95,
                    "muon_lr_scale": 4.0},
    # `vitkit train --init WEIGHTS` (no recipe named, where the run trains in fp32) or `vitkit train --recipe
    # fmnist-fp32-adamw`.
    # Cost and result: those of fmnist-fp32 with AdamW above (91.32% on Zen 3, 91.41% on Zen 4 in fp32).
    # The fp32 default run before Muon, kept for fine-tuning: Muon's steps were measured from scratch, and on
    # weights AdamW trained they were no better in Liu et al. 2025 (and 4x the lr would move them far).
    "fmnist-fp32-adamw": {"label_smoothing": 0.1, "epochs": 3.0},
    # `vitkit train --recipe fmnist-long`.
    # Cost: 1 h 47 min for seed 0 on a quiet 2-core AMD EPYC (900 img/s median), bf16.
    # Result: 94.47 / 94.69 / 94.49% test top-1 (EMA 94.57 / 94.76 / 94.50%), seeds 0-2; with
    # flip-shift TTA (EMA, fp32) 95.10 / 95.13 / 95.00% (docs/training.md, The long recipe;
    # benchmarks/results/fmnist_long_s{0,1,2}_cpu-amd-epyc_2026-11-26.json).
    # Longer and deeper (4 transformer layers), with crop + flip + random erasing and an EMA of
    # the weights; no label smoothing or stochastic depth: this small model underfits them
    # (30 epochs with both: 92.8% test; 40 without: 93.2-93.4%; 80 without erasing: 93.6%;
    # 60 of this: 93.7%, EMA 93.8%; 100 of this: 94.4-94.8% (seeds 0-2); 200 of this: 94.7%, not
    # worth twice the time by default; README: Training). The summary adds the test score with
    # flip-shift TTA, the 10 views its crop and flip train on (chosen on the 200-epoch run's
    # validation images: 95.66% against 94.96% without; 100 epochs, seeds 0-2: 95.10%, 95.13%
    # and 95.00%, EMA, fp32).
    "fmnist-long": {"epochs": 100.0, "model_args": {"depth": 4}, "crop_pad": 2, "hflip": True,
                    "random_erasing": 0.25, "ema_decay": 0.9995, "test_tta": "flip-shift"},
    # `vitkit train --recipe paper-pretrain --dataset folder --data-dir imagenet21k/` (under torchrun
    # for several GPUs: docs/scaling.md).
    # Cost and result: not measured.
    # The paper's pre-training: Adam (0.9, 0.999), decoupled weight decay 0.1, batch 4096
    # (accumulated when it does not fit), 10k warm-up steps then linear decay, clip 1,
    # tanh pre-logits head (D units: "width" is the model's embed_dim), dropout 0.1.
    "paper-pretrain": {"optimizer": "adamw", "betas": (0.9, 0.999), "weight_decay": 0.1,
                       "batch_size": 4096, "micro_batch": 256, "warmup_steps": 10_000, "schedule": "linear",
                       "clip_grad": 1.0, "lr": 1e-3, "min_lr": 0.0, "crop_pad": 0, "hflip": True,
                       "model_args": {"representation_size": "width", "drop_rate": 0.1}},
    # `vitkit train --recipe paper-finetune --init ViT-B_16.npz --dataset folder --data-dir photos/
    # --img-size 384 --init-interpolation bilinear-aligned` (docs/datasets.md: the official code's resizing
    # of the position table; a recipe cannot hold it, as it needs --init).
    # Cost and result: not measured.
    # The paper's fine-tuning: SGD momentum 0.9, batch 512, cosine, no weight decay, clip 1.
    "paper-finetune": {"optimizer": "sgd", "momentum": 0.9, "batch_size": 512, "weight_decay": 0.0,
                       "schedule": "cosine", "clip_grad": 1.0, "lr": 0.01, "warmup_steps": 500,
                       "min_lr": 0.0},
    # `vitkit train --recipe deit --model deit_tiny_patch16_224 --dataset folder --data-dir imagenet/
    # --batch-size 1024` (docs/training.md, The DeiT recipe).
    # Cost and result: not measured.
    # DeiT (Touvron et al. 2021, Table 9 / the official main.py): AdamW, lr 5e-4 x batch / 512
    # (scaled from the run's batch_size), weight decay 0.05, cosine to 1e-5 after 5 warm-up
    # epochs, 300 epochs, no gradient clipping, RandAugment m9-mstd0.5, Mixup 0.8, CutMix 1.0,
    # random erasing 0.25, stochastic depth 0.1, repeated augmentation 3, label smoothing 0.1,
    # model EMA 0.99996.
    "deit": {"optimizer": "adamw", "betas": (0.9, 0.999), "lr": 5e-4, "lr_scale_batch": 512,
             "weight_decay": 0.05, "schedule": "cosine", "warmup_epochs": 5.0, "min_lr": 1e-5, "epochs": 300.0,
             "clip_grad": None, "randaugment": "m9-mstd0.5", "mixup": 0.8, "cutmix": 1.0,
             "mixup_switch_prob": 0.5, "random_erasing": 0.25, "model_args": {"drop_path_rate": 0.1},
             "repeated_aug": 3, "label_smoothing": 0.1, "ema_decay": 0.99996},
    # `vitkit pretrain --objective simmim`.
    # Cost: 8 epochs in 769 s (part of it beside other work) on 2 CPU cores (AMD EPYC), fp32.
    # Result: its encoder fine-tuned on 1% / 10% of the labels 75.6% / 83.2% test top-1 (scratch
    # 67.7% / 78.3%), mean of seeds 0-2; frozen 5-shot 54.6% (docs/selfsup.md;
    # benchmarks/results/selfsup_cpu-amd-epyc_2026-11-24.json).
    # SimMIM: a 4 px block (one patch) is to 28 px what the paper's 32 px block is to 192 px
    "simmim-fmnist": {**_PRETRAIN_FMNIST, "mask_block": 4},
    # `vitkit pretrain --objective mpp`.
    # Cost: 8 epochs in 597 s on 2 CPU cores (AMD EPYC), fp32.
    # Result: its encoder fine-tuned on 1% / 10% of the labels 76.3% / 84.0% test top-1 (scratch
    # 67.7% / 78.3%), mean of seeds 0-2; frozen 5-shot 59.6% (docs/selfsup.md;
    # benchmarks/results/selfsup_cpu-amd-epyc_2026-11-24.json).
    "mpp-fmnist": dict(_PRETRAIN_FMNIST),
    # `vitkit pretrain --objective mae`.
    # Cost: 15 epochs in 623 s on 2 CPU cores (AMD EPYC), fp32, 1,574 img/s.
    # Result: its encoder fine-tuned on 1% / 10% of the labels 77.2% / 85.7% test top-1 (scratch
    # 67.7% / 78.3%), mean of seeds 0-2; frozen 5-shot 66.2% (docs/selfsup.md;
    # benchmarks/results/selfsup_cpu-amd-epyc_2026-11-24.json).
    # MAE with a light decoder (MAE's ablation: depth 1-2 costs little accuracy when fine-tuning)
    "mae-fmnist": {**_PRETRAIN_FMNIST, "epochs": 15.0, "decoder_dim": 64, "decoder_depth": 2, "decoder_heads": 4,
                   "decoder_mlp_dim": 128},
}


def resolve_width(model_args: Dict[str, Any], config: Any) -> Dict[str, Any]:
    """``representation_size="width"`` (a recipe's way to say D) -> the model's width: the
    ``embed_dim`` override, else the architecture's (``config``); CNNs have no such layer."""
    if model_args.get("representation_size") != "width":
        return model_args
    width = model_args.get("embed_dim", getattr(config, "embed_dim", None))
    if width is None:
        raise ValueError(f"a pre-logits layer of the model's width needs a ViT; {config.name or config.architecture} "
                         f"has no embed_dim (drop representation_size from the model args)")
    return {**model_args, "representation_size": width}


#: the pre-training recipes and the objective each pre-trains (``vitkit pretrain --objective X``: ``X-fmnist``)
PRETRAIN_RECIPES = {"simmim-fmnist": "simmim", "mpp-fmnist": "mpp", "mae-fmnist": "mae"}
#: ``vitkit train`` without --recipe: the recipe for the precision the run trains in (train/precision.py).
DEFAULT_RECIPES = {"fp32": "fmnist-fp32", "bf16": "fmnist", "fp16": "fmnist"}
#: ``vitkit train --init`` without --recipe: a default recipe's fine-tuning form, where it has one.
FINETUNE_RECIPES = {"fmnist": "fmnist-adamw", "fmnist-fp32": "fmnist-fp32-adamw"}


#: the fields a recipe sets for its optimizer alone: they go with it when a run names another optimizer
OPTIMIZER_FIELDS = {"muon": ("momentum", "muon_lr_scale"), "sgd": ("momentum",)}


def recipe_optimizer(recipe: Optional[str], defaults: Mapping[str, Any]) -> str:
    """The optimizer ``recipe`` trains with: its own, else the field's default (``defaults``: TrainConfig's)."""
    return RECIPES.get(recipe or "", {}).get("optimizer", defaults["optimizer"])


def for_other_optimizer(recipe: str, values: Dict[str, Any], chosen: Mapping[str, Any],
                        defaults: Mapping[str, Any]) -> str:
    """``--optimizer sgd`` over a Muon recipe: the recipe's momentum and lr scale were Muon's (0.95 reached SGD in
    silence), so they return to the fields' defaults. The note returned names those the new optimizer reads, and
    says the lr was chosen for the recipe's optimizer where the two step on different scales (SGD and the rest)."""
    mine, theirs = values.get("optimizer"), recipe_optimizer(recipe, defaults)
    if "optimizer" not in chosen or mine == theirs:
        return ""
    reset = [k for k in OPTIMIZER_FIELDS.get(theirs, ()) if k in RECIPES[recipe] and k not in chosen]
    said = [f"its {k} {_show(values[k])} goes back to {_show(defaults[k])}" for k in reset  # (what mine reads)
            if k in OPTIMIZER_FIELDS.get(mine, ()) and values[k] != defaults[k]]
    values.update({k: defaults[k] for k in reset})
    if "lr" not in chosen and "sgd" in (mine, theirs):
        per = f" per {values['lr_scale_batch']} images of batch" if values.get("lr_scale_batch") else ""
        said.append(f"its learning rate {_show(values.get('lr', defaults['lr']))}{per} is {theirs}'s, not {mine}'s: "
                    f"choose one with --lr")
    return f"optimizer {mine} replaces recipe {recipe}'s {theirs}: {'; '.join(said)}" if said else ""


def default_recipe(precision: str = "auto", device: Any = None) -> Tuple[str, str]:
    """(recipe, why) for a run that names no recipe, from the precision it will train in."""
    from .precision import trains_in  # imports torch: parsing flags does not

    name, why = trains_in(precision, device)
    return DEFAULT_RECIPES[name], f"{name}: {why}"


def recipe_in_effect(recipe: Optional[str], file: Optional[str], given: Mapping[str, Any],
                      from_file: Mapping[str, Any]) -> str:
    """The recipe named (--recipe, else the config file's, as a run's config.json names it), else the default
    run's for the objective or for the precision the run will train in; --recipe and the file's must agree."""
    objective = given.get("objective", from_file.get("objective"))
    if recipe is None and isinstance(from_file.get("recipe"), str):  # the file's, as --recipe (a run's config.json)
        recipe = _named_by_file(file, from_file["recipe"], given.get("precision", from_file.get("precision")))
    if recipe is None and f"{objective}-fmnist" in RECIPES:  # pre-training's, as vitkit pretrain --objective picks
        recipe = f"{objective}-fmnist"
    if recipe is None:
        precision = given.get("precision", from_file.get("precision", "auto"))  # (TrainConfig's)
        if precision not in CHOICES["precision"]:
            raise ValueError(f"precision must be one of {', '.join(CHOICES['precision'])}, not {_show(precision)}")
        recipe = default_recipe(precision)[0]
        if given.get("init", from_file.get("init")):  # fine-tuning: the default run's fine-tuning form
            recipe = FINETUNE_RECIPES.get(recipe, recipe)
    if recipe not in RECIPES:
        where = f"{file}: " if file and from_file.get("recipe") == recipe else ""
        raise ValueError(f"{where}unknown recipe {recipe!r}; known: {', '.join(RECIPES)}")
    if file and from_file.get("recipe", recipe) != recipe:  # --recipe and the file's disagree
        raise ValueError(f"{file}: recipe {_show(from_file['recipe'])} differs from --recipe {recipe}: name "
                         f"one recipe")
    return recipe


def _named_by_file(file: Optional[str], recipe: str, precision: Optional[str]) -> str:
    """A config file's recipe, with a note when it is the default run of another precision than this run's (a run's
    config.json from a machine with bf16, reused on one without: its model was sized for the other)."""
    precision = "auto" if precision is None else precision  # (TrainConfig's: a file that does not say)
    if recipe in DEFAULT_RECIPES.values() and precision in CHOICES["precision"]:
        here, why = default_recipe(precision)
        if here != recipe:
            meant = " or ".join(p for p, r in DEFAULT_RECIPES.items() if r == recipe)
            warnings.warn(ConfigNote(f"{file}: recipe {recipe} is the default run for {meant}; this run trains in "
                                     f"{why.replace(': ', ' (', 1)}), whose default run is --recipe {here}"),
                          stacklevel=4)
    return recipe


__all__ = ["DEFAULT_RECIPES", "FINETUNE_RECIPES", "OPTIMIZER_FIELDS", "PRETRAIN_RECIPES", "RECIPES", "default_recipe",
           "for_other_optimizer", "recipe_in_effect", "recipe_optimizer", "resolve_width"]
