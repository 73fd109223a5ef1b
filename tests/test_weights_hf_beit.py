"""BEiT's Hugging Face layout both ways: ``save_pretrained`` folders of ``BeitModel`` and
``BeitForImageClassification`` (and data2vec-vision's same layout) read by ``vitkit.from_pretrained`` give
transformers' outputs (fp32, 1e-5), with every position scheme the class has; timm's BEiT exported as 'hf'
gives timm's logits through transformers' own class; what vitkit does not read is one line."""

import json

import pytest
import torch
from safetensors.torch import save_file

import vitkit
from conftest import max_diff, randomize
from vitkit.weights.io import WeightsError

T = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, patch_size=8,
             layer_scale_init_value=0.1)


def _out(model, x):
    out = model(pixel_values=x)
    return out.logits if hasattr(out, "logits") else out.pooler_output


def _close(a, b):
    return a.shape == b.shape and max_diff(a, b) <= 1e-5 * max(1.0, a.abs().max().item())


CASES = {  # (class, config, image size)
    "classifier_mean_pool": ("BeitForImageClassification", lambda: T.BeitConfig(
        **SMALL, image_size=32, num_labels=5, use_relative_position_bias=True, use_mean_pooling=True), (32, 32)),
    "classifier_class_token_non_square": ("BeitForImageClassification", lambda: T.BeitConfig(
        **SMALL, image_size=[32, 48], num_labels=3, use_relative_position_bias=True, use_mean_pooling=False),
        (32, 48)),
    "shared_table": ("BeitModel", lambda: T.BeitConfig(
        **SMALL, image_size=32, use_shared_relative_position_bias=True, use_mask_token=True), (32, 32)),
    "absolute_table_no_layer_scale": ("BeitModel", lambda: T.BeitConfig(
        **{**SMALL, "layer_scale_init_value": 0.0}, image_size=32, use_absolute_position_embeddings=True,
        use_mean_pooling=False), (32, 32)),
    "data2vec_vision": ("Data2VecVisionForImageClassification", lambda: T.Data2VecVisionConfig(
        **SMALL, image_size=32, num_labels=4, use_relative_position_bias=True, use_mean_pooling=True), (32, 32)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hugging_face_beit_folder_loads_with_parity(case, tmp_path, images):
    cls, config, (h, w) = CASES[case]
    ref = randomize(getattr(T, cls)(config())).eval()
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    x = images(2, h, w)
    with torch.no_grad():
        assert _close(_out(ref, x), ours(x))
    assert ours.config.norm_eps == ref.config.layer_norm_eps  # 1e-12, not timm's BEiT's 1e-6
    if "ForImageClassification" in cls:
        assert ref.config.id2label[0] == "LABEL_0" and ours.config.label_names is None  # placeholders: none


def test_transformers_5_in_memory_names_load_too(tmp_path, images):
    """A state dict saved straight from a transformers 5 model (``layers.N.attention.q_proj``, ``lambda_1``,
    the table under ``relative_position_bias``), not through save_pretrained's hub names."""
    ref = randomize(T.BeitForImageClassification(T.BeitConfig(**SMALL, image_size=32, num_labels=5,
                                                              use_relative_position_bias=True))).eval()
    assert any(".layers.0.attention.q_proj." in k for k in ref.state_dict())
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "model.safetensors"))
    ref.config.to_json_file(str(tmp_path / "config.json"))
    x = images(2, 32, 32)
    with torch.no_grad():
        assert _close(_out(ref, x), vitkit.from_pretrained(tmp_path)(x))


@pytest.mark.parametrize("pool", ["avg", "token"])
def test_timms_beit_exported_as_hf_gives_timms_logits_in_transformers(pool, tmp_path, images):
    """timm's BEiT weights -> vitkit -> 'hf' -> transformers' BeitForImageClassification: timm's logits (the
    convention checked against two other codebases, not vitkit against itself), and back."""
    ref = randomize(timm.create_model("beit_base_patch16_224", depth=2, img_size=40, patch_size=8,
                                      num_classes=7, global_pool=pool)).eval()
    ours = vitkit.create_model("beit_base_patch16_224", depth=2, img_size=40, patch_size=8, num_classes=7,
                               global_pool=pool)
    ours.load_state_dict(ref.state_dict())
    vitkit.export_weights(ours, tmp_path / "hf", "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["BeitForImageClassification"] and config["layer_norm_eps"] == 1e-6
    theirs = T.BeitForImageClassification.from_pretrained(tmp_path / "hf").eval()
    processor = T.AutoImageProcessor.from_pretrained(tmp_path / "hf")
    assert type(processor).__name__.startswith("BeitImageProcessor")
    photo = torch.randint(0, 255, (50, 70, 3), dtype=torch.uint8).numpy()
    assert tuple(processor(photo, return_tensors="pt")["pixel_values"].shape) == (1, 3, 40, 40)
    x = images(2, 40, 40)
    with torch.no_grad():
        expected = ref(x)
        assert _close(_out(theirs, x), expected)
        assert _close(vitkit.from_pretrained(tmp_path / "hf")(x), expected)


def test_beits_pre_trained_checkpoint_reads_as_its_encoder(tmp_path, images):
    """BeitForMaskedImageModeling (microsoft/beit-*-pt22k, where BEiT's fine-tuning starts): its shared table in
    every layer, the tokens through its final norm as its visual-token head reads them (the head left out)."""
    ref = randomize(T.BeitForMaskedImageModeling(T.BeitConfig(**SMALL, image_size=32, use_mask_token=True,
                                                              use_shared_relative_position_bias=True))).eval()
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    x = images(2, 32, 32)
    with torch.no_grad():
        assert _close(ref.layernorm(ref.beit(pixel_values=x).last_hidden_state), ours.forward_features(x))
    assert ours.config.num_classes == 0 and ours.config.global_pool == "token"


def test_what_vitkit_does_not_read_is_one_line(tmp_path):
    cases = {
        "mim_two_norms": (T.BeitForMaskedImageModeling(T.BeitConfig(**SMALL, image_size=32, use_mean_pooling=False,
                                                                    use_shared_relative_position_bias=True)),
                          "normalises its tokens twice"),
        "segmentation": (T.BeitForSemanticSegmentation(T.BeitConfig(**{**SMALL, "num_hidden_layers": 4}, image_size=32,
                                                                    out_indices=[0, 1, 2, 3])),
                         "head vitkit does not read \\(auxiliary_head"),
        "both_tables": (T.BeitModel(T.BeitConfig(**SMALL, image_size=32, use_absolute_position_embeddings=True,
                                                 use_relative_position_bias=True)),
                        "both an absolute position table and relative"),
    }
    for name, (model, message) in cases.items():
        model.save_pretrained(tmp_path / name)
        with pytest.raises(WeightsError, match=message) as e:
            vitkit.from_pretrained(tmp_path / name)
        assert "\n" not in str(e.value)


def test_an_edited_folder_is_refused(tmp_path):
    ref = T.BeitForImageClassification(T.BeitConfig(**SMALL, image_size=32, num_labels=5,
                                                    use_relative_position_bias=True))
    ref.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["id2label"] = {"0": "cat", "1": "dog"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="id2label names 2 classes where its classifier holds 5"):
        vitkit.from_pretrained(tmp_path)
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    sd["beit.layers.0.attention.k_proj.bias"] = torch.zeros(64)  # BEiT's key has no bias
    save_file(sd, str(tmp_path / "model.safetensors"))
    config["id2label"] = {str(i): f"c{i}" for i in range(5)}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match="key bias"):
        vitkit.from_pretrained(tmp_path)
    ref.save_pretrained(tmp_path)  # a config that claims another image size than its tables hold
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "image_size": 48}))
    with pytest.raises(WeightsError, match="img_size 48x48 .* where its weights hold 52 relative-bias rows"):
        vitkit.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))  # asked for a size: the tables are resampled
    assert vitkit.from_pretrained(tmp_path, img_size=48).blocks[0].attn.relative_position_bias_table.shape[0] == 124


def test_a_beit_no_hugging_face_class_holds_is_refused_naming_beit(tmp_path):
    """Non-square patches, and a non-square grid: transformers' BEiT resamples a non-square grid's tables
    in every forward pass (the folder read above matches it; a vitkit model written there would not)."""
    for shape, message in [(dict(img_size=32, patch_size=(8, 4)), "patch_size=\\(8, 4\\)"),
                           (dict(img_size=(32, 48), patch_size=8), "relative bias on a 4 x 6 grid")]:
        model = vitkit.create_model("beit_base_patch16_224", depth=1, **shape)
        with pytest.raises(WeightsError, match=f"nearest, beit, cannot hold .*{message}") as e:
            vitkit.export_weights(model, tmp_path / "hf", "hf")
        assert "\n" not in str(e.value) and not (tmp_path / "hf").exists()


def test_a_beit_without_its_pooler_is_the_encoder_without_a_final_norm(tmp_path, images):
    """data2vec-vision's model (and BEiT's backbone) is built without the pooling layer: with mean pooling its
    tokens leave the last block un-normalised, and vitkit reads it so (no norm to invent)."""
    ref = randomize(T.Data2VecVisionModel(T.Data2VecVisionConfig(**SMALL, image_size=32, use_mean_pooling=True,
                                                                 use_relative_position_bias=True))).eval()
    assert ref.pooler is None
    ref.save_pretrained(tmp_path)
    ours = vitkit.from_pretrained(tmp_path)
    x = images(2, 32, 32)
    with torch.no_grad():
        assert _close(ref(pixel_values=x).last_hidden_state, ours.forward_features(x))
    assert not ours.config.final_norm and ours.config.global_pool == "avg"
