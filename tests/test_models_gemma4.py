"""Gemma 4's vision encoder (timm's ``gemma4_vit_{167m,570m}`` and ``_enc``): timm's outputs from timm's own hub
folders (fp32, 1e-5 of the output's scale) at its size and others (the position tables looked up, the rotary halves,
clamped projections with finite bounds, grouped-query attention, the soft tokens' 3 x 3 blocks and their
standardisation), written back in timm's names, and what vitkit does not read refused in one line. (Every registered
name's parameter names and count: test_models_names; the cost: test_complexity; ONNX: test_deploy_onnx.)"""

import re

import pytest
import torch

import vitkit
from conftest import max_diff, model_args_refusal, randomize
from vitkit.models.complexity import count_params
from vitkit.weights.io import WeightsError
from vitkit.weights.pretrained import GuessWarning

timm = pytest.importorskip("timm")
pytest.importorskip("timm.models.gemma4_vit")
from timm.models import save_for_hf  # noqa: E402

#: a small Gemma 4 (two blocks of 64 in heads of 16, tables of 64 slots): every part of the released ones, fast
SMALL = dict(img_size=96, depth=2, embed_dim=64, num_heads=4, head_dim=16, intermediate_size=128,
             position_embedding_size=64)
#: the model's own size, wide, tall (grids of whole 3 x 3 blocks for the soft tokens)
SIZES = [(96, 96), (48, 144), (144, 96)]


def _timm(name, **kw):
    """timm's model with random weights and, where it has them, finite clamps (they clip) and a standardisation."""
    torch.manual_seed(0)
    model = randomize(timm.create_model(name, **{**SMALL, **kw}), scale=0.2).eval()
    g = torch.Generator().manual_seed(1)
    for module in model.modules():
        if getattr(module, "use_clipped", False):
            module.input_min.fill_(-1.5), module.input_max.fill_(1.5)
            module.output_min.fill_(-0.8), module.output_max.fill_(0.9)
        if getattr(module, "std_bias", None) is not None:
            module.std_bias.copy_(torch.randn(module.std_bias.shape, generator=g))
            module.std_scale.copy_(torch.rand(module.std_scale.shape, generator=g) + 0.5)
    return model


@pytest.mark.parametrize("name, kw", [("gemma4_vit_167m", dict(num_classes=5)), ("gemma4_vit_167m_enc", {}),
                                      ("gemma4_vit_570m", dict(num_classes=3, num_kv_heads=2)),
                                      ("gemma4_vit_570m_enc", {})])
def test_timms_hub_folders_load_with_parity_at_every_size(name, kw, tmp_path):
    ref = _timm(name, **kw)
    save_for_hf(ref, str(tmp_path / "g"), safe_serialization=True)
    model = vitkit.from_pretrained(tmp_path / "g")
    assert type(model).__name__ == "Gemma4ViT" and model.config.mean == (0.0, 0.0, 0.0)  # (it scales [0, 1] itself)
    for size in SIZES:
        x = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            expected = ref(x)
            got = model(x) if expected.dim() == 2 else model.forward_features(x)  # (_enc: the soft tokens)
            assert got.shape == expected.shape and max_diff(got, expected) < 1e-5 * max(1.0, expected.abs().max()), size
            explicit, _ = model(x, return_attention=True)  # (the maps' path: the same function)
            assert max_diff(explicit, model(x)) < 1e-5 * max(1.0, explicit.abs().max())
    assert count_params(model.config) == sum(p.numel() for p in ref.parameters())


@pytest.mark.parametrize("name", ["gemma4_vit_167m", "gemma4_vit_570m_enc"])
def test_the_timm_layout_written_back_is_what_timm_loads(name, tmp_path):
    from safetensors.torch import load_file

    kw = dict(num_classes=4) if not name.endswith("_enc") else {}
    ref = _timm(name, **kw)
    save_for_hf(ref, str(tmp_path / "g"), safe_serialization=True)
    model = vitkit.from_pretrained(tmp_path / "g")
    vitkit.export_weights(model, tmp_path / "back.safetensors", format="timm")
    again = timm.create_model(name, **{**SMALL, **kw})
    again.load_state_dict(load_file(tmp_path / "back.safetensors"))  # strict: timm's names, clamps, std buffers
    x = torch.rand(2, 3, 96, 144)
    with torch.no_grad():
        assert max_diff(again.eval()(x), ref(x)) == 0
        assert max_diff(vitkit.from_pretrained(tmp_path / "back.safetensors")(x), model(x)) == 0


def test_unbounded_clamps_load_and_a_nan_bound_is_refused(tmp_path):
    """timm's default bounds are infinite (no clamp): they load; a NaN in one is a damaged file."""
    from safetensors.torch import load_file, save_file

    ref = randomize(timm.create_model("gemma4_vit_167m", **SMALL), scale=0.2).eval()
    save_for_hf(ref, str(tmp_path / "g"), safe_serialization=True)
    model = vitkit.from_pretrained(tmp_path / "g")
    assert model.blocks[0].attn.q_proj.input_max.item() == float("inf")
    x = torch.rand(1, 3, 96, 96)
    with torch.no_grad():
        assert max_diff(model(x), ref(x)) < 1e-5
    sd = load_file(tmp_path / "g" / "model.safetensors")
    sd["encoder.blocks.1.attn.v_proj.output_min"] = torch.tensor(float("nan"))
    save_file(sd, tmp_path / "g" / "model.safetensors")
    with pytest.raises(WeightsError, match=r"non-finite values \(NaN or inf\) in blocks.1.attn.v_proj.output_min"):
        vitkit.from_pretrained(tmp_path / "g")


def test_a_grid_of_no_whole_blocks_is_one_line_for_the_soft_tokens():
    model = vitkit.create_model("gemma4_vit_167m_enc", img_size=96, embed_dim=64, depth=1, num_heads=4)
    with pytest.raises(ValueError, match="soft tokens average whole 3x3 blocks of patches: a grid of 3x4 patches"):
        model(torch.rand(1, 3, 48, 64))
    with pytest.raises(ValueError, match=r"img_size \(48, 64\) is a grid of 3x4 patches, not of whole 3x3 blocks "
                                         r"for the soft tokens: give it a multiple of 48x48 px"):
        vitkit.create_model("gemma4_vit_167m_enc", img_size=(48, 64), depth=1)
    assert vitkit.create_model("gemma4_vit_167m", img_size=(48, 64), depth=1).config.grid_size == (3, 4)


@pytest.mark.parametrize("args, words", [({"head_dim": 32}, "head_dim=32: vitkit's heads are the width's share"),
                                         ({"act_layer": "relu"}, "act_layer is not read"),
                                         ({"encoder_pool": "soft"}, "encoder_pool='soft': vitkit reads"),
                                         ({"rope_type": "mixed"}, "rope_type are not read")])
def test_model_args_vitkit_does_not_build_are_one_line(tmp_path, args, words):
    save_for_hf(_timm("gemma4_vit_167m"), str(tmp_path / "g"), safe_serialization=True)
    assert re.search(words, model_args_refusal(tmp_path / "g", args))


@pytest.mark.parametrize("field, value", [("kv_heads", 5), ("pool_kernel", 0), ("table_size", -1),
                                          ("clipped", "yes"), ("global_pool", "token")])
def test_a_field_that_would_make_another_model_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        vitkit.create_model("gemma4_vit_167m", depth=1, **{field: value})


def test_a_grid_past_the_position_tables_and_a_bare_file_are_refused(tmp_path):
    from safetensors.torch import save_file

    model = vitkit.create_model("gemma4_vit_167m", img_size=32, depth=1, table_size=3)
    with pytest.raises(ValueError, match="a grid of 4x4 patches is past the position tables' 3 slots"):
        model(torch.rand(1, 3, 64, 64))
    with pytest.raises(ValueError, match=r"img_size \(64, 64\) is a grid of 4x4 patches, past the position tables' "
                                         r"3 slots"):
        vitkit.create_model("gemma4_vit_167m", img_size=64, depth=1, table_size=3)
    save_file(_timm("gemma4_vit_167m").state_dict(), tmp_path / "bare.safetensors")
    with pytest.raises(WeightsError, match="holds neither its rotary positions' base nor its readout"):
        vitkit.from_pretrained(tmp_path / "bare.safetensors")


def test_pre_training_says_why_it_refuses_the_family():
    from vitkit.selfsup import create_pretrainer

    with pytest.raises(ValueError, match="mae pre-trains a plain ViT or an EVA-style one, not 'gemma4': Gemma 4's"):
        create_pretrainer("mae", vitkit.create_model("gemma4_vit_167m", depth=1, img_size=96))


def test_a_grey_model_from_rgb_weights_and_its_save_and_checkpoint_keep_unbounded_clamps(tmp_path):
    """Fine-tuning on grey images: the linear patch projection's channels summed as a convolution's are (a grey
    image gives the answer its RGB copy had); a model whose clamps have no bounds is saved, and its training
    checkpoint is written (both refused infinite values: a run stopped at its first checkpoint)."""
    from vitkit.train.checkpoint import non_finite_parts

    ref = randomize(timm.create_model("gemma4_vit_167m", **{**SMALL, "num_classes": 3}), scale=0.2).eval()
    save_for_hf(ref, str(tmp_path / "g"), safe_serialization=True)
    grey = vitkit.from_pretrained(tmp_path / "g", in_chans=1)
    x = torch.rand(2, 1, 96, 96)
    with torch.no_grad():
        assert max_diff(grey(x), ref(x.repeat(1, 3, 1, 1))) < 1e-5
    grey.save_pretrained(tmp_path / "saved")
    assert vitkit.from_pretrained(tmp_path / "saved").blocks[0].mlp.up_proj.output_min.item() == float("-inf")
    state = {"model": grey.state_dict(), "ema": grey.state_dict()}
    assert non_finite_parts(state, grey.UNBOUNDED) == [] and non_finite_parts(state) == ["model", "ema"]
    state["model"]["blocks.0.attn.q_proj.input_min"] = torch.tensor(float("nan"))
    assert non_finite_parts(state, grey.UNBOUNDED) == ["model"]


def test_inspection_draws_its_filters_and_looked_up_positions():
    from vitkit.inspect import embedding_filters, pos_embed_similarity

    model = vitkit.create_model("gemma4_vit_167m", img_size=48, depth=1, embed_dim=64, num_heads=4, table_size=8)
    weight = model.patch_embed.input_proj.weight
    assert torch.equal(embedding_filters(model)[5, 1, 2], weight[5, 256 + 2 * 16:256 + 3 * 16])  # channel 1, row 2
    table = model.patch_embed.position_embedding_table.detach()
    sim = pos_embed_similarity(model)
    a, b = table[0, 1] + table[1, 2], table[0, 0] + table[1, 1]  # (row 2, column 1) and (row 1, column 0)
    assert torch.allclose(sim[2, 1, 1, 0], torch.nn.functional.cosine_similarity(a, b, dim=0), atol=1e-6)


def _hf_tower(**kw):
    """transformers' Gemma 4 vision tower (the reference code timm's is checked against), small, with finite clamps
    and a standardisation."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Gemma4VisionConfig(**{**dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, position_embedding_size=64, use_clipped_linears=True, standardize=True), **kw})
    tower = randomize(transformers.Gemma4VisionModel(config), scale=0.2).eval()
    for module in tower.modules():
        if hasattr(module, "input_min"):
            module.input_min.fill_(-1.5), module.input_max.fill_(1.5)
            module.output_min.fill_(-0.8), module.output_max.fill_(0.9)
    return tower


def _hf_soft_tokens(tower, x, patch=16):
    """transformers' soft tokens of images (B, C, H, W): its patches flattened channel first, their (x, y)."""
    B, C, H, W = x.shape
    gh, gw = H // patch, W // patch
    patches = x.reshape(B, C, gh, patch, gw, patch).permute(0, 2, 4, 1, 3, 5).reshape(B, gh * gw, -1)
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    where = torch.stack([cols.flatten(), rows.flatten()], dim=-1).expand(B, -1, -1)
    with torch.no_grad():
        return tower(pixel_values=patches, pixel_position_ids=where).last_hidden_state.reshape(B, -1, tower.config
                                                                                              .hidden_size)


def test_gemmas_own_checkpoint_and_folder_read_as_transformers_computes_them(tmp_path, capsys):
    """Gemma4Model's vision tower beside its language model's tensors (model.vision_tower.*, read off the shapes:
    grouped-query heads, clamps, the standardisation), and a Gemma4VisionModel folder: vitkit's soft tokens are
    transformers' (its tower's last_hidden_state) on wide and tall images."""
    from safetensors.torch import save_file

    from conftest import in_process

    tower = _hf_tower()
    sd = {"model.vision_tower." + k: v.contiguous() for k, v in tower.state_dict().items()}
    sd.update({"model.embed_vision.embedding_projection.weight": torch.randn(8, 64),
               "model.language_model.embed_tokens.weight": torch.randn(10, 8)})
    save_file(sd, tmp_path / "model-00001-of-00002.safetensors")
    tower.save_pretrained(tmp_path / "tower")
    for source in (tmp_path / "model-00001-of-00002.safetensors", tmp_path / "tower"):
        model = vitkit.from_pretrained(source)
        c = model.config
        assert (c.num_heads, c.kv_heads, c.clipped, c.standardize, c.global_pool) == (4, 2, True, True, "soft")
        for size in [(96, 144), (144, 48)]:
            x = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(3))
            expected = _hf_soft_tokens(tower, x)
            with torch.no_grad():
                assert max_diff(model.forward_features(x), expected) < 1e-5 * max(1.0, expected.abs().max()), size
    out = in_process(capsys, "info", str(tmp_path / "model-00001-of-00002.safetensors")).stdout
    assert "layout      gemma4 (Gemma 4's own: its vision tower; 2 tensors of its language model and projections " \
           "left out)" in out


def test_a_gemma4_vlm_folder_reads_its_tower_shards_alone(tmp_path):
    """A Gemma 4 repository as the hub has it (config.json with vision_config, a shard index, the language model in
    shards of its own): only the tower's shard is read (the other is not even a weights file here); an activation
    other than the tower's in its vision_config is refused in one line."""
    import json

    from conftest import vlm_repository

    tower = _hf_tower(use_clipped_linears=False, standardize=False, num_key_value_heads=4)
    vlm_repository(tmp_path, {"model.vision_tower." + k: v for k, v in tower.state_dict().items()},
                   "model.language_model.embed_tokens.weight", {
                       "model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
                       "vision_config": tower.config.to_dict(), "text_config": {}})
    model = vitkit.from_pretrained(tmp_path)
    assert model.config.kv_heads is None and not model.config.clipped
    # its processor (a Gemma4Processor's file, as transformers 5 saves it) keeps each image's aspect: said
    transformers = pytest.importorskip("transformers")
    fields = {**transformers.Gemma4ImageProcessor(max_soft_tokens=70).to_dict(),
              "image_processor_type": "Gemma4ImageProcessor"}
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_processor": fields,
                                                                "processor_class": "Gemma4Processor"}))
    with pytest.warns(GuessWarning, match=r"its image processor \(Gemma 4's\) resizes each image to at most 630 "
                                          r"patches \(70 soft tokens\), its sides multiples of 48 px, keeping its "
                                          r"aspect; vitkit's resizes every image to the model's size \(768x768\)"):
        vitkit.from_pretrained(tmp_path)
    x = torch.rand(1, 3, 96, 96)
    expected = _hf_soft_tokens(tower, x)
    with torch.no_grad():
        assert max_diff(model.forward_features(x), expected) < 1e-5 * max(1.0, expected.abs().max())
    config = json.loads((tmp_path / "config.json").read_text())
    config["vision_config"]["hidden_activation"] = "silu"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="hidden_activation 'silu'"):
        vitkit.from_pretrained(tmp_path)


def test_an_encoder_is_written_as_transformers_gemma4_vision_model(tmp_path):
    """Both ways: Gemma 4's own tower read and written back is its tensors, loaded strictly by transformers; an
    encoder of other blocks and rotary base (random here) is computed by transformers as by vitkit, and read back
    with them (before, a folder's own base and blocks were left out for the released towers' 100 and 3)."""
    from vitkit.weights.export import ExportWarning

    transformers = pytest.importorskip("transformers")
    tower = _hf_tower()
    tower.save_pretrained(tmp_path / "tower")
    with pytest.warns(ExportWarning, match="no image processor is written: Gemma 4's"):
        vitkit.export_weights(vitkit.from_pretrained(tmp_path / "tower"), tmp_path / "back", "hf")
    back, info = transformers.Gemma4VisionModel.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not any(info.values())
    original = tower.state_dict()
    assert all(torch.equal(value, original[name]) for name, value in back.state_dict().items())
    ours = vitkit.create_model("gemma4_vit_167m_enc", depth=2, embed_dim=64, num_heads=4, kv_heads=2, mlp_dim=96,
                               pool_kernel=2, rope_theta=50.0, table_size=32, img_size=96)
    randomize(ours, scale=0.2)
    with pytest.warns(ExportWarning):
        vitkit.export_weights(ours, tmp_path / "other", "hf")
    theirs = transformers.Gemma4VisionModel.from_pretrained(tmp_path / "other").eval()
    again = vitkit.from_pretrained(tmp_path / "other")
    assert (again.config.pool_kernel, again.config.rope_theta) == (2, 50.0)
    for size in [(64, 96), (96, 32)]:
        x = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(1))
        expected = _hf_soft_tokens(theirs, x)
        with torch.no_grad():
            assert max_diff(ours.forward_features(x), expected) < 1e-5 * max(1.0, expected.abs().max()), size
            assert max_diff(again.forward_features(x), expected) < 1e-5 * max(1.0, expected.abs().max()), size


@pytest.mark.parametrize("field, value, words", [
    ("attention_bias", True, "attention_bias true: vitkit's tower's projections have no bias"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 100.0}, "rope_parameters .*rope_type 'axial'"),
    ("pooling_kernel_size", 0, "pool_kernel must be a positive integer, got 0")])
def test_a_vision_config_vitkits_tower_does_not_compute_is_one_line(field, value, words, tmp_path):
    import json

    _hf_tower().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(WeightsError, match=words) as info:
        vitkit.from_pretrained(tmp_path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("change, words", [(dict(num_classes=3), "a classifier"), (dict(in_chans=1), "in_chans=1")])
def test_what_gemma4_vision_model_cannot_hold_is_one_line(change, words, tmp_path, capsys):
    from conftest import in_process

    model = vitkit.create_model("gemma4_vit_167m_enc", depth=1, embed_dim=64, num_heads=4, mlp_dim=96, **change)
    with pytest.raises(WeightsError, match=f"Gemma4VisionModel cannot hold {words}") as info:
        vitkit.export_weights(model, tmp_path / "hf", "hf")
    assert "\n" not in str(info.value) and not (tmp_path / "hf").exists()
    model.save_pretrained(tmp_path / "saved")
    said = in_process(capsys, "convert", str(tmp_path / "saved"), str(tmp_path / "hf"), "--to", "hf")
    assert said.returncode == 2 and words in said.stderr and "Traceback" not in said.stderr


def test_bf16_autocast_normalises_in_float32_without_torchs_mixed_dtype_note():
    """Under bf16 autocast an RMSNorm's tokens are bf16 and its weight float32: torch's rms_norm took its slow
    mixed-dtype path and said so on every run ('Mismatch dtype between input and weight'); the tokens are now
    normalised in float32, as autocast normalises a LayerNorm's, and come back bf16."""
    import warnings

    from vitkit.models.norms import RmsNorm

    norm = randomize(RmsNorm(64), scale=0.3)
    x = torch.randn(4, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = norm(x.bfloat16())
    assert got.dtype == torch.bfloat16
    assert max_diff(got, norm(x.bfloat16().float())) <= 2 ** -8 * norm(x).abs().max()  # (one bf16 rounding)


def test_a_vlm_towers_soft_tokens_take_a_head_as_timms_classifier_over_them(tmp_path):
    """Fine-tuning a Gemma 4 VLM's tower (read as _enc) gives it a head over the mean of its soft tokens (it was
    refused: "global_pool='soft' ... has no classes"); written in timm's names it is timm's classifier with
    encoder_pool='soft', which loads it strictly and computes the same."""
    from safetensors.torch import load_file

    ref = _timm("gemma4_vit_570m_enc")
    save_for_hf(ref, str(tmp_path / "g"), safe_serialization=True)
    model = randomize(vitkit.from_pretrained(tmp_path / "g", num_classes=5), seed=2)
    assert model.config.global_pool == "soft" and model.head.weight.shape == (5, 64)
    vitkit.export_weights(model, tmp_path / "head.safetensors", format="timm")
    theirs = timm.create_model("gemma4_vit_570m", **SMALL, num_classes=5, encoder_pool="soft", final_norm=False)
    theirs.load_state_dict(load_file(tmp_path / "head.safetensors"))
    x = torch.rand(2, 3, 96, 144)
    with torch.no_grad():
        expected = theirs.eval()(x)
        assert max_diff(model(x), expected) < 1e-5 * max(1.0, expected.abs().max())
