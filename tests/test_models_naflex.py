"""timm's NaFlexViT on images (``naflexvit_*``: timm's NaFlex ViTs, SigLIP 2 NaFlex's towers, C-RADIO v3 and v4):
timm's outputs from its own hub folders and bare state dicts (fp32, 1e-5 of the output's scale) at its table's size
and others (the table resampled per input: bicubic with antialias, bilinear, the corners aligned, the aspect ratio
kept, the factorised row and column tables), written back in timm's names, and what vitkit does not build refused
in one line. (Every registered name's parameter names and count: test_models_names.)"""

import re

import pytest
import torch
from safetensors.torch import save_file

import vitkit
from conftest import max_diff, model_args_refusal, randomize
from vitkit.weights.io import WeightsError

timm = pytest.importorskip("timm")
pytest.importorskip("timm.models.naflexvit")
from timm.models import save_for_hf  # noqa: E402

#: two blocks of 64 (two heads), an 8 x 8 table of 8 px patches: every part of the released models, fast
SMALL = dict(embed_dim=64, depth=2, num_heads=2, patch_size=8, pos_embed_grid_size=(8, 8))
#: the same in vitkit's fields (the table's size in pixels)
OURS = dict(embed_dim=64, depth=2, num_heads=2, patch_size=8, pos_embed_size=64)
#: the table's own grid, larger (upsampled), a tall one, a wide one below the table (downsampled, cropped)
SIZES = [(64, 64), (96, 96), (80, 48), (40, 72)]
NAMES = ["naflexvit_base_patch16_gap", "naflexvit_base_patch16_par_gap", "naflexvit_base_patch16_parfac_gap",
         "naflexvit_base_patch16_map", "naflexvit_base_patch16_siglip", "naflexvit_base_patch16_radio_v3",
         "naflexvit_so400m_patch16_radio_v4"]


def _timm(name, **kw):
    torch.manual_seed(0)
    return randomize(timm.create_model(name, **{**SMALL, **kw}), scale=0.2).eval()


def _same(got, expected):
    return max_diff(got, expected) <= 1e-5 * max(1.0, expected.abs().max().item())


@pytest.mark.parametrize("name", NAMES)
def test_timms_hub_folders_load_with_parity_at_every_size(name, tmp_path):
    """Registers and a class token before the patches, no position for them; LayerScale; mean pooling with
    fc_norm, the MAP head, or RADIO's class token with no final norm; and the table resampled as each model does."""
    ref = _timm(name)
    save_for_hf(ref, str(tmp_path / "n"), model_args=SMALL, safe_serialization=True)
    model = vitkit.from_pretrained(tmp_path / "n")
    assert type(model).__name__ == "NaFlexViT" and model.config.pos_embed_size == (64, 64)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
    for size in SIZES:
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert _same(model(x), ref(x)), size


@pytest.mark.parametrize("name", ["naflexvit_base_patch16_gap", "naflexvit_base_patch16_parfac_gap"])
def test_another_image_size_keeps_the_table_at_its_own_grid(name, tmp_path):
    """timm's NaFlexViT ignores img_size for its table: loaded (or fine-tuned) at another size, vitkit's keeps the
    table at its grid and resamples it per input as timm does (resampled once to the new grid, it was another
    function at every other size)."""
    from vitkit.models.config_base import fit_table_size  # (vitkit train --init's rule too)

    ref = _timm(name)
    save_for_hf(ref, str(tmp_path / "n"), model_args=SMALL, safe_serialization=True)
    model = vitkit.from_pretrained(tmp_path / "n", img_size=(80, 48))
    assert model.config.img_size == (80, 48) and model.config.pos_embed_size == (64, 64)
    assert fit_table_size(model.config, {"img_size": 32}) == {"img_size": 32, "pos_embed_size": (64, 64)}
    for size in ((80, 48), (40, 72)):
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert _same(model(x), ref(x)), size


def test_each_resampling_rule_is_timms_own_not_another():
    """The rules differ where they matter: a tall grid's table kept square and cropped is not the table stretched
    to it, and the factorised tables give what the 2D table would not (each compared with timm's own path)."""
    x = torch.randn(1, 3, 80, 48, generator=torch.Generator().manual_seed(2))
    outputs = {}
    for name in ("naflexvit_base_patch16_gap", "naflexvit_base_patch16_par_gap"):
        ref = _timm(name)
        model = vitkit.create_model(name, **OURS)
        model.load_state_dict(vitkit.models.family("naflexvit").from_timm(ref.state_dict()))
        with torch.no_grad():
            outputs[name] = model(x)
            assert _same(outputs[name], ref(x)), name
    assert max_diff(*outputs.values()) > 1e-3  # (the same weights: only the rule differs)


def test_a_bare_state_dict_is_read_off_its_shapes(tmp_path):
    """timm's tensors alone: the width, depth, registers, pooling and the table's grid off the shapes (the
    resampling is timm's default, bicubic with antialias: no tensor says another)."""
    ref = _timm("naflexvit_base_patch16_gap", reg_tokens=2, embed_dim=128)  # (heads of 64: no tensor says them)
    save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.warns(UserWarning, match="holds tensors only"):
        model = vitkit.from_pretrained(tmp_path / "w.safetensors")
    cfg = model.config
    assert (cfg.architecture, cfg.reg_tokens, cfg.global_pool, cfg.patch_size) == ("naflexvit", 2, "avg", (8, 8))
    for size in ((64, 64), (96, 48)):
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert _same(model(x), ref(x)), size


@pytest.mark.parametrize("name", ["naflexvit_base_patch16_gap", "naflexvit_base_patch16_parfac_gap"])
def test_written_back_in_timms_names_it_loads_strictly_into_timm(name, tmp_path):
    """The convolution's kernel back to the linear projection (height, width, channel), the flat table back to
    (1, H, W, D), the factorised tables and tokens under ``embeds.``: timm loads it strictly, same outputs."""
    model = randomize(vitkit.create_model(name, **OURS))
    vitkit.export_weights(model, tmp_path / "t.safetensors", format="timm")
    from safetensors.torch import load_file

    ref = timm.create_model(name, **SMALL).eval()
    ref.load_state_dict(load_file(str(tmp_path / "t.safetensors")), strict=True)
    x = torch.randn(2, 3, 96, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert _same(model(x), ref(x))
    back = vitkit.from_pretrained(tmp_path / "t.safetensors")  # (vitkit's config in its metadata)
    with torch.no_grad():
        assert max_diff(back(x), model(x)) == 0.0


@pytest.mark.parametrize("fields, said", [
    ({"no_embed_class": False}, "no_embed_class is True in a NaFlex ViT"),
    ({"dynamic_img_size": False}, "dynamic_img_size is True in a NaFlex ViT"),
    ({"pos_embed": "sincos2d"}, "a NaFlex ViT's pos_embed is one of ('learned', 'factorized', 'none')"),
    ({"pos_embed_ar_preserving": "yes"}, "pos_embed_ar_preserving must be true or false"),
])
def test_fields_a_naflex_vit_does_not_have_are_refused(fields, said):
    with pytest.raises(ValueError, match=r"invalid NaFlex ViT config: .*" + re.escape(said)):
        vitkit.create_model("naflexvit_base_patch16_gap", **fields)


@pytest.mark.parametrize("args, said", [
    ({"embed_proj_type": "conv"}, "embed_proj_type='conv' are not built by vitkit"),
    ({"rope_type": "axial"}, "rope_type='axial' are not built by vitkit"),
    ({"pos_embed_grid_size": "x"}, "timm model_args pos_embed_grid_size must be an int or a pair .H, W. of ints, "
                                   "got 'x'"),
    ({"pos_embed_interp_mode": "area"}, "pos_embed_interpolation must be one of"),
])
def test_timm_model_args_vitkit_does_not_build_are_refused_by_name(args, said, tmp_path):
    ref = _timm("naflexvit_base_patch16_gap")
    save_for_hf(ref, str(tmp_path / "n"), model_args=SMALL, safe_serialization=True)
    assert re.search(said, model_args_refusal(tmp_path / "n", args))


def test_a_linear_projection_of_no_square_patch_is_refused(tmp_path):
    from vitkit.models.naflexvit import patch_of

    assert patch_of(768) == (16, 3) and patch_of(64) == (8, 1)
    sd = _timm("naflexvit_base_patch16_gap").state_dict()
    sd["embeds.proj.weight"] = sd["embeds.proj.weight"][:, :99].contiguous()
    save_file(sd, str(tmp_path / "w.safetensors"))
    with pytest.raises(WeightsError, match="over 99 values is no square patch of 3 or 1 channels"):
        vitkit.from_pretrained(tmp_path / "w.safetensors")


def test_onnx_runtime_computes_the_factorised_square_cropped_positions(tmp_path):
    """The linear resampling of the row and column tables, kept square and cropped, in the exported graph."""
    ort = pytest.importorskip("onnxruntime")
    from vitkit.deploy.onnx_export import export_onnx

    model = randomize(vitkit.create_model("naflexvit_base_patch16_parfac_gap", **OURS, img_size=(80, 48)))
    session = ort.InferenceSession(str(export_onnx(model, tmp_path / "m.onnx")))
    x = torch.randn(3, 3, 80, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(x)
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    assert _same(got, expected)
