"""Segment Anything's image encoder (timm's ``samvit_*``, transformers' ``SamVisionModel`` / ``SamModel``, SAM's own
``image_encoder.`` checkpoints): the reference libraries' outputs (fp32, 1e-5) from each source at its size and
others (windows over a padded grid, offset tables stretched to another grid, the neck), written back in timm's and
transformers' names, and what vitkit does not read refused in one line. (Every registered name's parameter names
and count: test_models_names; the cost: test_complexity; ONNX: test_deploy_onnx.)"""

import json
import re

import pytest
import torch

import vitkit
from conftest import in_process, max_diff, model_args_refusal, randomize
from vitkit.models.complexity import count_params
from vitkit.weights.io import WeightsError

timm = pytest.importorskip("timm")
pytest.importorskip("timm.models.vision_transformer_sam")
from timm.models import save_for_hf  # noqa: E402

#: a small SAM encoder: every part of the released ones (windows of 3 patches, a global block, the neck), fast
SMALL = dict(img_size=96, depth=3, embed_dim=64, num_heads=4, window_size=3, global_attn_indexes=[1], neck_chans=32)
#: the model's own size, grids padded to whole windows (5 x 7 -> 6 x 9), smaller than one window, larger
SIZES = [(96, 96), (80, 112), (32, 32), (128, 96)]


def _timm(name="samvit_base_patch16", **kw):
    torch.manual_seed(0)
    return randomize(timm.create_model(name, **{**SMALL, **kw}), scale=0.2).eval()


def _saved(ref, folder, **pretrained):
    save_for_hf(ref, str(folder), safe_serialization=True)
    if pretrained:
        config = json.loads((folder / "config.json").read_text())
        config["pretrained_cfg"].update(pretrained)
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def _tokens(feature_map):
    """timm's and transformers' (B, C, H, W) map as vitkit's tokens (B, H*W, C)."""
    return feature_map.flatten(2).transpose(1, 2)


@pytest.mark.parametrize("name, kw", [("samvit_base_patch16", {}),
                                      ("samvit_base_patch16", dict(num_classes=5, qkv_bias=False)),
                                      ("samvit_base_patch16_224", dict(num_classes=7, neck_chans=None))])
def test_timms_hub_folders_load_with_parity_at_every_size(name, kw, tmp_path):
    """The windows (padding past the grid's edge taking part in their attention, cut off after), the decomposed
    offsets (stretched linearly to another grid), the table resampled to each input's grid, the neck (or its
    LayerNorm alone, without a table: samvit_base_patch16_224's), the mean of the map through the head. timm
    serves the folder at 1,024 px (its pretrained_cfg) where the model was saved at 96: vitkit holds the table and
    the global blocks' offsets where they were saved, as timm does."""
    ref = _timm(name, **kw)
    model = vitkit.from_pretrained(_saved(ref, tmp_path / "s"))
    assert type(model).__name__ == "SamViT" and model.config.norm_eps == 1e-5  # (timm's nn.LayerNorm's)
    for size in SIZES:
        x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert max_diff(model(x), ref(x)) < 1e-5, size
            assert max_diff(model.forward_features(x), _tokens(ref.forward_features(x))) < 1e-5, size
    assert count_params(model.config) == sum(p.numel() for p in ref.parameters())


def test_a_bare_timm_file_reads_its_windows_and_global_blocks_off_the_tables(tmp_path):
    """The heads from the offset tables' width, the grid from the (1, gh, gw, D) table, the global blocks from
    their tables' length (here a window wider than the grid: the released models at 112 px); without a table the
    lengths say nothing of which is the grid's, and an image size must be given."""
    from safetensors.torch import save_file

    ref = _timm(img_size=(64, 48), window_size=5, global_attn_indexes=[0, 2])
    save_file(ref.state_dict(), tmp_path / "bare.safetensors")
    model = vitkit.from_pretrained(tmp_path / "bare.safetensors")
    c = model.config
    assert (c.img_size, c.window_size, c.global_attn_indexes, c.num_heads) == ((64, 48), 5, (0, 2), 4)
    x = torch.randn(1, 3, 64, 48)
    with torch.no_grad():
        assert max_diff(model.forward_features(x), _tokens(ref.forward_features(x))) < 1e-5
    tableless = _timm("samvit_base_patch16_224", num_classes=3)
    save_file(tableless.state_dict(), tmp_path / "none.safetensors")
    with pytest.raises(WeightsError, match="without a position table holds offset tables of 2 lengths, and no "
                                           "tensor says which is the grid's: give its img_size") as e:
        vitkit.from_pretrained(tmp_path / "none.safetensors")
    assert "\n" not in str(e.value)
    model = vitkit.from_pretrained(tmp_path / "none.safetensors", img_size=96)
    with torch.no_grad():
        assert max_diff(model(torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(3))),
                        tableless(torch.randn(2, 3, 96, 96, generator=torch.Generator().manual_seed(3)))) < 1e-5


def test_another_size_asked_for_at_loading_or_after_is_timms_model_run_at_that_size(tmp_path):
    """The table resampled and the global blocks' offsets stretched once (loading, set_input_size) compute what
    timm's model computes when it stretches them on every call at that input size."""
    ref = _timm()
    folder = _saved(ref, tmp_path / "s")
    x = torch.randn(2, 3, 128, 160, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = ref(x)
        model = vitkit.from_pretrained(folder, img_size=(128, 160))
        assert model.blocks[1].attn.rel_pos_h.shape[0] == 2 * 8 - 1 and model.config.pos_embed_size is None
        assert max_diff(model(x), expected) < 1e-5
        again = vitkit.from_pretrained(folder)
        again.set_input_size((128, 160))
        assert (again.blocks[1].attn.rel_pos_w.shape[0], again.config.rel_pos_size) == (2 * 10 - 1, None)
        assert max_diff(again(x), expected) < 1e-5


def test_the_timm_layout_written_back_is_what_timm_loads(tmp_path):
    from safetensors.torch import load_file

    ref = _timm(num_classes=4, img_size=(64, 96))
    model = vitkit.from_pretrained(_saved(ref, tmp_path / "s"))
    vitkit.export_weights(model, tmp_path / "back.safetensors", format="timm")
    again = _timm(num_classes=4, img_size=(64, 96))
    again.load_state_dict(load_file(tmp_path / "back.safetensors"))  # strict: timm's own names and shapes
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        assert max_diff(again(x), ref(x)) < 1e-5
        assert max_diff(vitkit.from_pretrained(tmp_path / "back.safetensors")(x), model(x)) < 1e-5


def _hf_encoder(**kw):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.SamVisionConfig(**{**dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                                    image_size=80, window_size=3, global_attn_indexes=[1],
                                                    output_channels=32, mlp_dim=128), **kw})
    return randomize(transformers.SamVisionModel(config), scale=0.2).eval()


def test_transformers_folders_read_and_written_as_transformers_computes_them(tmp_path, capsys):
    """SamVisionModel's folder and SamModel's (its prompt encoder and mask decoder left out), at transformers' one
    size (5 x 5 patches: two windows of 3 a side, padded); vitkit's export is what transformers loads."""
    import transformers

    ref = _hf_encoder()
    x = torch.randn(2, 3, 80, 80, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = _tokens(ref(pixel_values=x).last_hidden_state)
    ref.save_pretrained(tmp_path / "vision")
    whole = transformers.SamModel(transformers.SamConfig(vision_config=ref.config.to_dict())).eval()
    whole.vision_encoder.load_state_dict(ref.vision_encoder.state_dict())
    whole.save_pretrained(tmp_path / "whole")
    for folder in ("vision", "whole"):
        model = vitkit.from_pretrained(tmp_path / folder)
        assert model.config.norm_eps == 1e-6  # (SAM's, as transformers has it)
        with torch.no_grad():
            assert max_diff(model.forward_features(x), expected) < 1e-5, folder
    assert "layout      hf (SamModel)" in in_process(capsys, "info", str(tmp_path / "whole")).stdout
    vitkit.export_weights(model, tmp_path / "back", format="hf")
    again = transformers.SamVisionModel.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert max_diff(_tokens(again(pixel_values=x).last_hidden_state), expected) < 1e-5
    classifier = vitkit.create_model("samvit_base_patch16", **{**SMALL, "num_classes": 3})
    with pytest.raises(WeightsError, match="the nearest, sam_vision_model, cannot hold num_classes=3"):
        vitkit.export_weights(classifier, tmp_path / "head", format="hf")


def test_sams_processor_is_read_and_written_as_transformers_preprocesses(tmp_path):
    """SAM's processor (the longer side to 80 px, bilinear, the normalised image padded with zeros at the right and
    bottom): vitkit's pixels are transformers' (its PIL processor) on wide, tall and square photos, read from a
    folder's preprocessor_config.json and as a folder without one; the processor vitkit writes is read back so by
    transformers. A SAM processor that does not pad to a square is refused in one line."""
    import numpy as np
    import transformers
    from PIL import Image

    from vitkit.data.transforms import transform_for

    _hf_encoder().save_pretrained(tmp_path / "bare")
    transformers.SamImageProcessor(size={"longest_edge": 80}, pad_size={"height": 80, "width": 80}).save_pretrained(
        tmp_path / "bare")
    for folder in ("bare", "written"):
        model = vitkit.from_pretrained(tmp_path / folder)
        theirs = transformers.SamImageProcessorPil.from_pretrained(tmp_path / folder)
        assert (model.config.crop_mode, model.config.crop_offset, model.config.interpolation) == \
            ("border", "start", "bilinear")
        for shape in [(50, 120, 3), (120, 50, 3), (80, 80, 3), (200, 300, 3)]:
            photo = Image.fromarray(np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8))
            expected = theirs(photo, return_tensors="pt")["pixel_values"][0]
            assert torch.equal(transform_for(model)(photo), expected), (folder, shape)
        if folder == "bare":
            vitkit.export_weights(model, tmp_path / "written", format="hf")
    (tmp_path / "bare" / "preprocessor_config.json").unlink()  # (a SamModel folder without one: SAM's own)
    assert vitkit.from_pretrained(tmp_path / "bare").config.crop_offset == "start"
    transformers.SamImageProcessor(do_pad=False).save_pretrained(tmp_path / "bare")
    with pytest.raises(WeightsError, match="SamImageProcessor with size .* and do_pad False: vitkit reads SAM's") as e:
        vitkit.from_pretrained(tmp_path / "bare")
    assert "\n" not in str(e.value)


def test_a_timm_model_written_for_transformers_says_its_processor_pads(tmp_path):
    """timm's samvit evaluation crops the centre (its pretrained_cfg); SAM's processor, the one the folder gets,
    pads: said, not written in silence."""
    import warnings

    from vitkit.weights.export import ExportWarning

    model = vitkit.from_pretrained(_saved(_timm(img_size=80), tmp_path / "s"), img_size=80)
    with pytest.warns(ExportWarning, match="SamImageProcessor resizes the longer side and pads the image at the "
                                           "right and bottom .SAM's preprocessing., where this model's is "
                                           "crop_mode='center'"):
        vitkit.export_weights(model, tmp_path / "hf", format="hf")
    model.config = model.config.replace(crop_mode="border", crop_offset="start")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)
        vitkit.export_weights(model, tmp_path / "hf2", format="hf")


def test_sams_own_checkpoint_reads_as_transformers_computes_it(tmp_path, capsys):
    """A checkpoint as SAM's code saves it (``image_encoder.`` with ``mlp.lin1``, its prompt encoder and mask decoder
    beside it; a .pth read without unpickling code): SAM's eps 1e-6, the windows and global blocks off the tables."""
    ref = _hf_encoder()
    renames = [(r"^vision_encoder\.patch_embed\.projection", "patch_embed.proj"),
               (r"^vision_encoder\.layers\.(\d+)\.layer_norm(\d)", r"blocks.\1.norm\2"),
               (r"^vision_encoder\.layers\.", "blocks."), (r"^vision_encoder\.", ""), (r"neck\.conv1", "neck.0"),
               (r"neck\.layer_norm1", "neck.1"), (r"neck\.conv2", "neck.2"), (r"neck\.layer_norm2", "neck.3")]
    sd = {}
    for key, value in ref.state_dict().items():
        for pattern, repl in renames:
            key = re.sub(pattern, repl, key)
        sd["image_encoder." + key] = value
    sd.update({"prompt_encoder.point_embeddings.0.weight": torch.randn(1, 32),
               "mask_decoder.iou_token.weight": torch.randn(1, 32)})
    assert "image_encoder.blocks.0.mlp.lin1.weight" in sd and "image_encoder.pos_embed" in sd
    torch.save(sd, tmp_path / "sam_vit_t.pth")
    model = vitkit.from_pretrained(tmp_path / "sam_vit_t.pth")
    c = model.config
    assert (c.norm_eps, c.window_size, c.global_attn_indexes, c.img_size) == (1e-6, 3, (1,), (80, 80))
    x = torch.randn(2, 3, 80, 80, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert max_diff(model.forward_features(x), _tokens(ref(pixel_values=x).last_hidden_state)) < 1e-5
    out = in_process(capsys, "info", str(tmp_path / "sam_vit_t.pth")).stdout
    assert "layout      sam (SAM's own: its vision tower; 2 tensors of its prompt encoder and mask decoder left out)" \
        in out
    del sd["image_encoder.blocks.1.attn.rel_pos_h"]  # (a file cut short)
    torch.save(sd, tmp_path / "cut.pth")
    with pytest.raises(WeightsError, match="the SAM ViT state dict is partial: blocks.1.attn.rel_pos_h missing"):
        vitkit.from_pretrained(tmp_path / "cut.pth")


def test_windowed_attention_weights_are_placed_on_the_grid():
    """return_attention gives every block's weights over the grid's tokens: transformers' own weights (its eager
    layers') where two tokens share a window, 0 where they do not; a row of an edge window sums to its weight off the
    padding."""
    from vitkit.models.sam import windows_on_grid
    from vitkit.weights.hf_tower_sam import SAM_TOWER

    ref = _hf_encoder()
    ref.config._attn_implementation = "eager"
    eager = type(ref)(ref.config).eval()
    eager.load_state_dict(ref.state_dict())
    theirs = []
    for layer in eager.vision_encoder.layers:  # (its weights, (windows x heads, N, N), are the layers' outputs)
        layer.attn.register_forward_hook(lambda module, args, out: theirs.append(out[1].reshape(-1, 4,
                                                                                                *out[1].shape[1:])))
    model = vitkit.models.SamViT(SAM_TOWER.config(ref.config.to_dict(), {}))
    model.load_state_dict(SAM_TOWER.to_native(dict(ref.state_dict()), ref.config.to_dict()))
    x = torch.randn(1, 3, 80, 80, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _, attns = model.eval()(x, return_attention=True)
        eager(pixel_values=x)
    assert attns[1].shape == theirs[1].shape == (1, 4, 25, 25)  # the global block: the whole grid
    assert max_diff(attns[1], theirs[1]) < 1e-5
    assert theirs[0].shape == (4, 4, 9, 9)  # 2 x 2 windows of 3 x 3 over the grid padded to 6 x 6
    assert max_diff(attns[0], windows_on_grid(theirs[0], (5, 5), (6, 6), 3)) < 1e-5
    assert attns[0][0, 0, 0, 3] == 0 and attns[0][0, 0, 0, 1] > 0  # (0, 0) and (0, 3) are in two windows
    assert max_diff(attns[0][0, :, 0, [0, 1, 2, 5, 6, 7, 10, 11, 12]], theirs[0][0, :, 0]) < 1e-6  # window 0, as is
    sums = attns[0].sum(-1)
    assert torch.allclose(sums[..., 0], torch.ones(1, 4)) and (sums[..., 24] < 1 - 1e-3).all()  # (4, 4): padded


@pytest.mark.parametrize("field, value, words", [
    ("window_size", -1, "window_size must be an integer >= 0"),
    ("global_attn_indexes", (1, 7), r"global_attn_indexes \[1, 7\] name blocks past the last of depth 3"),
    ("global_attn_indexes", (1, 1), "global_attn_indexes must be a list of distinct block indexes"),
    ("class_token", True, "class_token is False in a SAM ViT"),
    ("pos_embed", "sincos2d", "a SAM ViT's pos_embed is 'learned' or 'none'"),
    ("neck_chans", "256", "neck_chans must be an integer >= 0"),
    ("rel_pos_size", 100, "rel_pos_size must be a positive multiple of the patch")])
def test_a_field_that_would_make_another_model_is_refused(field, value, words):
    with pytest.raises(ValueError, match=words):
        vitkit.create_model("samvit_base_patch16", **{**SMALL, field: value})


@pytest.mark.parametrize("args, words", [({"use_rope": True}, "use_rope=True is not built"),
                                         ({"head_hidden_size": 64}, "head_hidden_size=64 is not built"),
                                         ({"mlp_layer": "swiglu"}, "mlp_layer are not read")])
def test_model_args_vitkit_does_not_build_are_one_line(tmp_path, args, words):
    assert re.search(words, model_args_refusal(_saved(_timm(), tmp_path / "s"), args))


def test_pre_training_says_why_it_refuses_the_family():
    from vitkit.selfsup import create_pretrainer

    with pytest.raises(ValueError, match="mae pre-trains a plain ViT or an EVA-style one, not 'sam': SAM's windows"):
        create_pretrainer("mae", vitkit.create_model("samvit_base_patch16", **SMALL))
