"""The analytic cost model agrees with PyTorch's own FLOP counter."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.models import get_model_config
from vitkit.models.complexity import complexity


@pytest.mark.parametrize("kw", [{}, {"representation_size": 48, "class_token": False, "global_pool": "avg",
                                     "img_size": (32, 64)}])
def test_macs_match_flop_counter(kw):
    config = get_model_config("Ti/16").replace(img_size=kw.pop("img_size", 64), patch_size=8, depth=3,
                                               num_classes=10, **kw)
    model = vitkit.VisionTransformer(config).eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randn(1, 3, *config.img_size), return_attention=True)  # explicit matmuls are counted
    c = complexity(config)
    assert counter.get_total_flops() == c.flops
    assert c.params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name, kw", [
    ("vit_base_patch16_siglip_224", dict(depth=2, img_size=64)),  # the MAP head
    ("eva02_base_patch14_224", dict(depth=2, img_size=56)),  # SwiGLU, rotary positions
    ("vit_large_patch16_sapiens2", dict(img_size=(48, 32))),  # grouped-query attention, registers, packed SwiGLU
    ("vit_small_patch14_reg4_dinov2", dict(depth=2, img_size=70, num_classes=10)),  # registers
    ("vit_relpos_medium_patch16_cls_224", dict(depth=2, img_size=64)),  # a bias MLP in every layer
    ("vit_srelpos_small_patch16_224", dict(depth=2, img_size=64)),  # one bias MLP for all
    ("vit_dwee_patch16_reg1_gap_256", dict(depth=2, img_size=64)),  # differential attention: two maps
    ("vit_dpwee_patch16_reg1_gap_256", dict(depth=2, img_size=64)),  # parallel blocks, differential
    ("vit_pwee_patch16_reg1_gap_256", dict(depth=2, img_size=64)),  # parallel blocks
    ("deepseek_vit_412m_align", dict(depth=2, img_size=(56, 70), embed_dim=64, num_heads=4, mlp_dim=176,
                                     projector_dim=48, num_classes=10)),  # DeepSeek's VLM projector, padded blocks
    ("samvit_base_patch16", dict(depth=3, img_size=(80, 112), embed_dim=64, num_heads=4, window_size=3, neck_chans=32,
                                 global_attn_indexes=(1,), num_classes=10)),  # SAM: padded windows, offsets, neck
    ("gemma4_vit_570m", dict(depth=2, img_size=(48, 80), embed_dim=64, num_heads=4, kv_heads=2, mlp_dim=96,
                             num_classes=10)),  # Gemma 4: separate q/k/v/o, grouped-query, the gated MLP
    ("gemma4_vit_167m_enc", dict(depth=1, img_size=(96, 48), embed_dim=64, num_heads=4, mlp_dim=96)),  # soft tokens
    ("qwen3_vit_88m_merge", dict(depth=2, img_size=(64, 96), embed_dim=64, num_heads=4, projector_dim=48,
                                 num_classes=10)),  # Qwen's merger
])
def test_macs_of_the_later_vits_match_flop_counter(name, kw):
    model = vitkit.create_model(name, **kw).eval().requires_grad_(False)
    counter = FlopCounterMode(display=False)
    with counter:
        model(torch.randn(1, 3, *model.config.img_size), return_attention=True)
    c = complexity(model.config)
    assert counter.get_total_flops() == c.flops
    assert c.params == sum(p.numel() for p in model.parameters())


def test_reference_numbers():
    c = complexity(get_model_config("vit_base_patch16_224"))
    assert round(c.macs / 1e9, 1) == 17.6 and c.tokens == 197  # the DeiT paper's "17.6 GFLOPs" are MACs


def test_counting_leaves_torch_init_as_it_was_even_when_a_build_fails():
    from torch.nn import init

    from vitkit.models.complexity import count_params
    before = {n: getattr(init, n) for n in dir(init) if n.endswith("_") and not n.startswith("_")}
    config = get_model_config("Ti/16").replace(img_size=32, patch_size=8, depth=2)
    model = vitkit.VisionTransformer(config)
    assert count_params(config) == sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError):
        count_params(config.replace(pos_embed="sincos2d", embed_dim=190))  # 190 is not a multiple of 4
    assert {n: getattr(init, n) for n in before} == before
    torch.manual_seed(0)
    assert vitkit.VisionTransformer(config).blocks[0].mlp.fc1.weight.std() > 0  # real builds still initialise


def test_a_model_built_in_another_thread_while_one_is_counted_is_initialised(monkeypatch):
    import threading

    from vitkit.models import complexity as module
    config = get_model_config("Ti/16").replace(img_size=32, patch_size=8, depth=2)
    built = []

    def build_beside_the_count(c):  # inside count_params: torch.nn.init is patched right now
        other = threading.Thread(target=lambda: built.append(vitkit.VisionTransformer(config)))
        other.start()
        other.join()
        return vitkit.VisionTransformer(c)

    monkeypatch.setattr(module, "build_from_config", build_beside_the_count)
    torch.manual_seed(0)
    assert module.count_params(config) == sum(p.numel() for p in built[0].parameters())
    model = built[0]  # initialised through torch.nn.init, not torch.empty's leftovers (zeros, here)
    assert model.patch_embed.proj.weight.std() > 0.01 and model.pos_embed.std() > 0.01
    assert torch.equal(model.blocks[0].norm1.weight, torch.ones(config.embed_dim))


def test_a_fixed_table_is_made_on_the_cpu_and_lands_on_the_default_device():
    import subprocess
    import sys

    from vitkit.models.positions import relative_position_index, sincos_2d_pos_embed
    with torch.device("meta"):
        table, index = sincos_2d_pos_embed((3, 4), 16), relative_position_index((3, 4), 1)
    assert table.is_meta and index.is_meta
    assert table.shape == sincos_2d_pos_embed((3, 4), 16).shape and index.shape == (13, 13)
    for grid, prefix in (((3, 5), 0), ((5, 3), 1)):  # meta: allocated from its shape, not computed (2 GiB at 2,048 px)
        with torch.device("meta"):
            meta = relative_position_index(grid, prefix)
        assert meta.is_meta and meta.shape == relative_position_index(grid, prefix).shape == (15 + prefix, 15 + prefix)
    with torch.device("meta"), pytest.raises(ValueError, match="0 or 1 prefix tokens"):
        relative_position_index((3, 4), 2)
    # counting the default model's parameters (every `vitkit train` does) never reaches torch._dynamo
    code = ("import sys; from vitkit.models import get_model_config; from vitkit.models.complexity import "
            "count_params; count_params(get_model_config('vit_fmnist_hybrid')); print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_count_inside_a_build_being_counted_neither_deadlocks_nor_leaves_init_patched(monkeypatch):
    from torch.nn import init

    from vitkit.models import complexity as module
    config = get_model_config("Ti/16").replace(img_size=32, patch_size=8, depth=2)
    original, build, inner = init.trunc_normal_, module.build_from_config, {}

    def build_that_counts(c):  # a builder that asks for a count of its own (once)
        if "asked" not in inner:
            inner["asked"] = True
            inner["count"] = module.count_params(c)
        return build(c)

    monkeypatch.setattr(module, "build_from_config", build_that_counts)
    real = sum(p.numel() for p in vitkit.VisionTransformer(config).parameters())
    assert module.count_params(config) == inner["count"] == real
    assert init.trunc_normal_ is original
