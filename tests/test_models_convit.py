"""ConViT (d'Ascoli et al., 2021): counts and names equal timm's, fp32 parity both ways, the
official .pth layout, the local init of GPSA, gates, config.json round trip, inspection,
MACs, clear errors."""

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from conftest import max_diff, randomize
from vitkit.models import ConViT, ConViTConfig, count_parameters
from vitkit.models.complexity import complexity
from vitkit.models.convit import GPSA, kernel_offsets, relative_positions
from vitkit.weights import WeightsError

TOL = 1e-5

#: timm 1.0.31, ``timm.create_model(name, num_classes=1000)``, counted on the meta device.
TIMM_COUNTS = {"convit_tiny": 5_710_512, "convit_small": 27_777_322, "convit_base": 86_540_040}


def tiny_config(**kw):
    base = dict(img_size=32, patch_size=8, embed_dim=48, num_heads=4, mlp_dim=192, depth=3,
                local_up_to_layer=2, num_classes=7)
    base.update(kw)
    return ConViTConfig(**base)


def timm_convit(cfg):
    """timm's class with the same configuration (timm passes the width per head)."""
    from timm.models.convit import ConVit

    return ConVit(img_size=cfg.img_size[0], patch_size=cfg.patch_size[0], in_chans=cfg.in_chans,
                  num_classes=cfg.num_classes, global_pool=cfg.global_pool,
                  embed_dim=cfg.embed_dim // cfg.num_heads, num_heads=cfg.num_heads,
                  mlp_ratio=cfg.mlp_dim / cfg.embed_dim, depth=cfg.depth,
                  local_up_to_layer=cfg.local_up_to_layer, locality_strength=cfg.locality_strength,
                  qkv_bias=cfg.qkv_bias)


# ------------------------------------------------------------------ registry and counts


@pytest.mark.parametrize("name", sorted(TIMM_COUNTS))
def test_registered_counts_and_names_equal_timm(name):
    with torch.device("meta"):
        ours = vitkit.create_model(name)
    assert count_parameters(ours) == TIMM_COUNTS[name] == complexity(ours.config).params
    cfg = ours.config
    assert (cfg.depth, cfg.local_up_to_layer, cfg.embed_dim // cfg.num_heads) == (12, 10, 48)
    assert len(ours.gpsa_layers()) == 10 and ours.num_prefix_tokens == 1
    timm = pytest.importorskip("timm")
    with torch.device("meta"):
        ref = timm.create_model(name, pretrained=False, num_classes=1000)
    assert sum(p.numel() for p in ref.parameters()) == TIMM_COUNTS[name]
    assert {k: tuple(v.shape) for k, v in ref.state_dict().items()} == \
           {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    pre = ref.pretrained_cfg
    assert (cfg.mean, cfg.std, cfg.crop_pct, cfg.interpolation) == \
           (tuple(pre["mean"]), tuple(pre["std"]), pre["crop_pct"], pre["interpolation"])


def test_models_table_lists_convit(capsys):
    from vitkit.cli import main

    assert main(["models", "--filter", "convit_*"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in TIMM_COUNTS) and "5.71M" in out


# ------------------------------------------------------------------ timm parity


CASES = {
    "tiny": {},
    # 9 heads (a full 3x3 kernel), avg pooling, q/k/v biases, one GPSA layer
    "nine_heads_avg": dict(embed_dim=36, num_heads=9, mlp_dim=72, local_up_to_layer=1, global_pool="avg",
                           qkv_bias=True, img_size=24, patch_size=4),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_timm_to_vitkit_parity(case, images):
    pytest.importorskip("timm")
    cfg = tiny_config(**CASES[case])
    ref = randomize(timm_convit(cfg))
    ours = ConViT(cfg).eval()
    report = vitkit.load_weights(ours, ref.state_dict())
    assert report.format == "timm" and not report.missing and not report.unexpected and not report.resampled
    x = images(2, *cfg.img_size)
    with torch.no_grad():
        a, b = ref(x), ours(x)
        logits, attns = ours(x, return_attention=True)
        fa, fb = ref.forward_features(x), ours.forward_features(x)
    assert max_diff(a, b) <= TOL and max_diff(a, logits) <= TOL and max_diff(fa, fb) <= TOL
    n = cfg.grid_size[0] * cfg.grid_size[1]
    assert [tuple(t.shape) for t in attns] == [(2, cfg.num_heads, n, n)] * cfg.local_up_to_layer + \
        [(2, cfg.num_heads, n + 1, n + 1)] * (cfg.depth - cfg.local_up_to_layer)
    with torch.no_grad():  # the GPSA maps are timm's get_attention
        gpsa = ref.blocks[0].attn.get_attention(ref.blocks[0].norm1(ref.patch_embed(x) + ref.pos_embed))
    assert max_diff(gpsa, attns[0]) <= TOL


@pytest.mark.parametrize("kw", [dict(indices=None), dict(indices=2, norm=True), dict(indices=[0, -1], output_fmt="NLC"),
                                dict(indices=[2], stop_early=True), dict(indices=[1], intermediates_only=True)])
def test_forward_intermediates_match_timm(kw, images):
    """Patch tokens of every layer, the class token left out after it joins (timm's contract)."""
    pytest.importorskip("timm")
    cfg = tiny_config()
    ref = randomize(timm_convit(cfg)).eval()
    ours = ConViT(cfg).eval()
    vitkit.load_weights(ours, ref.state_dict())
    x = images(2, *cfg.img_size)
    with torch.no_grad():
        a, b = ref.forward_intermediates(x, **kw), ours.forward_intermediates(x, **kw)
    if not kw.get("intermediates_only"):
        assert max_diff(a[0], b[0]) <= TOL
        a, b = a[1], b[1]
    assert [t.shape for t in a] == [t.shape for t in b] and len(b) >= 1
    assert all(max_diff(p, q) <= TOL for p, q in zip(a, b))
    assert b[-1].shape[-1 if kw.get("output_fmt") == "NLC" else 1] == cfg.embed_dim


def test_vitkit_to_timm_parity(tmp_path, images):
    pytest.importorskip("timm")
    cfg = tiny_config()
    ours = randomize(ConViT(cfg), seed=3)
    path = vitkit.export_weights(ours, tmp_path / "convit.pth", format="timm")
    ref = timm_convit(cfg).eval()
    ref.load_state_dict(torch.load(path, weights_only=True), strict=True)
    x = images(2, 32, 32)
    with torch.no_grad():
        assert max_diff(ref(x), ours(x)) <= TOL
    for fmt, name in (("npz", "m.npz"), ("hf", "hf")):  # layouts without ConViT say so
        with pytest.raises(WeightsError, match="convit"):
            vitkit.export_weights(ours, tmp_path / name, format=fmt)


def test_official_pth_layout_loads_with_parity(tmp_path, images):
    """The official checkpoints: timm's names under 'model'; the architecture from the shapes."""
    pytest.importorskip("timm")
    cfg = tiny_config()
    ref = randomize(timm_convit(cfg), seed=5)
    path = tmp_path / "convit_tiny_official.pth"
    torch.save({"model": ref.state_dict(), "epoch": 299}, path)
    model = vitkit.from_pretrained(path)
    assert isinstance(model, ConViT)
    got = model.config
    assert (got.embed_dim, got.num_heads, got.depth, got.local_up_to_layer, got.mlp_dim, got.img_size,
            got.patch_size, got.num_classes, got.qkv_bias) == \
           (48, 4, 3, 2, 192, (32, 32), (8, 8), 7, False)
    x = images(2, 32, 32)
    with torch.no_grad():
        assert max_diff(ref(x), model(x)) <= TOL
    fresh = ConViT(cfg).eval()
    assert vitkit.load_weights(fresh, path).format == "timm"
    with torch.no_grad():
        assert max_diff(ref(x), fresh(x)) <= TOL
    # a larger image: the patch-only position table is resampled (no class slot is invented)
    big = vitkit.from_pretrained(path, img_size=48)
    assert big.pos_embed.shape == (1, 36, 48)


def test_timm_hub_config_rebuilds_the_model(tmp_path, images):
    pytest.importorskip("timm")
    cfg = tiny_config()
    ref = randomize(timm_convit(cfg), seed=6)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "model.safetensors"))
    hub = {"architecture": "convit_tiny", "num_classes": 7,
           "model_args": {"img_size": 32, "patch_size": 8, "embed_dim": 12, "num_heads": 4, "depth": 3,
                          "local_up_to_layer": 2},
           "pretrained_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "crop_pct": 0.9}}
    (tmp_path / "config.json").write_text(json.dumps(hub))
    model = vitkit.from_pretrained(tmp_path)
    assert (model.config.embed_dim, model.config.mlp_dim, model.config.mean) == (48, 192, (0.5, 0.5, 0.5))
    x = images(1, 32, 32)
    with torch.no_grad():
        assert max_diff(ref(x), model(x)) <= TOL


# ------------------------------------------------------------------ GPSA


def test_relative_positions_equal_timm_and_follow_rows_and_columns():
    pytest.importorskip("timm")
    gpsa = GPSA(8, 2)
    from timm.models.convit import GPSA as TimmGPSA

    ref = TimmGPSA(8, 2).get_rel_indices(9)[0]
    assert torch.equal(relative_positions((3, 3)), ref)
    r = relative_positions((2, 3))  # non-square: patch 1 is (row 0, col 1), patch 5 is (row 1, col 2)
    assert r[1, 5].tolist() == [1.0, 1.0, 2.0] and r[5, 0].tolist() == [-2.0, -1.0, 5.0]
    assert gpsa.positional_attention((2, 3)).shape == (2, 6, 6)


@pytest.mark.parametrize("heads,alpha", [(9, 1.0), (9, 3.0), (16, 1.0)])
def test_local_init_peaks_each_head_at_its_own_offset(heads, alpha):
    """At initialisation head h's positional attention is softmax(-alpha ||r - delta_h||^2): for
    every query whose kernel neighbourhood lies inside the grid it peaks at delta_h, and more
    sharply for a larger locality strength; value = identity, gates = sigmoid(1)."""
    torch.manual_seed(0)
    cfg = tiny_config(embed_dim=4 * heads, num_heads=heads, mlp_dim=8 * heads, img_size=56, patch_size=8,
                      locality_strength=alpha)
    model = ConViT(cfg)
    grid = cfg.grid_size
    offsets = kernel_offsets(heads)
    k = int(math.isqrt(heads))
    assert len(offsets) == k * k
    for gpsa in model.gpsa_layers():
        assert torch.equal(gpsa.v.weight, torch.eye(cfg.embed_dim))
        assert torch.allclose(gpsa.gates(), torch.full((heads,), 1 / (1 + math.exp(-1))))
        pos = gpsa.positional_attention(grid).detach()  # (H, N, N)
        rel = relative_positions(grid)
        for h, (dx, dy) in enumerate(offsets):
            w = gpsa.pos_proj.weight[h]
            assert torch.allclose(w, alpha * torch.tensor([2 * dx, 2 * dy, -1.0]))
            for qy in range(2, grid[0] - 2):
                for qx in range(2, grid[1] - 2):
                    q = qy * grid[1] + qx
                    best = pos[h, q].max()
                    at = torch.isclose(pos[h, q], best)
                    # the peak: the key(s) nearest to the offset (two for the half-integer offsets
                    # of an even kernel: the head sits between two patches)
                    d2 = (rel[q, :, 0] - dx) ** 2 + (rel[q, :, 1] - dy) ** 2
                    assert torch.equal(at, torch.isclose(d2, d2.min()))
    if heads == 9:  # integer offsets: a single peak per head, the 3x3 kernel's taps
        assert sorted(offsets) == [(x, y) for x in (-1.0, 0.0, 1.0) for y in (-1.0, 0.0, 1.0)]
        centre = pos[4, (grid[0] // 2) * grid[1] + grid[1] // 2]
        assert centre.max() == pytest.approx(1 / (1 + 4 * math.exp(-alpha) + 4 * math.exp(-2 * alpha)),
                                             rel=1e-3, abs=0.03)


def test_local_init_equals_timm_on_the_positional_weights():
    pytest.importorskip("timm")
    cfg = tiny_config(embed_dim=36, num_heads=9, mlp_dim=72, locality_strength=2.0)
    ref, ours = timm_convit(cfg), ConViT(cfg)
    for a, b in zip(ref.blocks[:2], ours.blocks[:2]):
        assert torch.equal(a.attn.pos_proj.weight, b.attn.pos_proj.weight)
        assert torch.equal(a.attn.v.weight, b.attn.v.weight)
        assert torch.equal(a.attn.gating_param, b.attn.gating_param)
    assert not ConViT(cfg.replace(use_local_init=False)).blocks[0].attn.v.weight.equal(torch.eye(36))


def test_gates_shape_range_and_inspection_function():
    from vitkit.inspect import convit_gates

    model = randomize(ConViT(tiny_config()), scale=3.0)
    gates = convit_gates(model)
    assert gates.shape == (2, 4) and bool(((gates > 0) & (gates < 1)).all())
    assert torch.allclose(gates, model.gates())
    assert torch.allclose(gates[1], torch.sigmoid(model.blocks[1].attn.gating_param))
    with pytest.raises(ValueError, match="ConViT"):
        convit_gates(vitkit.create_model("Ti/16", img_size=32, depth=1))


def test_attention_analyses_work_on_convit(images):
    from vitkit.inspect import attention_maps, attention_rollout, mean_attention_distance, pos_embed_similarity

    model = randomize(ConViT(tiny_config(img_size=(32, 48))))
    x = images(2, 32, 48)
    maps = attention_maps(model, x)
    assert [m.shape[-1] for m in maps] == [24, 24, 25]
    assert all(torch.allclose(m.sum(-1), torch.ones(())) for m in maps)
    roll = attention_rollout(model, x, discard_ratio=0.5)
    assert roll.shape == (2, 4, 6) and torch.allclose(roll.sum(dim=(1, 2)), torch.ones(2))
    dist = mean_attention_distance(model, x)
    assert dist.shape == (3, 4) and bool((dist > 0).all())
    assert pos_embed_similarity(model).shape == (4, 6, 4, 6)
    with torch.no_grad():  # inspection leaves the function as it was
        assert max_diff(model(x), model(x, return_attention=True)[0]) <= TOL  # MHSA: SDPA vs explicit


def _gpsa_output_and_grads(impl, dtype, scale):
    torch.manual_seed(0)
    gpsa = randomize(GPSA(48, 4, impl=impl), scale=scale).to(dtype)
    x = torch.randn(2, 16, 48, generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_()
    y = gpsa(x, (4, 4))[0]
    (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(dtype)).sum().backward()
    grads = {n: p.grad.double() for n, p in gpsa.named_parameters() if n != "pos_proj.bias"}
    return y.double(), {**grads, "x": x.grad.double()}  # pos_proj.bias: softmax-invariant, grad 0


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_fused_and_explicit_gpsa_are_the_same_function_and_gradient(scale):
    """The fused path mixes SDPA's output with the positional one; against a float64 explicit
    reference it is as exact as the explicit fp32 path, outputs and every gradient."""
    ref_y, ref_g = _gpsa_output_and_grads("explicit", torch.float64, scale)
    for impl in ("sdpa", "explicit"):
        y, grads = _gpsa_output_and_grads(impl, torch.float32, scale)
        assert max_diff(y, ref_y) <= 1e-5 * ref_y.abs().max().item(), impl
        for name, g in ref_g.items():
            assert max_diff(grads[name], g) <= 1e-4 * g.abs().max().item(), (impl, name)


def test_convit_attn_impl_reaches_gpsa_and_both_paths_agree(images):
    x = images(2, 32, 32)
    outs = {}
    for impl in ("sdpa", "explicit"):
        model = randomize(ConViT(tiny_config(attn_impl=impl)))
        assert all(b.attn.impl == impl for b in model.blocks)
        outs[impl] = model(x)
    assert max_diff(outs["sdpa"], outs["explicit"]) <= TOL
    with torch.no_grad():  # the weights are still returned on request, from either kernel choice
        assert GPSA(16, 2, impl="sdpa")(torch.randn(1, 4, 16), (2, 2), True)[1].shape == (1, 2, 4, 4)
    with pytest.raises(ValueError, match="attention impl"):
        GPSA(16, 2, impl="flash")


def test_inspect_writes_the_gate_figure(tmp_path):
    pytest.importorskip("matplotlib")
    from vitkit.inspect import inspect_model

    model = randomize(ConViT(tiny_config()))
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 52, 3), dtype=np.uint8)).save(photo)
    result = inspect_model(model, tmp_path / "out", images=[photo])
    assert result.figures["convit_gates"] == tmp_path / "out" / "convit_gates.png"
    assert {"rollout_1", "attention_per_layer", "attention_distance", "position_embedding_similarity",
            "filter_pca", "convit_gates"} <= set(result.figures)
    assert all(p.is_file() and p.stat().st_size > 1000 for p in result.figures.values())
    assert "convit gates" in result.report.read_text()


# ------------------------------------------------------------------ config, cost, errors


def test_config_json_round_trip(tmp_path, images):
    model = randomize(ConViT(tiny_config(label_names=[f"c{i}" for i in range(7)], locality_strength=0.5)))
    model.save_pretrained(tmp_path / "m")
    stored = json.loads((tmp_path / "m" / "config.json").read_text())["config"]
    assert stored["architecture"] == "convit" and stored["local_up_to_layer"] == 2
    again = vitkit.from_pretrained(tmp_path / "m")
    assert isinstance(again, ConViT) and again.config == model.config
    assert ConViTConfig.from_dict(model.config.to_dict()) == model.config
    x = images(2, 32, 32)
    with torch.no_grad():
        assert max_diff(model(x), again(x)) == 0


def test_model_api(images):
    model = ConViT(tiny_config())
    x = images(2, 32, 32)
    with torch.no_grad():
        feats = model.forward_features(x)
        assert feats.shape == (2, 17, 48)
        assert model.forward_head(feats, pre_logits=True).shape == (2, 48)
    assert model.no_weight_decay() == {"cls_token", "pos_embed"}
    model.reset_classifier(3)
    assert model.head.weight.abs().sum() == 0 and model.config.num_classes == 3
    model.set_grad_checkpointing(True)
    model.train()
    model(x).sum().backward()
    assert model.blocks[0].attn.gating_param.grad is not None
    model.set_input_size(48)
    assert model.pos_embed.shape == (1, 36, 48) and model(images(1, 48, 48)).shape == (1, 3)
    dyn = ConViT(tiny_config(dynamic_img_size=True)).eval()
    with torch.no_grad():
        assert dyn(images(1, 40, 24)).shape == (1, 7)


@pytest.mark.parametrize("kw", [{}, {"img_size": (32, 48), "global_pool": "avg", "local_up_to_layer": 0}])
def test_macs_match_flop_counter(kw):
    config = tiny_config(**kw)
    model = ConViT(config).eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randn(1, 3, *config.img_size), return_attention=True)
    c = complexity(config)
    assert counter.get_total_flops() == c.flops
    assert c.params == count_parameters(model) and c.tokens == config.grid_size[0] * config.grid_size[1] + 1


@pytest.mark.parametrize("kw,match", [
    ({"local_up_to_layer": 3}, "local_up_to_layer must be in 0..2"),
    ({"num_heads": 5}, "not divisible by num_heads"),
    ({"locality_strength": 0.0}, "locality_strength must be a positive"),
    ({"global_pool": "max"}, "global_pool must be one of"),
    ({"img_size": 30}, "not divisible by patch_size"),
])
def test_bad_config_is_a_clear_error(kw, match):
    with pytest.raises(ValueError, match=f"invalid ConViT config: .*{match}"):
        tiny_config(**kw)


def test_unknown_fields_and_bad_state_dicts_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown ConViT config fields: blocks"):
        ConViTConfig.from_dict({**tiny_config().to_dict(), "blocks": 3})
    sd = ConViT(tiny_config()).state_dict()
    bad = {k: v for k, v in sd.items() if not k.startswith("blocks.0.attn.gating")}
    torch.save(bad, tmp_path / "bad.pth")
    with pytest.raises(WeightsError, match="GPSA layers must come first"):
        vitkit.from_pretrained(tmp_path / "bad.pth")
