"""Self-supervised pre-training on Fashion-MNIST: does it help when labels are few?

Each objective (SimMIM, the ViT paper's masked patch prediction, MAE) pre-trains the plain
``vit_fmnist`` on all 60,000 training images without their labels (``vitkit pretrain
--objective X``, its default recipe: about 10 minutes on 2 CPU cores). Then:

- **fine-tuning** with 1% and 10% of the labels (``train_fraction``: the fixed, class-balanced,
  nested subsets every run draws) for the same number of optimiser steps as the same model
  trained from scratch; scratch uses its best plain recipe, a pre-trained encoder the usual
  fine-tuning rule on top of it (layer-wise learning-rate decay, ``--layer-decay``), both
  listed in the results; score: top-1 on the 10,000 test images, mean over seeds;
- **few-shot** linear evaluation of the frozen encoder (1/5/10/25 shots per class, the
  paper's closed-form ridge, 3 seeds; ``vitkit fewshot``), beside the same encoder at its
  random initialisation.

    python benchmarks/selfsup.py                         # 3 objectives, 3 seeds (about 80 min on 2 cores)
    python benchmarks/selfsup.py --smoke                 # smoke check (minutes): MAE, seed 0, 1%,
                                                         # 0.2 pre-training epochs, 20 fine-tuning steps

Every run is a ``vitkit`` subprocess with its own folder under ``--work``; a finished run is not
repeated when the benchmark is started again. Results: ``benchmarks/results/selfsup_<device>_<date>.json``
(rewritten after every run), the table as Markdown (``--table``) and a figure (``--figure``).
A smoke check (``--smoke``, or shortened with ``--pretrain-epochs`` / ``--steps``) writes its
results and runs under ``bench_inference.SMOKE_DIR`` instead (unless ``--out`` / ``--work``
say otherwise): never over the day's real results, and never a run a full benchmark would reuse.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_inference import SMOKE_DIR, dated_name, machine_info, results_path, work_dir, write_json_atomic  # noqa: E402

OBJECTIVES = ("simmim", "mpp", "mae")
LABELS = {"scratch": "from scratch", "simmim": "SimMIM", "mpp": "masked patch prediction (ViT 4.6)", "mae": "MAE"}
FRACTIONS = (0.01, 0.1)
SHOTS = (1, 5, 10, 25)
#: fine-tuning budget per label fraction: (optimiser steps, batch size); the same for every arm
BUDGET = {0.01: (400, 64), 0.1: (1000, 128)}
#: the fine-tuning recipe every arm shares (augmentation, schedule), and what differs
COMMON = {"model": "vit_fmnist", "warmup_steps": 30, "crop_pad": 2, "hflip": True, "weight_decay": 0.05,
          "min_lr": 1e-5, "tensorboard": False}
SCRATCH = {"lr": 1e-3}
PRETRAINED = {"lr": 3e-3, "layer_decay": 0.75}
#: --smoke: the options a smoke check runs with (explicit options win)
SMOKE = {"objectives": ["mae"], "fractions": [0.01], "seeds": [0], "pretrain_epochs": 0.2, "steps": 20}


def vitkit(*args: str) -> Dict[str, Any]:
    """Run one vitkit command with --json; its summary (exits on failure, with its stderr)."""
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "vitkit", *args, "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"vitkit {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_seconds"] = round(time.time() - t0, 1)
    return out


def finished(run_dir: Path) -> Optional[Dict[str, Any]]:
    """The summary of a finished run; an unfinished one is removed (started again from scratch)."""
    if (run_dir / "summary.json").is_file():
        return json.loads((run_dir / "summary.json").read_text())
    if run_dir.exists():
        shutil.rmtree(run_dir)
    return None


def pretrain(objective: str, args: argparse.Namespace) -> Dict[str, Any]:
    run = args.work / f"pretrain-{objective}"
    done = finished(run)
    if done is None:
        extra = ["--epochs", str(args.pretrain_epochs)] if args.pretrain_epochs else []
        done = vitkit("pretrain", "--objective", objective, "--runs-dir", str(args.work), "--name", run.name,
                      "--no-progress", *extra, *_threads(args))
    return done


def finetune(source: str, fraction: float, seed: int, args: argparse.Namespace) -> Dict[str, Any]:
    run = args.work / f"ft-{source}-f{fraction:g}-s{seed}"
    done = finished(run)
    if done is None:
        steps, batch = BUDGET[fraction]
        steps = args.steps or steps
        recipe = {**COMMON, **(SCRATCH if source == "scratch" else PRETRAINED), "train_fraction": fraction,
                  "seed": seed, "max_steps": steps, "batch_size": batch, "val_every": steps,
                  "checkpoint_every": steps, "keep_checkpoints": 1}
        if source != "scratch":  # the architecture comes from the weights
            recipe["init"] = str(args.work / f"pretrain-{source}")
            del recipe["model"]
        cfg = args.work / f"{run.name}.json"
        cfg.write_text(json.dumps(recipe, indent=1))
        done = vitkit("train", "--config", str(cfg), "--runs-dir", str(args.work), "--name", run.name, "--no-progress",
                      *_threads(args))
    return done


def fewshot(weights: str, args: argparse.Namespace) -> Dict[str, float]:
    out = vitkit("fewshot", "--weights", weights, "--shots", *map(str, SHOTS), "--seeds", "3", "--pool", "10000")
    return {str(r["shots"]): r["mean"] for r in out["results"]}


def random_encoder(args: argparse.Namespace) -> str:
    """vit_fmnist at its initialisation (seed 0, as `vitkit pretrain` draws it), headless."""
    folder = args.work / "random-init"
    if not (folder / "model.safetensors").is_file():
        import vitkit as vk
        from vitkit.utils import seed_for

        torch.manual_seed(seed_for(0, "init"))
        vk.create_model("vit_fmnist", num_classes=0, crop_pct=1.0).save_pretrained(folder)
    return str(folder)


def _threads(args: argparse.Namespace) -> List[str]:
    return ["--threads", str(args.threads)] if args.threads else []


def _accs(results: Dict[str, Any], source: str, fraction: float) -> List[float]:
    return [r["test_top1"] for r in results["finetune"].values() if r["source"] == source and r["fraction"] == fraction]


def summarise(results: Dict[str, Any]) -> None:
    """Means, standard deviations and the gain over scratch, per arm and fraction; the goal check."""
    table = {}
    for source in ["scratch"] + results["settings"]["objectives"]:
        for fraction in results["settings"]["fractions"]:
            accs = _accs(results, source, fraction)
            if accs:
                table[f"{source}@{fraction:g}"] = {"mean": statistics.mean(accs),
                                                   "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                                                   "n": len(accs)}
    for key, row in table.items():
        base = table.get(f"scratch@{key.split('@')[1]}")
        row["gain_over_scratch"] = None if base is None else row["mean"] - base["mean"]
    goals = {"0.01": 0.05, "0.1": 0.02}
    met = {o: all((table.get(f"{o}@{f}", {}).get("gain_over_scratch") or -1) >= g for f, g in goals.items())
           for o in results["settings"]["objectives"]}
    results["table"] = table
    results["goal"] = {"gain_at_1pct": 0.05, "gain_at_10pct": 0.02, "met_by": [o for o, ok in met.items() if ok]}


def markdown(results: Dict[str, Any]) -> str:
    fr = results["settings"]["fractions"]
    head = "| start | " + " | ".join(f"{100 * f:g}% of labels" for f in fr) + " | " + \
        " | ".join(f"{k}-shot (frozen)" for k in SHOTS) + " |"
    lines = [head, "|---|" + "---:|" * (len(fr) + len(SHOTS))]
    for source in ["scratch"] + results["settings"]["objectives"]:
        cells = []
        for f in fr:
            row = results["table"].get(f"{source}@{f:g}")
            if row is None:
                cells.append("–")
                continue
            gain = "" if source == "scratch" else f" ({100 * row['gain_over_scratch']:+.1f})"
            cells.append(f"{100 * row['mean']:.1f}% ± {100 * row['std']:.1f}{gain}")
        few = results["fewshot"].get("random-init" if source == "scratch" else source, {})
        cells += [f"{100 * few[str(k)]:.1f}%" if str(k) in few else "–" for k in SHOTS]
        label = LABELS[source] + (" (random init for few-shot)" if source == "scratch" else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: Dict[str, Any], path: Path) -> None:
    """Left: fine-tuned test top-1 per arm and label fraction (seeds as dots). Right: few-shot
    accuracy of the frozen encoders against shots."""
    from vitkit.utils import pyplot, save_png

    plt = pyplot()
    sources = ["scratch"] + results["settings"]["objectives"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.8 / len(sources)
    for i, source in enumerate(sources):
        for j, f in enumerate(results["settings"]["fractions"]):
            accs = [100 * a for a in _accs(results, source, f)]
            if not accs:
                continue
            x = j + (i - (len(sources) - 1) / 2) * width
            ax1.bar(x, statistics.mean(accs), width * 0.9, color=f"C{i}", label=LABELS[source] if j == 0 else None)
            ax1.plot([x] * len(accs), accs, "k.", markersize=4)
    ax1.set_xticks(range(len(results["settings"]["fractions"])))
    ax1.set_xticklabels([f"{100 * f:g}% of labels ({results['n_labels'].get(str(f), 0):,} images)"
                         for f in results["settings"]["fractions"]])
    lows = [100 * r["mean"] for r in results["table"].values()]
    ax1.set_ylim(min(lows) - 6, max(lows) + 3)
    ax1.set_ylabel("test top-1 (%)")
    ax1.set_title("fine-tuned, same steps for every start")
    ax1.legend(fontsize=8, loc="upper left")
    ax1.grid(alpha=0.3, axis="y")
    for i, source in enumerate(sources):
        few = results["fewshot"].get("random-init" if source == "scratch" else source)
        if few:
            ax2.plot(SHOTS, [100 * few[str(k)] for k in SHOTS], "o-", color=f"C{i}",
                     label="random init" if source == "scratch" else LABELS[source])
    ax2.set_xscale("log")
    ax2.set_xticks(SHOTS)
    ax2.set_xticklabels([str(k) for k in SHOTS])
    ax2.set(xlabel="labelled images per class", ylabel="test top-1 (%)", title="few-shot, frozen encoder (ridge)")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    fig.suptitle("Fashion-MNIST: vit_fmnist pre-trained on 60k images without labels")
    fig.tight_layout()
    save_png(fig, path)


def parse_options(ap: argparse.ArgumentParser, argv: Optional[List[str]]) -> argparse.Namespace:
    """The options with the defaults filled in. Shortened pre-training or fine-tuning is a smoke
    check even without ``--smoke`` (its numbers are no benchmark result): it writes where one does."""
    args = ap.parse_args(argv)
    apply_smoke(args, SMOKE)
    args.objectives = args.objectives or list(OBJECTIVES)
    args.fractions = args.fractions or list(FRACTIONS)
    args.seeds = args.seeds or [0, 1, 2]
    return args


def add_run_options(ap: argparse.ArgumentParser) -> None:
    """The options of every benchmark on these runs (this one, finetune_modes.py)."""
    ap.add_argument("--pretrain-epochs", type=float, help="override the recipes' pre-training epochs (smoke checks)")
    ap.add_argument("--steps", type=int, help="override the fine-tuning steps (smoke checks)")
    ap.add_argument("--threads", type=int, help="torch threads per run (default: torch's)")
    ap.add_argument("--work", type=Path, help=f"run directories (default runs/selfsup; smoke: {SMOKE_DIR}/selfsup)")


def apply_smoke(args: argparse.Namespace, smoke: Dict[str, Any]) -> None:
    """``--smoke``'s values under the explicit options; shortened runs count as a smoke check; the
    runs' folder (a smoke check's never the real one)."""
    for key, value in (smoke if args.smoke else {}).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.smoke = args.smoke or args.pretrain_epochs is not None or args.steps is not None
    args.work = work_dir(args.work, "selfsup", args.smoke)


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objectives", nargs="+", choices=list(OBJECTIVES), help="default: all")
    ap.add_argument("--fractions", nargs="+", type=float, choices=list(FRACTIONS), help="default: all")
    ap.add_argument("--seeds", nargs="+", type=int, help="fine-tuning seeds (default 0 1 2)")
    add_run_options(ap)
    ap.add_argument("--out", help="results file, or a folder for the default name (default benchmarks/results/"
                                  f"selfsup_<device>_<date>.json; smoke: the same name in {SMOKE_DIR})")
    ap.add_argument("--table", type=Path, help="also write the Markdown table here")
    ap.add_argument("--figure", type=Path, help="also write the figure (PNG) here")
    ap.add_argument("--smoke", action="store_true", help="smoke check: " + ", ".join(
        f"{k.replace('_', '-')} {v}" for k, v in SMOKE.items()) + " (explicit options win)")
    args = parse_options(ap, argv)
    args.work.mkdir(parents=True, exist_ok=True)

    info = machine_info(torch.device("cpu"))
    out = results_path(args.out, dated_name("selfsup", torch.device("cpu"), info), smoke=args.smoke)
    results: Dict[str, Any] = {
        "benchmark": "selfsup", "date": datetime.date.today().isoformat(), "machine": info,
        "settings": {"objectives": args.objectives, "fractions": args.fractions, "seeds": args.seeds,
                     "budget": {str(f): {"steps": args.steps or BUDGET[f][0], "batch_size": BUDGET[f][1]}
                                for f in args.fractions},
                     "finetune_common": COMMON, "finetune_scratch": SCRATCH, "finetune_pretrained": PRETRAINED,
                     "pretrain_epochs_override": args.pretrain_epochs},
        "pretrain": {}, "fewshot": {}, "finetune": {}, "n_labels": {}}

    def save():
        summarise(results)
        write_json_atomic(out, results)  # after every run: nothing finished is lost

    for objective in args.objectives:
        print(f"pre-training {objective} ...", end=" ", flush=True)
        s = pretrain(objective, args)
        cfg = json.loads((args.work / f"pretrain-{objective}" / "config.json").read_text())
        results["pretrain"][objective] = {**s, "config": cfg}
        print(f"loss {s['test_loss']:.4f}, {s['seconds']:.0f} s, {s['train_img_s']:.0f} img/s", flush=True)
        results["fewshot"][objective] = fewshot(str(args.work / f"pretrain-{objective}"), args)
        save()
    results["fewshot"]["random-init"] = fewshot(random_encoder(args), args)
    jobs = [(src, f, s) for s in args.seeds for f in args.fractions for src in ["scratch"] + args.objectives]
    for i, (source, fraction, seed) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] fine-tune {source} {100 * fraction:g}% seed {seed} ...", end=" ", flush=True)
        s = finetune(source, fraction, seed, args)
        results["finetune"][f"{source}-f{fraction:g}-s{seed}"] = {"source": source, "fraction": fraction,
                                                                   "seed": seed, **s}
        results["n_labels"][str(fraction)] = s["train_images"]
        print(f"test top-1 {100 * s['test_top1']:.2f}%  ({s['seconds']:.0f} s)", flush=True)
        save()
    md = markdown(results)
    print("\n" + md)
    print(f"\ngoal (>= +5 points at 1%, >= +2 at 10%) met by: {', '.join(results['goal']['met_by']) or 'none'}")
    print(f"wrote {out}")
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(md + "\n")
    if args.figure:
        plot(results, args.figure)
        print(f"wrote {args.figure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
