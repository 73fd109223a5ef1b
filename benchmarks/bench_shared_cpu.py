"""A CPU shared with other work: `vitkit train` alone and beside a busy process, in one run.

Each scenario runs the real command (`vitkit train --max-steps N`, the default model and data)
as a subprocess and reads its ``train_img_s`` from summary.json:

- alone, with ``--cpu-parallel ops`` (torch's OpenMP threads inside each operation: vitkit
  before batch parts) and ``batch`` (the default: each thread runs a part of the batch);
- beside a busy process, started in its own session as another user's job would be: a torch
  matmul loop on as many OpenMP threads as there are cores (its matmuls/s are recorded alone
  and during each scenario, to show how the two share the machine);
- ``--threads 1`` beside it (the advice before batch parts) and two `vitkit train` runs side by
  side (each run's img/s).

Reported per scenario: img/s and the fraction of the same mode's img/s alone, and of the
default alone (the goal: a run beside one busy process keeps >= 35% of its img/s alone); and
the default run's model FLOPs utilisation alone: 3x its forward FLOPs per image times img/s over
the bf16 GEMM peak measured in the same run (limits.py).

    python benchmarks/bench_shared_cpu.py            # ~5 minutes on 2 cores
    python benchmarks/bench_shared_cpu.py --quick    # smoke check (a few steps, to SMOKE_DIR)

A benchmark, not a test: run it on a quiet machine (it measures the load it adds itself).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_inference import dated_name, machine_info, results_path  # noqa: E402
from limits import at_limit, close_limits, describe  # noqa: E402

BUSY = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
a = torch.randn(512, 512)
n, t = 0, time.perf_counter()
while True:
    a @ a
    n += 1
    if time.perf_counter() - t >= 1.0:
        print(f"{time.perf_counter():.3f} {n / (time.perf_counter() - t):.1f}", flush=True)
        n, t = 0, time.perf_counter()
"""


#: a single-threaded process (a Python loop: a data script, a linter, a compiler), its rate in
#: thousands of iterations a second
BUSY_PYTHON = """
import sys, time
n, t = 0, time.perf_counter()
while True:
    for _ in range(1000):
        pass
    n += 1
    if time.perf_counter() - t >= 1.0:
        print(f"{time.perf_counter():.3f} {n / (time.perf_counter() - t):.1f}", flush=True)
        n, t = 0, time.perf_counter()
"""


class Busy:
    """The other process: a torch matmul loop on ``threads`` OpenMP threads (``kind="torch"``, its
    rate in matmuls/s) or a one-thread Python loop (``kind="python"``); it prints its rate once a
    second. ``own_session``: started as another user's or terminal's job (Linux's autogroup then
    shares the CPU between sessions first), else as a background job of this one's shell."""

    def __init__(self, threads: int, log_path: str, kind: str = "torch", own_session: bool = True):
        self.log_path = log_path
        self.log = open(log_path, "w")
        script = [BUSY, str(threads)] if kind == "torch" else [BUSY_PYTHON]
        self.proc = subprocess.Popen([sys.executable, "-c", *script], stdout=self.log,
                                     stderr=subprocess.DEVNULL, start_new_session=own_session)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until its first rate is reported (torch's import takes seconds)."""
        end = time.perf_counter() + timeout
        while time.perf_counter() < end and os.path.getsize(self.log_path) == 0:
            time.sleep(0.1)

    def rate(self, since: float, until: float) -> float | None:
        """Its mean rate over the seconds reported between ``since`` and ``until`` (perf_counter)."""
        rows = []
        with open(self.log_path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and since <= float(parts[0]) <= until:
                    rows.append(float(parts[1]))
        return round(sum(rows) / len(rows), 1) if rows else None

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()


def train(runs: str, name: str, steps: int, extra: list) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vitkit", "train", "--max-steps", str(steps), "--runs-dir", runs, "--name", name,
           "--no-progress", "--no-tensorboard", "--val-size", "1000", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, runs: str, name: str) -> dict:
    _, err = proc.communicate()
    if proc.returncode != 0:
        last = err.strip().splitlines()[-1] if err.strip() else f"exit code {proc.returncode}"
        raise SystemExit(f"vitkit train {name} failed: {last}")
    with open(os.path.join(runs, name, "summary.json")) as f:
        summary = json.load(f)
    return {"train_img_s": summary["train_img_s"], "seconds": summary["seconds"], "test_top1": summary["test_top1"]}


def scenario(runs: str, name: str, steps: int, extra: list, busy: Busy | None = None, twin: bool = False) -> dict:
    t0 = time.perf_counter()
    procs = [(name, train(runs, name, steps, extra))]
    if twin:
        procs.append((name + "-twin", train(runs, name + "-twin", steps, extra)))
    rows = [finish(p, runs, n) for n, p in procs]
    row = dict(rows[0], args=extra, steps=steps)
    if twin:
        row["twin_train_img_s"] = rows[1]["train_img_s"]
    if busy is not None:
        row["busy_matmul_s"] = busy.rate(t0 + 5, time.perf_counter())  # after the run's start-up
    print(f"{name:24s} {row['train_img_s']:8.1f} img/s" + (f"  (twin {row['twin_train_img_s']:.1f})" if twin else "")
          + (f"  busy process {row['busy_matmul_s']} matmul/s" if busy else ""), flush=True)
    return row


def default_run_mfu(img_s: float, limits: dict) -> dict:
    """The default run's training img/s against the GEMM peak of the precision it trains in (bf16 where
    native, else fp32; fwd + bwd = 3 forwards)."""
    import vitkit
    from vitkit.models.complexity import complexity
    from vitkit.train.config import DEFAULT_MODEL

    gflop = 3 * complexity(vitkit.create_model(DEFAULT_MODEL).config).flops / 1e9
    peak = limits["bf16_gflop_s"] or limits["fp32_gflop_s"]  # None where bf16 is not native
    return {"model": DEFAULT_MODEL, "train_gflop_per_image": gflop, **at_limit(img_s, gflop, peak)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100, help="training steps of each run (the slowest: a third)")
    ap.add_argument("--quick", action="store_true", help="smoke check: a few steps, results to SMOKE_DIR")
    ap.add_argument("--out", help="results file or folder (default: benchmarks/results/)")
    args = ap.parse_args(argv)
    steps = 4 if args.quick else args.steps
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    info = machine_info(torch.device("cpu"))
    print(describe(info["limits"]), flush=True)
    out = results_path(args.out, dated_name("shared_cpu", torch.device("cpu"), info), smoke=args.quick)
    results: dict = {"benchmark": "shared_cpu", "goal": "beside one busy process, >= 35% of the img/s alone",
                     "machine": info, "busy_process": f"torch 512x512 matmul loop on {cores} OpenMP threads, "
                                                       f"own session", "scenarios": {}}
    rows = results["scenarios"]
    with tempfile.TemporaryDirectory() as runs:
        rows["alone_ops"] = scenario(runs, "alone_ops", steps, ["--cpu-parallel", "ops"])
        rows["alone_batch"] = scenario(runs, "alone_batch", steps, ["--cpu-parallel", "batch"])
        rows["two_runs_batch"] = scenario(runs, "two_runs_batch", steps, ["--cpu-parallel", "batch"], twin=True)
        busy = Busy(cores, os.path.join(runs, "busy.log"))
        try:
            time.sleep(6)
            results["busy_alone_matmul_s"] = busy.rate(time.perf_counter() - 5, time.perf_counter())
            print(f"busy process alone: {results['busy_alone_matmul_s']} matmul/s", flush=True)
            rows["shared_batch"] = scenario(runs, "shared_batch", steps, ["--cpu-parallel", "batch"], busy)
            rows["shared_threads1"] = scenario(runs, "shared_threads1", steps, ["--threads", "1"], busy)
            rows["shared_ops"] = scenario(runs, "shared_ops", max(2, steps // 3), ["--cpu-parallel", "ops"], busy)
        finally:
            busy.stop()
    alone = {"ops": rows["alone_ops"]["train_img_s"], "batch": rows["alone_batch"]["train_img_s"]}
    for name, row in rows.items():
        mode = "ops" if "ops" in name else "batch"
        row["of_alone_same_mode"] = round(row["train_img_s"] / alone[mode], 3)
        row["of_default_alone"] = round(row["train_img_s"] / alone["batch"], 3)
    results["verdict"] = (f"beside a busy process the default run keeps {rows['shared_batch']['of_default_alone']:.0%} "
                          f"of its img/s alone (goal >= 35%); torch's threads alone kept "
                          f"{rows['shared_ops']['of_alone_same_mode']:.0%}")
    results["default_run_mfu"] = default_run_mfu(rows["alone_batch"]["train_img_s"], info["limits"])
    info["limits"] = close_limits(info["limits"])
    print(results["verdict"])
    print(f"default run alone: {100 * results['default_run_mfu']['fraction_of_limit']:.1f}% of the bf16 limit "
          f"({results['default_run_mfu']['img_s_at_limit']:.0f} img/s)")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
