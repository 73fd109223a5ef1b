"""timm's hub layout (``config.json`` + ``model.safetensors``, what ``hf-hub:timm/...`` delivers) of the
later ViTs, saved by timm itself with random weights, read by ``vitkit.from_pretrained``: the same
outputs (fp32, 1e-5); architectures vitkit does not know and arguments it does not read refused by name."""

import json

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.weights.io import WeightsError
from vitkit.weights.pretrained import GuessWarning

timm = pytest.importorskip("timm")
from timm.models import save_for_hf  # noqa: E402


def _saved(tmp_path, name, **kw):
    ref = randomize(timm.create_model(name, **kw))
    folder = tmp_path / name
    save_for_hf(ref, str(folder), safe_serialization=True)
    return ref, folder


def test_a_folder_with_its_config_named_as_an_architecture_is_read_by_its_config(tmp_path, images):
    """`convert FOLDER --model deit_tiny_patch16_224` rebuilt a 64 x 96 timm folder at the name's 224 px with
    ImageNet's statistics and wrote a file that computes something else, without a word: the name now only has to
    agree with the folder's config, which decides; another architecture's name is refused."""
    ref, folder = _saved(tmp_path, "vit_tiny_patch16_224", num_classes=7, img_size=(64, 96))
    x = images(2, 64, 96)
    with torch.no_grad():
        want = ref.eval()(x)
    for name in ("vit_tiny_patch16_224", "deit_tiny_patch16_224"):  # the same architecture, the name's defaults
        ours = vitkit.from_pretrained(folder, model_name=name)
        assert tuple(ours.config.img_size) == (64, 96) and ours.config.mean == tuple(ref.pretrained_cfg["mean"])
        with torch.no_grad():
            assert max_diff(ours(x), want) <= 1e-5
    with pytest.raises(WeightsError, match=r"the file's config is another architecture than vit_small_patch16_224: "
                                           r"embed_dim 192 \(not 384\)"):
        vitkit.from_pretrained(folder, model_name="vit_small_patch16_224")


@pytest.mark.parametrize("name, saved_at, loaded_at", [
    ("vit_small_patch16_224", (32, 128), (64, 64)),   # a 2x8 table is no 4x4 one, though both have 16 patches
    ("vit_small_patch16_224", (64, 96), (96, 64)),    # a 4x6 table is no 6x4 one (the model's slot count)
    ("deit3_small_patch16_224", (64, 144), (64, 64)),  # patches only: 4x9
    ("beit_base_patch16_224", (32, 224), (80, 80)),   # a per-layer relative-bias table of a 2x14 grid
])
def test_a_hub_folder_saved_at_a_non_square_size_is_resampled_from_its_own_grid(tmp_path, name, saved_at,
                                                                                 loaded_at, images):
    """The grid a table was made for is the one its config.json names, as timm's ``set_input_size`` resizes that
    model; the slot count alone was read as a square grid, or as the model's own (max |difference| 0.02-2)."""
    import copy

    ref, folder = _saved(tmp_path, name, depth=1, img_size=saved_at)
    resized = copy.deepcopy(ref)
    resized.set_input_size(img_size=loaded_at)
    ours = vitkit.from_pretrained(folder, img_size=loaded_at)
    x = images(2, *loaded_at)
    with torch.no_grad():
        want = resized(x)
        assert max_diff(want, ours(x)) <= 1e-5 * max(1.0, want.abs().max().item())


EVERY_FIELD = ("crop_pct", "mean", "std", "interpolation", "crop_mode")


@pytest.mark.parametrize("dropped, as_null", [(("crop_pct",), False), (("mean", "std"), False), (EVERY_FIELD, False),
                                              (EVERY_FIELD, True)])
def test_a_hub_config_that_leaves_preprocessing_out_is_preprocessed_as_timm_loads_it(tmp_path, dropped, as_null):
    """timm reads a folder's pretrained_cfg into its PretrainedCfg, whose defaults (crop 0.875, ImageNet's
    statistics) fill what the file leaves out, or gives as null; vitkit took the architecture's (0.9, mean 0.5):
    up to 2.0 off, and refused the nulls ("crop_pct must be a number")."""
    import numpy as np
    from PIL import Image

    _, folder = _saved(tmp_path, "vit_tiny_patch16_224", num_classes=5)
    config = json.loads((folder / "config.json").read_text())
    for key in dropped:
        if as_null:
            config["pretrained_cfg"][key] = None
        else:
            del config["pretrained_cfg"][key]
    (folder / "config.json").write_text(json.dumps(config))
    theirs = timm.create_model(f"local-dir:{folder}")
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=theirs))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (200, 300, 3), dtype=np.uint8))
    ours = vitkit.preprocess(vitkit.from_pretrained(folder), image)[0]
    assert torch.equal(ours, transform(image))


def test_a_hub_input_size_that_is_no_size_is_refused(tmp_path):
    """pretrained_cfg input_size [3, "x", 70] was taken without a word (model_args' size used)."""
    _, folder = _saved(tmp_path, "vit_tiny_patch16_224", num_classes=5, img_size=32, depth=1)
    config = json.loads((folder / "config.json").read_text())
    for size in ([3, "x", 70], [3, 32], [3, 0, 32], "224"):
        config["pretrained_cfg"]["input_size"] = size
        (folder / "config.json").write_text(json.dumps(config))
        with pytest.raises(WeightsError, match=r"pretrained_cfg input_size must be \[channels, height, width\] in "
                                               r"whole numbers, not "):
            vitkit.from_pretrained(folder)


def test_a_dynamic_size_model_runs_at_the_size_timms_data_config_feeds_it(tmp_path):
    """A model saved with dynamic_img_size and a pretrained_cfg input_size other than its img_size: timm's
    data config feeds it 96 px (its table resampled each forward); vitkit ran it at model_args' 64 px, and 3 of
    6 images took another class. Its table is resampled once while loading, to timm's logits at 96."""
    import numpy as np
    from PIL import Image

    model = randomize(timm.create_model("vit_tiny_patch16_224", img_size=64, depth=2, num_classes=5,
                                        dynamic_img_size=True)).eval()
    model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (3, 96, 96), "crop_pct": 1.0}
    save_for_hf(model, tmp_path, model_args={"img_size": 64, "depth": 2, "dynamic_img_size": True},
                safe_serialization=True)
    theirs = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=theirs))
    ours = vitkit.from_pretrained(tmp_path).eval()
    assert tuple(ours.config.img_size) == (96, 96)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (80, 100, 3), dtype=np.uint8))
    x = vitkit.preprocess(ours, image)
    assert torch.equal(x[0], transform(image))
    with torch.no_grad():
        assert max_diff(theirs(x), ours(x)) <= 1e-5


def test_a_model_of_any_size_by_its_architecture_runs_at_the_size_timm_feeds_it(tmp_path):
    """DINOv3 runs at any size without dynamic_img_size in its model_args (its architecture's own default): its
    folder's pretrained_cfg says 256 px where model_args say 32, timm's pipeline feeds 256, and vitkit fed 32
    (another class). A one-value mean/std is spread over the channels as timm's Normalize spreads it, and label
    names that are not one per class are said, not dropped in silence."""
    import warnings

    import numpy as np
    from PIL import Image

    args = {"img_size": 32, "depth": 2, "embed_dim": 64, "num_heads": 2, "num_classes": 5}
    model = randomize(timm.create_model("vit_small_patch16_dinov3", **args)).eval()
    save_for_hf(model, tmp_path / "d3", model_args=args, safe_serialization=True)
    theirs = timm.create_model(f"local-dir:{tmp_path / 'd3'}", pretrained=True).eval()
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=theirs))
    ours = vitkit.from_pretrained(tmp_path / "d3").eval()
    assert tuple(ours.config.img_size) == tuple(theirs.pretrained_cfg["input_size"][1:]) != (32, 32)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (80, 100, 3), dtype=np.uint8))
    x = vitkit.preprocess(ours, image)
    assert torch.equal(x[0], transform(image))
    with torch.no_grad():
        assert max_diff(theirs(x), ours(x)) <= 1e-5
    config = json.loads((tmp_path / "d3" / "config.json").read_text())
    config["pretrained_cfg"].update(mean=[0.5], std=[0.25])
    config["label_names"] = ["a", "b", "c"]
    (tmp_path / "d3" / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match=r"label_names \(3\) are not one name for each of the head's 5 classes"):
        ours = vitkit.from_pretrained(tmp_path / "d3")
    assert ours.config.mean == (0.5,) * 3 and ours.config.std == (0.25,) * 3 and ours.config.label_names is None
    theirs = timm.create_model(f"local-dir:{tmp_path / 'd3'}", pretrained=True).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=theirs))
    assert torch.equal(vitkit.preprocess(ours, image)[0], transform(image))


def test_a_hub_folders_weight_file_named_alone_is_read_with_the_config_beside_it(tmp_path, images):
    """``--init FOLDER/model.safetensors`` read the tensors alone: heads guessed from the width (1 where the
    config says 2) and mean 0.5 where it says ImageNet's, 4e-4 off timm, said only as guesses."""
    ref, folder = _saved(tmp_path, "deit3_small_patch16_224", img_size=32, depth=2, embed_dim=64, num_heads=2,
                         num_classes=3)
    ours = vitkit.from_pretrained(folder / "model.safetensors")
    assert ours.config.num_heads == 2 and ours.config.mean == vitkit.from_pretrained(folder).config.mean
    x = images(2, 32, 32)
    with torch.no_grad():
        assert max_diff(ours(x), ref(x)) <= 1e-5


def test_a_hub_folder_with_stray_pre_training_tensors_is_refused_naming_them(tmp_path):
    """A timm hub folder holds the model its config names: MAE-like tensors beside it (a mask token, a decoder's
    embedding) made it read as an MAE, refused naming tensors the file does not hold (q_bias, gamma_1)."""
    from safetensors.torch import load_file, save_file

    _, folder = _saved(tmp_path, "deit3_small_patch16_224", img_size=32, depth=1, num_classes=3)
    tensors = load_file(folder / "model.safetensors")
    save_file({**tensors, "mask_token": torch.zeros(1, 384), "decoder_embed.weight": torch.zeros(32, 384)},
              folder / "model.safetensors")
    with pytest.raises(WeightsError, match=r"not in the model: decoder_embed\.weight") as e:
        vitkit.from_pretrained(folder)
    assert "q_bias" not in str(e.value) and "\n" not in str(e.value)


def test_a_position_table_cut_short_of_its_config_is_refused(tmp_path):
    """A 2x8 grid with a class slot is 17 slots: 16 were read as a table without a class slot, and every patch
    took its neighbour's position in silence."""
    from safetensors.torch import load_file, save_file

    _, folder = _saved(tmp_path, "vit_small_patch16_224", depth=1, img_size=(32, 128))
    tensors = load_file(folder / "model.safetensors")
    tensors["pos_embed"] = tensors["pos_embed"][:, 1:].contiguous()
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(WeightsError, match=r"pos_embed has 16 slots where the weights' own config \(2x8 patches, 1 "
                                           r"prefix slot\(s\)\) needs 17: the table was cut"):
        vitkit.from_pretrained(folder)


def test_a_hub_config_whose_patch_size_its_filters_do_not_have_is_refused_naming_the_patch(tmp_path):
    """model_args patch_size [16, 8] beside 16x16 filters was refused as a position table 'cut' (5 slots where 9)."""
    _, folder = _saved(tmp_path, "vit_tiny_patch16_224", depth=1, img_size=32)
    config = json.loads((folder / "config.json").read_text())
    config["model_args"]["patch_size"] = [16, 8]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match=r"the config says patch_size 16x8 where its weights hold 16x16 px patch "
                                           r"filters\): it was edited or mixed.*ask for another: from_pretrained\("
                                           r"path, patch_size=N\)"):
        vitkit.from_pretrained(folder)
    # what the refusal says to do gives what timm's local-dir: gives the edited folder (its filters resampled)
    timm = pytest.importorskip("timm")
    reference = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    config["model_args"]["patch_size"] = 16
    (folder / "config.json").write_text(json.dumps(config))
    ours = vitkit.from_pretrained(folder, patch_size=(16, 8))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (ours(x) - reference(x)).abs().max() < 1e-5


@pytest.mark.parametrize("name, kw", [
    ("vit_little_patch16_reg4_gap_256", dict(depth=2, img_size=64, num_classes=7)),
    ("vit_base_patch16_siglip_224", dict(depth=2, img_size=64)),
    ("vit_base_patch16_clip_quickgelu_224", dict(depth=2, img_size=64)),
    ("deit3_small_patch16_224", dict(depth=2, img_size=(48, 80))),
    ("vit_base_patch16_rpn_224", dict(depth=2, img_size=64)),
    ("eva02_tiny_patch14_224", dict(depth=2, img_size=56)),
    ("vit_small_patch16_dinov3", dict(depth=2, img_size=64)),
    ("vit_pe_core_tiny_patch16_384", dict(depth=2, img_size=64)),
    ("beitv2_base_patch16_224", dict(depth=2, img_size=64, num_classes=5)),
    ("vit_dwee_patch16_reg1_gap_256", dict(depth=2, img_size=64)),
    ("vit_dpwee_patch16_reg1_gap_256", dict(depth=2, img_size=64)),
])
def test_timm_hub_folder_loads_with_parity(tmp_path, name, kw, images):
    ref, folder = _saved(tmp_path, name, **kw)
    assert (folder / "model.safetensors").is_file() and "model_args" in json.loads((folder / "config.json").read_text())
    ours = vitkit.from_pretrained(folder)
    h, w = ours.config.img_size
    x = images(2, h, w)
    with torch.no_grad():
        a, b = ref(x), ours(x)
    assert max_diff(a, b) <= 1e-5 * max(1.0, a.abs().max().item())
    # the preprocessing and class count come from the folder's pretrained_cfg
    cfg = json.loads((folder / "config.json").read_text())["pretrained_cfg"]
    assert list(ours.config.mean) == pytest.approx(cfg["mean"]) and ours.config.crop_pct == cfg["crop_pct"]
    assert ours.config.num_classes == ref.num_classes


def test_unknown_architecture_is_refused_not_guessed(tmp_path):
    """A name vitkit does not know is never read as another model off its tensor names."""
    _, folder = _saved(tmp_path, "vit_small_patch16_18x2_224", depth=2, img_size=64)
    with pytest.raises(WeightsError, match="'vit_small_patch16_18x2_224' is not one vitkit knows") as e:
        vitkit.from_pretrained(folder)
    assert "\n" not in str(e.value)


def test_a_config_that_says_no_architecture_is_refused_not_passed_over(tmp_path):
    """Without 'architecture' the folder's config.json was passed over in silence and the tensors read bare
    (QuickGELU read as GELU, 1 head for 2: 8e-4 off), with none of the guesses said a bare file says."""
    _, folder = _saved(tmp_path, "vit_base_patch16_clip_quickgelu_224", depth=2, embed_dim=64, num_heads=2,
                       img_size=64)
    config = json.loads((folder / "config.json").read_text())
    del config["architecture"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="config.json says neither its architecture .timm's 'architecture'.") as e:
        vitkit.from_pretrained(folder)
    assert "\n" not in str(e.value)


def test_model_args_vitkit_does_not_read_are_refused(tmp_path):
    _, folder = _saved(tmp_path, "vit_small_patch16_224", depth=2, img_size=64)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_args"]["dynamic_img_pad"] = True
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match="dynamic_img_pad"):
        vitkit.from_pretrained(folder)
    cfg["model_args"].pop("dynamic_img_pad")
    cfg["model_args"]["block_fn"] = "ParallelScalingBlock"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match="block_fn"):
        vitkit.from_pretrained(folder)


@pytest.mark.parametrize("field, value, words", [("crop_pct", -1, "crop_pct must be in"),
                                                  ("mean", "abc", "mean and std must be lists of numbers"),
                                                  ("interpolation", "lanczos", "interpolation must be one of")])
def test_a_broken_pretrained_cfg_is_one_line_naming_its_file(tmp_path, field, value, words):
    """Said as the folder's config.json (before: only "invalid ViT config: ...", no file named)."""
    _, folder = _saved(tmp_path, "vit_small_patch16_224", depth=1, img_size=32, patch_size=16)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["pretrained_cfg"][field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match=f"^{folder / 'config.json'}: .*{words}") as e:
        vitkit.from_pretrained(folder)
    assert "\n" not in str(e.value)


def test_register_count_that_disagrees_with_the_tensors_is_named(tmp_path):
    _, folder = _saved(tmp_path, "vit_small_patch14_reg4_dinov2", depth=2, img_size=70, reg_tokens=1)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_args"].pop("reg_tokens")  # the config now claims the name's 4 registers; the tensors hold 1
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match="reg_token"):
        vitkit.from_pretrained(folder)


def test_rope_model_asked_for_a_size_its_patches_cannot_tile(tmp_path, images):
    _, folder = _saved(tmp_path, "eva02_tiny_patch14_224", depth=2, img_size=56)
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        vitkit.from_pretrained(folder, img_size=60)
    model = vitkit.from_pretrained(folder, img_size=84)  # a size it can tile: the angles follow the new grid
    assert model.rope.grid == (6, 6)
    with torch.no_grad():
        assert model(images(1, 84, 84)).shape == (1, 192)  # eva02_tiny at 224 px: a headless encoder


def test_a_state_dict_mixing_layouts_is_refused_by_name():
    model = vitkit.create_model("vit_small_patch16_224", depth=1, img_size=32, num_classes=2)
    sd = dict(model.state_dict())
    sd["vit.embeddings.patch_embeddings.projection.weight"] = sd["patch_embed.proj.weight"]  # a Hugging Face key too
    with pytest.raises(WeightsError, match=r"mixes two layouts: Hugging Face's names \(e.g. vit.embeddings.patch_embed"
                                           r"dings.projection.weight\) beside 12 tensors of timm's layers"):
        vitkit.load_weights(model, sd)


def test_bare_eva_state_dict_is_not_guessed():
    """The rotary kind has no tensors: an EVA state dict without its architecture is refused in one line."""
    ref = timm.create_model("vit_small_patch16_rope_224", depth=1, img_size=32)
    with pytest.raises(WeightsError, match="rotary positions"):
        vitkit.weights.timm_format.infer_config(ref.state_dict())


def test_a_bare_perception_encoder_file_says_rotary_positions_were_assumed_absent(tmp_path):
    """Perception Encoder's spatial towers store a plain ViT's names (pre-norm, class token, table, fused qkv):
    their rotary positions have no tensors, so a bare file reads as a ViT without them and says so."""
    from safetensors.torch import save_file

    from vitkit.weights.pretrained import GuessWarning

    ref = randomize(timm.create_model("vit_pe_spatial_tiny_patch16_512", depth=1, img_size=64))
    save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.warns(GuessWarning, match="no rotary positions"):
        vitkit.from_pretrained(tmp_path / "w.safetensors")


def test_vitkit_info_says_what_a_folder_is_before_loading_it(tmp_path, capsys):
    from vitkit.cli import main

    _, folder = _saved(tmp_path, "vit_small_patch14_reg4_dinov2", depth=2, img_size=70)
    assert main(["info", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "timm (vit_small_patch14_reg4_dinov2)" in out and "4 registers" in out and "5 prefix tokens" in out
    assert main(["info", str(folder), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["source"]["format"] == "timm" and info["source"]["config"]["reg_tokens"] == 4
    assert info["params"] == info["source"]["values"]  # the tensors are the model's parameters
    _, unknown = _saved(tmp_path, "vit_small_patch16_18x2_224", depth=1, img_size=64)
    assert main(["info", str(unknown)]) == 2
    out = capsys.readouterr().out
    assert "cannot load it: timm architecture 'vit_small_patch16_18x2_224' is not one vitkit knows" in out


@pytest.mark.parametrize("name, kw", [("vit_small_patch14_reg4_dinov2", dict(depth=2, img_size=70)),
                                      # 3 x 3 patch slots, or 2 x 2 after a class token and 4 registers: was read
                                      # as the 28 px tower; 2 x 2 slots: "complex doesn't define __round__"
                                      ("vit_small_patch14_reg4_dinov2", dict(depth=1, img_size=42)),
                                      ("vit_small_patch14_reg4_dinov2", dict(depth=1, img_size=28)),
                                      ("vit_base_patch16_siglip_224", dict(depth=2, img_size=64)),
                                      ("vit_giant_patch14_dinov2", dict(depth=1, img_size=42))])
def test_a_bare_file_of_a_later_vit_is_read_off_its_shapes_and_says_what_it_assumed(name, kw, tmp_path, images):
    """Registers, the patch-only table, the MAP head, packed SwiGLU are in the tensors; the block kind, eps and
    GELU are not, and the warning says so (where they are timm's defaults, the outputs are timm's)."""
    from safetensors.torch import save_file

    from vitkit.weights.pretrained import GuessWarning

    ref = randomize(timm.create_model(name, **kw))
    save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.warns(GuessWarning, match="block kind.*eps.*GELU.*no rotary positions"):
        ours = vitkit.from_pretrained(tmp_path / "w.safetensors")
    x = images(2, *ours.config.img_size)
    with torch.no_grad():
        a, b = ref(x), ours(x)
    assert max_diff(a, b) <= 1e-5 * max(1.0, a.abs().max().item())


@pytest.mark.parametrize("name", ["vit_relpos_small_patch16_224", "vit_srelpos_small_patch16_224",
                                  "vit_relpos_medium_patch16_cls_224"])
def test_a_bare_relative_mlp_vit_is_read_off_its_shapes_and_says_its_image_size_is_assumed(name, tmp_path, images):
    """timm's relative-bias MLP (per layer or shared) is in the tensors, its hidden width too; the grid its
    bias is computed for is not: the image size is said to be assumed, unless img_size= gives it."""
    from safetensors.torch import save_file

    from vitkit.weights.pretrained import GuessWarning

    ref = randomize(timm.create_model(name, depth=2, img_size=64))
    save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.warns(GuessWarning, match=r"the image size \(224x224 px"):
        vitkit.from_pretrained(tmp_path / "w.safetensors")
    with pytest.warns(GuessWarning) as said:
        ours = vitkit.from_pretrained(tmp_path / "w.safetensors", img_size=64)
    assert not any("image size" in str(w.message) for w in said)
    assert ours.config.pos_embed == "relative_mlp" and ours.config.shared_rel_pos == ("srelpos" in name)
    x = images(2, 64, 64)
    with torch.no_grad():
        a, b = ref(x), ours(x)
    assert max_diff(a, b) <= 1e-5 * max(1.0, a.abs().max().item())


def test_a_bare_file_that_could_be_a_residual_post_norm_vit_says_its_block_kind_is_assumed(tmp_path, images,
                                                                                            capsys):
    """timm's rpn blocks have a pre-norm block's names: a bare rpn state dict reads as pre-norm (other outputs)
    and the warning and `vitkit info` say the block kind was assumed; its architecture name gives timm's."""
    from safetensors.torch import save_file

    from vitkit.cli import main
    from vitkit.weights.pretrained import GuessWarning

    ref = randomize(timm.create_model("vit_base_patch16_rpn_224", depth=2, img_size=64))
    save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
    x = images(2, 64, 64)
    with pytest.warns(GuessWarning, match="the block kind.*residual post-norm"):
        guessed = vitkit.from_pretrained(tmp_path / "w.safetensors")
    named = vitkit.from_pretrained(tmp_path / "w.safetensors", model_name="vit_base_patch16_rpn_224", depth=2,
                                   img_size=64)
    with torch.no_grad():
        a, wrong, right = ref(x), guessed(x), named(x)
    assert guessed.config.block == "pre" and max_diff(a, wrong) > 1e-3
    assert max_diff(a, right) <= 1e-5 * max(1.0, a.abs().max().item())
    capsys.readouterr()
    assert main(["info", str(tmp_path / "w.safetensors")]) == 0
    assert "assumed     what no tensor holds was assumed: the block kind" in capsys.readouterr().out


@pytest.mark.parametrize("name, unstored", [("vit_base_patch32_siglip_gap_256", "the GELU"),
                                            ("beit3_base_patch16_224", "the norms' eps")])
def test_a_bare_file_whose_unstored_fields_differ_says_so_and_its_name_gives_timms_outputs(name, unstored, tmp_path,
                                                                                          images):
    """SigLIP-gap's tanh GELU and BEiT-3's eps 1e-5 are in no tensor (found by coverage.py --bare, where both
    loaded with other outputs without a word): the warning names the field, the architecture name is exact."""
    from safetensors.torch import save_file

    from vitkit.weights.pretrained import GuessWarning

    ref = randomize(timm.create_model(name, depth=2, img_size=64))
    save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.warns(GuessWarning, match=unstored):
        vitkit.from_pretrained(tmp_path / "w.safetensors")
    named = vitkit.from_pretrained(tmp_path / "w.safetensors", model_name=name, depth=2, img_size=64)
    x = images(2, 64, 64)
    with torch.no_grad():
        a, b = ref(x), named(x)
    assert max_diff(a, b) <= 1e-5 * max(1.0, a.abs().max().item())


def test_bare_beit_files_are_read_off_their_tables_with_parity(tmp_path, images):
    """BEiT's relative-bias tables hold its heads (columns) and grid (rows): a bare BEiT / BEiT v2 state dict
    loads as timm's model, no rotary guess (it has none); only its normalisation is said to be assumed."""
    from safetensors.torch import save_file

    from vitkit.weights.pretrained import GuessWarning

    for name, kw in (("beit_base_patch16_224", dict(depth=2, img_size=48)),
                     ("beitv2_base_patch16_224", dict(depth=1, img_size=32, num_classes=0))):
        ref = randomize(timm.create_model(name, **kw))
        save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
        with pytest.warns(GuessWarning) as said:
            ours = vitkit.from_pretrained(tmp_path / "w.safetensors")
        notes = [str(w.message).split(": ", 1)[1].split(" is not stored")[0] for w in said]
        assert notes == ["its input normalisation"]
        assert ours.config.architecture == "eva" and ours.config.num_heads == 12
        x = images(2, *ours.config.img_size)
        with torch.no_grad():
            a, b = ref(x), ours(x)
        assert ours.config.img_size == tuple(ref.patch_embed.img_size)
        assert max_diff(a, b) <= 1e-5 * max(1.0, a.abs().max().item())
    ref = randomize(timm.create_model("beit_base_patch16_224", depth=1, img_size=(32, 64)))  # 3 x 7, or 7 x 3?
    save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.raises(WeightsError, match=r"relative-bias table of 24 rows .* pass img_size= \(--img-size H W\), "
                                           r"or load it from its hub folder"):
        vitkit.from_pretrained(tmp_path / "w.safetensors")
    # with its size given, read at it (it was refused all the same); a size of another table, refused by its rows
    with pytest.warns(GuessWarning):
        ours = vitkit.from_pretrained(tmp_path / "w.safetensors", img_size=(32, 64)).eval()
    x = images(2, 32, 64)
    with torch.no_grad():
        assert max_diff(ref(x), ours(x)) <= 1e-5 * max(1.0, ref(x).abs().max().item())
    with pytest.raises(WeightsError, match=r"a relative-bias table of 24 rows is no 2x2 grid of 16x16 patches "
                                           r"\(32x32 px\), which has 12: give the size it was trained at"):
        vitkit.from_pretrained(tmp_path / "w.safetensors", img_size=(32, 32))


def test_predict_takes_a_bare_files_normalisation_from_mean_and_std(tmp_path, capsys):
    """A bare file says its normalisation was assumed; vitkit predict --mean/--std give it (0.5 is the assumed
    one: the same answer), one of the wrong length is refused in one line."""
    import numpy as np
    from PIL import Image
    from safetensors.torch import save_file

    from vitkit.cli import main

    ref = randomize(timm.create_model("vit_tiny_patch16_224", depth=1, img_size=32, patch_size=8, num_classes=3))
    save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(tmp_path / "a.png")
    run = ["predict", str(tmp_path / "a.png"), "--weights", str(tmp_path / "w.safetensors"), "--json"]

    def top(*flags):
        assert main(run + list(flags)) == 0
        out, err = capsys.readouterr()
        return [t["probability"] for t in json.loads(out)[0]["top"]], err

    assumed, err = top()
    assert "its input normalisation is not stored and was read as mean [0.5, 0.5, 0.5]" in err
    assert "and its resize as bicubic to the centre 0.9 (center)" in err  # (assumed too: it said only mean, std)
    imagenet, err = top("--mean", "0.485", "0.456", "0.406", "--std", "0.229", "0.224", "0.225")
    assert "normalisation" not in err and imagenet != assumed
    assert top("--mean", "0.5", "0.5", "0.5", "--std", "0.5", "0.5", "0.5")[0] == assumed
    assert main(run + ["--mean", "0.4", "--std", "0.2", "0.2", "0.2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mean (0.4,) has 1 value for in_chans 3: give one a channel" in err
    assert main(run + ["--labels", "a", "b", "c"]) == 2  # it said the file "carries its own preprocessing"
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "its classes are its tensors'" in err and "--mean and --std stand in" in err, err


def test_predict_and_info_read_a_bare_table_of_no_square_grid_at_img_size(tmp_path, capsys):
    """A bare file of a model trained at 32x64 (33 slots: a class slot and 4 x 8 patches) could be loaded by
    from_pretrained(img_size=) alone: predict and info said "pass img_size=", which neither could. --img-size
    now reads it there; predict's answer is timm's own on timm's own evaluation transform."""
    import numpy as np
    from PIL import Image
    from safetensors.torch import save_file

    from vitkit.cli import main

    ref = randomize(timm.create_model("vit_tiny_patch16_224", depth=1, img_size=(32, 64), patch_size=8,
                                      num_classes=3, embed_dim=64, num_heads=1)).eval()
    save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
    photo = tmp_path / "a.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (50, 90, 3), dtype=np.uint8)).save(photo)
    run = ["predict", str(photo), "--weights", str(tmp_path / "w.safetensors"), "--json", "--top-k", "3"]
    assert main(run) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "position embedding with 33 slots (no square grid with or without its 1 prefix " \
                             "slot(s)); pass img_size= (--img-size H W)" in err[0], err
    assert main(run + ["--img-size", "32", "64"]) == 0
    top = {t["label"]: t["probability"] for t in json.loads(capsys.readouterr().out)[0]["top"]}
    config = timm.data.resolve_data_config({"input_size": (3, 32, 64)}, model=ref)  # (timm's vit: 0.5s, 0.9 crop)
    assert config["crop_pct"] == 0.9 and config["mean"] == (0.5, 0.5, 0.5)
    x = timm.data.create_transform(**config)(Image.open(photo).convert("RGB"))[None]
    with torch.no_grad():
        theirs = ref(x).softmax(-1)[0]
    assert max(abs(top[f"class {i}"] - theirs[i].item()) for i in range(3)) < 1e-5, (top, theirs)
    assert main(["info", str(tmp_path / "w.safetensors"), "--img-size", "32", "64"]) == 0
    assert "grid 4 x 8 = 32 patches" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "w.safetensors")]) == 2
    assert "pass img_size= (--img-size H W)" in capsys.readouterr().out
    # convert too (it named --img-size, which it did not have): timm reads the file it writes as its own
    from safetensors.torch import load_file

    assert main(["convert", str(tmp_path / "w.safetensors"), str(tmp_path / "t.safetensors"), "--to", "timm",
                 "--img-size", "32", "64"]) == 0
    back = timm.create_model("vit_tiny_patch16_224", depth=1, img_size=(32, 64), patch_size=8, num_classes=3,
                             embed_dim=64, num_heads=1).eval()
    back.load_state_dict(load_file(str(tmp_path / "t.safetensors")), strict=True)
    with torch.no_grad():
        assert max_diff(back(x), ref(x)) <= 1e-6
    # and inspect and fewshot, which the same error sent to a flag they did not have
    assert main(["inspect", "--weights", str(tmp_path / "w.safetensors"), "--image", str(photo), "--out",
                 str(tmp_path / "ins"), "--img-size", "32", "64", "--no-progress"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["fewshot", "--help"])
    assert "--img-size PX" in capsys.readouterr().out


@pytest.mark.parametrize("kw", [{}, {"class_token": False, "global_pool": "avg"}, {"no_embed_class": True}])
def test_a_bare_square_table_asked_for_a_grid_of_as_many_slots_is_resampled(kw, tmp_path):
    """A bare 64 px file (a 4x4 table) asked for at 32x128 (2x8: as many slots) had its table copied into the new
    grid as it was, 2.5e-3 off timm's resampling; it is resampled from the grid it was read as, as timm does."""
    from safetensors.torch import save_file
    from timm.layers import resample_abs_pos_embed

    ref = randomize(timm.create_model("vit_tiny_patch16_224", img_size=64, depth=1, num_classes=4, **kw)).eval()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "w.safetensors"))
    with pytest.warns(GuessWarning):
        ours = vitkit.from_pretrained(tmp_path / "w.safetensors", img_size=(32, 128)).eval()
    theirs = timm.create_model("vit_tiny_patch16_224", img_size=(32, 128), depth=1, num_classes=4, **kw).eval()
    sd = dict(ref.state_dict())
    sd["pos_embed"] = resample_abs_pos_embed(sd["pos_embed"], (2, 8), num_prefix_tokens=0 if kw else 1)
    theirs.load_state_dict(sd)
    x = torch.randn(2, 3, 32, 128)
    with torch.no_grad():
        assert max_diff(ours(x), theirs(x)) <= 1e-5


def test_timm_06s_single_dict_config_reads_as_timm_reads_it(tmp_path, images):
    """timm 0.6's config.json (one dict: the pretrained config's keys beside ``architecture``, ``labels``
    for the class names), which timm still reads: its mean, std, crop, filter and class names were
    left out in silence (ImageNet-style 0.5 / 0.9 / bicubic, classes by number)."""
    from safetensors.torch import save_file

    ref = randomize(timm.create_model("vit_tiny_patch16_224", num_classes=4)).eval()
    folder = tmp_path / "legacy"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architecture": "vit_tiny_patch16_224", "num_classes": 4, "num_features": 192, "input_size": [3, 224, 224],
        "crop_pct": 1.0, "interpolation": "bilinear", "mean": [0.1, 0.2, 0.3], "std": [0.3, 0.25, 0.2],
        "labels": ["ant", "bee", "cat", "dog"]}))
    theirs = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    data = timm.data.resolve_data_config({}, model=theirs)
    ours = vitkit.from_pretrained(folder)
    c = ours.config
    assert (list(c.mean), list(c.std)) == (pytest.approx(list(data["mean"])), pytest.approx(list(data["std"])))
    assert (c.crop_pct, c.interpolation) == (data["crop_pct"], data["interpolation"]) == (1.0, "bilinear")
    assert c.label_names == theirs.pretrained_cfg["label_names"] == ["ant", "bee", "cat", "dog"]
    x = images(2, 224, 224)
    with torch.no_grad():
        assert max_diff(ours(x), theirs(x)) <= 1e-5


@pytest.mark.parametrize("field, value", [("model_args", [1, 2]), ("pretrained_cfg", "imagenet")])
def test_a_config_field_of_the_wrong_type_is_one_line_naming_the_file(tmp_path, field, value):
    _, folder = _saved(tmp_path, "vit_small_patch16_224", depth=2, img_size=64)
    cfg = json.loads((folder / "config.json").read_text())
    cfg[field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match=rf"config\.json: {field} must be an object of fields, not a "):
        vitkit.from_pretrained(folder)


def test_a_width_in_model_args_brings_its_mlp_width_as_timm_builds_it(tmp_path, images):
    """timm's hidden width is embed_dim x mlp_ratio: vitkit kept the registered 1,536 for a width of 192
    and refused the folder as a shape mismatch."""
    ref, folder = _saved(tmp_path, "vit_small_patch16_224", depth=2, img_size=32, num_classes=3, embed_dim=192,
                         num_heads=3)
    ours = vitkit.from_pretrained(folder)
    assert (ours.config.embed_dim, ours.config.mlp_dim) == (192, 768)
    x = images(2, 32, 32)
    with torch.no_grad():
        assert max_diff(ours(x), ref(x)) <= 1e-5


def test_weights_another_models_config_json_describes_say_which_file_and_stay_one_short_line(tmp_path):
    """The hub folder's config.json (another width) was used without saying so, and every one of the 31 tensors
    was listed: a line of 3,000 characters."""
    _, tiny = _saved(tmp_path, "vit_tiny_patch16_224", depth=2, img_size=32)
    _, small = _saved(tmp_path, "vit_small_patch16_224", depth=2, img_size=32)
    (tiny / "config.json").write_bytes((small / "config.json").read_bytes())
    for source in (tiny, tiny / "model.safetensors"):
        with pytest.raises(WeightsError) as e:
            vitkit.from_pretrained(source)
        said = str(e.value)
        assert said.startswith(f"{tiny / 'config.json'} describes another model than these weights: shape mismatch: ")
        assert "head.weight: checkpoint (1000, 192) vs model (1000, 384)" in said and said.endswith(
            "; and 24 more of 31 tensors") and len(said) < 800
