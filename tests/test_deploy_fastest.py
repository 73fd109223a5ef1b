"""The runtime and precision vitkit picks or recommends on a CPU, from its instruction set: the
rule per kind of machine (flags as Linux reports them), torch's own reading of this CPU's
capability agrees with the flags read, `--runtime auto` runs what it says it chose, and
`vitkit convert` names the faster path when the export is not it."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from conftest import randomize
from vitkit.cli import main
from vitkit.deploy import fastest as fastest_mod
from vitkit.deploy.choose import resolve_runtime
from vitkit.deploy.fastest import cpu_flags, fastest, installed_runtimes

ZEN3 = {"fpu", "sse4_2", "avx", "avx2", "fma", "f16c"}  # family 25 model 1: no AVX-512, no VNNI
ZEN4 = ZEN3 | {"avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}
ALDER_LAKE = ZEN3 | {"avx_vnni"}  # VNNI on 256-bit registers, no AVX-512
SAPPHIRE_RAPIDS = ZEN3 | {"avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"}
ALL = {"torch", "onnxruntime", "openvino"}


@pytest.mark.parametrize("flags,runtime,quantize", [
    (ZEN3, "onnxruntime", "int8"),  # measured: ORT int8 1.6-1.9x, OpenVINO int8 1.1x
    (ZEN4, "openvino", "int8"),  # measured: OpenVINO int8 2.2-2.8x
    (ALDER_LAKE, "openvino", "int8"),
    (SAPPHIRE_RAPIDS, "openvino", "int8"),  # measured: OpenVINO int8 1.6-2.8x, ORT int8 0.6-1.9x
    (set(), "torch", None),  # another architecture, or nothing to read: nothing unmeasured
    ({"neon", "asimd"}, "torch", None),
])
def test_the_choice_follows_the_instruction_set(flags, runtime, quantize):
    choice = fastest(flags, installed=ALL)
    assert (choice.runtime, choice.quantize) == (runtime, quantize)
    assert ("VNNI" in choice.why or "vnni" in choice.why) is (runtime != "torch")  # the reason names it


def test_the_reason_quotes_the_machine_it_was_measured_on():
    assert "Intel Xeon with AMX" in fastest(SAPPHIRE_RAPIDS, installed=ALL).why
    assert "Zen 4" in fastest(ZEN4, installed=ALL).why and "Zen 3" in fastest(ZEN3, installed=ALL).why
    assert "AMX" in fastest(SAPPHIRE_RAPIDS, installed={"torch", "onnxruntime"}).why


def test_without_images_to_calibrate_on_the_choice_needs_none():
    """OpenVINO's int8 is NNCF's, calibrated on images: a model whose classes name no built-in dataset
    gets the fastest measured path that needs none, and the reason says what was passed over and why."""
    amx = fastest(SAPPHIRE_RAPIDS, installed=ALL, calibrated=False)
    assert (amx.runtime, amx.quantize, amx.precision) == ("openvino", None, "bf16")
    assert amx.describe().startswith("openvino bf16 (") and "--calibration FOLDER" in amx.why
    zen4 = fastest(ZEN4, installed=ALL, calibrated=False)
    assert (zen4.runtime, zen4.quantize) == ("onnxruntime", "int8") and "--calibration" in zen4.why
    assert fastest(ZEN3, installed=ALL, calibrated=False) == fastest(ZEN3, installed=ALL)  # it needed none
    assert "--calibration" not in fastest(ZEN4, installed={"torch", "onnxruntime"}, calibrated=False).why


def _cpuinfo(tmp_path, vendor, family, model, flags=ZEN3):
    """A /proc/cpuinfo of two processors (the first one's fields are read)."""
    block = (f"processor\t: {{}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
             f"model name\t: a CPU\nflags\t\t: {' '.join(sorted(flags))}\n\n")
    path = tmp_path / f"cpuinfo_{vendor}_{family}_{model}"
    path.write_text(block.format(0) + block.format(1).replace("cpu family\t: ", "cpu family\t: 9"))
    return str(path)


@pytest.mark.parametrize("vendor,family,model,half", [
    ("AuthenticAMD", 23, 1, True),  # Zen 1 (EPYC 7001): AVX2 on 128-bit units
    ("AuthenticAMD", 23, 8, True),  # Zen+
    ("AuthenticAMD", 23, 49, False),  # Zen 2 (0x31): 256-bit
    ("AuthenticAMD", 25, 1, False),  # Zen 3
    ("GenuineIntel", 6, 23, False),  # an Intel of model 23: family 23 is AMD's alone
])
def test_avx2_on_128_bit_units_is_read_from_the_family_and_model(tmp_path, vendor, family, model, half):
    path = _cpuinfo(tmp_path, vendor, family, model)
    assert fastest_mod.half_width_avx2(path) is half
    assert fastest_mod.cpu_flags(path) == frozenset(ZEN3)  # the same flags either way
    assert fastest_mod.half_width_avx2(str(tmp_path / "none")) is False and not fastest_mod.cpu_flags("/none")


def test_where_int8_does_not_pay_the_exact_path_is_chosen(monkeypatch, tmp_path):
    """On AVX2 over 128-bit units (an AMD EPYC of family 23) ONNX Runtime int8 tied OpenVINO fp32 (7.7 img/s each,
    ViT-S/16): the rule picked int8, as on Zen 3, for no speed and some accuracy. Now OpenVINO fp32 where it is
    installed; int8 asked for goes to ONNX Runtime, OpenVINO int8 being the slowest there."""
    exact = fastest(ZEN3, installed=ALL, half_width=True)
    assert (exact.runtime, exact.quantize, exact.precision) == ("openvino", None, "fp32")
    assert "128-bit units" in exact.why and "fp32 is exact" in exact.why
    assert fastest(ZEN3, installed=ALL, half_width=True, calibrated=False) == exact  # it needs no images
    tied = fastest(ZEN3, installed={"torch", "onnxruntime"}, half_width=True)  # no advice to install a tie
    assert (tied.runtime, tied.quantize) == ("onnxruntime", "int8") and "pip install" not in tied.why
    assert fastest(ZEN4, installed=ALL, half_width=True) == fastest(ZEN4, installed=ALL)  # VNNI decides first
    monkeypatch.setattr(fastest_mod, "cpu_flags", lambda: frozenset(ZEN3))
    monkeypatch.setattr(fastest_mod, "half_width_avx2", lambda: True)
    monkeypatch.setattr(fastest_mod, "installed_runtimes", lambda: frozenset(ALL))
    weights = tmp_path / "w"
    assert resolve_runtime(weights, "auto", None)[:2] == ("openvino", None)
    assert resolve_runtime(weights, "auto", "int8")[:2] == ("onnxruntime", "int8")
    assert fastest() == exact and fastest(ZEN3, installed=ALL) != exact  # given flags describe another CPU


def test_int8_asked_for_goes_where_it_can_run(monkeypatch, tmp_path):
    monkeypatch.setattr(fastest_mod, "cpu_flags", lambda: frozenset(SAPPHIRE_RAPIDS))
    weights = tmp_path / "w"
    assert resolve_runtime(weights, "auto", None)[:2] == ("openvino", "int8")
    assert resolve_runtime(weights, "auto", "int8-static")[:2] == ("onnxruntime", "int8-static")  # an ONNX format
    assert resolve_runtime(weights, "auto", "int8", calibrated=False)[:2] == ("onnxruntime", "int8")
    assert resolve_runtime(weights, "auto", None, calibrated=False)[:2] == ("openvino", None)


def test_a_missing_runtime_falls_back_and_names_the_extra():
    choice = fastest(ZEN4, installed={"torch", "onnxruntime"})  # no OpenVINO: the next measured path
    assert (choice.runtime, choice.quantize) == ("onnxruntime", "int8")
    assert choice.why.endswith("; openvino int8, faster here, is not installed: pip install 'vitkit[openvino]'")
    bare = fastest(ZEN3, installed={"torch"})
    assert (bare.runtime, bare.quantize) == ("torch", None)
    assert "pip install 'vitkit[onnx]'" in bare.why
    assert "pip install 'vitkit[openvino]'" in fastest(ZEN4, installed={"torch"}).why


def test_openvino_without_nncf_is_named_by_what_is_missing(monkeypatch):
    """With OpenVINO installed and NNCF not, the choice said "openvino int8 ... is not installed"."""
    import importlib.util

    real = importlib.util.find_spec
    present = {"onnxruntime", "onnx", "openvino"}
    packages = {"onnxruntime", "onnx", "openvino", "nncf"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (object() if name in present else None)
                        if name in packages else real(name, *a))
    assert fastest_mod.installed_runtimes() == {"torch", "onnxruntime"}
    choice = fastest(ZEN4)
    assert (choice.runtime, choice.quantize) == ("onnxruntime", "int8")
    assert choice.why.endswith("; openvino int8, faster here, needs nncf, which is not installed: "
                               "pip install 'vitkit[openvino]'"), choice.why
    present -= {"openvino"}
    assert fastest(ZEN4).why.endswith("; openvino int8, faster here, is not installed: pip install 'vitkit[openvino]'")
    present -= {"onnx"}  # ONNX Runtime without onnx, on AVX2: it said "not installed here" of no package
    bare = fastest(ZEN3)
    assert (bare.runtime, bare.quantize) == ("torch", None)
    assert bare.why.endswith("; onnxruntime needs onnx, which is not installed here: pip install 'vitkit[onnx]'"), \
        bare.why


def test_the_flags_read_agree_with_torchs_own_probe():
    capability = torch.backends.cpu.get_cpu_capability()  # ATen's dispatch level: its own CPUID reading
    flags = cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo flags on this system")
    assert ("avx512f" in flags) is (capability.startswith("AVX512")), (capability, sorted(flags))
    assert ("avx2" in flags) is (capability in ("AVX2", "AVX512", "AVX512_VNNI", "AMX") or "avx512f" in flags)
    assert "torch" in installed_runtimes() and "onnxruntime" in installed_runtimes()  # the test environment's


def test_auto_on_a_file_keeps_its_own_runtime_and_other_names_pass_through(tmp_path):
    assert resolve_runtime(tmp_path / "m.onnx", "auto", None)[:2] == (None, None)
    assert resolve_runtime(tmp_path / "m.xml", "auto", None)[:2] == (None, None)
    assert resolve_runtime(tmp_path / "w", "torch", "int8") == ("torch", "int8", None)  # refused later, as before


def _weights_and_photos(tmp_path):
    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=3,
                                          label_names=["cat", "dog", "fox"]), scale=0.3)
    model.save_pretrained(tmp_path / "weights")
    photos = []
    for i in range(3):
        photos.append(str(tmp_path / f"p{i}.png"))
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (40, 44, 3), dtype=np.uint8)).save(photos[-1])
    return str(tmp_path / "weights"), photos


def test_predict_runtime_auto_runs_what_it_says_it_chose(tmp_path, capsys, monkeypatch):
    weights, photos = _weights_and_photos(tmp_path)
    monkeypatch.setattr(fastest_mod, "half_width_avx2", lambda: False)  # the flags below are the whole CPU
    monkeypatch.setattr(fastest_mod, "cpu_flags", lambda: frozenset(ZEN3))
    assert main(["predict", *photos, "--weights", weights, "--json", "--runtime", "auto"]) == 0
    captured = capsys.readouterr()
    assert "runtime auto: onnxruntime int8 (AVX2 without VNNI" in captured.err
    auto = json.loads(captured.out)
    assert main(["predict", *photos, "--weights", weights, "--json", "--runtime", "onnxruntime", "--quantize",
                 "int8"]) == 0
    assert json.loads(capsys.readouterr().out) == auto  # the same int8 model: the same answers
    # on a VNNI CPU OpenVINO int8 would be first, but these classes (cat, dog, fox) name no dataset to
    # calibrate on: ONNX Runtime's dynamic int8, which needs none, and the line says why
    monkeypatch.setattr(fastest_mod, "cpu_flags", lambda: frozenset(ZEN4))
    assert main(["predict", *photos, "--weights", weights, "--json", "--runtime", "auto"]) == 0
    captured = capsys.readouterr()
    assert "runtime auto: onnxruntime int8 (" in captured.err
    assert ("--calibration FOLDER" in captured.err) is ("openvino" in installed_runtimes())
    assert json.loads(captured.out) == auto
    monkeypatch.setattr(fastest_mod, "cpu_flags", lambda: frozenset())  # nothing measured: torch, fp32
    assert main(["predict", *photos, "--weights", weights, "--json", "--runtime", "auto"]) == 0
    captured = capsys.readouterr()
    assert "runtime auto: torch fp32" in captured.err
    assert main(["predict", *photos, "--weights", weights, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(captured.out)


def test_convert_names_the_faster_path_only_when_the_export_is_not_it(tmp_path, capsys, monkeypatch):
    weights, _ = _weights_and_photos(tmp_path)
    monkeypatch.setattr(fastest_mod, "half_width_avx2", lambda: False)  # the flags below are the whole CPU
    monkeypatch.setattr(fastest_mod, "cpu_flags", lambda: frozenset(ZEN3))
    assert main(["convert", weights, str(tmp_path / "a.onnx"), "--to", "onnx", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["fastest_here"].startswith("onnxruntime int8") and info["fastest_here"].endswith(
        "--to onnx --quantize int8")
    # the advice reads --to and --quantize alone: the other exports are the tracer's (0.2 s, not dynamo's 2 s)
    tracer = ["--exporter", "torchscript"]
    assert main(["convert", weights, str(tmp_path / "b.onnx"), "--to", "onnx", *tracer]) == 0
    assert "note: on this CPU the fastest measured path is onnxruntime int8" in capsys.readouterr().err
    assert main(["convert", weights, str(tmp_path / "c.onnx"), "--to", "onnx", "--quantize", "int8", "--json",
                 *tracer]) == 0
    captured = capsys.readouterr()
    assert "fastest_here" not in json.loads(captured.out) and "note" not in captured.err
    monkeypatch.setattr(fastest_mod, "half_width_avx2", lambda: True)  # int8 does not pay: OpenVINO fp32's advice
    monkeypatch.setattr(fastest_mod, "installed_runtimes", lambda: frozenset(ALL))
    assert main(["convert", weights, str(tmp_path / "e.onnx"), "--to", "onnx", "--quantize", "int8", "--json",
                 *tracer]) == 0
    assert json.loads(capsys.readouterr().out)["fastest_here"].endswith("fp32 is exact): --to openvino")
    monkeypatch.setattr(fastest_mod, "cpu_flags", lambda: frozenset())
    assert main(["convert", weights, str(tmp_path / "d.onnx"), "--to", "onnx", "--json", *tracer]) == 0
    assert "fastest_here" not in json.loads(capsys.readouterr().out)  # nothing measured faster: no advice
