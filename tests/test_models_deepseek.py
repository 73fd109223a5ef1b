"""DeepSeek's vision encoder (timm's ``deepseek_vit_412m``): timm's parameter count, timm's outputs from timm's own
hub folder and state dict (fp32, 1e-5) at its size and another, written back in timm's names, and the parts vitkit
does not build (the VLM projector) refused by name."""

import json

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.models import get_model_config
from vitkit.models.complexity import count_params
from vitkit.models.layers import RmsNorm
from vitkit.weights.io import WeightsError

timm = pytest.importorskip("timm")
pytest.importorskip("timm.models.deepseek_vit")
from timm.models import save_for_hf  # noqa: E402

#: a small DeepSeek (two blocks of 64, four heads): every part of the 412M model, fast
SMALL = dict(img_size=56, embed_dim=64, depth=2, num_heads=4, num_classes=7)


def _ours(**kw):
    """vitkit's model of SMALL's shape (SwiGLU 176 = int(64 x 2.75), as timm's mlp_ratio makes it)."""
    return vitkit.create_model("deepseek_vit_412m", **{**SMALL, "mlp_dim": 176, **kw}).eval()


def _timm(**kw):
    torch.manual_seed(0)
    return randomize(timm.create_model("deepseek_vit_412m", **{**SMALL, **kw}), scale=0.2)


def test_the_412m_model_has_timms_parameter_count():
    with torch.device("meta"):  # (its hub checkpoints are headless: num_classes 0)
        theirs = sum(p.numel() for p in timm.create_model("deepseek_vit_412m", num_classes=0).parameters())
    assert count_params(get_model_config("deepseek_vit_412m")) == theirs == 411_842_560


def test_timms_hub_folder_loads_with_parity_at_its_size_and_another(tmp_path):
    """The mean of the final-normed patches through the weightless RMSNorm, a bias-free SwiGLU beside an attention
    that keeps its biases, axial RoPE on integer indices with the halves rotated: exact where any part differed."""
    ref = _timm()
    save_for_hf(ref, str(tmp_path / "ds"), safe_serialization=True)
    model = vitkit.from_pretrained(tmp_path / "ds")
    assert type(model).__name__ == "Deepseek" and model.config.crop_mode == "border"
    assert isinstance(model.fc_norm, RmsNorm) and model.fc_norm.weight is None
    for size in [(56, 56), (42, 70)]:  # any multiple of the patch, as timm's (no position table to resample)
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert max_diff(model(x), ref(x)) < 1e-5, size


def test_the_timm_layout_written_back_is_what_timm_loads(tmp_path):
    ref = _timm()
    model = _ours()
    vitkit.load_weights(model, ref.state_dict())
    vitkit.export_weights(model, tmp_path / "back.safetensors", format="timm")
    again = timm.create_model("deepseek_vit_412m", **SMALL).eval()
    from safetensors.torch import load_file

    again.load_state_dict(load_file(tmp_path / "back.safetensors"))  # strict: timm's own names, nothing else
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        assert max_diff(again(x), ref(x)) < 1e-5


def test_a_bare_file_is_not_guessed_and_reads_with_its_name(tmp_path):
    ref = _timm()
    from safetensors.torch import save_file

    save_file(ref.state_dict(), tmp_path / "bare.safetensors")
    with pytest.raises(WeightsError, match="does not hold its rotary positions"):
        vitkit.from_pretrained(tmp_path / "bare.safetensors")
    model = vitkit.from_pretrained(tmp_path / "bare.safetensors", model_name="deepseek_vit_412m", img_size=56,
                                   embed_dim=64, depth=2, num_heads=4, num_classes=7, mlp_dim=176)
    x = torch.randn(1, 3, 56, 56)
    with torch.no_grad():
        assert max_diff(model(x), ref(x)) < 1e-5


def test_a_state_dict_given_to_from_pretrained_is_named_not_printed():
    """from_pretrained(state_dict) printed every tensor of the dict into its one line (thousands of lines)."""
    with pytest.raises(WeightsError) as e:
        vitkit.from_pretrained(_timm().state_dict())
    assert str(e.value) == ("weights are a file, a folder or hf-hub:NAME, not an OrderedDict (a state dict loads into "
                            "a model: vitkit.load_weights(model, sd))")


def test_the_vlm_projector_variants_are_refused_by_name(tmp_path):
    """timm's _align and _enc models read out through DeepSeek's aligner (a 3 x 3 pixel-unshuffle and two layers to
    the language model's width), which vitkit does not build: each is one line, never the encoder without it."""
    for name in ("deepseek_vit_412m_align", "deepseek_vit_412m_enc"):
        torch.manual_seed(0)
        kw = dict(SMALL, out_features=32)
        if name.endswith("_enc"):  # (timm's encoder takes no class count)
            kw.pop("num_classes")
        ref = timm.create_model(name, **kw)
        save_for_hf(ref, str(tmp_path / name), safe_serialization=True)
        with pytest.raises(WeightsError, match=f"{name}' is DeepSeek's encoder .*VLM projector") as e:
            vitkit.from_pretrained(tmp_path / name)
        assert "\n" not in str(e.value)
    sd = timm.create_model("deepseek_vit_412m_align", **SMALL, out_features=32).state_dict()
    with pytest.raises(WeightsError, match=r"with its VLM projector \(encoder.aligner.fc1.bias"):
        vitkit.load_weights(_ours(), sd)


@pytest.mark.parametrize("args, words", [
    ({"encoder_pool": "align", "out_features": 32}, "build the VLM projector"),
    ({"dynamic_img_pad": True}, "dynamic_img_pad"),
    ({"rope_type": "mixed"}, "rope_type are not read"),
])
def test_model_args_vitkit_does_not_build_are_one_line(tmp_path, args, words):
    ref = _timm()
    save_for_hf(ref, str(tmp_path / "ds"), safe_serialization=True)
    config = json.loads((tmp_path / "ds" / "config.json").read_text())
    config["model_args"] = {**config.get("model_args", {}), **args}
    (tmp_path / "ds" / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match=words):
        vitkit.from_pretrained(tmp_path / "ds")


@pytest.mark.parametrize("field, value", [("class_token", True), ("pos_embed", "learned"), ("global_pool", "token"),
                                          ("rope_half", False), ("pooled_norm", "yes")])
def test_a_field_that_would_make_another_model_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        _ours(**{field: value})


def test_without_the_pooled_norm_the_pooled_mean_is_read_raw():
    """timm's final_norm=False: the head reads the mean itself (model_args say so, the field follows)."""
    ref = _timm(final_norm=False)
    model = _ours(pooled_norm=False)
    vitkit.load_weights(model, ref.state_dict())
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        assert max_diff(model(x), ref(x)) < 1e-5


def test_pre_training_says_why_it_refuses_the_family():
    from vitkit.selfsup import create_pretrainer

    with pytest.raises(ValueError, match="mae pre-trains a plain ViT or an EVA-style one, not 'deepseek': the "
                                         "objectives are not built for DeepSeek's family"):
        create_pretrainer("mae", _ours(num_classes=0))
