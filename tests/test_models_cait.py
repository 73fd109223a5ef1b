"""CaiT ("Going deeper with Image Transformers"): counts and names equal timm's, fp32 parity
with timm in both directions, the official checkpoint layout, config.json round trips,
LayerScale epsilons, cost = FlopCounterMode, clear errors."""

import json
import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from conftest import max_diff, randomize
from vitkit.models import CaiT, CaiTConfig, count_parameters
from vitkit.models.cait import layer_scale_init
from vitkit.models.complexity import complexity
from vitkit.weights import WeightsError

TOL = 1e-5

#: timm 1.0.31, ``timm.create_model(name, num_classes=1000)``, counted on the meta device.
TIMM_COUNTS = {
    "cait_xxs24_224": 11_956_264,
    "cait_xxs24_384": 12_029_224,
    "cait_xxs36_224": 17_299_720,
    "cait_xxs36_384": 17_372_680,
    "cait_xs24_384": 26_670_088,
    "cait_s24_224": 46_916_200,
    "cait_s24_384": 47_062_120,
    "cait_s36_384": 68_366_632,
    "cait_m36_384": 271_221_352,
    "cait_m48_448": 356_460_520,
}

#: a tiny CaiT: 2 talking-heads layers, 2 class-attention layers, 32 px, patch 8 (16 patches)
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, cls_depth=2, num_classes=5)


def tiny_config(**kw):
    return CaiTConfig(**dict(TINY, **kw))


def timm_cait(cfg):
    """timm's own Cait with the same configuration."""
    from timm.models.cait import Cait

    return Cait(img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans,
                num_classes=cfg.num_classes, global_pool=cfg.global_pool, embed_dim=cfg.embed_dim,
                depth=cfg.depth, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio,
                depth_token_only=cfg.cls_depth, mlp_ratio_token_only=cfg.cls_mlp_ratio,
                init_values=cfg.layer_scale_init)


# ------------------------------------------------------------------ registry and counts


@pytest.mark.parametrize("name", sorted(TIMM_COUNTS))
def test_registered_counts_equal_timm(name):
    with torch.device("meta"):
        model = vitkit.create_model(name)
    assert isinstance(model, CaiT) and model.config.architecture == "cait"
    assert count_parameters(model) == TIMM_COUNTS[name]
    assert complexity(model.config).params == TIMM_COUNTS[name]


def test_every_timm_cait_is_registered_with_its_names_and_shapes():
    timm = pytest.importorskip("timm")
    assert sorted(timm.list_models("cait_*")) == vitkit.list_models("cait_*") == sorted(TIMM_COUNTS)
    for name in ("cait_xxs24_224", "cait_xs24_384", "cait_m36_384"):
        with torch.device("meta"):
            ref = timm.create_model(name, pretrained=False, num_classes=1000)
            ours = vitkit.create_model(name)
        assert {k: tuple(v.shape) for k, v in ref.state_dict().items()} == \
               {k: tuple(v.shape) for k, v in ours.state_dict().items()}
        assert sum(p.numel() for p in ref.parameters()) == TIMM_COUNTS[name]


def test_layer_scale_epsilons_follow_the_paper_and_timm():
    """The paper (section 3.1): 0.1 up to depth 18, 1e-5 at 24, 1e-6 deeper. timm (= the official
    code) registers 1e-5 for the 24-layer models and for XXS-36, 1e-6 for S-36, M-36, M-48."""
    timm = pytest.importorskip("timm")
    assert [layer_scale_init(d) for d in (12, 18, 20, 24, 36, 48)] == [0.1, 0.1, 1e-5, 1e-5, 1e-6, 1e-6]
    assert CaiTConfig(depth=12).layer_scale_init == 0.1
    assert CaiTConfig(depth=12, init_values=1e-3).layer_scale_init == 1e-3
    for name in TIMM_COUNTS:
        cfg = vitkit.models.get_model_config(name)
        expected = 1e-5 if cfg.depth == 24 or name.startswith("cait_xxs36") else 1e-6
        assert cfg.init_values == cfg.layer_scale_init == expected, name
        if not name.startswith("cait_xxs36"):
            assert expected == layer_scale_init(cfg.depth), name
        # timm's registered value: a narrow copy of the same entry point (depth kept)
        ref = timm.create_model(name, pretrained=False, embed_dim=8, num_heads=2, img_size=16, num_classes=0)
        assert ref.blocks[0].gamma_1[0].item() == pytest.approx(expected, rel=1e-6), name
        assert ref.blocks_token_only[0].gamma_2[0].item() == pytest.approx(expected, rel=1e-6), name
    model = CaiT(tiny_config(depth=3))
    for blk in list(model.blocks) + list(model.blocks_token_only):
        assert torch.equal(blk.gamma_1, torch.full((32,), 0.1)) and torch.equal(blk.gamma_2, torch.full((32,), 0.1))


def test_structure_class_token_joins_only_in_class_attention():
    model = CaiT(tiny_config())
    assert model.pos_embed.shape == (1, 16, 32)  # patches only
    assert model.num_prefix_tokens == 1 and model.no_weight_decay() == {"pos_embed", "cls_token"}
    assert model.blocks[0].attn.proj_l.weight.shape == (4, 4) and model.blocks[0].attn.proj_w.bias.shape == (4,)
    ca = model.blocks_token_only[0].attn
    assert {n for n, _ in ca.named_parameters()} == {f"{p}.{w}" for p in "qkv" for w in ("weight", "bias")} | \
        {"proj.weight", "proj.bias"}
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens = model.forward_features(x)
        logits, maps = model(x, return_attention=True)
    assert tokens.shape == (2, 17, 32)
    assert [tuple(m.shape) for m in maps] == [(2, 4, 16, 16)] * 2 + [(2, 4, 1, 17)] * 2
    assert torch.allclose(maps[-1].sum(-1), torch.ones(2, 4, 1))
    assert torch.equal(model.forward_head(tokens, pre_logits=True), tokens[:, 0])
    assert max_diff(logits, model(x)) <= 1e-6  # SDPA class attention = the explicit path


# ------------------------------------------------------------------ timm parity


PARITY = {
    "square": {},
    "non_square_avg": dict(img_size=(40, 24), patch_size=(8, 4), in_chans=1, depth=1, cls_depth=1,
                           num_heads=2, mlp_ratio=3.0, cls_mlp_ratio=2.0, global_pool="avg"),
}


@pytest.mark.parametrize("case", sorted(PARITY))
def test_timm_to_vitkit_parity(case, images):
    pytest.importorskip("timm")
    cfg = tiny_config(**PARITY[case])
    ref = randomize(timm_cait(cfg))
    ours = CaiT(cfg).eval()
    report = vitkit.load_weights(ours, ref.state_dict())
    assert report.format == "timm" and not report.missing and not report.unexpected and not report.resampled
    x = images(2, *cfg.img_size, c=cfg.in_chans)
    with torch.no_grad():
        a, b = ref(x), ours(x)
        assert max_diff(ref.forward_features(x), ours.forward_features(x)) <= TOL
    assert a.std() > 1e-2 and max_diff(a, b) <= TOL


INTERMEDIATE_CALLS = [dict(indices=None), dict(indices=1, norm=True), dict(indices=[0, -1], output_fmt="NLC"),
                      dict(indices=[0], intermediates_only=True, stop_early=True)]


@pytest.mark.parametrize("kw", INTERMEDIATE_CALLS)
def test_forward_intermediates_match_timm(kw, images):
    """Patch tokens of the self-attention layers only; the final tokens as forward_features."""
    pytest.importorskip("timm")
    cfg = tiny_config()
    ref = randomize(timm_cait(cfg)).eval()
    ours = CaiT(cfg).eval()
    vitkit.load_weights(ours, ref.state_dict())
    x = images(2, *cfg.img_size)
    with torch.no_grad():
        a, b = ref.forward_intermediates(x, **kw), ours.forward_intermediates(x, **kw)
    if not kw.get("intermediates_only"):
        assert max_diff(a[0], b[0]) <= TOL and max_diff(b[0], ours.forward_features(x)) <= TOL
        a, b = a[1], b[1]
    assert [t.shape for t in a] == [t.shape for t in b] and len(b) >= 1
    assert all(max_diff(p, q) <= TOL for p, q in zip(a, b))
    with pytest.raises(ValueError, match="out of range"):
        ours.forward_intermediates(x, indices=[cfg.depth])


@pytest.mark.parametrize("case", sorted(PARITY))
def test_vitkit_to_timm_export_parity(case, tmp_path, images):
    pytest.importorskip("timm")
    from safetensors.torch import load_file

    cfg = tiny_config(**PARITY[case])
    ours = randomize(CaiT(cfg), seed=3)
    path = vitkit.export_weights(ours, tmp_path / "cait.safetensors", "timm")
    ref = timm_cait(cfg).eval()
    ref.load_state_dict(load_file(str(path)), strict=True)
    x = images(2, *cfg.img_size, c=cfg.in_chans, seed=4)
    with torch.no_grad():
        a, b = ref(x), ours(x)
    assert a.std() > 1e-2 and max_diff(a, b) <= TOL


def test_official_checkpoint_layout_loads_from_the_file_alone(tmp_path, images):
    """The DeiT repository's CaiT .pth files are timm's names under a 'model' key."""
    pytest.importorskip("timm")
    cfg = tiny_config(num_heads=2)  # heads are read off proj_l, not guessed from the width
    ref = randomize(timm_cait(cfg))
    torch.save({"model": ref.state_dict()}, tmp_path / "S24_224.pth")
    ours = vitkit.from_pretrained(tmp_path / "S24_224.pth")
    assert isinstance(ours, CaiT)
    c = ours.config
    assert (c.embed_dim, c.depth, c.cls_depth, c.num_heads, c.img_size, c.patch_size, c.num_classes) == \
        (32, 2, 2, 2, (32, 32), (8, 8), 5)
    x = images(2, 32, 32)
    with torch.no_grad():
        expected = ref(x)
        assert expected.std() > 1e-2 and max_diff(ours(x), expected) <= TOL
    model = CaiT(cfg).eval()
    assert vitkit.load_weights(model, tmp_path / "S24_224.pth").format == "timm"
    with torch.no_grad():
        assert max_diff(model(x), expected) <= TOL


def test_position_table_is_resampled_without_a_class_slot(tmp_path, images):
    pytest.importorskip("timm")
    ref = randomize(timm_cait(tiny_config()))
    torch.save({"model": ref.state_dict()}, tmp_path / "m.pth")
    bigger = vitkit.from_pretrained(tmp_path / "m.pth", img_size=48)
    assert bigger.pos_embed.shape == (1, 36, 32)
    model = CaiT(tiny_config(img_size=48))
    report = vitkit.load_weights(model, tmp_path / "m.pth")
    assert report.resampled == ["pos_embed 4x4 -> 6x6 (bicubic, antialiased)"]  # as timm resamples it
    # dynamic size resamples the same way at run time
    dyn = CaiT(tiny_config(dynamic_img_size=True)).eval()
    vitkit.load_weights(dyn, ref.state_dict())
    x = images(1, 48, 48)
    with torch.no_grad():
        assert max_diff(dyn(x), model(x)) <= 1e-5
        dyn.set_input_size(48)
        assert max_diff(dyn(x), model(x)) <= 1e-5


def test_timm_hub_folder(tmp_path, images):
    pytest.importorskip("timm")
    from safetensors.torch import save_file

    cfg = tiny_config(cls_depth=1)
    ref = randomize(timm_cait(cfg))
    (tmp_path / "hub").mkdir()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "hub" / "model.safetensors"))
    hub = {"architecture": "cait_xxs24_224", "num_classes": 5,
           "model_args": {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 4,
                          "depth_token_only": 1},
           "pretrained_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "crop_pct": 0.875,
                              "interpolation": "bicubic", "input_size": [3, 32, 32]}}
    (tmp_path / "hub" / "config.json").write_text(json.dumps(hub))
    ours = vitkit.from_pretrained(tmp_path / "hub")
    assert ours.config.cls_depth == 1 and ours.config.mean == (0.5, 0.5, 0.5) and ours.config.crop_pct == 0.875
    x = images(2, 32, 32)
    with torch.no_grad():
        assert max_diff(ours(x), ref(x)) <= TOL


# ------------------------------------------------------------------ native, API, errors


def test_config_json_round_trip(tmp_path, images):
    model = randomize(vitkit.create_model("cait_xxs24_224", img_size=32, patch_size=8, depth=1,
                                          embed_dim=16, num_heads=2, num_classes=3, label_names=["a", "b", "c"]))
    model.save_pretrained(tmp_path / "m")
    stored = json.loads((tmp_path / "m" / "config.json").read_text())["config"]
    assert stored["architecture"] == "cait" and stored["name"] == "cait_xxs24_224" and stored["init_values"] == 1e-5
    back = vitkit.from_pretrained(tmp_path / "m")
    assert isinstance(back, CaiT) and back.config == model.config
    assert CaiTConfig.from_dict(model.config.to_dict()) == model.config
    x = images(2, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), back(x))


def test_reset_classifier_grad_checkpointing_and_training_step():
    model = randomize(CaiT(tiny_config(drop_path_rate=0.1, proj_drop_rate=0.1, attn_drop_rate=0.1,
                                       pos_drop_rate=0.1, drop_rate=0.1)))
    model.reset_classifier(7)
    assert model.config.num_classes == 7 and torch.equal(model.head.weight, torch.zeros(7, 32))
    model.reset_classifier(0, "avg")
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 32) and model.config.global_pool == "avg"
    model = randomize(CaiT(tiny_config())).train()
    x = torch.randn(2, 3, 32, 32)
    model(x).square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing()
    model(x).square().sum().backward()
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[n], atol=1e-6), n
    assert grads["blocks.0.attn.proj_l.weight"].abs().sum() > 0


@pytest.mark.parametrize("kw,match", [
    (dict(embed_dim=30, num_heads=4), "not divisible by num_heads"),
    (dict(cls_depth=0), "cls_depth must be >= 1"),
    (dict(img_size=30), "not divisible by patch_size"),
    (dict(global_pool="map"), "global_pool must be one of"),
    (dict(init_values=0.0), "init_values"),
    (dict(mlp_ratio=0), "mlp_ratio must be > 0"),
    (dict(attn_impl="flash"), "attn_impl"),
    (dict(drop_path_rate=1.5), "drop_path_rate"),
    # the config says it (built directly); create_model first, naming the values
    (dict(in_chans=2, mean=(0.5, 0.5, 0.5, 0.5)), r"(mean/std need 2 values|mean \(0.5, 0.5, 0.5, 0.5\) has 4 values)"),
])
def test_bad_config_is_a_clear_error(kw, match):
    with pytest.raises(ValueError, match=re.escape("invalid CaiT config") + ".*" + match):
        tiny_config(**kw)
    with pytest.raises(ValueError, match=match):
        vitkit.create_model("cait_xxs24_224", **kw)
    with pytest.raises(ValueError, match="unknown CaiT config fields: mlp_dim"):
        CaiTConfig.from_dict({"mlp_dim": 12})
    with pytest.raises(TypeError, match="unknown option"):
        vitkit.create_model("cait_xxs24_224", class_token=False)


def test_layouts_that_cannot_express_cait_are_refused(tmp_path):
    model = CaiT(tiny_config())
    for fmt, path in (("npz", tmp_path / "m.npz"), ("hf", tmp_path / "hf")):
        with pytest.raises(WeightsError, match="architecture 'cait'"):
            vitkit.export_weights(model, path, fmt)
    broken = {k: v for k, v in model.state_dict().items() if not k.startswith("blocks.0.attn.proj_l")}
    with pytest.raises(WeightsError, match="CaiT state dict: not a CaiT.*proj_l"):
        vitkit.weights.timm_format.infer_config(broken)


# ------------------------------------------------------------------ cost


@pytest.mark.parametrize("config", [
    tiny_config(),
    tiny_config(**PARITY["non_square_avg"], num_classes=0),
], ids=["tiny", "non_square_no_head"])
def test_macs_match_flop_counter(config):
    model = CaiT(config).eval()
    counter = FlopCounterMode(display=False)
    with counter:  # the explicit path: the CPU flop counter does not see fused attention
        model(torch.randn(1, config.in_chans, *config.img_size), return_attention=True)
    c = complexity(config)
    assert counter.get_total_flops() == c.flops and c.params == count_parameters(model)
    assert c.tokens == config.grid_size[0] * config.grid_size[1] and 0 < c.attn_macs_share < 1


def test_models_table_lists_cait(capsys):
    from vitkit.cli import main

    assert main(["models", "--filter", "cait_*"]) == 0
    out = capsys.readouterr().out
    for name in TIMM_COUNTS:
        assert name in out
    # the paper's Table 3: CaiT-XXS24 224 px, 12.0M parameters, 2.5 G(MAC)s
    assert re.search(r"cait_xxs24_224\s+11\.96M\s+2\.5\d", out)
    assert main(["info", "cait_s24_224"]) == 0
    assert "196 tokens" in capsys.readouterr().out
