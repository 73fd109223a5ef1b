"""pos_embed="relative": a learned bias per head and 2D offset in every attention layer, proven
against timm's ``VisionTransformerRelPos(rel_pos_type="bias")`` (its ``RelPosBias``) on the same
weights, in both directions, and through save, load, a change of resolution and ONNX export."""

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from conftest import max_diff, randomize
from vitkit.models.layers import relative_position_index, resize_relative_table
from vitkit.weights import WeightsError

relpos = pytest.importorskip("timm.models.vision_transformer_relpos")
from timm.layers.pos_embed_rel import gen_relative_position_index  # noqa: E402

SMALL = dict(patch_size=8, embed_dim=48, depth=2, num_heads=3, mlp_dim=96, num_classes=5)


def timm_relpos(img_size=(32, 40), class_token=False, init_values=None, seed=0):
    """timm's relative-position ViT (bias tables, not its MLP kind), random weights, eval mode."""
    torch.manual_seed(seed)
    model = relpos.VisionTransformerRelPos(img_size=img_size, patch_size=8, embed_dim=48, depth=2, num_heads=3,
                                           mlp_ratio=2.0, num_classes=5, rel_pos_type="bias",
                                           class_token=class_token, global_pool="token" if class_token else "avg",
                                           init_values=init_values)
    return randomize(model).eval()


def ours(img_size=(32, 40), class_token=False, **kw):
    return vitkit.create_model("vit_tiny_patch16_224", img_size=img_size, pos_embed="relative",
                               class_token=class_token, global_pool="token" if class_token else "avg",
                               fc_norm=False, **{**SMALL, **kw}).eval()


@pytest.mark.parametrize("grid", [(3, 3), (2, 5), (4, 3)])
@pytest.mark.parametrize("prefix", [0, 1])
def test_the_offset_index_is_timm_s(grid, prefix):
    assert torch.equal(relative_position_index(grid, prefix), gen_relative_position_index(grid, class_token=prefix > 0))


@pytest.mark.parametrize("class_token,init_values", [(False, None), (True, None), (True, 1e-5), (False, 0.1)])
def test_logits_equal_timm_s_on_the_same_weights(class_token, init_values):
    theirs = timm_relpos(class_token=class_token, init_values=init_values)
    model = ours(class_token=class_token, init_values=init_values)
    report = vitkit.load_weights(model, theirs.state_dict(), strict=True)
    assert not report.missing and not report.unexpected
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        expected = theirs(x)
        assert max_diff(model(x), expected) <= 1e-5  # fused attention with the bias as its mask
        logits, attn = model(x, return_attention=True)  # the explicit path
        assert max_diff(logits, expected) <= 1e-5
    n = 20 + int(class_token)
    assert [tuple(a.shape) for a in attn] == [(2, 3, n, n)] * 2
    assert torch.allclose(attn[0].sum(-1), torch.ones(2, 3, n))


def test_a_timm_file_loads_with_its_architecture_read_off_the_shapes(tmp_path):
    from safetensors.torch import save_file

    theirs = timm_relpos(img_size=(32, 32), class_token=True)
    save_file(theirs.state_dict(), tmp_path / "relpos.safetensors")
    model = vitkit.from_pretrained(tmp_path / "relpos.safetensors", num_heads=3).eval()
    assert model.config.pos_embed == "relative" and model.config.img_size == (32, 32)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert max_diff(model(x), theirs(x)) <= 1e-5


def test_timm_reads_vitkit_s_export_back(tmp_path):
    model = randomize(ours(class_token=True))
    path = vitkit.export_weights(model, tmp_path / "w.safetensors", "timm")
    from safetensors.torch import load_file

    theirs = timm_relpos(class_token=True, seed=1)
    theirs.load_state_dict(load_file(path))
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        assert max_diff(theirs(x), model(x)) <= 1e-5
    for fmt, name in (("npz", "w.npz"), ("hf", "hf")):
        with pytest.raises(WeightsError, match="relative position bias"):
            vitkit.export_weights(model, tmp_path / name, fmt)


def test_save_load_and_a_change_of_resolution_keep_each_offset_s_bias(tmp_path):
    model = randomize(ours(img_size=(24, 24), class_token=True))
    model.save_pretrained(tmp_path / "m")
    again = vitkit.from_pretrained(tmp_path / "m").eval()
    x = torch.randn(2, 3, 24, 24)
    with torch.no_grad():
        assert torch.equal(again(x), model(x))
    old = model.blocks[0].attn.rel_pos((3, 3))[0]  # (heads, 10, 10): class + 3x3 patches
    model.set_input_size(40)  # 5x5 patches
    new = model.blocks[0].attn.rel_pos((5, 5))[0]
    assert model.blocks[0].attn.rel_pos.relative_position_bias_table.shape == (81 + 3, 3)
    # the patches (r, c) and (r', c') of the 3x3 corner of the larger grid keep the bias of their offset
    old_pos = [(r, c) for r in range(3) for c in range(3)]
    for i, (r, c) in enumerate(old_pos):
        for j, (r2, c2) in enumerate(old_pos):
            assert torch.equal(new[:, 1 + r * 5 + c, 1 + r2 * 5 + c2], old[:, 1 + i, 1 + j])
    assert torch.equal(new[:, 0], torch.cat([new[:, 0, :1], old[:, 0, 1:2].expand(-1, 25)], 1))  # class rows
    with torch.no_grad():
        assert model(torch.randn(1, 3, 40, 40)).shape == (1, 5)
    # a different size at run time equals the model set to that size
    dynamic = vitkit.from_pretrained(tmp_path / "m", dynamic_img_size=True).eval()
    with torch.no_grad():
        z = torch.randn(2, 3, 40, 40)
        assert max_diff(dynamic(z), model(z)) <= 1e-6
    model.set_input_size(24)  # back: the table is the one saved, exactly
    saved = again.blocks[1].attn.rel_pos.relative_position_bias_table
    assert torch.equal(model.blocks[1].attn.rel_pos.relative_position_bias_table, saved)
    # saved weights loaded into a model of another size resize their tables the same way, and say so
    bigger = ours(img_size=(40, 40), class_token=True)
    report = vitkit.load_weights(bigger, tmp_path / "m")
    assert report.resampled == ["2 relative-bias tables 3x3 -> 5x5 (offsets kept, the outermost extended)"]
    model.set_input_size(40)
    with torch.no_grad():
        assert max_diff(bigger(z), model(z)) <= 1e-6


def test_resizing_keeps_offsets_and_crops_back_exactly():
    table = torch.randn(3 * 5 + 3, 2)  # a 2x3 grid with a class token
    bigger = resize_relative_table(table, (2, 3), (4, 4), 1)
    assert bigger.shape == (7 * 7 + 3, 2)
    assert torch.equal(resize_relative_table(bigger, (4, 4), (2, 3), 1), table)
    with pytest.raises(ValueError, match="not that of a 3x3 grid"):
        resize_relative_table(table, (3, 3), (4, 4), 1)


def test_the_bilinear_mode_stretches_the_offsets_as_torch_resizes_an_image():
    """rel_pos_resize='bilinear' (transformers' BEiT): the offsets' table is an image of (2h-1) x (2w-1) pixels
    per head, resized bilinearly (corners not aligned); the class token's three rows stay as they are."""
    table = torch.randn(3 * 5 + 3, 2)
    stretched = resize_relative_table(table, (2, 3), (4, 4), 1, "bilinear")
    image = table[:15].reshape(3, 5, 2).permute(2, 0, 1)
    for head in range(2):  # PIL's bilinear on an upscale is the same half-pixel-centred filter
        pil = Image.fromarray(image[head].numpy()).resize((7, 7), Image.BILINEAR)
        assert max_diff(torch.from_numpy(np.asarray(pil)), stretched[:49, head].reshape(7, 7)) <= 1e-5
    assert torch.equal(stretched[49:], table[15:])
    assert torch.equal(resize_relative_table(table, (2, 3), (2, 3), 1, "bilinear"), table)  # its own grid: itself
    with pytest.raises(ValueError, match="rel_pos_resize must be one of"):
        resize_relative_table(table, (2, 3), (4, 4), 1, "nearest")
    with pytest.raises(ValueError, match="rel_pos_resize must be one of"):
        ours(rel_pos_resize="stretch")


@pytest.mark.parametrize("old, new", [((14, 14), (16, 16)), ((14, 14), (12, 12)), ((14, 14), (14, 16)),
                                      ((3, 5), (6, 4))])
def test_the_geometric_mode_is_timms_resize_of_beits_tables(old, new):
    """rel_pos_resize='geometric' (BEiT's fine-tuning code; timm's resize_rel_pos_bias_table without scipy)."""
    from timm.layers.pos_embed_rel import resize_rel_pos_bias_table

    table = torch.randn((2 * old[0] - 1) * (2 * old[1] - 1) + 3, 4)
    rows = (2 * new[0] - 1) * (2 * new[1] - 1) + 3
    want = resize_rel_pos_bias_table(table, new_window_size=new, new_bias_shape=(rows, 4), old_window_size=old)
    assert max_diff(resize_relative_table(table, old, new, 1, "geometric"), want) <= 1e-6


def test_a_timm_beit_folder_at_another_size_is_timms_model_at_that_size(tmp_path, images):
    """timm resizes a BEiT's tables its way (set_input_size, or loading at another img_size): so does vitkit
    for timm's BEiT names (their other sizes differed from timm's before: each offset's bias was kept)."""
    timm = pytest.importorskip("timm")
    from timm.models import save_for_hf

    ref = randomize(timm.create_model("beitv2_base_patch16_224", depth=2, img_size=64, num_classes=5)).eval()
    save_for_hf(ref, str(tmp_path / "beit"), safe_serialization=True)
    ref.set_input_size(img_size=(64, 96))
    ours = vitkit.from_pretrained(tmp_path / "beit", img_size=(64, 96))
    x = images(2, 64, 96)
    with torch.no_grad():
        want = ref(x)
        assert max_diff(ours(x), want) <= 1e-5 * max(1.0, want.abs().max().item())
        kept = vitkit.from_pretrained(tmp_path / "beit", img_size=(64, 96), rel_pos_resize="keep")
        assert max_diff(kept(x), want) > 1e-4  # the check can fail: vitkit's own resampling is another function


@pytest.mark.parametrize("name", ["beit_base_patch16_224", "vit_small_patch16_rope_224", "eva02_tiny_patch14_224"])
def test_a_timm_eva_folder_saved_at_another_width_loads_as_timm_builds_it(tmp_path, images, name):
    """timm's hidden MLP width is embed_dim x the architecture's mlp_ratio: a hub folder saved with another
    embed_dim (and no mlp_ratio in its model_args) was refused with an MLP shape mismatch."""
    timm = pytest.importorskip("timm")
    from timm.models import save_for_hf

    ref = randomize(timm.create_model(name, depth=2, embed_dim=96, num_heads=2, img_size=112, num_classes=5)).eval()
    save_for_hf(ref, str(tmp_path / "hub"), safe_serialization=True)
    ours = vitkit.from_pretrained(tmp_path / "hub")
    x = images(2, 112, 112)
    with torch.no_grad():
        want = ref(x)
        assert max_diff(ours(x), want) <= 1e-5 * max(1.0, want.abs().max().item())


def test_vitkit_s_own_beit_at_a_non_square_size_keeps_its_grid_when_loaded_at_another(tmp_path, images):
    """A 4x6 grid's tables have the rows of a 6x4 one: read off the saved config, not the row count (they were
    reused transposed, 0.03-0.2 off)."""
    import copy

    model = randomize(vitkit.create_model("beit_base_patch16_224", depth=1, img_size=(64, 96)), scale=0.2)
    model.save_pretrained(tmp_path / "beit")
    resized = copy.deepcopy(model)
    resized.set_input_size((96, 64))
    x = images(2, 96, 64)
    with torch.no_grad():
        assert max_diff(resized(x), vitkit.from_pretrained(tmp_path / "beit", img_size=(96, 64))(x)) <= 1e-5


@pytest.mark.parametrize("name", ["beit_base_patch16_224", "vit_relpos_medium_patch16_cls_224"])
def test_a_relative_bias_too_large_to_index_is_refused_by_its_memory(name):
    """4,096 px at patch 16: 65,537 tokens, whose index alone is 32 GiB (torch's allocation error before)."""
    with pytest.raises(ValueError, match=r"65,537 tokens: its 65,537 x 65,537 index of bias rows would take 32 GiB"):
        vitkit.create_model(name, img_size=4096, depth=1)
    with torch.device("meta"):
        assert vitkit.create_model(name, img_size=2048, depth=1).config.img_size == (2048, 2048)


def test_it_trains_without_weight_decay_on_its_tables():
    model = ours().train()
    names = model.no_weight_decay()
    assert {f"blocks.{i}.attn.rel_pos.relative_position_bias_table" for i in range(2)} <= names
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model.forward_features(torch.randn(4, 3, 32, 40)).float().pow(2).mean()  # (the head starts at 0)
    loss.backward()
    assert model.blocks[0].attn.rel_pos.relative_position_bias_table.grad.abs().sum() > 0
    assert model.blocks[0].attn.rel_pos.relative_position_bias_table.std() > 0  # initialised, not zero


def test_configurations_it_cannot_serve_are_refused():
    with pytest.raises(ValueError, match="not DeiT's distillation token"):
        vitkit.create_model("deit_tiny_distilled_patch16_224", pos_embed="relative")
    from vitkit.selfsup import MAE, SimMIM

    with pytest.raises(ValueError, match="mae encodes the visible patches alone"):
        MAE(vitkit.create_model("vit_fmnist", pos_embed="relative").config)
    out = SimMIM(vitkit.create_model("vit_fmnist", pos_embed="relative").config, mask_block=4)(
        torch.randn(2, 1, 28, 28))
    assert torch.isfinite(out.loss)


@pytest.mark.slow
def test_onnx_export_matches_pytorch(tmp_path):
    pytest.importorskip("onnxruntime")
    from vitkit.deploy import OnnxModel

    model = randomize(ours(class_token=True))
    path = vitkit.export_onnx(model, tmp_path / "relpos.onnx")
    runtime = OnnxModel(path)
    x = torch.randn(3, 3, 32, 40)
    with torch.no_grad():
        assert max_diff(runtime(x), model(x)) <= 1e-4
    assert np.isfinite(runtime(x).numpy()).all()
