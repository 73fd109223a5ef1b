"""What ``vitkit train --compile`` costs and gives: compile seconds and steady-state training speed.

One training step is what ``vitkit train`` runs: forward under autocast (bf16) or in fp32,
cross-entropy, backward, AdamW step (``make_optimizer``), zero_grad. For each model the
compiled module (``torch.compile``, default mode, as the flag does) is timed against eager:

- ``compile_s``: the first compiled step minus an eager step, with an empty inductor cache
  (``TORCHINDUCTOR_CACHE_DIR`` set to a fresh folder before torch is imported), so it is the
  cost a first run pays; later runs of the same model reuse the cache;
- steady state: after warm-up, ``--rounds`` rounds in which eager and compiled each run a
  window of ``--steps`` steps, alternating which goes first; reported are the median img/s
  of each and the median of the per-round ratios compiled / eager (> 1: compile is faster).

    python benchmarks/bench_compile.py --quick    # the default model only, < 2 min on 2 cores (to SMOKE_DIR)
    python benchmarks/bench_compile.py            # default model, plain vit_fmnist, ViT-Ti/16; bf16 and fp32
                                                  # (fp32 only on a CPU without native bf16)

This is a benchmark, not a test: run it on a quiet machine.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:  # a cold cache per run, removed when it ends (they piled up in /tmp)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="vitkit-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], True)

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import vitkit  # noqa: E402
from vitkit.machine import native_bf16_cpu  # noqa: E402
from vitkit.models.complexity import complexity  # noqa: E402
from vitkit.train.config import TrainConfig  # noqa: E402
from vitkit.train.loop import make_optimizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling benchmark, however run
from bench_inference import SMOKE_DIR, dated_name, machine_info, results_path, write_json_atomic  # noqa: E402
from limits import at_limit, close_limits, describe  # noqa: E402

#: (model, batch, image side, channels): the default run's model, its plain twin, a 224-px ViT
CASES = [("vit_fmnist_hybrid", 128, 28, 1), ("vit_fmnist", 128, 28, 1), ("vit_tiny_patch16_224", 32, 224, 3)]


def make_step(model, fwd, batch: int, side: int, chans: int, amp: bool):
    optimizer = make_optimizer(model, TrainConfig())
    x, y = torch.randn(batch, chans, side, side), torch.randint(0, 10, (batch,))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(fwd(x).float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def timed(fn, n: int = 1) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - t0


def measure(name: str, batch: int, side: int, chans: int, amp: bool, args) -> dict:
    torch.manual_seed(0)
    eager_model = vitkit.create_model(name, num_classes=10).train()
    compiled_model = vitkit.create_model(name, num_classes=10).train()
    compiled_model.load_state_dict(eager_model.state_dict())
    torch._dynamo.reset()
    steps = {"eager": make_step(eager_model, eager_model, batch, side, chans, amp),
             "compiled": make_step(compiled_model, torch.compile(compiled_model), batch, side, chans, amp)}
    eager_first = timed(steps["eager"])
    compile_s = timed(steps["compiled"]) - eager_first
    for _ in range(args.warmup):
        steps["eager"](), steps["compiled"]()
    samples = {"eager": [], "compiled": []}
    for r in range(args.rounds):
        for kind in (("eager", "compiled") if r % 2 == 0 else ("compiled", "eager")):
            samples[kind].append(args.steps * batch / timed(steps[kind], args.steps))
    ratios = [c / e for c, e in zip(samples["compiled"], samples["eager"])]
    return {"model": name, "batch": batch, "img_size": side, "precision": "bf16" if amp else "fp32",
            "compile_s": round(compile_s, 1), "eager_img_s": round(statistics.median(samples["eager"]), 1),
            "compiled_img_s": round(statistics.median(samples["compiled"]), 1),
            "ratio_compiled_over_eager": round(statistics.median(ratios), 3), "samples": samples}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke check: the default model in bf16 only (fp32 where bf16 is not native)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=8, help="steps per timed window")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int)
    p.add_argument("--out", help="results file, or a folder for the default name (default: benchmarks/results/"
                                 f"compile_<device>_<date>.json; with --quick, the same name in {SMOKE_DIR})")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    info = machine_info(torch.device("cpu"))
    info["threads"] = torch.get_num_threads()
    out = results_path(args.out, dated_name("compile", torch.device("cpu"), info), smoke=args.quick)
    print(describe(info["limits"]), flush=True)
    # bf16 only where it is native: emulated, one row would take hours and measure nothing
    amps = (True, False) if native_bf16_cpu() else (False,)
    if amps == (False,):
        print("no native bf16 on this CPU: fp32 rows only", flush=True)
    cases = CASES[:1] if args.quick else CASES
    rows = []
    for name, batch, side, chans in cases:
        for amp in amps[:1] if args.quick else amps:
            row = measure(name, batch, side, chans, amp, args)
            gflop = 3 * complexity(vitkit.create_model(name, num_classes=10).config).flops / 1e9
            peak = info["limits"]["bf16_gflop_s" if amp else "fp32_gflop_s"]
            row["mfu"] = {k: at_limit(row[f"{k}_img_s"], gflop, peak) for k in ("eager", "compiled")}
            rows.append(row)
            print(f"{name:<22} b{batch:<4} {row['precision']}: compile {row['compile_s']:5.1f} s, eager "
                  f"{row['eager_img_s']:7.1f} img/s, compiled {row['compiled_img_s']:7.1f} img/s, "
                  f"ratio {row['ratio_compiled_over_eager']:.3f}; MFU eager "
                  f"{row['mfu']['eager']['fraction_of_limit'] or 0:.1%}, compiled "
                  f"{row['mfu']['compiled']['fraction_of_limit'] or 0:.1%}", flush=True)
    info["limits"] = close_limits(info["limits"])
    write_json_atomic(out, {"benchmark": "compile", "machine": info, "settings": vars(args), "rows": rows})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
