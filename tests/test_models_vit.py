"""The ViT module: sizes, options, API contracts, initialisation."""

import math
import re

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.models import VisionTransformer, ViTConfig, count_parameters
from vitkit.models.layers import compile_for_inference, fast_inference

PAPER_COUNTS = {
    "vit_tiny_patch16_224": 5_717_416,
    "vit_small_patch16_224": 22_050_664,
    "vit_base_patch16_224": 86_567_656,
    "vit_base_patch32_224": 88_224_232,
    "vit_large_patch16_224": 304_326_632,
    "vit_large_patch32_224": 306_535_400,
    "vit_huge_patch14_224": 632_045_800,
}


@pytest.mark.parametrize("name,expected", sorted(PAPER_COUNTS.items()))
def test_parameter_counts_exact(name, expected):
    with torch.device("meta"):
        model = vitkit.create_model(name)
    assert count_parameters(model) == expected


def test_size_strings_match_registered_names():
    with torch.device("meta"):
        a = vitkit.create_model("B/16")
        b = vitkit.create_model("B/16", img_size=384, num_classes=10)
    assert count_parameters(a) == PAPER_COUNTS["vit_base_patch16_224"]
    assert b.pos_embed.shape == (1, 24 * 24 + 1, 768) and b.head.out_features == 10


def test_list_models_and_unknown_name():
    names = vitkit.list_models()
    for n in PAPER_COUNTS:
        assert n in names
    assert "vit_base_patch16_384" in names and "vit_small_patch32_384" in names
    assert vitkit.list_models("vit_huge_patch14_2*") == ["vit_huge_patch14_224"]  # a pattern filters
    with pytest.raises(ValueError, match="did you mean"):
        vitkit.create_model("vit_base_patch16_244")
    with pytest.raises(TypeError, match="unknown option"):
        vitkit.create_model("Ti/16", not_an_option=1)
    # another library's name for a field, or a typo, is pointed at the field (a list of 60 names said nothing)
    for keyword, meant in (("mlp_ratio", "mlp_dim (the MLP's width: mlp_ratio x embed_dim)"),
                           ("num_attention_heads", "num_heads"), ("embed_dm", "embed_dim")):
        with pytest.raises(TypeError, match=re.escape(f"unknown option(s) {keyword} of a ViT config (did you mean "
                                                      f"{meant}?); known: ")):
            vitkit.create_model("Ti/16", **{keyword: 2})
    with pytest.raises(TypeError) as info:  # a name only for a field this config has (a ResNetV2 has no embed_dim)
        vitkit.create_model("resnetv2_50_nopreact", width=2)
    assert "embed_dim?" not in str(info.value)


def tiny(**kw):
    base = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_dim=64, num_classes=5)
    base.update(kw)
    return randomize(VisionTransformer(ViTConfig(**base)))


@pytest.mark.parametrize("pos", ["learned", "learned_2d", "sincos2d", "none"])
@pytest.mark.parametrize("pool,cls", [("token", True), ("avg", True), ("avg", False)])
def test_options_forward_shapes(pos, pool, cls, images):
    model = tiny(pos_embed=pos, global_pool=pool, class_token=cls, img_size=(32, 48))
    x = images(3, 32, 48)
    out = model(x)
    assert out.shape == (3, 5) and torch.isfinite(out).all()
    tokens = model.forward_features(x)
    assert tokens.shape == (3, 4 * 6 + int(cls), 32)
    assert model.forward_head(tokens, pre_logits=True).shape == (3, 32)


def test_position_embedding_variants_are_used(images):
    """Permuting whole patches changes the output only when positions are embedded."""
    x = images(1, 32, 32)
    # Reverse the order of the 4 patch rows (8 px each): same patches, other positions.
    moved = x.reshape(1, 3, 4, 8, 32).flip(2).reshape(1, 3, 32, 32)
    for pos in ("learned", "learned_2d", "sincos2d"):
        model = tiny(pos_embed=pos, global_pool="avg", class_token=False)
        assert max_diff(model(x), model(moved)) > 1e-4, pos
    nopos = tiny(pos_embed="none", global_pool="avg", class_token=False)
    assert max_diff(nopos(x), nopos(moved)) < 1e-5


def test_learned_2d_is_row_plus_column_concat():
    model = tiny(pos_embed="learned_2d")
    pe = model.patch_pos_embed((4, 4)).reshape(4, 4, 32)
    assert torch.equal(pe[1, 2, :16], model.pos_embed_row[0, 1])
    assert torch.equal(pe[1, 2, 16:], model.pos_embed_col[0, 2])
    assert {"pos_embed_row", "pos_embed_col"} <= model.no_weight_decay()


def test_representation_layer_is_tanh(images):
    model = tiny(representation_size=24)
    feats = model.forward_head(model.forward_features(images(2, 32, 32)), pre_logits=True)
    assert feats.shape == (2, 24) and feats.abs().max() <= 1.0
    assert model.head.in_features == 24


def test_layerscale_and_tanh_gelu_options():
    model = VisionTransformer(ViTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4,
                                        mlp_dim=64, init_values=1e-5, gelu="tanh"))
    assert torch.allclose(model.blocks[0].ls1.gamma, torch.full((32,), 1e-5))
    assert model.blocks[0].mlp.act.approximate == "tanh"


def test_invalid_configs_have_clear_errors():
    with pytest.raises(ValueError, match="class_token"):
        ViTConfig(global_pool="token", class_token=False)
    with pytest.raises(ValueError, match=r"nearest multiples: 288 or 304\)"):  # a square size's, once
        ViTConfig(img_size=300, patch_size=16)
    with pytest.raises(ValueError, match=r"nearest multiples: 288 or 304 / 96 or 112\)"):
        ViTConfig(img_size=(300, 100), patch_size=16)
    with pytest.raises(ValueError, match="pos_embed must be one of"):
        ViTConfig(pos_embed="rope")
    with pytest.raises(ValueError, match="divisible by num_heads"):
        ViTConfig(embed_dim=100, num_heads=3)


def test_wrong_input_size_and_channels(images):
    model = tiny()
    with pytest.raises(ValueError, match="does not match the model's 32x32"):
        model(images(1, 48, 48))
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 3, H, W\)"):
        model(torch.randn(1, 1, 32, 32))


def test_pixels_of_another_dtype_are_one_clear_line(images):
    """Raw uint8 pixels, or float16 ones into float32 weights, ended in the convolution's own error."""
    model = tiny().eval()
    x = images(1, 32, 32)
    with pytest.raises(ValueError, match="expected float pixels.*uint8 tensor"):
        model((x * 255).to(torch.uint8))
    with pytest.raises(ValueError, match=r"images are torch.float16 and the model's weights torch.float32"):
        model(x.half())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts them: allowed
        assert model(x.bfloat16()).shape == (1, model.config.num_classes)
    assert model.to(torch.float64)(x.double()).dtype == torch.float64


def test_fused_and_explicit_attention_agree(images):
    model = tiny(depth=3)
    x = images(2, 32, 32)
    fused = model(x)
    logits, attns = model(x, return_attention=True)
    assert max_diff(fused, logits) < 1e-6
    assert len(attns) == 3
    for a in attns:
        assert a.shape == (2, 4, 17, 17)
        assert torch.allclose(a.sum(-1), torch.ones(2, 4, 17), atol=1e-5)
        assert (a >= 0).all()


def test_dynamic_img_size_and_set_input_size(images):
    model = tiny(dynamic_img_size=True)
    out = model(images(2, 48, 64))
    assert out.shape == (2, 5)
    with pytest.raises(ValueError, match="not divisible by the patch size"):
        model(images(1, 36, 32))
    fixed = tiny()
    x = images(2, 48, 64)
    dyn_out = tiny(dynamic_img_size=True)(x)  # same seed -> same weights
    fixed.set_input_size((48, 64))
    assert fixed.pos_embed.shape == (1, 1 + 6 * 8, 32)
    assert fixed.config.img_size == (48, 64)
    assert max_diff(fixed(x), dyn_out) < 1e-5


def test_set_input_size_for_2d_and_sincos(images):
    for pos in ("learned_2d", "sincos2d"):
        model = tiny(pos_embed=pos)
        model.set_input_size(64)
        assert model(images(1, 64, 64)).shape == (1, 5)


def test_reset_classifier_zero_head(images):
    model = tiny()
    model.reset_classifier(3)
    assert model.head.out_features == 3
    assert torch.count_nonzero(model.head.weight) == 0
    assert model.config.num_classes == 3
    model.reset_classifier(0)
    assert model(images(2, 32, 32)).shape == (2, 32)


def test_forward_intermediates(images):
    model = tiny(depth=4)
    x = images(2, 32, 32)
    final, inter = model.forward_intermediates(x, indices=2)
    assert len(inter) == 2 and inter[0].shape == (2, 32, 4, 4)
    assert max_diff(final, model.forward_features(x)) < 1e-6
    only = model.forward_intermediates(x, indices=[0, -1], output_fmt="NLC", intermediates_only=True)
    assert [t.shape for t in only] == [(2, 16, 32)] * 2
    with_prefix = model.forward_intermediates(x, indices=[1], return_prefix_tokens=True, intermediates_only=True)
    assert with_prefix[0][1].shape == (2, 1, 32)
    with pytest.raises(ValueError, match="out of range"):
        model.forward_intermediates(x, indices=[7])


def test_grad_checkpointing_same_gradients(images):
    x = images(2, 32, 32)
    grads = []
    for ckpt in (False, True):
        model = tiny()
        model.train()
        model.set_grad_checkpointing(ckpt)
        model(x).sum().backward()
        grads.append(model.patch_embed.proj.weight.grad.clone())
    assert max_diff(*grads) < 1e-6


def test_drop_path_linear_over_depth_and_train_mode_noise(images):
    model = tiny(depth=5, drop_path_rate=0.2, drop_rate=0.1)
    assert [round(b.drop_path, 4) for b in model.blocks] == [0.0, 0.05, 0.1, 0.15, 0.2]
    x = images(4, 32, 32)
    model.eval()
    assert max_diff(model(x), model(x)) == 0
    model.train()
    torch.manual_seed(0)
    assert max_diff(model(x), model(x)) > 0


def test_drop_path_on_one_block_is_said_not_silent(recwarn):
    """timm's linear rule gives the only block of a depth-1 model rate 0: the rate would do nothing."""
    model = tiny(depth=1, drop_path_rate=0.1)
    assert [b.drop_path for b in model.blocks] == [0.0]
    assert any("has no effect on a model of depth 1" in str(w.message) for w in recwarn.list)
    recwarn.clear()
    tiny(depth=2, drop_path_rate=0.1)
    assert not [w for w in recwarn.list if "drop_path_rate" in str(w.message)]


def test_no_weight_decay_names():
    model = tiny()
    assert model.no_weight_decay() == {"cls_token", "pos_embed"}


def test_official_initialisation_statistics():
    torch.manual_seed(0)
    model = vitkit.create_model("S/16", num_classes=10)
    D = 384
    assert torch.count_nonzero(model.head.weight) == 0 and torch.count_nonzero(model.cls_token) == 0
    qkv = model.blocks[0].attn.qkv.weight
    bound = math.sqrt(6 / (D + D))  # each of q, k, v as its own D x D kernel
    assert qkv.abs().max() <= bound and qkv.abs().max() > 0.95 * bound
    fc1 = model.blocks[0].mlp.fc1.weight
    assert fc1.abs().max() <= math.sqrt(6 / (D + 4 * D))
    assert model.blocks[0].mlp.fc1.bias.std() < 1e-5
    assert abs(model.pos_embed.std().item() - 0.02) < 0.002
    w = model.patch_embed.proj.weight
    assert abs(w.std().item() - math.sqrt(1 / (3 * 16 * 16))) < 0.003  # LeCun normal


def test_inference_fast_path_equals_autograd_path(images):
    """The in-place GELU used without autograd computes exactly what the autograd path does."""
    for gelu in ("exact", "tanh"):
        model = tiny(gelu=gelu, attn_impl="sdpa")  # the same attention kernel in both modes
        x = images(2, 32, 32)
        with_grad = model(x)
        assert with_grad.requires_grad
        with torch.inference_mode(), fast_inference(model):
            fast = model(x)
        assert torch.equal(with_grad.detach(), fast)


def test_autocast_weight_cache_is_exact_and_follows_weight_updates(images):
    model = tiny(attn_impl="sdpa")  # the same attention kernel with and without autograd
    x = images(2, 32, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = model(x).detach()  # autograd on: PyTorch's own per-call casts
        with torch.inference_mode(), fast_inference(model):
            cached, again = model(x), model(x)
    assert torch.equal(plain, cached) and torch.equal(cached, again)
    assert not any("_autocast_cache" in m.__dict__ for m in model.modules())  # dropped on exit
    # outside fast_inference nothing is kept: a fused AdamW step (no version bump) is seen at once
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        before = model(x)
    model(x).square().mean().backward()
    opt.step()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain2 = model(x).detach()
        with torch.no_grad():
            after = model(x)
    assert torch.equal(plain2, after) and not torch.equal(after, before)


@pytest.mark.full
def test_compile_for_inference_computes_what_eager_bf16_computes(images):
    """Inductor with freezing (weights folded in as constants, prepacked) is the same function:
    under bf16 autocast it agrees with the eager fast path to bf16 rounding."""
    model = tiny(attn_impl="sdpa").eval()
    x = images(4, 32, 32)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        with fast_inference(model):
            eager = model(x).float()
        compiled = compile_for_inference(model)(x).float()
    assert compiled.shape == eager.shape
    assert (compiled - eager).abs().max().item() < 0.05 * eager.abs().max().item()


def test_hooks_see_what_module_names_say_as_in_timm(images):
    model = tiny().eval()
    seen = {}
    mlp = model.blocks[0].mlp
    mlp.fc1.register_forward_hook(lambda m, i, o: seen.__setitem__("fc1", o.clone()))
    mlp.act.register_forward_hook(lambda m, i, o: seen.__setitem__("act", (i[0].clone(), o.clone())))
    x = images(1, 32, 32)
    for context in (torch.no_grad(), fast_inference(model)):
        seen.clear()
        with torch.no_grad(), context:
            model(x)
        act_in, act_out = seen["act"]
        assert torch.equal(seen["fc1"], act_in)  # pre-activation, not GELU(fc1(x))
        assert torch.equal(act_out, mlp.act(act_in))


def test_autocast_path_with_a_model_built_in_inference_mode(images):
    x = images(1, 32, 32)
    with torch.inference_mode():
        model = tiny(attn_impl="sdpa")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = tiny(attn_impl="sdpa")(x).detach()
    assert torch.equal(out, ref)


def test_attention_impls_compute_the_same_gradients(images):
    """'auto' trains through the explicit path under CPU autocast, else through the fused kernel."""
    x = images(2, 32, 32)
    grads = {}
    for impl in ("auto", "sdpa", "explicit"):
        for amp in (False, True):
            model = tiny(attn_impl=impl)
            model.train()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                model(x).float().square().sum().backward()
            grads[impl, amp] = model.blocks[0].attn.qkv.weight.grad
    assert max_diff(grads["auto", False], grads["explicit", False]) < 1e-5
    assert torch.equal(grads["auto", False], grads["sdpa", False])
    assert torch.equal(grads["auto", True], grads["explicit", True])
    with pytest.raises(ValueError, match="attn_impl"):
        tiny(attn_impl="flash")


def test_token_avg_pooling_reads_the_class_token_beside_the_patches_mean():
    """DINOv2's linear heads (transformers' Dinov2ForImageClassification): [class token, mean of the patches]
    after the final norm, a head twice the width; refused where there is no class token, and by timm's layout."""
    model = vitkit.create_model("vit_small_patch14_reg4_dinov2", depth=1, img_size=28, num_classes=3,
                                global_pool="token_avg").eval()
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        tokens = model.forward_features(x)
        want = model.head(torch.cat([tokens[:, 0], tokens[:, model.num_prefix_tokens:].mean(1)], -1))
        assert torch.equal(model(x), want) and model.head.in_features == 2 * 384
    with pytest.raises(ValueError, match="token_avg' reads the class token"):
        vitkit.create_model("vit_small_patch16_224", class_token=False, global_pool="token_avg")
    with pytest.raises(vitkit.weights.io.WeightsError, match="no pooling of the class token beside"):
        vitkit.export_weights(model, "/nonexistent/never.safetensors", "timm")


def test_a_refused_reset_or_resize_changes_nothing():
    """reset_classifier(-1) raised after the head was replaced (features out, the config saying 5 classes, a
    folder from_pretrained then refused); set_input_size(-16) after the grid was set to -1x-1 (every later call
    failed); load_weights(exclude="pos_embed") read the string a letter at a time and left most tensors out."""
    m = vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=5)
    x = torch.randn(1, 3, 32, 32)
    for bad in (-1, 2.0, True, "3", None):
        with pytest.raises(ValueError, match="num_classes must be a whole number from 0"):
            m.reset_classifier(bad)
    with pytest.raises(ValueError, match="img_size must be positive"):
        m.set_input_size(-16)
    assert m(x).shape == (1, 5) and m.config.num_classes == 5 and m.patch_embed.grid_size == (2, 2)
    m.set_input_size((48, 64))
    assert m(torch.randn(1, 3, 48, 64)).shape == (1, 5)
    other = vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=5)
    source = {k: v + 1 for k, v in other.state_dict().items()}
    vitkit.load_weights(other, source, exclude="pos_embed")
    assert [k for k, v in other.state_dict().items() if not torch.equal(v, source[k])] == ["pos_embed"]


def test_save_pretrained_writes_only_what_from_pretrained_reads(tmp_path):
    """A head replaced by assignment (the fine-tuning idiom), a NaN and a backbone (features_only) were saved
    without a word and then refused by from_pretrained ("it was edited or mixed with other weights"; a backbone's
    'model.' names: "unrecognised weight layout"): refused when saving now, the backbone saved as its model."""
    m = vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=5)
    m.head = torch.nn.Linear(192, 10)
    with pytest.raises(ValueError, match=r"head.weight is \(10, 192\), the config builds \(5, 192\).*"
                                         r"reset_classifier\(n\)"):
        m.save_pretrained(tmp_path / "head")
    assert not (tmp_path / "head").exists()
    m.reset_classifier(10)
    with torch.no_grad():
        m.blocks[0].mlp.fc1.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or infinite values \(blocks.0.mlp.fc1.weight\)"):
        m.save_pretrained(tmp_path / "nan")
    backbone = vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=2, features_only=True,
                                   out_indices=(0, 1))
    backbone.save_pretrained(tmp_path / "bb")
    vitkit.export_weights(backbone, tmp_path / "bb.safetensors", "timm")
    again = vitkit.from_pretrained(tmp_path / "bb", features_only=True, out_indices=(0, 1))
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(again(x), backbone(x)))
    assert vitkit.from_pretrained(tmp_path / "bb.safetensors").config.num_classes == 0


@pytest.mark.parametrize("field,value", [("pre_norm", "false"), ("dynamic_img_size", "no"), ("class_token", "false"),
                                         ("qkv_bias", 1)])
def test_a_switch_is_true_or_false_not_a_word(field, value):
    """pre_norm="false" built a pre-norm model (a non-empty string is true); dynamic_img_size="no" took any size."""
    with pytest.raises(ValueError, match=f"{field} must be true or false, got {value!r}"):
        vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, **{field: value})


@pytest.mark.parametrize("name,size", [("vit_tiny_patch16_224", 32), ("eva02_tiny_patch14_224", 28),
                                       ("vit_base_patch16_siglip_224", 32)])
def test_a_new_width_keeps_the_mlp_ratio_as_timms_create_model_does(name, size):
    """create_model(name, embed_dim=64) kept the registered MLP width (768 for ViT-Ti), where timm scales it by
    mlp_ratio (256): the same call built another model than timm's."""
    timm = pytest.importorskip("timm")
    kw = dict(embed_dim=64, num_heads=2, depth=1, img_size=size)
    ref = randomize(timm.create_model(name, **kw)).eval()
    ours = vitkit.create_model(name, **kw).eval()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    vitkit.load_weights(ours, ref.state_dict())
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        assert max_diff(ours(x), ref(x)) < 1e-5


def test_a_channel_count_gets_one_normalisation_whichever_way_the_model_is_built(tmp_path):
    """create_model(in_chans=1) took the red channel's mean (0.485) where from_pretrained(in_chans=1) averaged
    (0.449): one architecture, two preprocessings. A given mean of another length was cut in silence."""
    rgb = vitkit.create_model("deit_tiny_patch16_224", img_size=32, depth=1)
    rgb.save_pretrained(tmp_path / "rgb")
    built = vitkit.create_model("deit_tiny_patch16_224", img_size=32, depth=1, in_chans=1).config
    loaded = vitkit.from_pretrained(tmp_path / "rgb", in_chans=1).config
    assert built.mean == loaded.mean == (pytest.approx(sum(rgb.config.mean) / 3),)
    assert built.std == loaded.std
    with pytest.raises(ValueError, match=r"mean \(0.1, 0.2, 0.3\) has 3 values for in_chans 2"):
        vitkit.create_model("deit_tiny_patch16_224", img_size=32, depth=1, in_chans=2, mean=(0.1, 0.2, 0.3))
    with pytest.raises(ValueError, match=r"std \(0.2, 0.2, 0.2\) has 3 values for in_chans 1"):
        vitkit.from_pretrained(tmp_path / "rgb", in_chans=1, std=(0.2, 0.2, 0.2))


def test_a_gelu_that_nothing_reads_is_refused():
    """A SwiGLU MLP gates with SiLU: gelu='quick' was stored and changed nothing (bit-identical outputs)."""
    with pytest.raises(ValueError, match=r"gelu 'quick' has nothing to act on: a swiglu MLP gates with SiLU"):
        vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, mlp="swiglu", gelu="quick")
    # a MAP head's MLP reads it: kept
    vitkit.create_model("vit_base_patch16_siglip_224", img_size=32, depth=1, mlp="swiglu", gelu="tanh")


def test_a_model_keeps_its_own_copy_of_the_label_names():
    """The config held the caller's list: sorting it afterwards relabelled the head without a word, and adding a
    name made a model whose saved folder from_pretrained refused (4 label names for 3 classes)."""
    names = ["zebra", "ant", "moth"]
    for name in ("vit_tiny_patch16_224", "convit_tiny", "cait_xxs24_224"):
        model = vitkit.create_model(name, img_size=32, depth=2, num_classes=3, label_names=names,
                                    **({"local_up_to_layer": 1} if name == "convit_tiny" else {}))
        names.sort()
        names.append("x")
        assert model.config.label_names == ["zebra", "ant", "moth"], name
        names[:] = ["zebra", "ant", "moth"]
    assert vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=2,
                               label_names=("a", "b")).config.label_names == ["a", "b"]
    import numpy as np

    assert vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=2,
                               label_names=np.array(["a", "b"])).config.label_names == ["a", "b"]
    for unordered in ({0: "cat", 1: "dog"}, {"cat", "dog"}, b"ab"):  # its keys, its hash order, its numbers
        with pytest.raises(ValueError, match="label_names must be a list of names in class order"):
            vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=2, label_names=unordered)


def test_api_values_of_the_wrong_kind_are_one_clear_error():
    """Each was taken (label_names 'abc' as three names) or failed deep inside (a TypeError from re, from a
    tensor's size, from a comparison; an AttributeError for a numpy input)."""
    import numpy as np

    small = dict(img_size=32, depth=1)
    for name, kw, words in (
            ("vit_tiny_patch16_224", dict(label_names="abc", num_classes=3), "label_names must be a list of names"),
            ("cait_xxs24_224", dict(label_names=5, num_classes=3),
             "label_names must be a list of names in class order, got int 5"),
            ("vit_tiny_patch16_224", dict(init_values="0.1"), "init_values (LayerScale's start) must be a number"),
            ("cait_xxs24_224", dict(init_values="0.1"), "init_values (LayerScale's start) must be a number"),
            ("vit_tiny_patch16_224", dict(representation_size=-3), "representation_size must be a positive integer"),
            ("vit_tiny_patch16_224", dict(representation_size=32.0), "representation_size must be a positive"),
            ("vit_tiny_patch16_224", dict(drop_path_rate=False), "drop_path_rate must be in [0, 1), got False")):
        with pytest.raises(ValueError, match=re.escape(words)):
            vitkit.create_model(name, **small, **kw)
    for bad in (None, 3):
        with pytest.raises(ValueError, match="a model name is a string"):
            vitkit.create_model(bad)
    with pytest.raises(ValueError, match="shell-style pattern string"):
        vitkit.list_models(3)
    model = vitkit.create_model("vit_tiny_patch16_224", **small)
    with pytest.raises(TypeError, match=r"takes a torch.Tensor of images \(B, 3, H, W\), not a ndarray"):
        model(np.zeros((1, 3, 32, 32), np.float32))
