"""The machine's limits, measured in the same run as the benchmark that is compared with them.

A figure in img/s says little until it is put beside what the machine could do at that moment;
on a shared or virtual CPU the clock and the matrix units' speed change from day to day (this
project's 2-core EPYC ran its bf16 GEMM at 975 GFLOP/s one day and 426 the next). So every
benchmark measures, in its own process:

- **the clock**: cycles per second of one core, counted by a chain of dependent integer adds
  of two registers (one add per cycle on any x86-64 core of the last decade) in a small C
  program compiled on the spot. Not adds of a constant: Intel's cores since Golden Cove fold a
  chain of those in the renamer, and an Intel Xeon with AMX read 21 GHz that way. Sampled at
  the start and at the end of the run. It shows the speed the core really ran at (turbo,
  throttling, a hypervisor's share), which ``/proc/cpuinfo`` does not.
  ``perf``'s cycle counter is not available in most virtual machines, this project's included.
- **GEMM peaks**: fp32, bf16 and int8 GFLOP/s of one large matrix product
  (2048x3072x768: ViT-B's MLP shape, cut to fit), best of a few timings, on every thread the
  benchmark uses. A CPU without native bf16 (no AVX-512 BF16 or AMX: Zen 3, most laptops) has
  no bf16 limit (``None``, with the reason): torch emulates bf16 there at about 1 GFLOP/s, which
  is no limit of anything a path would choose. int8 is the best of ``torch._int_mm`` and ONNX
  Runtime's ``MatMulInteger`` (u8 x s8, the kernel its int8 models run; torch's CPU kernel is a
  slow reference on AVX2 machines). OpenVINO's own quantized product (a FakeQuantize into int8
  weights, as NNCF's models run it) is not among them: on an Intel Xeon with AMX it reached
  1,246-1,444 GOP/s where ONNX Runtime's reached 2,222-2,508 (its f32 output costs it). fp32 is
  the best of torch, numpy and ONNX Runtime (each library's own figure is kept): torch's CPU
  build calls Intel's MKL, which on this AMD EPYC reached 210 GFLOP/s where numpy's OpenBLAS
  reached 263 and ONNX Runtime ran ViT-B/16 at 393, so torch alone would put ORT's fp32 path at
  180% of "the limit". bf16 likewise is the best of torch and OpenVINO (a bf16 MatMul; when installed):
  on a Zen 4 torch's probe read 269 GFLOP/s in one run where OpenVINO's bf16 SigLIP-B/16 computed at 382,
  and the same product ran at 355 in OpenVINO and 392 in torch minutes later. A model whose every FLOP ran at
  that speed would reach ``peak / GFLOPs-per-image`` img/s: :func:`at_limit` states a figure
  as a fraction of that.

On a GPU the peaks are measured the same way on the device, on an 8192x8192x8192 product: the
ViT-B shape keeps an H200 at 301-355 of its ~790 bf16 TFLOP/s, and a model FLOPs utilisation
must be read against what the card can reach. The host's clock is still sampled and the GPU's
clock is the driver's figure.
Needs stdlib, torch and numpy; ONNX Runtime is used when installed, and a C compiler (``cc``;
without one the clock is reported as unknown).
"""

from __future__ import annotations

import atexit
import os
import platform
import shutil
import subprocess
import tempfile
import time
from typing import Optional

import torch

from vitkit.machine import native_bf16_cpu

#: (m, n, k) of the GEMM timed for the peaks on a CPU
GEMM = (2048, 3072, 768)
#: on a GPU: a product large enough to reach the card's peak (ViT-B's shape reaches 40% of an H200's)
GEMM_CUDA = (8192, 8192, 8192)
#: dependent adds per loop iteration of the clock probe
_ADDS = 200

_PROBE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char **argv) {
    long iters = atol(argv[1]);
    unsigned long x = 0, one = argc > 0;  /* a 1 the compiler cannot see: the adds stay register adds */
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now();
        for (long i = 0; i < iters; i++) {
            __asm__ volatile(REPEAT : "+r"(x) : "r"(one));
        }
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    printf("%.6f %lu\n", (double)iters * ADDS / best / 1e9, x);
    return 0;
}
"""


def _probe_binary() -> Optional[str]:
    """The clock probe compiled into a temporary folder, or None (not x86-64, no compiler)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not shutil.which("cc"):
        return None
    folder = tempfile.mkdtemp(prefix="vitkit-clock-")
    atexit.register(shutil.rmtree, folder, True)  # the binary serves every call of this process, then goes
    source, binary = os.path.join(folder, "clock.c"), os.path.join(folder, "clock")
    with open(source, "w") as f:
        f.write(_PROBE.replace("REPEAT", '"' + "add %1, %0\\n\\t" * _ADDS + '"').replace("ADDS", str(_ADDS)))
    try:
        subprocess.run(["cc", "-O1", "-o", binary, source], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return binary


_binary: Optional[str] = None


def clock_ghz(seconds: float = 0.05) -> Optional[float]:
    """One core's cycles per second in GHz, best of five windows of about ``seconds`` each
    (the core's speed while it runs, not the nominal figure); None where it cannot be measured."""
    global _binary
    if _binary is None:
        _binary = _probe_binary() or ""
    if not _binary:
        return None
    iters = max(1, int(seconds * 3e9 / _ADDS))
    try:
        out = subprocess.run([_binary, str(iters)], check=True, capture_output=True, text=True, timeout=60).stdout
        return round(float(out.split()[0]), 3)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


#: rows of the first, small int8 product (a kernel far below the fp32 peak is not timed in full)
PROBE_ROWS = 256


def _timed_best(fn, rounds: int, device: torch.device, calls: int = 2) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, (time.perf_counter() - t) / calls)
    return best


def gemm_peaks(device: torch.device = torch.device("cpu"), rounds: int = 3) -> dict:
    """fp32, bf16 and int8 GFLOP/s (int8: GOP/s) of :data:`GEMM` on ``device`` (:data:`GEMM_CUDA` on a GPU)."""
    m, n, k = GEMM_CUDA if device.type == "cuda" else GEMM
    flops = 2 * m * n * k
    peaks = {"gemm_shape": [m, n, k]}
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
    native_bf16 = device.type != "cpu" or native_bf16_cpu()
    with torch.inference_mode():
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            if name == "bf16" and not native_bf16:
                peaks["bf16_gflop_s"] = None
                peaks["bf16_unavailable"] = "no native bf16 on this CPU (no AVX-512 BF16 or AMX): torch emulates it"
                continue
            x, y = a.to(device, dtype), b.to(device, dtype)
            peaks[f"{name}_gflop_s"] = round(flops / _timed_best(lambda: x @ y, rounds, device) / 1e9, 1)
        if device.type == "cpu":
            by_library = {"torch": peaks["fp32_gflop_s"], **_other_fp32(a.numpy(), b.numpy(), flops, rounds, device)}
            peaks["fp32_gflop_s_by_library"] = by_library
            peaks["fp32_gflop_s"] = max(by_library.values())
            if native_bf16:
                bf16 = {"torch": peaks["bf16_gflop_s"], **_openvino_bf16(a.numpy(), b.numpy(), flops, rounds, device)}
                peaks["bf16_gflop_s_by_library"] = bf16
                peaks["bf16_gflop_s"] = max(bf16.values())
        int8 = {}
        try:
            x = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=gen).to(device)
            y = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=gen).to(device)
            small = x[:PROBE_ROWS]  # a first look: on Zen 3 torch's kernel runs at ~3 GOP/s (25 s a call in full)
            probe = flops * PROBE_ROWS / m / _timed_best(lambda: torch._int_mm(small, y), 1, device, calls=1) / 1e9
            if probe < peaks["fp32_gflop_s"] / 4:  # a fallback no int8 path would choose: its rate is this
                int8["torch"] = round(probe, 1)
                peaks["int8_torch"] = f"a fallback kernel, timed on {PROBE_ROWS} rows only"
            else:
                int8["torch"] = round(flops / _timed_best(lambda: torch._int_mm(x, y), rounds, device) / 1e9, 1)
        except (RuntimeError, NotImplementedError) as e:  # no int8 GEMM kernel for this device
            peaks["int8_unavailable"] = str(e).splitlines()[0][:200]
        if device.type == "cpu":
            int8.update(_ort_int8(flops, rounds, device))
        peaks["int8_gop_s"] = max(int8.values()) if int8 else None
        if int8:
            peaks["int8_gop_s_by_library"] = int8
    return peaks


def _ort_rate(op: str, feed: dict, out_dtype, flops: int, rounds: int, device: torch.device) -> Optional[float]:
    """G(FL)OP/s of the one-node ONNX graph ``op(a, b)`` on ``feed`` (numpy arrays named a and b)
    in ONNX Runtime's CPU provider on the benchmark's threads, or None without onnx/onnxruntime."""
    try:
        import onnx
        import onnxruntime as ort
        from onnx import helper
    except ImportError:
        return None

    def value(name, dtype, shape):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), list(shape))
    a, b = feed["a"], feed["b"]
    graph = helper.make_graph([helper.make_node(op, ["a", "b"], ["c"])], "gemm",
                              [value("a", a.dtype, a.shape), value("b", b.dtype, b.shape)],
                              [value("c", out_dtype, (a.shape[0], b.shape[1]))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, onnx.IR_VERSION)
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return round(flops / _timed_best(lambda: session.run(None, feed), rounds, device) / 1e9, 1)


def _ort_int8(flops: int, rounds: int, device: torch.device) -> dict:
    """GOP/s of the GEMM shape in ONNX Runtime's ``MatMulInteger`` (u8 activations x s8 weights)."""
    import numpy as np

    m, n, k = GEMM
    rng = np.random.default_rng(0)
    feed = {"a": rng.integers(0, 256, (m, k), dtype=np.uint8), "b": rng.integers(-128, 128, (k, n), dtype=np.int8)}
    rate = _ort_rate("MatMulInteger", feed, np.dtype(np.int32), flops, rounds, device)
    return {} if rate is None else {"onnxruntime": rate}


def _other_fp32(a, b, flops: int, rounds: int, device: torch.device) -> dict:
    """fp32 GFLOP/s of the same product in numpy and (when installed) ONNX Runtime's MatMul."""
    out = {"numpy": round(flops / _timed_best(lambda: a @ b, rounds, device) / 1e9, 1)}
    rate = _ort_rate("MatMul", {"a": a, "b": b}, a.dtype, flops, rounds, device)
    return out if rate is None else {**out, "onnxruntime": rate}


def _openvino_bf16(a, b, flops: int, rounds: int, device: torch.device) -> dict:
    """bf16 GFLOP/s of the same product in OpenVINO (when installed): a MatMul with a constant right-hand side,
    compiled with bf16 inference precision on the benchmark's threads, as OpenVINO runs a model's products."""
    from vitkit.deploy.openvino import openvino_module  # OpenVINO without its telemetry's forks

    try:
        ov = openvino_module("the bf16 peak through OpenVINO")
        import openvino.opset13 as ops
    except ImportError:
        return {}
    left = ops.parameter(list(a.shape), a.dtype, name="a")
    graph = ov.Model([ops.matmul(left, ops.constant(b), False, False)], [left])
    compiled = ov.Core().compile_model(graph, "CPU", {"INFERENCE_NUM_THREADS": torch.get_num_threads(),
                                                      "INFERENCE_PRECISION_HINT": "bf16"})
    return {"openvino": round(flops / _timed_best(lambda: compiled(a), rounds, device) / 1e9, 1)}


def machine_limits(device: torch.device = torch.device("cpu")) -> dict:
    """The clock and the GEMM peaks, measured now (a few seconds)."""
    limits = {"clock_ghz_start": clock_ghz(), "threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        limits["cuda_clock_ghz"] = getattr(props, "clock_rate", 0) / 1e6 or None
    limits.update(gemm_peaks(device))
    return limits


#: the peaks a figure is stated against
PEAKS = ("fp32_gflop_s", "bf16_gflop_s", "int8_gop_s")


def close_limits(limits: dict, device: Optional[torch.device] = None) -> dict:
    """``limits`` with the clock sampled again at the end of the run (the cycles *during* it lie
    between the two samples; a large gap says the machine changed speed while it ran). With
    ``device`` the GEMM peaks are measured again too, and each becomes the better of the two
    readings (both kept, ``peaks_at_start`` / ``peaks_at_end``): one short reading at the start
    has read a third below what the run's own models then computed at (a Zen 4, 2026-11-29: bf16
    302 GFLOP/s at the start, OpenVINO's bf16 DINOv2-S/14 at 360 in the run)."""
    closed = {**limits, "clock_ghz_end": clock_ghz()}
    if device is not None:
        again = gemm_peaks(device)
        closed["peaks_at_start"] = {k: limits.get(k) for k in PEAKS}
        closed["peaks_at_end"] = {k: again.get(k) for k in PEAKS}
        for k in PEAKS:
            readings = [v for v in (limits.get(k), again.get(k)) if v]
            closed[k] = max(readings) if readings else limits.get(k)
    return closed


def at_limit(img_s: float, gflop_per_image: float, peak_gflop_s: Optional[float]) -> dict:
    """``img_s`` beside the img/s a model of ``gflop_per_image`` would reach if every FLOP ran
    at ``peak_gflop_s``, and the fraction of it reached (the model FLOPs utilisation)."""
    if not peak_gflop_s or not gflop_per_image:
        return {"img_s_at_limit": None, "fraction_of_limit": None}
    limit = peak_gflop_s / gflop_per_image
    return {"img_s_at_limit": round(limit, 1), "fraction_of_limit": round(img_s / limit, 4)}


def describe(limits: dict) -> str:
    """One line for a benchmark's output."""
    clock = limits.get("clock_ghz_start")
    end = limits.get("clock_ghz_end")
    clock_text = "clock unknown" if clock is None else f"clock {clock:.2f} GHz" + (
        f" -> {end:.2f} GHz" if end is not None else "")
    int8 = limits.get("int8_gop_s")
    bf16 = limits.get("bf16_gflop_s")
    return (f"{clock_text}; GEMM {'x'.join(map(str, GEMM))} peaks: fp32 {limits['fp32_gflop_s']:.0f}, "
            f"bf16 {'n/a (not native)' if bf16 is None else f'{bf16:.0f}'} GFLOP/s, int8 "
            + ("n/a" if int8 is None else f"{int8:.0f} GOP/s") + f" ({limits['threads']} threads)")
