"""``vitkit train`` and ``vitkit pretrain``: one flag per ``TrainConfig`` field, the run by ``vitkit.train``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, Optional

from ..files import as_argument, check_output
from .common import fmt_int


def train_config(args: argparse.Namespace, objective: Optional[str] = None):
    """The run's TrainConfig from ``vitkit train``'s (or ``pretrain``'s) flags (recipe <- --config <- flags)."""
    from ..train import resolve_config

    overrides = {name: getattr(args, name, None) for name in _train_fields()}
    overrides["objective"] = objective
    if isinstance(overrides.get("model_args"), str):
        try:
            overrides["model_args"] = json.loads(overrides["model_args"])
        except json.JSONDecodeError as e:
            raise ValueError(f"--model-args is not valid JSON ({e}): {overrides['model_args']!r}") from None
        if not isinstance(overrides["model_args"], dict):
            raise ValueError(f"--model-args must be a JSON object of model options, e.g. '{{\"depth\": 4}}', "
                             f"not {json.dumps(overrides['model_args'])}")
    if overrides["img_size"] is not None:
        from ..models.sizes import one_size  # (here: --help answers without importing torch)

        overrides["img_size"] = one_size(overrides["img_size"])
    if args.no_progress:
        overrides["progress"] = False
    recipe = args.recipe  # none: the config file's, else the objective's or the precision's (recipe_in_effect)
    if args.resume:  # the run's saved config decides; only the runtime fields may change
        from ..train.resume import check_resume, with_saved

        overrides = check_resume(args.resume, overrides, args.verb, args.config, args.recipe)
        saved_recipe, overrides = with_saved(args.resume, overrides)
        recipe = saved_recipe or recipe
    return resolve_config(recipe, args.config, **overrides)


def _run(cfg, args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """Train (or pre-train); the summary to print, or None when it was printed as JSON or this
    process is not the one that reports (under torchrun, rank 0 reports)."""
    from ..train import train
    from ..train.resume import RUNTIME_FIELDS

    asked = [f for f in RUNTIME_FIELDS if getattr(args, f, None) is not None] + ["progress"] * args.no_progress
    first = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 says what every rank would
    summary = train(cfg, resume=args.resume, log=lambda m: print(m, file=sys.stderr) if first else None, asked=asked)
    if not first:
        return None
    if args.json:
        print(json.dumps(summary))
        return None
    return summary


def _quick_run_notes(summary: Dict[str, Any], width: int = 9) -> None:
    """The notes that keep a quick run's numbers from passing for the split's."""
    if summary.get("test_split_images"):  # (a --test-size past the split's size scored all of it: no note)
        print(f"{'note':<{width}}test scores are of {summary['test_images']:,} of the split's "
              f"{summary['test_split_images']:,} test images (--test-size: a fixed random sample)")
    if summary.get("tiny"):
        print(f"{'note':<{width}}{summary['tiny']}")


def _check_writable(args: argparse.Namespace, cfg) -> None:
    """The folder the run writes into, before any work: the --resume run's own, else --runs-dir (a --resume of no
    folder is left to the resume, whose words say why)."""
    if not args.resume:
        check_output(cfg.runs_dir, "folder", "--runs-dir")
    elif Path(args.resume).is_dir():
        check_output(args.resume, "folder", "--resume")


def cmd_train(args: argparse.Namespace) -> int:
    cfg = train_config(args)
    _check_writable(args, cfg)
    if cfg.objective != "classify":  # a config file may say so; its summary is pre-training's
        raise ValueError(f"the configuration asks for {cfg.objective} pre-training: run it with vitkit pretrain")
    summary = _run(cfg, args)
    if summary is None:
        return 0
    print(f"\nrun      {summary['run_dir']}")
    print(f"model    {summary['model']} ({fmt_int(summary['params'])} parameters, {summary['precision']})")
    def tta(key: str) -> str:  # the test score with the views it was scored with, when the run has one
        return f"; {summary['test_tta']} TTA {100 * summary[key]:.2f}%" if key in summary else ""

    images = f" on {summary['test_images']:,} images" if "test_images" in summary else ""
    val = "no validation split: its rows scored the test split" if summary.get("val_is_test") else \
        f"validation {100 * summary['val_top1']:.2f}%"
    print(f"test     top-1 {100 * summary['test_top1']:.2f}%{images}  ({val}{tta('test_top1_tta')})")
    if summary.get("skipped_files"):  # (a stream's are found as it is read: the first lines could not say them)
        print(f"skipped  {summary['skipped_files']:,} unreadable images or samples (named in the log)")
    if "test_top1_ema" in summary:
        ema_val = "" if summary.get("val_is_test") else f"validation {100 * summary['val_top1_ema']:.2f}%"
        print(f"EMA      top-1 {100 * summary['test_top1_ema']:.2f}%  ({ema_val}{tta('test_top1_ema_tta')}"
              f"{'; ' if ema_val or 'test_top1_ema_tta' in summary else ''}model_ema/)")
    print(f"time     {summary['seconds']:.0f} s for {summary['steps']:,} steps ({summary['epochs']} epochs), "
          f"{_img_s(summary)}")
    run = summary["run_dir"]
    print(f"next     vitkit eval --weights {as_argument(run)}   (per-class accuracy, confusion matrix)")
    print(f"         vitkit predict --weights {as_argument(run)} IMAGE...   |   vitkit inspect --weights "
          f"{as_argument(run)}   (attention maps)")
    _quick_run_notes(summary)
    return 0


def _img_s(summary: dict) -> str:
    speed = summary.get("train_img_s")
    return "no step timed in this process" if speed is None else f"{speed:.0f} img/s"


def cmd_pretrain(args: argparse.Namespace) -> int:
    if not args.objective and not args.resume and not args.config and not args.recipe:
        raise ValueError("--objective is required: simmim, mpp or mae (see vitkit pretrain --help)")
    if args.config and not args.objective and not args.resume:  # said before the pre-training flags beside it are
        from ..train.config_files import load_config_file  # refused as "only applies to pre-training"

        if load_config_file(args.config).get("objective") == "classify":
            raise ValueError(f"{args.config} says objective: classify, which vitkit train runs: vitkit pretrain "
                             f"needs simmim, mpp or mae (--objective, or objective: in the config file)")
    cfg = train_config(args, args.objective)
    if cfg.objective == "classify" and not args.resume:  # a config file without an objective
        raise ValueError("--objective is required: simmim, mpp or mae (or objective: in the config file)")
    _check_writable(args, cfg)
    summary = _run(cfg, args)
    if summary is None:
        return 0
    print(f"\nrun       {summary['run_dir']}")
    print(f"model     {summary['objective']} on {summary['model']} ({fmt_int(summary['params'])} parameters, "
          f"{summary['precision']}; {summary['train_images']:,} images, no labels)")
    acc = f", colour accuracy {100 * summary['test_colour_acc']:.1f}%" if "test_colour_acc" in summary else ""
    print(f"test      pre-training loss {summary['test_loss']:.4f}{acc}")
    if "test_loss_ema" in summary:  # (written, and not said)
        print(f"EMA       pre-training loss {summary['test_loss_ema']:.4f}  (model_ema/)")
    if summary.get("fewshot"):
        shots = "  ".join(f"{k}-shot {100 * v:.1f}%" for k, v in summary["fewshot"].items())
        print(f"few-shot  {shots}  (frozen encoder, ridge; labels only here)")
    print(f"time      {summary['seconds']:.0f} s for {summary['steps']:,} steps ({summary['epochs']} epochs), "
          f"{_img_s(summary)}")
    print(f"next      vitkit train --init {as_argument(summary['run_dir'])}   (fine-tune the encoder on labels)")
    _quick_run_notes(summary, 10)
    return 0


def _train_fields():
    from ..train import TrainConfig

    return {f.name: f for f in dataclasses.fields(TrainConfig) if f.name not in ("recipe", "progress", "objective")}


def _optional(parse):
    """A flag type that also takes ``none`` (or ``off``): switch the optional field off."""
    from ..train.config import OFF

    def convert(text: str):
        return OFF if text.lower() in ("none", "off") else parse(text)

    convert.__name__ = getattr(parse, "__name__", "value")  # argparse names the type in its errors
    return convert


def _add_train_flags(p: argparse.ArgumentParser, pretrain: bool = False) -> None:
    """One flag per TrainConfig field: every hyper-parameter is overridable, its help the field's
    comment. ``vitkit train`` shows classification's fields, ``vitkit pretrain`` the objectives'
    and none of those that need labels."""
    from ..train import RECIPES, TrainConfig
    from ..train.config import LABEL_FIELDS, OBJECTIVE_OPTIONS
    from ..train.recipes import PRETRAIN_RECIPES
    from ..utils import field_comments

    recipes = list(PRETRAIN_RECIPES)
    if pretrain:
        p.add_argument("--recipe", choices=recipes, help="named recipe whose values replace the defaults "
                       "(a config file and flags override it) [default: OBJECTIVE-fmnist]")
    else:
        p.add_argument("--recipe", choices=[r for r in RECIPES if r not in recipes],
                       help=field_comments(TrainConfig)["recipe"])
    p.add_argument("--config", help="YAML or JSON file of training options (over the recipe; flags win)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    comments = field_comments(TrainConfig)
    # pre-training starts from no weights: what fine-tunes a part of --init weights has nothing to act on
    hidden = set(LABEL_FIELDS) | {"init_head", "init_interpolation", "alpha", "tau", "mixup_switch_prob", "finetune",
                                  "lora_rank", "lora_alpha", "lora_targets", "freeze_blocks"} if pretrain else \
        set(OBJECTIVE_OPTIONS) | {"fewshot"}
    for name, f in _train_fields().items():
        if name in hidden:
            continue
        flag, kind = "--" + name.replace("_", "-"), str(f.type)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        help = comments.get(name, "").replace("%", "%%") + f" [default: {_default_shown(name, default, pretrain)}"
        help += "; 'none' unsets it]" if "Optional" in kind and "bool" not in kind else "]"  # (--no-X: a switch's)
        if name == "model_args":
            p.add_argument(flag, metavar="JSON", help=help)
        elif name == "betas":
            p.add_argument(flag, type=float, nargs=2, metavar=("B1", "B2"), help=help)
        elif name == "img_size":  # one side, or H W (read by one_size)
            p.add_argument(flag, type=_optional(int), nargs="+", metavar="PX", help=help)
        elif "bool" in kind:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help)
        else:
            parse = int if "int" in kind else float if "float" in kind else str
            p.add_argument(flag, type=_optional(parse) if "Optional" in kind else parse, help=help)


def _default_shown(name: str, default, pretrain: bool) -> str:
    """A field's default as a run takes it: the default recipe's value where it sets one (train: the recipe of the
    precision the run trains in; pretrain: the objective's), the field's own elsewhere."""
    from ..train.recipes import DEFAULT_RECIPES, FINETUNE_RECIPES, PRETRAIN_RECIPES, RECIPES

    def shown(value) -> str:
        return "none" if value is None else json.dumps(value) if isinstance(value, (dict, tuple)) else str(value)

    if pretrain:
        by = {r.split("-")[0]: RECIPES[r].get(name, default) for r in PRETRAIN_RECIPES}
        if len({shown(v) for v in by.values()}) == 1:
            return shown(next(iter(by.values())))
        return "by --objective: " + ", ".join(f"{k} {shown(v)}" for k, v in by.items())
    def by_precision(recipes) -> str:  # {precision: recipe} in words
        bf16, fp32 = (shown(RECIPES[recipes[p]].get(name, default)) for p in ("bf16", "fp32"))
        return bf16 if bf16 == fp32 else f"{bf16} where the run trains in bf16, {fp32} in fp32"

    run = by_precision(DEFAULT_RECIPES)
    tuning = by_precision({p: FINETUNE_RECIPES.get(r, r) for p, r in DEFAULT_RECIPES.items()})
    if run == tuning == shown(default):
        return run
    return f"{run}{f' ({tuning} with --init)' if tuning != run else ''} (the default recipes; {shown(default)} under " \
           f"a recipe that sets none)"


def add_train(verb) -> None:
    p = verb("train", "train a ViT (default: Fashion-MNIST, a few minutes on a CPU)")
    _add_train_flags(p)
    p.set_defaults(func=cmd_train)



def add_pretrain(verb) -> None:
    p = verb("pretrain", "self-supervised pre-training of a ViT on images without labels: SimMIM, the paper's "
                         "masked patch prediction or MAE (default: Fashion-MNIST's 60k training images)")
    p.add_argument("--objective", choices=["simmim", "mpp", "mae"],
                   help="simmim: masked blocks' pixels by L1 (arXiv 2111.09886); mpp: the ViT paper's masked patch "
                        "prediction (3-bit mean colour); mae: masked autoencoder (arXiv 2111.06377); required, here "
                        "or as --config's objective")
    _add_train_flags(p, pretrain=True)
    p.set_defaults(func=cmd_pretrain)

