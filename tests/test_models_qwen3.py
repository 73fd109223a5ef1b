"""Qwen3's vision encoder (timm's ``qwen3_vit_*``, ``_merge``, ``_enc``): timm's outputs from timm's own hub folders
and state dicts (fp32, 1e-5) at its size and others (the 48 x 48 table resampled with its corners aligned, the
merger's 2 x 2 blocks), written back in timm's names, and what vitkit does not read refused in one line. (Every
registered name's parameter names and count: test_models_names.)"""

import json
import re
import warnings

import pytest
import torch

import vitkit
from conftest import max_diff, model_args_refusal, randomize
from vitkit.models.complexity import count_params
from vitkit.weights.io import WeightsError
from vitkit.weights.pretrained import GuessWarning

timm = pytest.importorskip("timm")
pytest.importorskip("timm.models.qwen3_vit")
from timm.models import save_for_hf  # noqa: E402

#: a small Qwen3 (two blocks of 64, four heads, a 6 x 6 table): every part of the released models, fast
SMALL = dict(img_size=64, embed_dim=64, depth=2, num_heads=4, pos_embed_grid_size=6)
#: sizes whose grids are whole 2 x 2 blocks: the table's own, wider (upsampled), taller, smaller
SIZES = [(96, 96), (64, 128), (160, 64), (32, 32)]


def _timm(name, **kw):
    torch.manual_seed(0)
    kw = {k: v for k, v in {**SMALL, **kw}.items() if v is not None}
    if name.endswith("_merge") or name.endswith("_enc"):
        kw.setdefault("out_features", 48)
    return randomize(timm.create_model(name, **kw), scale=0.2).eval()


def _saved(ref, folder, drop_width=True):
    save_for_hf(ref, str(folder), safe_serialization=True)
    config = json.loads((folder / "config.json").read_text())
    if drop_width:
        config["model_args"].pop("out_features", None)  # as a tagged checkpoint's: the width is the tag's
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("name, kw", [("qwen3_vit_88m", dict(num_classes=5)), ("qwen3_vit_88m_merge", {}),
                                      ("qwen3_vit_88m_enc", {}), ("qwen3_vit_88m_merge", dict(final_norm=False))])
def test_timms_hub_folders_load_with_parity_at_every_size(name, kw, tmp_path):
    """The learned table resampled bilinearly with its corners aligned to each grid (up and down), the rotary
    positions on the patches' indices, the GELU-tanh MLP, no final norm; the merger's per-patch norm, 2 x 2 blocks
    in row-major order and two layers; the pooled mean through a LayerNorm without weight."""
    ref = _timm(name, **kw)
    model = vitkit.from_pretrained(_saved(ref, tmp_path / "q"))
    assert type(model).__name__ == "Qwen3" and model.config.crop_mode == "squash"
    for size in SIZES:
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            expected = ref(x)
            got = model(x) if expected.dim() == 2 else model.forward_features(x)
            assert max_diff(got, expected) < 1e-5, size
            if name.endswith("_merge"):
                assert max_diff(model.forward_features(x), ref.forward_features(x)) < 1e-5, size
    assert count_params(model.config) == sum(p.numel() for p in ref.parameters())


@pytest.mark.parametrize("name", ["qwen3_vit_88m_merge", "qwen3_vit_88m_enc"])
def test_the_timm_layout_written_back_is_what_timm_loads(name, tmp_path):
    ref = _timm(name)
    model = vitkit.from_pretrained(_saved(ref, tmp_path / "q", drop_width=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no word of another resampling: timm's Qwen3 resamples as vitkit's)
        vitkit.export_weights(model, tmp_path / "back.safetensors", format="timm")
    again = _timm(name)
    from safetensors.torch import load_file

    again.load_state_dict(load_file(tmp_path / "back.safetensors"))  # strict: timm's own names, nothing else
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        assert max_diff(again(x), ref(x)) < 1e-5
        assert max_diff(vitkit.from_pretrained(tmp_path / "back.safetensors")(x), model(x)) < 1e-5


def test_a_model_built_at_another_size_keeps_its_48_by_48_table(tmp_path):
    """timm builds the table at pos_embed_grid_size (48 unless given) whatever img_size the model is built at: the
    hub config.json's img_size is not the table's (it was read as the table's and refused as cut)."""
    ref = _timm("qwen3_vit_88m_enc", img_size=64, depth=1, pos_embed_grid_size=None)
    assert ref.pos_embed.shape[1] == 48 * 48
    model = vitkit.from_pretrained(_saved(ref, tmp_path / "q"))
    assert model.pos_embed.shape[1] == 48 * 48
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        assert max_diff(model.forward_features(x), ref(x)) < 1e-5


def test_timms_encoder_pooling_its_patches_has_no_projector(tmp_path):
    ref = _timm("qwen3_vit_88m_enc", global_pool="avg")
    model = vitkit.from_pretrained(_saved(ref, tmp_path / "q"))
    assert model.merger is None and not model.config.projector_dim
    x = torch.randn(2, 3, 48, 80)  # (an odd grid: no merger to need whole blocks)
    with torch.no_grad():
        assert max_diff(model(x), ref(x)) < 1e-5


def test_a_grid_of_no_whole_blocks_is_one_line_for_the_merger():
    model = vitkit.create_model("qwen3_vit_88m_merge", img_size=64, embed_dim=64, depth=1, num_heads=4,
                                projector_dim=8)
    with pytest.raises(ValueError, match="whole 2x2 blocks of patches: a grid of 3x4 patches is not"):
        model(torch.randn(1, 3, 48, 64))
    with pytest.raises(ValueError, match=r"img_size \(48, 64\) is a grid of 3x4 patches, not of whole 2x2 blocks for "
                                         r"the merger: give it a multiple of 32x32 px"):  # (said before any data)
        vitkit.create_model("qwen3_vit_88m_merge", img_size=(48, 64), depth=1)
    assert vitkit.create_model("qwen3_vit_88m", img_size=(48, 64), depth=1).config.grid_size == (3, 4)  # no merger


@pytest.mark.parametrize("args, words", [({"global_pool": ""}, "vitkit pools the patches"),
                                         ({"act_layer": "relu"}, "act_layer is not read"),
                                         ({"deepstack": True}, "deepstack are not read")])
def test_model_args_vitkit_does_not_build_are_one_line(tmp_path, args, words):
    assert re.search(words, model_args_refusal(_saved(_timm("qwen3_vit_88m"), tmp_path / "q"), args))


@pytest.mark.parametrize("field, value", [("pos_embed_align_corners", False), ("final_norm", True), ("gelu", "exact"),
                                          ("class_token", True), ("projector_dim", -2)])
def test_a_field_that_would_make_another_model_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        vitkit.create_model("qwen3_vit_88m", depth=1, **{field: value})


def test_a_bare_file_is_not_guessed(tmp_path):
    from safetensors.torch import save_file

    save_file(_timm("qwen3_vit_88m_merge").state_dict(), tmp_path / "bare.safetensors")
    with pytest.raises(WeightsError, match="does not hold its rotary positions"):
        vitkit.from_pretrained(tmp_path / "bare.safetensors")


def test_pre_training_says_why_it_refuses_the_family():
    from vitkit.selfsup import create_pretrainer

    with pytest.raises(ValueError, match="simmim pre-trains a plain ViT or an EVA-style one, not 'qwen3': the "
                                         "objectives are not built for Qwen3's family"):
        create_pretrainer("simmim", vitkit.create_model("qwen3_vit_88m", depth=1, img_size=64))


def test_info_says_the_merger_and_the_table(tmp_path, capsys):
    from conftest import in_process

    folder = _saved(_timm("qwen3_vit_88m_enc", depth=1), tmp_path / "q")
    out = in_process(capsys, "info", str(folder)).stdout
    assert "layout      timm (qwen3_vit_88m_enc)" in out
    assert "a VLM projector (2x2 patches -> 48 wide; forward_features gives its tokens)" in out


def _hf_tower(qwen35=False, **kw):
    """transformers' Qwen3-VL vision tower (the reference code; Qwen3.5's, which has no DeepStack, with qwen35),
    small: two blocks of 128 in heads of 64 (as the released widths' 64 or 72), a 6 x 6 table, a DeepStack
    projector after block 0."""
    import transformers

    torch.manual_seed(0)
    kw = {**dict(depth=2, hidden_size=128, intermediate_size=256, num_heads=2, patch_size=16, out_hidden_size=48,
                 num_position_embeddings=36), **({} if qwen35 else dict(deepstack_visual_indexes=[0])), **kw}
    config, model = ((transformers.Qwen3_5VisionConfig, transformers.Qwen3_5VisionModel) if qwen35 else
                     (transformers.Qwen3VLVisionConfig, transformers.Qwen3VLVisionModel))
    return randomize(model(config(**kw)), scale=0.2).eval()


def _hf_patches(x, patch=16, merge=2, frames=2):
    """Images (1, C, H, W) -> the flat patches Qwen's image processor gives its tower (each 2 x 2 block's four
    patches together, each patch's two frames the same image), and the grid."""
    _, c, h, w = x.shape
    gh, gw = h // patch, w // patch
    p = x.repeat(frames, 1, 1, 1).reshape(1, frames, c, gh // merge, merge, patch, gw // merge, merge, patch)
    p = p.permute(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(gh * gw, c * frames * patch * patch)
    return p, torch.tensor([[1, gh, gw]])


def test_a_qwen35_checkpoint_reads_as_transformers_computes_it_too(tmp_path):
    """Qwen3.5's tower (transformers' Qwen3_5VisionModel: Qwen3-VL's without the DeepStack projectors)."""
    from safetensors.torch import save_file

    ref = _hf_tower(qwen35=True)
    save_file({"model.visual." + k: v.contiguous() for k, v in ref.state_dict().items()}, tmp_path / "q.safetensors")
    model = vitkit.from_pretrained(tmp_path / "q.safetensors")
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = ref(*_hf_patches(x)).pooler_output
        assert max_diff(model.forward_features(x)[0], expected) < 1e-5 * max(1.0, expected.abs().max().item())


def test_qwens_own_checkpoint_reads_as_transformers_computes_it(tmp_path, capsys):
    """A Qwen3-VL checkpoint's tower (model.visual.*, its 3D patch embedding over two frames, its table an
    embedding of the slots, a DeepStack projector) beside the language model's tensors: vitkit's tokens for the
    language model are transformers' reference tower's (its pooler_output) at the table's size and others."""
    from safetensors.torch import save_file

    from conftest import in_process

    ref = _hf_tower()
    sd = {"model.visual." + k: v.contiguous() for k, v in ref.state_dict().items()}
    sd.update({"model.language_model.embed_tokens.weight": torch.randn(10, 8), "lm_head.weight": torch.randn(10, 8)})
    save_file(sd, tmp_path / "model-00001-of-00002.safetensors")
    model = vitkit.from_pretrained(tmp_path / "model-00001-of-00002.safetensors")
    assert (model.config.num_heads, model.config.projector_dim, model.pos_embed.shape[1]) == (2, 48, 36)
    for size in [(96, 96), (64, 128), (160, 64)]:
        x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            expected = ref(*_hf_patches(x)).pooler_output  # (tokens of ~50: fp32 rounds them to ~1e-4, as
            scale = max(1.0, expected.abs().max().item())  # transformers' own fp32 and fp64 outputs differ)
            assert max_diff(model.forward_features(x)[0], expected) < 1e-5 * scale, size
    out = in_process(capsys, "info", str(tmp_path / "model-00001-of-00002.safetensors")).stdout
    assert ("layout      qwen (Qwen's own: its vision tower; 2 tensors of its language model; 6 of its DeepStack "
            "projectors left out)") in out
    assert "architecture 'qwen3': rotary positions" in out  # (no released width: no released name)


@pytest.mark.parametrize("qwen35", [False, True], ids=["Qwen3VLVisionModel", "Qwen3_5VisionModel"])
def test_a_tower_saved_alone_by_transformers_loads_with_the_heads_its_config_says(qwen35, tmp_path, capsys):
    """``model.visual.save_pretrained(folder)``: Qwen's names without a prefix, its config the tower's own (before,
    refused as "a Hugging Face config where model.safetensors holds timm's tensor names: the two were mixed")."""
    from conftest import in_process

    ref = _hf_tower(qwen35=qwen35, num_heads=4)  # (4 heads of 32 channels: a count no width says)
    ref.save_pretrained(tmp_path)
    model = vitkit.from_pretrained(tmp_path)
    assert model.config.num_heads == 4
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = ref(*_hf_patches(x)).pooler_output
        assert max_diff(model.forward_features(x)[0], expected) < 1e-5 * max(1.0, expected.abs().max().item())
    said = in_process(capsys, "info", str(tmp_path))
    assert said.returncode == 0 and "layout      qwen (Qwen's own: its vision tower" in said.stdout


def test_a_qwen_vlm_folder_reads_its_tower_alone_with_the_heads_its_config_says(tmp_path):
    """A Qwen3-VL repository as the hub has it (config.json with vision_config, a shard index, the language model
    in shards of its own): only the tower's shard is read (the language model's, gigabytes, is not opened: here it
    is not even a weights file), and the heads are its vision_config's (4 of 36 channels, which no width says)."""
    from conftest import vlm_repository

    ref = _hf_tower(hidden_size=144, num_heads=4)
    vlm_repository(tmp_path, {"model.visual." + k: v for k, v in ref.state_dict().items()},
                   "model.language_model.embed_tokens.weight", {
                       "model_type": "qwen3_vl", "architectures": ["Qwen3VLForConditionalGeneration"],
                       "vision_config": ref.config.to_dict(), "text_config": {}})
    model = vitkit.from_pretrained(tmp_path)
    assert model.config.num_heads == 4
    processor = pytest.importorskip("transformers").Qwen2VLImageProcessor(patch_size=16, merge_size=2)
    processor.save_pretrained(tmp_path)  # (it resizes each image to a size of its own)
    with pytest.warns(GuessWarning, match=r"its image processor \(Qwen's\) resizes each image to between 3,136 and "
                                          r"1,003,520 pixels, its sides multiples of 32 px, keeping its aspect"):
        vitkit.from_pretrained(tmp_path)
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = ref(*_hf_patches(x)).pooler_output
        assert max_diff(model.forward_features(x)[0], expected) < 1e-5 * max(1.0, expected.abs().max().item())
    config = json.loads((tmp_path / "config.json").read_text())
    config["vision_config"]["hidden_act"] = "silu"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="hidden_act 'silu'"):
        vitkit.from_pretrained(tmp_path)
