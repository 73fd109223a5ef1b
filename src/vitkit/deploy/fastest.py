"""Which runtime and precision run a ViT fastest on this CPU, decided by its instruction set.

The fastest path depends on what the CPU's int8 and bf16 kernels have to work with, not on the
machine vitkit was tuned on. Measured with ``benchmarks/bench_onnx.py`` (2 cores, batch 32,
against timm's fastest PyTorch path on the same cores; docs/benchmarks.md):

- AVX-512 with VNNI and bf16 (AMD Zen 4): OpenVINO int8 was the fastest path in every row,
  2.17-2.83x (ViT-B/16: 2.71x; DINOv2-S/14: 2.33-2.83x, SigLIP-B/16: 2.23-2.42x); ONNX Runtime int8 1.2-1.9x.
- AVX-512 with VNNI, bf16 and AMX (an Intel Xeon, Sapphire Rapids class): OpenVINO int8 was
  the fastest path in every row, 1.57x (DINOv2-S/14), 2.15x (SigLIP-B/16), 2.21x (ViT-B/16 at
  batch 32) and 2.84x (ViT-B/16 at batch 1) timm's fastest (bf16 compiled, on AMX's bf16 tiles);
  ONNX Runtime int8 0.6-1.9x.
- AVX2 without VNNI (AMD Zen 3, most laptops and cloud VMs of a few years ago): ONNX Runtime's
  dynamic int8 was the fastest, 1.57x (DINOv2-S/14) to 1.90x (ViT-B/16); OpenVINO int8 only
  1.09x there: its int8 kernels are built on VNNI's dot products. Where AVX2 runs on 128-bit units (an AMD
  EPYC of family 23, Zen 1's), int8's products are no faster than fp32's: ONNX Runtime int8 tied OpenVINO fp32
  (ViT-S/16, 7.7 img/s each, 1.17x timm's eager fp32; ONNX Runtime fp32 7.1, OpenVINO int8 6.2; ViT-Ti/16 26.5
  and 26.4, ViT-B/16 2.07 and 2.03, the spread of three rounds 3-6%). Flags do not
  tell those units apart, the CPU's family and model do (AMD's family 23 before model 0x30, Zen 2): there the
  choice is OpenVINO fp32, as fast and exact, where it is installed, and ONNX Runtime int8 otherwise.

VNNI without the rest (AVX-VNNI, AVX-512 VNNI without bf16) is what OpenVINO's int8 kernels use;
those machines were not measured and get OpenVINO int8 by that rule. OpenVINO's int8 is NNCF's,
calibrated on images: a model with none to calibrate on (its classes name no built-in dataset and
none were given) gets the fastest measured path that needs none -- OpenVINO bf16 with AMX (1.3-1.6x
timm's fastest there), ONNX Runtime's dynamic int8 elsewhere. Elsewhere (another
architecture, no flags to read) vitkit recommends nothing it has not measured: PyTorch fp32.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Iterable, Optional

from ..machine import cpu_info

#: flags of /proc/cpuinfo that decide the choice
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


@dataclass(frozen=True)
class Choice:
    """A runtime (``torch``, ``onnxruntime``, ``openvino``), its quantization (None: fp32) and why."""

    runtime: str
    quantize: Optional[str]
    why: str
    #: what the float path computes in (OpenVINO's CPU default is bf16 where the CPU has it)
    precision: str = "fp32"

    def describe(self) -> str:
        return f"{self.runtime} {self.quantize or self.precision} ({self.why})"

    @property
    def calibrated(self) -> bool:
        """Whether this path quantizes with calibration images (:func:`~.quantize.calibrates`)."""
        from .quantize import calibrates

        return calibrates(self.runtime, self.quantize)


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset:
    """The instruction-set flags this CPU reports (Linux's /proc/cpuinfo; empty elsewhere)."""
    return frozenset(cpu_info(path).get("flags", "").split())


def half_width_avx2(path: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU runs AVX2 on 128-bit units: AMD's family 23 before model 0x30 (Zen 1 and Zen+; Zen 2 is
    model 0x31 on), whose flags are those of the 256-bit kinds."""
    info = cpu_info(path)
    try:
        family, model = int(info.get("cpu family", "")), int(info.get("model", ""))
    except ValueError:
        return False
    return info.get("vendor_id") == "AuthenticAMD" and family == 23 and model < 0x30


#: the packages each runtime's path needs (OpenVINO's model is read from an ONNX export, its int8 made by NNCF)
PACKAGES = {"onnxruntime": ("onnxruntime", "onnx"), "openvino": ("onnxruntime", "onnx", "openvino", "nncf")}


def installed_runtimes() -> frozenset:
    """The runtimes whose packages are importable here (int8 on OpenVINO also needs NNCF)."""
    return frozenset({"torch"} | {r for r, packages in PACKAGES.items()
                                  if all(importlib.util.find_spec(p) for p in packages)})


def _not_installed(runtime: str, where: str = "") -> str:
    """"is not installed", or the packages missing beside an installed runtime (OpenVINO without NNCF);
    ``where`` ends the words (" here")."""
    absent = [p for p in PACKAGES[runtime] if not importlib.util.find_spec(p)]
    if absent and runtime not in absent:
        return f"needs {' and '.join(absent)}, which {'is' if len(absent) == 1 else 'are'} not installed{where}"
    return f"is not installed{where}"


def _isa(flags: frozenset) -> str:
    vnni = [f for f in VNNI_FLAGS if f in flags]
    if "avx512f" in flags:
        return "AVX-512" + (" with " + ", ".join(vnni) if vnni else " without VNNI") \
            + (" and bf16" if "avx512_bf16" in flags else "")
    if "avx2" in flags:
        return "AVX2" + (" with " + ", ".join(vnni) if vnni else " without VNNI")
    return "no AVX2 flags read"


def fastest(flags: Optional[Iterable[str]] = None, installed: Optional[Iterable[str]] = None,
            calibrated: bool = True, half_width: Optional[bool] = None) -> Choice:
    """The fastest measured runtime and precision for a CPU with ``flags`` (default: this one's)
    among the ``installed`` runtimes (default: this environment's); ``why`` names the instruction
    set, and the extra to install when a faster runtime is missing. ``calibrated=False``: the
    model has no images to calibrate int8 on (:func:`vitkit.deploy.quantize.can_calibrate`), so
    the fastest path that needs none (``why`` says what it stands in for); ``half_width`` (default: this CPU's
    :func:`half_width_avx2`): AVX2 on 128-bit units, where int8 does not pay."""
    if half_width is None:  # this CPU's where its flags are read; flags given describe another
        half_width = flags is None and half_width_avx2()
    flags = cpu_flags() if flags is None else frozenset(flags)
    installed = installed_runtimes() if installed is None else frozenset(installed)
    isa = _isa(flags)
    if any(f in flags for f in VNNI_FLAGS):
        if "amx_int8" in flags:
            order = [Choice("openvino", "int8", f"{isa}; OpenVINO's int8 kernels use VNNI and AMX: 1.6-2.8x "
                                                f"timm's fastest on an Intel Xeon with AMX"),
                     Choice("openvino", None, f"{isa}; OpenVINO bf16 ran 1.3-1.6x timm's fastest on an Intel "
                                              f"Xeon with AMX", precision="bf16" if "amx_bf16" in flags else "fp32"),
                     Choice("onnxruntime", "int8", f"{isa}; ONNX Runtime int8 ran 0.6-1.9x timm's fastest on an "
                                                   f"Intel Xeon with AMX")]
        else:
            order = [Choice("openvino", "int8", f"{isa}; OpenVINO's int8 kernels use VNNI: 2.2-2.8x timm's fastest "
                                                f"on Zen 4"),
                     Choice("onnxruntime", "int8", f"{isa}; ONNX Runtime int8 ran 1.2-1.9x timm's fastest on Zen 4")]
    elif "avx2" in flags and half_width:  # a tie: the exact path where it is installed, no advice to install it
        tie = ("ONNX Runtime int8 and OpenVINO fp32 within 2% of each other, 1.04-1.17x timm's eager fp32 on an AMD "
               "EPYC of family 23")
        order = [Choice("openvino", None, f"{isa} on 128-bit units, where int8 products are no faster than fp32's: "
                                          f"{tie}; fp32 is exact")] if "openvino" in installed else [
            Choice("onnxruntime", "int8", f"{isa} on 128-bit units: {tie}; ONNX Runtime fp32 0.91-0.92x its int8")]
    elif "avx2" in flags:
        order = [Choice("onnxruntime", "int8", f"{isa}; ONNX Runtime's dynamic int8 ran 1.6-1.9x timm's fastest on "
                                               f"Zen 3, OpenVINO int8 1.1x")]
    else:
        return Choice("torch", None, f"{isa}; no runtime was measured faster on this instruction set")
    extras = {"openvino": "vitkit[openvino]", "onnxruntime": "vitkit[onnx]"}
    usable = [c for c in order if calibrated or not c.calibrated]
    best = usable[0]
    install = f"pip install '{extras[best.runtime]}'"
    for choice in usable:
        if choice.runtime in installed:
            if not calibrated and order[0].calibrated and order[0].runtime in installed:  # passed over: no images
                return Choice(choice.runtime, choice.quantize, f"{choice.why}; OpenVINO int8, faster here, "
                              f"calibrates on images and the model's classes name no built-in dataset "
                              f"(--calibration FOLDER)", choice.precision)
            if choice is not best:  # a faster one is missing: said, as where none is installed
                missing = f"{best.runtime} {best.quantize or best.precision}, faster here, " \
                          f"{_not_installed(best.runtime)}"
                return Choice(choice.runtime, choice.quantize, f"{choice.why}; {missing}: {install}", choice.precision)
            return choice
    return Choice("torch", None, f"{best.why}; {best.runtime} {_not_installed(best.runtime, ' here')}: {install}")


__all__ = ["Choice", "VNNI_FLAGS", "cpu_flags", "fastest", "half_width_avx2", "installed_runtimes"]
