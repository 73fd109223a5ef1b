"""The same `vitkit train` command on two source trees, alternating: accuracy and img/s before and after a change.

A refactor must leave the default run's accuracy within noise and its speed no lower. This
runs the command on ``--before`` (another checkout, e.g. ``git worktree add /tmp/before REV``)
and ``--after`` (default: this checkout), each from its own ``src/`` (``PYTHONPATH``), in
``--rounds`` rounds that alternate which goes first, so slow drift of the machine hits both
alike. Each run's ``summary.json`` gives test/validation top-1, training img/s (steps only)
and seconds; reported are the medians and the ratio after / before of the img/s medians.

    git worktree add /tmp/vitkit-before 40c6b4f
    python benchmarks/compare_revisions.py --before /tmp/vitkit-before --rounds 1            # two default runs
    python benchmarks/compare_revisions.py --before /tmp/vitkit-before --rounds 3 -- --max-steps 300

Arguments after ``--`` go to ``vitkit train``. A benchmark, not a test: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling benchmark, however run
from bench_inference import dated_name, machine_info, results_path, write_json_atomic  # noqa: E402

KEYS = ("test_top1", "val_top1", "train_img_s", "seconds", "steps")


def git_revision(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--", "src"], capture_output=True,
                           text=True).stdout.strip()
    return out.stdout.strip() + ("+changes" if dirty else "")


def train_once(tree: Path, name: str, out_dir: Path, train_args: list) -> dict:
    """One `vitkit train` run from ``tree``'s sources -> the summary's figures."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    cmd = [sys.executable, "-m", "vitkit", "train", "--no-progress", "--json", "--out", str(out_dir),
           "--name", name, *train_args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: vitkit train failed ({done.returncode}):\n{done.stderr[-2000:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: summary.get(k) for k in KEYS}


def main(argv=None) -> int:
    here = Path(__file__).resolve().parents[1]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, type=Path, help="the other checkout (its src/ is run)")
    p.add_argument("--after", type=Path, default=here, help="default: this checkout")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", help="results file, or a folder for the default name "
                                 "(default: benchmarks/results/revisions_<device>_<date>.json)")
    p.add_argument("train_args", nargs="*", help="after --: arguments of vitkit train")
    args = p.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for label, tree in trees.items():
        if not (tree / "src" / "vitkit").is_dir():
            raise SystemExit(f"--{label} {tree}: no src/vitkit there")
    info = machine_info(torch.device("cpu"))  # (before the runs: an unwritable --out is said now, not after them)
    out = results_path(args.out, dated_name("revisions", torch.device("cpu"), info))
    runs = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="vitkit-compare-") as tmp:
        for r in range(args.rounds):
            for label in (("before", "after") if r % 2 == 0 else ("after", "before")):
                row = train_once(trees[label], f"{label}-{r}", Path(tmp), args.train_args)
                runs[label].append(row)
                print(f"round {r + 1} {label:<6} test {100 * row['test_top1']:.2f}%  val {100 * row['val_top1']:.2f}%  "
                      f"{row['train_img_s']:.0f} img/s  {row['seconds']:.0f} s", flush=True)
    medians = {label: {k: statistics.median(r[k] for r in rows) for k in ("test_top1", "val_top1", "train_img_s")}
               for label, rows in runs.items()}
    ratio = medians["after"]["train_img_s"] / medians["before"]["train_img_s"]
    print(f"median img/s: before {medians['before']['train_img_s']:.0f}, after {medians['after']['train_img_s']:.0f} "
          f"(after / before {ratio:.3f})")
    write_json_atomic(out, {"benchmark": "compare_revisions", "machine": info, "train_args": args.train_args,
                            "revisions": {k: git_revision(t) for k, t in trees.items()}, "runs": runs,
                            "medians": medians, "img_s_after_over_before": round(ratio, 3)})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
