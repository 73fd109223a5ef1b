"""Collect finished `vitkit train` runs into one results file (accuracy, time, img/s spread).

    python benchmarks/collect_runs.py --kind fmnist_hybrid --goal "test top-1 >= 91% within 5 min" \
        runs/default-6ep runs/h5 --note default-6ep="vitkit train (the default)" \
        --plot docs/figures/fmnist_runs.png --goal-top1 0.91

Each run contributes its summary.json, config.json and the spread of the img/s it logged
(min / median / max over the logging windows): on a shared CPU the spread says how much of a
run's time was the machine's and not the code's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_inference import dated_name, machine_info, results_path, write_json_atomic  # noqa: E402
from vitkit.train.plot import plot_val_curves  # noqa: E402


def run_record(run_dir: Path) -> dict:
    summary = run_dir / "summary.json"
    if not summary.is_file():
        raise SystemExit(f"{run_dir}: no summary.json (not a finished run directory)")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    speeds = [r["img_s"] for r in rows if "img_s" in r]
    return {
        "summary": json.loads(summary.read_text()),
        "config": json.loads((run_dir / "config.json").read_text()),
        "val_curve": [[r["epoch"], r["val_acc"]] for r in rows if "val_acc" in r],
        "img_s_spread": {"min": round(min(speeds), 1), "median": round(statistics.median(speeds), 1),
                         "max": round(max(speeds), 1)} if speeds else None,
    }


def _score(summary: dict) -> str:
    """A run's result in words: its test top-1, or a pre-training run's loss on the test images (it has no top-1)."""
    if summary.get("test_top1") is not None:
        return f"test top-1 {100 * summary['test_top1']:.2f}%"
    return f"pre-training loss {summary.get('test_loss', float('nan')):.4f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="finished run directories")
    ap.add_argument("--kind", required=True, help="results file prefix, e.g. fmnist_hybrid")
    ap.add_argument("--goal", default="", help="what the runs were measured against")
    ap.add_argument("--note", action="append", default=[], metavar="RUN=TEXT", help="a note on one run")
    ap.add_argument("--out", help="results file, or a folder for the default name "
                                  "(default benchmarks/results/<kind>_<device>_<date>.json)")
    ap.add_argument("--plot", type=Path, help="also draw the runs' validation curves into this PNG")
    ap.add_argument("--goal-top1", type=float, help="with --plot: a dashed line at this accuracy (0..1)")
    args = ap.parse_args(argv)

    notes = dict(n.split("=", 1) for n in args.note)
    info = machine_info(torch.device("cpu"), limits=False)  # the runs ran earlier: today's peaks say nothing of them
    out = results_path(args.out, dated_name(args.kind, torch.device("cpu"), info))
    data = {"benchmark": args.kind, "goal": args.goal, "date": datetime.date.today().isoformat(),
            "machine": info, "notes": notes, "runs": {p.name: run_record(p) for p in args.runs}}
    write_json_atomic(out, data)
    for name, r in data["runs"].items():
        s = r["summary"]
        print(f"{name}: {s['model']} {_score(s)} in {s['seconds']:.0f} s, "
              f"{s['train_img_s']:.0f} img/s (spread {r['img_s_spread']})")
    print(f"wrote {out}")
    if args.plot:
        curves = {f"{name}: {_score(r['summary'])}": r["val_curve"] for name, r in data["runs"].items()}
        plot_val_curves(curves, args.plot, goal=args.goal_top1, title=f"{args.kind}: validation top-1",
                        goal_label="goal (test top-1)")
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
