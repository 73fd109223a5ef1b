"""DeepSeek's vision encoder (timm's ``deepseek_vit_412m``, ``_align``, ``_enc``): timm's parameter counts, timm's
outputs from timm's own hub folders and state dicts (fp32, 1e-5) at its size and others (the VLM projector's blocks
padded), written back in timm's names, and what vitkit does not read refused in one line."""

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
        # and vitkit reads its own export back (its config in the metadata; it was refused as "mixed")
        assert max_diff(vitkit.from_pretrained(tmp_path / "back.safetensors")(x), ref(x)) < 1e-5


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


def _projector(name, **kw):
    """timm's _align classifier or _enc encoder of SMALL's shape, its projector 48 wide, noised."""
    torch.manual_seed(0)
    kw = {**SMALL, "out_features": 48, **kw}
    if name.endswith("_enc"):  # (timm's encoder takes no class count)
        kw.pop("num_classes")
    return randomize(timm.create_model(name, **kw), scale=0.2)


@pytest.mark.parametrize("name", ["deepseek_vit_412m_align", "deepseek_vit_412m_enc"])
def test_timms_projector_models_load_with_parity_their_tokens_and_pooled_output(name, tmp_path):
    """DeepSeek's VLM projector: 3 x 3 blocks of patches side by side channel-major, the grid zero-padded at the
    bottom and right (4 x 4 -> 6 x 6, 3 x 5 -> 3 x 6), two layers to the language model's width. timm's config.json
    has no width (timm reads it off the checkpoint's tag): vitkit reads it off the tensors."""
    ref = _projector(name)
    save_for_hf(ref, str(tmp_path / "ds"), safe_serialization=True)
    config = json.loads((tmp_path / "ds" / "config.json").read_text())
    config["model_args"].pop("out_features")  # as a tagged checkpoint's: the width is the tag's
    (tmp_path / "ds" / "config.json").write_text(json.dumps(config))
    model = vitkit.from_pretrained(tmp_path / "ds")
    assert model.config.projector_dim == 48 and model.config.pooled_norm == name.endswith("_align")
    for size in [(56, 56), (42, 70), (70, 28)]:
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            tokens = ref(x) if name.endswith("_enc") else ref.forward_features(x)
            assert tokens.shape[1] == -(-size[0] // 42) * -(-size[1] // 42)
            assert max_diff(model.forward_features(x), tokens) < 1e-5, size
            if name.endswith("_align"):
                assert max_diff(model(x), ref(x)) < 1e-5, size
            else:  # (timm's encoder does not pool: vitkit's pools the tokens it gives)
                assert max_diff(model(x), tokens.mean(1)) < 1e-5, size
    assert count_params(model.config) == sum(p.numel() for p in ref.parameters())


def test_the_412m_projector_models_have_timms_parameter_counts():
    for name in ("deepseek_vit_412m_align", "deepseek_vit_412m_enc"):
        with torch.device("meta"):
            theirs = sum(p.numel() for p in timm.create_model(name).parameters())
        assert count_params(get_model_config(name)) == theirs == 485_253_120, name


@pytest.mark.parametrize("name", ["deepseek_vit_412m_align", "deepseek_vit_412m_enc"])
def test_a_projector_model_written_back_is_what_timm_loads(name, tmp_path):
    """timm's _enc names are vitkit's own (no encoder. prefix, no head); the classifier's move the prefix."""
    ref = _projector(name).eval()
    model = vitkit.create_model(name, **{k: v for k, v in SMALL.items() if not name.endswith("_enc") or
                                         k != "num_classes"}, mlp_dim=176, projector_dim=48).eval()
    vitkit.load_weights(model, ref.state_dict())
    vitkit.export_weights(model, tmp_path / "back.safetensors", format="timm")
    again = _projector(name).eval()
    from safetensors.torch import load_file

    again.load_state_dict(load_file(tmp_path / "back.safetensors"))  # strict: timm's own names, nothing else
    x = torch.randn(2, 3, 56, 42)
    with torch.no_grad():
        assert max_diff(again(x), ref(x)) < 1e-5
    assert max_diff(vitkit.from_pretrained(tmp_path / "back.safetensors")(x), model(x)) < 1e-5


def test_timms_encoder_pooling_its_patches_has_no_projector(tmp_path):
    """timm's _enc built with global_pool='avg' has no projector and returns the patches' mean."""
    ref = _projector("deepseek_vit_412m_enc", global_pool="avg")
    save_for_hf(ref, str(tmp_path / "ds"), safe_serialization=True)
    model = vitkit.from_pretrained(tmp_path / "ds")
    assert model.aligner is None and not model.config.projector_dim
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        assert max_diff(model(x), ref(x)) < 1e-5


def test_projector_files_that_do_not_fit_are_one_line(tmp_path):
    sd = _projector("deepseek_vit_412m_align", num_classes=0).state_dict()
    with pytest.raises(WeightsError, match="aligner.fc1") as e:  # a plain encoder: the projector's tensors are not
        vitkit.load_weights(_ours(num_classes=0), sd)  # its own
    assert "\n" not in str(e.value)
    ref = _projector("deepseek_vit_412m_enc")
    save_for_hf(ref, str(tmp_path / "ds"), safe_serialization=True)
    from safetensors.torch import load_file, save_file

    tensors = load_file(tmp_path / "ds" / "model.safetensors")
    tensors["aligner.fc1.weight"] = tensors["aligner.fc1.weight"][:, :500].contiguous()  # no r x r of 64
    save_file(tensors, tmp_path / "ds" / "model.safetensors")
    with pytest.raises(WeightsError, match="takes 500 inputs: no r x r blocks of 64-wide patches"):
        vitkit.from_pretrained(tmp_path / "ds")


@pytest.mark.parametrize("field, value", [("projector_dim", -1), ("projector_dim", 4.5), ("projector_ratio", 0),
                                          ("projector_ratio", True)])
def test_bad_projector_fields_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        _ours(**{field: value})


@pytest.mark.parametrize("args, words", [
    ({"global_pool": ""}, "vitkit pools the patches"),
    ({"encoder_pool": "token"}, "vitkit pools the patches"),
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


def test_info_says_the_projector_and_the_border_crop(tmp_path, capsys):
    from conftest import in_process

    save_for_hf(_projector("deepseek_vit_412m_enc"), str(tmp_path / "ds"), safe_serialization=True)
    out = in_process(capsys, "info", str(tmp_path / "ds")).stdout
    assert "a VLM projector (3x3 patches -> 48 wide; forward_features gives its tokens)" in out
    assert "crop 1.0 (the whole image, padded)" in out


def _deepseeks_own(ref) -> dict:
    """timm's _enc weights in DeepSeek's own names (its shard's vision. and aligner., the patch embedding a linear
    layer), beside a language model's tensors (whose norm and head names collide with timm's)."""
    sd = {}
    for k, v in ref.state_dict().items():
        if k.startswith("aligner."):
            sd[k.replace(".fc1.", ".w1.").replace(".fc2.", ".w2.")] = v
            continue
        for ours, theirs in ((".attn.qkv.", ".attn.wqkv."), (".attn.proj.", ".attn.wo."), (".mlp.fc1.", ".mlp.w1."),
                             (".mlp.fc2.", ".mlp.w2.")):
            k = k.replace(ours, theirs)
        sd["vision." + k] = v.flatten(1) if k == "patch_embed.proj.weight" else v
    return {**sd, "embed.weight": torch.randn(10, 8), "norm.weight": torch.ones(8), "head.weight": torch.randn(10, 8),
            "layers.0.attn.wq.weight": torch.randn(8, 8)}


def test_deepseeks_own_shard_reads_as_timms_filter_reads_it(tmp_path):
    """DeepSeek's first shard (the vision tower and projector among the language model's tensors): timm's own
    checkpoint filter and vitkit read it into the same model; the architecture is read off the shapes (heads of
    64, as the 412M tower's)."""
    from safetensors.torch import save_file
    from timm.models.deepseek_vit import checkpoint_filter_fn_encoder

    torch.manual_seed(0)
    shape = dict(img_size=56, embed_dim=128, depth=2, num_heads=2, out_features=48)
    own = _deepseeks_own(randomize(timm.create_model("deepseek_vit_412m_enc", **shape), scale=0.2))
    ref = timm.create_model("deepseek_vit_412m_enc", **shape).eval()
    ref.load_state_dict(checkpoint_filter_fn_encoder(own, ref))  # strict: timm's reading of DeepSeek's names
    save_file({k: v.contiguous() for k, v in own.items()}, tmp_path / "model-00001-of-00048.safetensors")
    model = vitkit.from_pretrained(tmp_path / "model-00001-of-00048.safetensors")
    assert (model.config.projector_dim, model.config.num_heads, model.config.depth) == (48, 2, 2)
    x = torch.randn(2, 3, 56, 70)
    with torch.no_grad():
        assert max_diff(model.forward_features(x), ref(x)) < 1e-5


@pytest.mark.parametrize("width, size", [(5120, 546), (4096, 392), (None, 546)])
def test_a_deepseek_shards_size_is_its_checkpoints(width, size):
    """V4.1-Flash's projector is 5,120 wide and its images 546 px; V4-Flash-Vision-Exp's 4,096 and 392 (timm's
    configs); the tower alone is the 412M encoder at 546."""
    from vitkit.weights import deepseek_format

    with torch.device("meta"):
        own = _deepseeks_own(timm.create_model("deepseek_vit_412m_enc", out_features=width or 8, depth=2))
    if width is None:
        own = {k: v for k, v in own.items() if not k.startswith("aligner.")}
    config = deepseek_format.infer_config(own)
    assert config.img_size == (size, size) and config.projector_dim == (width or 0)
    assert (config.embed_dim, config.num_heads, config.mlp_dim, config.patch_size) == (1024, 16, 2816, (14, 14))
    assert config.pooled_norm == (width is None)  # (the tower alone: the 412M classifier's headless readout)


def test_deepseek_shards_that_do_not_fit_are_one_line(tmp_path):
    from safetensors.torch import save_file

    own = _deepseeks_own(_projector("deepseek_vit_412m_enc"))
    own["vision.patch_embed.proj.weight"] = own["vision.patch_embed.proj.weight"][:, :500].contiguous()
    save_file({k: v.contiguous() for k, v in own.items()}, tmp_path / "odd.safetensors")
    with pytest.raises(WeightsError, match="DeepSeek checkpoint: DeepSeek's patch embedding takes 500 values"):
        vitkit.from_pretrained(tmp_path / "odd.safetensors")
    llm = {k: v for k, v in own.items() if not k.startswith(("vision.", "aligner."))}
    save_file(llm, tmp_path / "llm.safetensors")  # a later shard: the language model alone
    with pytest.raises(WeightsError, match="unrecognised weight layout"):
        vitkit.from_pretrained(tmp_path / "llm.safetensors")


def test_info_says_a_deepseek_shard_is_its_vision_tower_and_what_is_left_out(tmp_path, capsys):
    from safetensors.torch import save_file

    from conftest import in_process

    save_file(_deepseeks_own(_projector("deepseek_vit_412m_enc")), tmp_path / "shard.safetensors")
    out = in_process(capsys, "info", str(tmp_path / "shard.safetensors")).stdout
    assert "layout      deepseek (DeepSeek's own: its vision tower; 4 tensors of its language model left out)" in out
    assert "architecture 'deepseek': rotary positions" in out  # (64 wide: no released name)


def test_a_deepseek_vlm_folder_reads_its_tower_shard_alone(tmp_path):
    """A DeepSeek VLM repository (its config.json, a shard index, the language model in other shards: here not
    even weights files, so never opened) reads as its first shard does."""
    from conftest import vlm_repository

    torch.manual_seed(0)  # (heads of 64, as the released tower's: a shard does not say them)
    ref = randomize(timm.create_model("deepseek_vit_412m_enc", img_size=56, embed_dim=128, depth=2, num_heads=2,
                                      out_features=48), scale=0.2).eval()
    own = {k: v for k, v in _deepseeks_own(ref).items() if k.startswith(("vision.", "aligner."))}
    vlm_repository(tmp_path, own, "layers.0.attn.wq.weight", {"model_type": "deepseek_v4", "hidden_size": 4096})
    model = vitkit.from_pretrained(tmp_path)
    x = torch.randn(2, 3, 56, 70)
    with torch.no_grad():
        assert max_diff(model.forward_features(x), ref(x)) < 1e-5
