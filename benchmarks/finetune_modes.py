"""Fine-tuning with few trainable parameters on self-supervised encoders, when labels are few.

The encoders are the self-supervision study's (``vitkit study self-supervision``:
``vitkit pretrain --objective mae|simmim`` on all 60,000 Fashion-MNIST training images without
labels; its run folder by default, so either reuses the other's pre-training). Each is fine-tuned
with 1% and 10% of the labels, with the same optimiser steps as that study's budget, four ways
(``vitkit train --finetune``): full (the study's recipe: layer-wise lr decay 0.75), LoRA (rank 8
on every block's qkv, proj, fc1, fc2), BitFit (the biases), head only. Each row: test top-1
(mean over seeds), the trainable parameters and the training img/s.

    python benchmarks/finetune_modes.py          # 2 encoders x 2 fractions x 4 modes, 1 seed (~45 min, 2 cores)
    python benchmarks/finetune_modes.py --smoke  # a minute or two: MAE, 1%, 0.2 pre-training epochs, 20 steps

Results: ``benchmarks/results/peft_<device>_<date>.json`` (rewritten after every run) and the
table as Markdown (``--table``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from vitkit.studies.base import run_training
from vitkit.studies.selfsup import BUDGET, COMMON, LABELS, PRETRAINED, pretrain_run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_inference import SMOKE_DIR, dated_name, machine_info, results_path, work_dir, write_json_atomic  # noqa: E402

ENCODERS = ("mae", "simmim")
FRACTIONS = (0.01, 0.1)
MODES = ("full", "lora", "bitfit", "head")
#: what each mode changes in the self-supervision study's pre-trained recipe: few parameters learn at a flat lr
#: (layer decay would slow the adapters of the early blocks that are all that moves there)
MODE_RECIPE = {"full": {}, "lora": {"finetune": "lora", "lora_rank": 8, "layer_decay": None},
               "bitfit": {"finetune": "bitfit", "layer_decay": None}, "head": {"finetune": "head", "layer_decay": None}}
SMOKE = {"encoders": ["mae"], "fractions": [0.01], "seeds": [0], "pretrain_epochs": 0.2, "steps": 20}


def add_run_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--pretrain-epochs", type=float, help="override the recipes' pre-training epochs (smoke checks)")
    ap.add_argument("--steps", type=int, help="override the fine-tuning steps (smoke checks)")
    ap.add_argument("--threads", type=int, help="torch threads per run (default: torch's)")
    ap.add_argument("--work", type=Path, help="run directories (default runs/studies/self-supervision, the study's "
                                              f"own; smoke: {SMOKE_DIR}/selfsup)")


def apply_smoke(args: argparse.Namespace, smoke: Dict[str, Any]) -> None:
    """``--smoke``'s values under the explicit options; shortened runs count as a smoke check; the
    runs' folder (a smoke check's never the study's real one)."""
    for key, value in (smoke if args.smoke else {}).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.smoke = args.smoke or args.pretrain_epochs is not None or args.steps is not None
    args.work = work_dir(args.work, "selfsup", smoke=True) if args.smoke and not args.work else \
        Path(args.work or Path("runs") / "studies" / "self-supervision")


def finished(run: Path) -> Optional[Dict[str, Any]]:
    """The summary of a finished run; an unfinished one is removed (started again from scratch)."""
    if (run / "summary.json").is_file():
        return json.loads((run / "summary.json").read_text())
    if run.exists():
        shutil.rmtree(run)
    return None


def finetune(encoder: str, mode: str, fraction: float, seed: int, args: argparse.Namespace) -> Dict[str, Any]:
    run = args.work / f"peft-{encoder}-{mode}-f{fraction:g}-s{seed}"
    done = finished(run)
    if done is None:
        steps, batch = BUDGET[fraction]
        steps = args.steps or steps
        common = {k: v for k, v in COMMON.items() if k != "model"}  # the architecture comes from the weights
        recipe = {**common, **PRETRAINED, **MODE_RECIPE[mode], "init": str(args.work / f"pretrain-{encoder}"),
                  "train_fraction": fraction, "seed": seed, "max_steps": steps, "batch_size": batch,
                  "val_every": steps, "checkpoint_every": steps, "keep_checkpoints": 1}
        cfg = args.work / f"{run.name}.json"
        cfg.write_text(json.dumps({k: v for k, v in recipe.items() if v is not None}, indent=1))  # None: default
        # the recipe it was measured with, on every machine (naming none picks one by the machine's precision)
        done = run_training(run.name, "fmnist-adamw", str(cfg), threads=args.threads, runs_dir=str(args.work),
                            name=run.name)
    return done


def summarise(results: Dict[str, Any]) -> Dict[str, Any]:
    table = {}
    for key, row in results["finetune"].items():
        group = table.setdefault(f"{row['encoder']}-{row['mode']}@{row['fraction']:g}", {"accs": [], "img_s": []})
        group["accs"].append(row["test_top1"])
        group["img_s"].append(row.get("train_img_s") or 0.0)
        group["trainable_params"], group["params"] = row["trainable_params"], row["params"]
    for group in table.values():
        group["mean"] = statistics.mean(group["accs"])
        group["std"] = statistics.stdev(group["accs"]) if len(group["accs"]) > 1 else 0.0
        group["img_s"] = statistics.mean(group["img_s"])
    results["table"] = table
    return table


def markdown(results: Dict[str, Any]) -> str:
    fractions = results["settings"]["fractions"]
    lines = ["| encoder | fine-tuning | trains | " + " | ".join(f"{100 * f:g}% of labels" for f in fractions)
             + " | img/s |", "|---|---|---:|" + "---:|" * (len(fractions) + 1)]
    for encoder in results["settings"]["encoders"]:
        for mode in results["settings"]["modes"]:
            rows = [results["table"].get(f"{encoder}-{mode}@{f:g}") for f in fractions]
            known = [r for r in rows if r]
            if not known:
                continue
            share = known[0]["trainable_params"] / known[0]["params"]
            cells = [f"{100 * r['mean']:.1f}%" + (f" ± {100 * r['std']:.1f}" if r["std"] else "") if r else "–"
                     for r in rows]
            lines.append(f"| {LABELS[encoder]} | {mode} | {known[0]['trainable_params']:,} ({100 * share:.1f}%) | "
                         + " | ".join(cells) + f" | {statistics.mean(r['img_s'] for r in known):,.0f} |")
    return "\n".join(lines)


def parse_options(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--encoders", nargs="+", choices=list(ENCODERS), help="default: all")
    ap.add_argument("--modes", nargs="+", choices=list(MODES), help="default: all")
    ap.add_argument("--fractions", nargs="+", type=float, choices=list(FRACTIONS), help="default: all")
    ap.add_argument("--seeds", nargs="+", type=int, help="fine-tuning seeds (default 0)")
    add_run_options(ap)
    ap.add_argument("--out", help="results file, or a folder for the default name")
    ap.add_argument("--table", type=Path, help="also write the Markdown table here")
    ap.add_argument("--smoke", action="store_true", help="smoke check: " + ", ".join(
        f"{k.replace('_', '-')} {v}" for k, v in SMOKE.items()))
    args = ap.parse_args(argv)
    apply_smoke(args, SMOKE)
    args.encoders = args.encoders or list(ENCODERS)
    args.modes = args.modes or list(MODES)
    args.fractions = args.fractions or list(FRACTIONS)
    args.seeds = args.seeds or [0]
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_options(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu")
    info = machine_info(device, limits=False)
    out = results_path(args.out, dated_name("peft", device, info), args.smoke)
    results = {"benchmark": "peft", "machine": info,
               "settings": {"encoders": args.encoders, "modes": args.modes, "fractions": args.fractions,
                            "seeds": args.seeds, "mode_recipe": MODE_RECIPE, "common": COMMON,
                            "pretrained": PRETRAINED, "budget": {str(f): BUDGET[f] for f in args.fractions},
                            "steps_override": args.steps, "pretrain_epochs_override": args.pretrain_epochs},
               "pretrain": {}, "finetune": {}}
    for encoder in args.encoders:
        print(f"pre-training {encoder} (or reusing {args.work / f'pretrain-{encoder}'}) ...", flush=True)
        results["pretrain"][encoder] = pretrain_run(encoder, args.work, args.threads, args.pretrain_epochs)
    jobs = [(e, m, f, s) for s in args.seeds for f in args.fractions for e in args.encoders for m in args.modes]
    for i, (encoder, mode, fraction, seed) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {encoder} {mode} {100 * fraction:g}% seed {seed} ...", end=" ", flush=True)
        s = finetune(encoder, mode, fraction, seed, args)
        results["finetune"][f"{encoder}-{mode}-f{fraction:g}-s{seed}"] = {
            "encoder": encoder, "mode": mode, "fraction": fraction, "seed": seed, **s}
        print(f"test top-1 {100 * s['test_top1']:.2f}%, {s['trainable_params']:,} trainable", flush=True)
        summarise(results)
        write_json_atomic(out, results)
    md = markdown(results)
    print("\n" + md + f"\n\nwrote {out}")
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(md + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
