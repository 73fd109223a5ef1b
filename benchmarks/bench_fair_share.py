"""A crowded CPU: `vitkit train`, `eval` and `predict` beside 0, 1, 2 and 4 other busy processes.

A machine is rarely quiet: a test suite, another run, a conversion. Each row runs one vitkit
command (its real command line, its own process) beside ``k`` busy processes of one kind:

- ``python``: a one-thread Python loop (a data script, a linter);
- ``torch``: a torch matmul loop on as many OpenMP threads as there are cores (another training
  run, a conversion);

started either in this benchmark's session (``same``: background jobs of one shell, where Linux
gives every runnable thread an equal slice) or each in a session of its own (``own``: other
terminals or users; with autogroup, Linux's default, the CPU is shared between sessions first,
so a 2-thread command beside k one-thread sessions is entitled to 1 / (k + 1), not 2 / (k + 2)).

Speed: `train`'s training img/s from its summary.json (steps only; 1,000 validation images,
scored after the steps, are not counted); `eval` and `predict`: images over the command's wall
clock from outside, start-up included (what a user waits for). Each row's speed is divided by
the same command's speed alone; the goal (issue 42): every row keeps >= 80% of its fair share of
the cores, ``c / (k + c)`` of its speed alone on ``c`` cores with ``k`` others (2 / (k + 2) on 2
cores: every runnable thread an equal slice, vitkit's ``c`` threads against ``k`` one-thread
loops). Each row also states the scheduler's share (what the kernel entitles the command to,
given the kind, the sessions and autogroup) and the fraction of it kept: below 1, vitkit lost
time of its own (waits, serial parts); the busy processes' own rates are recorded alone and in
each row.

    python benchmarks/bench_fair_share.py            # ~25 minutes on 2 Zen 3 cores
    python benchmarks/bench_fair_share.py --verbs eval predict --runtime openvino --sessions same
                                                     # eval and predict on an OpenVINO int8 file
    python benchmarks/bench_fair_share.py --quick    # smoke check (k = 0 and 1, a few steps)

A benchmark, not a test: run it on a quiet machine (it adds the load it measures itself).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_inference import dated_name, machine_info, results_path, write_json_atomic  # noqa: E402
from bench_shared_cpu import Busy  # noqa: E402
from limits import close_limits, describe  # noqa: E402

GOAL = 0.8
KS = (0, 1, 2, 4)
KINDS = ("python", "torch")
VERBS = ("train", "eval", "predict")
#: ``--runtime``: what ``eval`` and ``predict`` run (an exported int8 file for the other two)
RUNTIMES = {"torch": None, "openvino": "model.xml", "onnxruntime": "model.onnx"}


def fair_share(k: int, cores: int) -> float:
    """The issue's fair share: what a ``cores``-thread command keeps of its speed alone beside ``k``
    one-thread loops when every runnable thread gets an equal slice."""
    return cores / (k + cores)


def scheduler_share(k: int, kind: str, cores: int, own_session: bool) -> float:
    """What the scheduler entitles the command to (of its ``cores`` cores alone): equal slices
    per runnable thread within a session, per session first across sessions (Linux's autogroup),
    each entity using at most the cores it has threads for (water-filling)."""
    others = 1 if kind == "python" else cores
    if own_session:  # sessions: vitkit's (``cores`` threads) and k others
        demands = [cores] + [others] * k
    else:  # one session: every thread alike
        demands = [1] * (cores + others * k)
    alloc, left, free = [0.0] * len(demands), list(range(len(demands))), float(cores)
    while left and free > 1e-12:
        each = free / len(left)
        full = [i for i in left if demands[i] - alloc[i] <= each]
        if not full:
            for i in left:
                alloc[i] += each
            break
        for i in full:
            free -= demands[i] - alloc[i]
            alloc[i] = demands[i]
        left = [i for i in left if i not in full]
    mine = alloc[0] if own_session else sum(alloc[:cores])
    return mine / cores


def vitkit(*args: str) -> list:
    return [sys.executable, "-m", "vitkit", *args]


def prepare(work: Path, n_images: int, steps: int = 30) -> Path:
    """A trained run to score and predict with (the default model, ``steps`` steps) and ``n_images``
    Fashion-MNIST test images as PNG files; returns the run folder."""
    from PIL import Image

    from vitkit.data import fashion_mnist as fm

    run = work / "runs" / "weights"
    if not (run / "summary.json").exists():
        subprocess.run(vitkit("train", "--max-steps", str(steps), "--runs-dir", str(work / "runs"), "--name", "weights",
                              "--no-progress", "--no-tensorboard", "--val-size", "1000"),
                       check=True, stdout=subprocess.DEVNULL)
    images = work / "images"
    images.mkdir(exist_ok=True)
    test = fm.load_split("test")
    for i in range(n_images):
        Image.fromarray(test.images[i]).save(images / f"{i:05d}.png")
    return run


def exported(work: Path, run: Path, runtime: str) -> Path:
    """The weights ``eval`` and ``predict`` read: the run's model for torch, else its int8 file for
    ``runtime`` (OpenVINO: NNCF calibrated on training images; ONNX Runtime: dynamic), written once
    here so that no row times an export."""
    name = RUNTIMES[runtime]
    if name is None:
        return run / "model"
    flag = "openvino" if runtime == "openvino" else "onnx"
    subprocess.run(vitkit("convert", str(run / "model"), str(work / name), "--to", flag, "--quantize", "int8"),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return work / name


def measure(verb: str, work: Path, run: Path, tag: str, args: argparse.Namespace) -> dict:
    """One command's speed (img/s) and wall clock."""
    weights = str(args.weights_file)
    if verb == "train":
        cmd = vitkit("train", "--max-steps", str(args.steps), "--runs-dir", str(work / "runs"), "--name", tag,
                     "--no-progress", "--no-tensorboard", "--val-size", "1000")
    elif verb == "eval":
        cmd = vitkit("eval", "--weights", weights, "--max-images", str(args.eval_images), "--no-progress",
                     "--json")
    else:
        cmd = vitkit("predict", "--weights", weights, "--json",
                     *sorted(str(p) for p in (work / "images").glob("*.png")))
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
        raise SystemExit(f"vitkit {verb} failed: {last}")
    if verb == "train":
        summary = json.loads((work / "runs" / tag / "summary.json").read_text())
        img_s = summary["train_img_s"]
    else:
        img_s = (args.eval_images if verb == "eval" else args.images) / wall
    return {"img_s": round(img_s, 1), "wall_s": round(wall, 2)}


def autogroup() -> bool | None:
    """Whether Linux shares the CPU between sessions first (None: not Linux, or not said)."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return None


def row(k: int, kind: str, session: str, work: Path, run: Path, args: argparse.Namespace, cores: int) -> dict:
    """The three commands one after another beside ``k`` busy processes of ``kind``, started in
    this benchmark's session (``same``) or each in its own (``own``)."""
    own = session == "own"
    crowd = [Busy(cores, str(work / f"busy-{kind}-{session}-{k}-{i}.log"), kind, own_session=own) for i in range(k)]
    try:
        for b in crowd:
            b.wait_ready()  # each loop running before the command starts
        out = {"k": k, "kind": kind if k else "none", "session": session if k else "none",
               "fair_share": round(fair_share(k, cores), 3),
               "scheduler_share": round(scheduler_share(k, kind, cores, own), 3) if k else 1.0, "verbs": {}}
        for verb in args.verbs:
            t0 = time.perf_counter()
            out["verbs"][verb] = measure(verb, work, run, f"train-{kind}-{session}-{k}", args)
            if crowd:
                out["verbs"][verb]["busy_rates"] = [b.rate(t0 + 1, time.perf_counter()) for b in crowd]
            print(f"k={k} {out['kind']:6s} {out['session']:4s} {verb:8s} {out['verbs'][verb]['img_s']:9.1f} img/s "
                  f"{out['verbs'][verb]['wall_s']:7.1f} s", flush=True)
        return out
    finally:
        for b in crowd:
            b.stop()


def busy_alone(work: Path, cores: int, kinds, seconds: float = 5) -> dict:
    """Each kind of busy process's rate alone: what it gives up in each row."""
    rates = {}
    for kind in kinds:
        b = Busy(cores, str(work / f"busy-{kind}-alone.log"), kind)
        try:
            b.wait_ready()
            time.sleep(seconds + 1)
            rates[kind] = b.rate(time.perf_counter() - seconds, time.perf_counter())
        finally:
            b.stop()
    return rates


def score(rows: list) -> list:
    """Each row's speed over the same command's speed alone, against its fair share and against
    what the scheduler entitles it to (below 1 there, vitkit lost time of its own)."""
    alone = {verb: v["img_s"] for verb, v in rows[0]["verbs"].items()}
    for r in rows:
        for verb, v in r["verbs"].items():
            v["of_alone"] = round(v["img_s"] / alone[verb], 3)
            v["of_fair_share"] = round(v["of_alone"] / r["fair_share"], 3)
            v["of_scheduler_share"] = round(v["of_alone"] / r["scheduler_share"], 3)
            v["meets_goal"] = v["of_fair_share"] >= GOAL
    return rows


def verdict(rows: list) -> str:
    worst = min(((v["of_fair_share"], r["k"], r["kind"], verb) for r in rows for verb, v in r["verbs"].items()))
    missed = [f"{verb} k={r['k']} {r['kind']}/{r['session']} ({v['of_fair_share']:.0%})" for r in rows
              for verb, v in r["verbs"].items() if not v["meets_goal"]]
    return (f"every row keeps >= {GOAL:.0%} of its fair share" if not missed else
            f"{len(missed)} of {sum(len(r['verbs']) for r in rows)} rows below {GOAL:.0%} of the fair share: "
            + ", ".join(missed)) + f"; worst {worst[0]:.0%} ({worst[3]} beside {worst[1]} {worst[2]})"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="training steps of each train row")
    ap.add_argument("--eval-images", type=int, default=10000, help="test images each eval row scores")
    ap.add_argument("--images", type=int, default=500, help="PNG files each predict row classifies")
    ap.add_argument("--ks", type=int, nargs="+", default=list(KS), help="numbers of busy processes (0 first)")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="kinds of busy process")
    ap.add_argument("--sessions", nargs="+", choices=("same", "own"), default=["same", "own"],
                    help="start the busy processes in this session (background jobs of one shell: every thread "
                         "an equal slice) and/or each in its own (other terminals or users: autogroup)")
    ap.add_argument("--verbs", nargs="+", choices=VERBS, default=list(VERBS), help="the commands each row runs")
    ap.add_argument("--runtime", choices=sorted(RUNTIMES), default="torch",
                    help="what eval and predict run: the model in PyTorch (default), or its int8 file exported once "
                         "for OpenVINO or ONNX Runtime")
    ap.add_argument("--quick", action="store_true",
                    help="smoke check: k = 0 and 1 Python loop, a few steps and images, to SMOKE_DIR")
    ap.add_argument("--out", help="results file or folder (default: benchmarks/results/)")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.eval_images, args.images, args.ks, args.sessions = 3, 200, 8, [0, 1], ["same"]
        args.kinds = ["python"]
    if not args.ks or args.ks[0] != 0 or any(k < 0 for k in args.ks):
        ap.error("--ks must start with 0 (the speed alone) and hold no negative number")
    if min(args.steps, args.eval_images, args.images) < 1:
        ap.error("--steps, --eval-images and --images must be at least 1")
    if args.runtime != "torch" and not set(args.verbs) - {"train"}:
        ap.error("--runtime is what eval and predict run: add them to --verbs (train runs in PyTorch)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    device = torch.device("cpu")
    info = machine_info(device)
    print(describe(info["limits"]), flush=True)
    out = results_path(args.out, dated_name("fair_share", device, info), smoke=args.quick)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run = prepare(work, args.images, steps=3 if args.quick else 30)
        args.weights_file = exported(work, run, args.runtime)  # train alone: torch (parse_args), no export
        results = {"benchmark": "fair_share", "goal": f"every row >= {GOAL:.0%} of c / (k + c) of its speed alone",
                   "cores": cores, "machine": info, "settings": {k: getattr(args, k) for k in
                                                                 ("steps", "eval_images", "images", "ks",
                                                                  "kinds", "sessions", "verbs", "runtime")},
                   "autogroup": autogroup(),
                   "busy_processes": {"python": "a one-thread Python loop (1,000-iteration blocks/s)",
                                      "torch": f"a torch 512x512 matmul loop on {cores} OpenMP threads (matmuls/s)"},
                   "busy_alone": busy_alone(work, cores, args.kinds, seconds=1.5 if args.quick else 5)}
        rows = [row(0, "none", "none", work, run, args, cores)]
        rows += [row(k, kind, session, work, run, args, cores)
                 for session in args.sessions for k in args.ks[1:] for kind in args.kinds]
    results["rows"] = score(rows)
    results["verdict"] = verdict(rows)
    info["limits"] = close_limits(info["limits"])
    print(results["verdict"])
    write_json_atomic(out, results)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
