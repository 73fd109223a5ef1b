"""The README's test command (`make test`) on this machine: its set-up and each pytest's wall clock.

Issue 42 asks for the suite under 20 minutes on a 2-core machine without bf16. This clones the
committed HEAD into a fresh folder, runs `make setup` and then `make test` there in a clean
environment (as CI's clean clone does), times each from outside, and writes one results file with
the machine (model, ISA flags, clock and GEMM peaks, measured before), each pytest's counts and
wall clock, the slowest tests pytest reported, and the verdict.

    python benchmarks/suite_time.py                   # about 22 min on a 2-core family-23 EPYC
    python benchmarks/suite_time.py --from-log LOG    # a finished `time make test` run's output

``--from-log`` reads what bash's ``time make test`` printed (pytest's summaries and ``real``: set-up is
then the rest of the total) on this machine, whose limits are measured now. A benchmark, not a test: run
it on a quiet machine and say what else ran.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_inference import dated_name, machine_info, results_path, write_json_atomic  # noqa: E402
from limits import close_limits  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: issue 42, item 3: the README's make test on a 2-core AVX2 machine without bf16
GOAL_SECONDS = 20 * 60
SUMMARY = re.compile(r"^=*\s*(?P<counts>\d+ (?:passed|failed|error).*?) in (?P<seconds>[\d.]+)s\b")
SLOW = re.compile(r"^(?P<seconds>[\d.]+)s (?P<phase>setup|call|teardown)\s+(?P<test>\S+)")
REAL = re.compile(r"^real\s+(?:(?P<m>\d+)m)?(?P<s>[\d.]+)s$")


def parse_log(text: str) -> dict:
    """Each pytest's counts and seconds, the slowest tests they reported and bash's ``real``, from a log."""
    runs, slowest, total = [], [], None
    for line in text.splitlines():
        line = line.strip()
        summary, slow, real = SUMMARY.match(line), SLOW.match(line), REAL.match(line)
        if summary:
            counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)",
                                                              summary["counts"])}
            runs.append({**counts, "seconds": float(summary["seconds"])})
        elif slow:
            slowest.append({"test": slow["test"], "phase": slow["phase"], "seconds": float(slow["seconds"])})
        elif real:
            total = 60 * int(real["m"] or 0) + float(real["s"])
    if not runs:
        raise ValueError("no pytest summary line (\"N passed ... in S s\") in the log: not a make test run's output")
    return {"pytest": runs, "slowest": sorted(slowest, key=lambda r: -r["seconds"])[:20], "total_s": total}


def run_fresh(clone: Path) -> dict:
    """`make setup` then `make test` in a fresh clone of HEAD, in a clean environment; each timed. A set-up that
    fails ends it (ValueError); failing tests are recorded (make test's exit code, pytest's counts)."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    seconds, done = {}, None
    for target in ("setup", "test"):
        start = time.monotonic()
        done = subprocess.run(["make", target], cwd=clone, env=env, capture_output=True, text=True)
        seconds[target] = time.monotonic() - start
        if target == "setup" and done.returncode:
            raise ValueError(f"make setup failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    record = parse_log(done.stdout + done.stderr)
    record.update(total_s=seconds["setup"] + seconds["test"], setup_s=seconds["setup"], test_s=seconds["test"],
                  exit_code=done.returncode)
    return record


def verdict(record: dict) -> str:
    tests = sum(r["seconds"] for r in record["pytest"])
    failed = sum(r.get("failed", 0) + r.get("error", 0) + r.get("errors", 0) for r in record["pytest"])
    parts = " + ".join(f"{r['seconds']:.0f} s" for r in record["pytest"])
    line = f"the tests took {tests / 60:.1f} min ({parts})"
    if record.get("total_s"):
        line += f", {record['total_s'] / 60:.1f} min with set-up"
    met = tests <= GOAL_SECONDS and not failed and not record.get("exit_code")
    if failed:
        line += f"; {failed} failed"
    if record.get("exit_code"):
        line += f"; make test exited {record['exit_code']}"
    return f"{'met' if met else 'not met'} (goal: make test's tests <= {GOAL_SECONDS // 60} min): {line}"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-log", help="a finished `time make test` run's output, instead of a run now")
    ap.add_argument("--commit", help="the commit the log's run tested (with --from-log; default: HEAD)")
    ap.add_argument("--out", help="results file, or a folder for the default name")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device("cpu")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    try:
        # a bad log is read before the machine is measured (it costs no GEMMs); a fresh run's machine is
        # measured before the run, on the quiet machine; the log's run was on this machine
        record = parse_log(Path(args.from_log).read_text()) if args.from_log else None
        info = machine_info(device)
        out = results_path(args.out, dated_name("suite", device, info))  # (an unwritable --out: said now)
        if record is None:
            with tempfile.TemporaryDirectory(prefix="vitkit-suite-") as folder:
                record = run_fresh(Path(folder) / "clone")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        print(f"suite_time: error: {args.from_log or 'make test'}: {e}", file=sys.stderr)
        return 2
    if "limits" in info:
        info["limits"] = close_limits(info["limits"])
    results = {"benchmark": "suite", "command": "make test", "commit": args.commit or head, "machine": info,
               "goal": f"make test's tests within {GOAL_SECONDS // 60} min on 2 cores without bf16", **record}
    results["verdict"] = verdict(record)
    print(results["verdict"])
    write_json_atomic(out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
