"""Differential attention (timm's ``vit_dwee``, ``vit_dlittle``) and ViT-22B's parallel block (``vit_pwee``;
both: ``vit_dpwee``): the explicit and fused paths agree, the maps are what the paper defines, the
architecture is read back off its tensor names, training reaches the new parameters, the default LoRA
targets find the parallel block's projections, ONNX Runtime computes the same function, and what cannot
hold (bad widths, combinations timm does not have, the attention analyses) is refused in one line.
Parity with timm itself: ``test_models_names.py`` (the blocks) and ``test_weights_timm_hub.py`` (hub folders)."""

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.models.diff_attention import differential_lambda, lambda_init_at

DIFF = ("vit_dwee_patch16_reg1_gap_256", "vit_dpwee_patch16_reg1_gap_256")
SMALL = dict(depth=3, img_size=64, num_classes=5)


def _model(name, **kw):
    return randomize(vitkit.create_model(name, **{**SMALL, **kw}), seed=2)


@pytest.mark.parametrize("name", DIFF + ("vit_pwee_patch16_reg1_gap_256",))
def test_explicit_path_computes_the_fused_function(name, images):
    """``return_attention=True`` runs the explicit softmax path: the same logits as the fused kernels."""
    model = _model(name)
    x = images(2, 64, 64)
    with torch.no_grad():
        fused = model(x)
        explicit, maps = model(x, return_attention=True)
    assert fused.std() > 1e-2
    assert max_diff(fused, explicit) <= 1e-5 * max(1.0, fused.abs().max().item())
    assert len(maps) == 3 and maps[0].shape == (2, 4, 16 + 1, 16 + 1)  # heads, registers + patches


@pytest.mark.parametrize("name", DIFF)
def test_differential_maps_are_two_softmax_maps_apart(name, images):
    """Each row is softmax_1 - lambda softmax_2: it sums to 1 - lambda, with lambda_init growing with depth."""
    model = _model(name)
    with torch.no_grad():
        _, maps = model(images(1, 64, 64), return_attention=True)
    holders = [m for m in model.modules() if hasattr(m, "lambda_q1")]
    assert [h.lambda_init for h in holders] == pytest.approx([lambda_init_at(i) for i in range(3)])
    assert lambda_init_at(0) == pytest.approx(0.2) and lambda_init_at(40) == pytest.approx(0.8, abs=1e-5)
    for holder, attn in zip(holders, maps):
        lam = differential_lambda(holder).item()
        assert torch.allclose(attn.sum(-1), torch.full_like(attn.sum(-1), 1 - lam), atol=1e-5)


@pytest.mark.parametrize("name", DIFF + ("vit_pwee_patch16_reg1_gap_256",))
def test_architecture_is_read_off_the_tensor_names(name, images):
    """A bare state dict (no config): the block kind, differential attention, widths and biases are found."""
    from vitkit.models.vit import infer_vit_config

    model = _model(name)
    cfg = infer_vit_config(model.state_dict())
    for field in ("block", "diff_attn", "mlp_dim", "depth", "qkv_bias", "proj_bias", "reg_tokens", "init_values",
                  "global_pool", "img_size"):
        assert getattr(cfg, field) == getattr(model.config, field), field
    rebuilt = vitkit.VisionTransformer(cfg).eval()
    report = vitkit.load_weights(rebuilt, model.state_dict())
    assert not report.missing and not report.unexpected
    x = images(1, 64, 64)
    with torch.no_grad():
        assert max_diff(model(x), rebuilt(x)) == 0


@pytest.mark.parametrize("name", DIFF + ("vit_pwee_patch16_reg1_gap_256",))
def test_training_reaches_the_new_parameters_and_lora_finds_the_projections(name, images):
    from vitkit.train.finetune import lora_target_names

    model = _model(name).train()
    model(images(2, 64, 64)).logsumexp(-1).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    for part in ("lambda_q1", "lambda_k2", "sub_norm.weight", "in_proj.weight", "mlp_out_proj.weight"):
        hits = [n for n in grads if n.endswith(part)]
        if hits:
            assert all(grads[n] is not None and grads[n].abs().sum() > 0 for n in hits), part
    parts = {n.rsplit(".", 1)[-1] for n in lora_target_names(model, ("qkv", "proj", "fc1", "fc2"))}
    parallel = model.config.block == "parallel"
    want = ({"in_proj", "out_proj"} if model.config.diff_attn else {"in_proj", "attn_out_proj", "mlp_out_proj"}) \
        if parallel else {"qkv", "proj", "fc1", "fc2"}
    assert parts == want


@pytest.mark.parametrize("bad, words", [
    (dict(diff_attn=True, embed_dim=96, num_heads=96), "splits each head in two"),
    (dict(diff_attn=True, pos_embed="relative"), "no relative position bias"),
    (dict(block="parallel", mlp="swiglu"), "no SwiGLU"),
    (dict(block="parallel", pos_embed="relative_mlp"), "no relative position bias"),
    (dict(diff_attn="yes"), "true or false"),
])
def test_combinations_timm_does_not_have_are_refused(bad, words):
    from vitkit.models import EvaConfig, ViTConfig

    with pytest.raises(ValueError, match=words):
        ViTConfig(**bad)
    with pytest.raises(ValueError, match="differential attention"):
        EvaConfig(diff_attn=True)


def test_the_attention_analyses_refuse_differential_maps_and_inspect_shows_the_rest(images, tmp_path):
    """Rollout and attention distance refuse maps that are no distributions; ``vitkit inspect`` leaves those
    figures out, says why in the report, and draws the others."""
    from PIL import Image

    from vitkit.inspect import analysis, inspect_model

    model = _model("vit_dwee_patch16_reg1_gap_256")
    for fn in (analysis.attention_rollout, analysis.mean_attention_distance):
        with pytest.raises(ValueError, match="difference of two softmax maps"):
            fn(model, images(1, 64, 64))
    photos = []
    for i in range(2):
        photos.append(tmp_path / f"p{i}.png")
        Image.fromarray((torch.rand(80, 80, 3) * 255).byte().numpy()).save(photos[-1])
    result = inspect_model(model, tmp_path / "out", images=photos, progress=False)
    assert {"token_norms", "position_embedding_similarity", "filter_pca"} <= set(result.figures)
    assert not any(k.startswith(("rollout", "attention")) for k in result.figures)
    page = result.report.read_text()
    assert "differential" in page and "the 2 images" in page and result.notes
    assert len(result.predictions) == 2
    plain = _model("vit_pwee_patch16_reg1_gap_256")  # the parallel block's maps are distributions
    assert analysis.attention_rollout(plain, images(1, 64, 64)).shape == (1, 4, 4)


@pytest.mark.parametrize("name", ("vit_dpwee_patch16_reg1_gap_256", "vit_pwee_patch16_reg1_gap_256"))
def test_onnx_runtime_computes_the_same_function(name, images, tmp_path):
    pytest.importorskip("onnxruntime")
    from vitkit.deploy import OnnxModel, export_onnx

    model = _model(name, depth=2)
    path = export_onnx(model, tmp_path / "m.onnx")
    x = images(3, 64, 64)
    with torch.no_grad():
        want = model(x)
    with torch.no_grad():
        got = OnnxModel(path)(x)
    assert max_diff(want, got) <= 1e-4 * max(1.0, want.abs().max().item())


def test_openvino_computes_the_same_function(images, tmp_path):
    """Differential attention and the parallel block in one model (vit_dpwee), through OpenVINO in fp32."""
    pytest.importorskip("openvino")
    from vitkit.deploy.openvino import OpenVinoModel, export_openvino

    model = _model("vit_dpwee_patch16_reg1_gap_256", depth=2)
    path = export_openvino(model, tmp_path / "m.xml", progress=False)
    x = images(3, 64, 64)
    with torch.no_grad():
        want, got = model(x), OpenVinoModel(path, precision="fp32")(x)
    assert want.std() > 1e-2 and max_diff(want, got) <= 1e-4 * max(1.0, want.abs().max().item())
