"""The paper's analyses, checked by properties with known answers (not snapshots)."""

import itertools
import math
import re
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import vitkit
from conftest import randomize
from vitkit.inspect import (
    attention_maps,
    attention_rollout,
    embedding_filters_pca,
    mean_attention_distance,
    pos_embed_similarity,
)
from vitkit.models import VisionTransformer, ViTConfig


def tiny(**kw):
    base = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=4, mlp_dim=64, num_classes=5)
    base.update(kw)
    return randomize(VisionTransformer(ViTConfig(**base)))


def uniform_attention(model):
    """Zero q and k projections: every logit equal, so every query attends uniformly."""
    with torch.no_grad():
        for blk in model.blocks:
            D = blk.attn.qkv.weight.shape[1]
            blk.attn.qkv.weight[:2 * D] = 0
            blk.attn.qkv.bias[:2 * D] = 0
    return model


class FixedAttention(nn.Module):
    """A stand-in model whose attention is whatever the test says."""

    def __init__(self, attn, patch_size=8, class_token=True, global_pool="token"):
        super().__init__()
        self.attn = attn
        self.config = SimpleNamespace(global_pool=global_pool)
        self.patch_embed = nn.Module()
        self.patch_embed.patch_size = (patch_size, patch_size)
        self.patch_embed.grid_for = lambda size: (size[0] // patch_size, size[1] // patch_size)
        self.num_prefix_tokens = 1 if class_token else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 4)) if class_token else None

    def forward(self, x, return_attention=False):
        return torch.zeros(x.shape[0], 2), [self.attn] * 3


def test_identity_attention_leaves_no_patch_mass_and_uniform_gives_a_uniform_map():
    N = 1 + 16
    identity = torch.eye(N).expand(2, 4, N, N)
    assert attention_rollout(FixedAttention(identity), torch.zeros(2, 3, 32, 32)).abs().sum() == 0
    model = uniform_attention(tiny())
    rollout = attention_rollout(model, torch.randn(2, 3, 32, 32))
    assert rollout.shape == (2, 4, 4)
    assert torch.allclose(rollout, torch.full_like(rollout, 1 / 16), atol=1e-6)


def test_the_rollout_follows_what_the_readout_reads():
    """A class token beside an average-pooled readout (open_clip's CLIPA towers): the map followed the class
    token, which the readout never reads (with identity attention: an empty map, where every patch counts)."""
    N = 1 + 16
    identity = torch.eye(N).expand(2, 4, N, N)
    for pool, expected in (("avg", 1 / 16), ("token_avg", 1 / 16), ("token", 0.0)):
        rollout = attention_rollout(FixedAttention(identity, global_pool=pool), torch.zeros(2, 3, 32, 32))
        assert torch.allclose(rollout, torch.full_like(rollout, expected), atol=1e-6), pool
    focused = torch.eye(N).repeat(2, 4, 1, 1)
    focused[:, :, 0] = 0
    focused[:, :, 0, 5] = 1  # the class token attends to one patch only
    half = attention_rollout(FixedAttention(focused, global_pool="token_avg"), torch.zeros(2, 3, 32, 32))
    # the class row holds 7/8 on that patch after 3 layers, the patch rows 1/16 each: half of the map is there
    assert half.flatten(1)[:, 4].tolist() == pytest.approx([0.5] * 2, abs=1e-6)


def test_a_distilled_deits_rollout_reads_both_tokens_its_heads_average():
    """A distilled DeiT's logits are the mean of the class and distillation heads: the map followed the class
    token alone (0.06 off the averaged rows on a peaked model)."""
    N = 2 + 16
    attn = torch.eye(N).repeat(2, 4, 1, 1)
    attn[:, :, 0] = 0
    attn[:, :, 0, 2] = 1  # the class token attends to patch 0, the distillation token to patch 15
    attn[:, :, 1] = 0
    attn[:, :, 1, 17] = 1
    model = vitkit.create_model("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, depth=3)
    fixed = FixedAttention(attn, global_pool="token")
    fixed.head_dist, fixed.num_prefix_tokens, fixed.cls_token = model.head_dist, 2, model.cls_token
    rollout = attention_rollout(fixed, torch.zeros(2, 3, 32, 32)).flatten(1)
    assert rollout[:, 0].tolist() == pytest.approx(rollout[:, 15].tolist()) and rollout[0, 0] > 0.4


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_rollout_options_and_no_class_token_on_a_non_square_grid(fusion):
    model = tiny(img_size=(32, 48), class_token=False, global_pool="avg")
    rollout = attention_rollout(model, torch.randn(2, 3, 32, 48), head_fusion=fusion, discard_ratio=0.5)
    assert rollout.shape == (2, 4, 6) and (rollout >= 0).all()
    assert torch.allclose(rollout.sum(dim=(1, 2)), torch.ones(2), atol=1e-5)
    with pytest.raises(ValueError, match="head_fusion"):
        attention_rollout(model, torch.randn(1, 3, 32, 48), head_fusion="median")


def test_mean_distance_is_zero_for_self_attention_and_analytic_for_uniform():
    N = 1 + 16
    self_only = torch.eye(N).expand(2, 4, N, N)
    assert mean_attention_distance(FixedAttention(self_only), torch.zeros(2, 3, 32, 32)).abs().max() == 0

    g, p = 4, 8
    cells = list(itertools.product(range(g), range(g)))
    analytic = sum(p * math.dist(a, b) for a in cells for b in cells) / len(cells) ** 2
    model = uniform_attention(tiny())  # with a class token: excluded, rows renormalised over patches
    distance = mean_attention_distance(model, torch.randn(3, 3, 32, 32))
    assert distance.shape == (3, 4)
    assert torch.allclose(distance, torch.full_like(distance, analytic), atol=1e-4)


def test_a_query_that_gives_a_prefix_token_almost_all_its_attention_keeps_its_distance():
    """A register sink: a patch query with 1e-13 of its attention on the patches was renormalised against a 1e-12
    floor in float32 and counted as 0 px, pulling its head's mean down (0.5-1 px on a DINOv2 with registers). Its
    patch attention, renormalised, is still a distance; a query with none on the patches is left out."""
    N = 1 + 16
    uniform = torch.full((1, 1, N, N), 1 / N)
    sink = uniform.clone()
    sink[:, :, 1:9] = 0
    sink[:, :, 1:9, 0] = 1 - 16e-14  # half the patch queries: almost everything on the class token
    sink[:, :, 1:9, 1:] = 1e-14
    none = uniform.clone()
    none[:, :, 1:9] = 0
    none[:, :, 1:9, 0] = 1  # and exactly nothing on the patches: no distance, left out
    want = mean_attention_distance(FixedAttention(uniform), torch.zeros(1, 3, 32, 32))
    for maps in (sink, none):
        got = mean_attention_distance(FixedAttention(maps), torch.zeros(1, 3, 32, 32))
        assert torch.allclose(got, want, atol=1e-4), (got, want)


def test_sincos_similarity_is_one_on_the_diagonal_and_falls_with_distance():
    model = tiny(img_size=64, patch_size=8, embed_dim=64, pos_embed="sincos2d", class_token=False, global_pool="avg")
    sim = pos_embed_similarity(model)
    assert sim.shape == (8, 8, 8, 8)
    diag = torch.stack([sim[i, j, i, j] for i in range(8) for j in range(8)])
    assert torch.allclose(diag, torch.ones(64), atol=1e-5)
    along_row = sim[0, 0, 0, :4]
    assert (along_row[1:] < along_row[:-1]).all()  # from a corner, the next patches less and less similar
    cells = torch.tensor(list(itertools.product(range(8), range(8))), dtype=torch.float32)
    dist = torch.cdist(cells, cells)
    flat = sim.reshape(64, 64)
    by_distance = [flat[(dist > lo) & (dist <= hi)].mean() for lo, hi in ((0, 1), (1, 3), (3, 6), (6, 11))]
    assert all(a > b for a, b in zip(by_distance, by_distance[1:]))  # on average, falls with grid distance


def test_learned_similarity_on_a_non_square_grid():
    sim = pos_embed_similarity(tiny(img_size=(32, 48)))
    assert sim.shape == (4, 6, 4, 6)
    assert torch.allclose(sim[1, 2, 1, 2], torch.tensor(1.0))
    with pytest.raises(ValueError, match="no position"):
        pos_embed_similarity(tiny(pos_embed="none"))


def test_the_similarity_figure_lays_each_positions_tile_where_the_position_is(tmp_path, monkeypatch):
    """The figure is one image of tiles (a subplot a tile took seconds at 14x14): tile (i, j) is position (i, j)'s
    similarity map, on a non-square grid too, with background between tiles."""
    import matplotlib.axes
    import numpy as np

    from vitkit.inspect.figures import pos_embed_similarity_grid

    shown = []
    draw = matplotlib.axes.Axes.imshow
    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", lambda ax, data, **kw: shown.append(data) or draw(ax, data,
                                                                                                          **kw))
    sim = torch.arange(4 * 6 * 4 * 6, dtype=torch.float32).reshape(4, 6, 4, 6) / (4 * 6 * 4 * 6)
    assert pos_embed_similarity_grid(sim, tmp_path / "s.png").stat().st_size > 1000
    (mosaic,) = shown
    gap = 1
    for i, j in itertools.product(range(4), range(6)):
        top, left = i * (4 + gap), j * (6 + gap)
        assert np.array_equal(mosaic[top:top + 4, left:left + 6], sim[i, j].numpy())
    assert mosaic.mask[4].all() and mosaic.mask[:, 6].all()  # the gaps: drawn as background


def test_a_large_grids_similarity_figure_draws_evenly_spaced_positions(tmp_path, monkeypatch):
    """SAM's 64x64 grid drew 4,096 tiles into a 59-inch figure (most of a 10-minute inspection); past 16 a side
    the tiles are of evenly spaced positions, the first and last kept, and the title says how many."""
    import matplotlib.axes
    import numpy as np

    from vitkit.inspect.figures import MAX_TILES, pos_embed_similarity_grid

    shown, titles = [], []
    draw, title = matplotlib.axes.Axes.imshow, matplotlib.axes.Axes.set_title
    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", lambda ax, data, **kw: shown.append(data) or draw(ax, data,
                                                                                                          **kw))
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda ax, text, **kw: titles.append(text) or title(
        ax, text, **kw))
    sim = torch.rand(40, 20, 40, 20, generator=torch.Generator().manual_seed(0))
    pos_embed_similarity_grid(sim, tmp_path / "s.png")
    (mosaic,), gap = shown, round(0.15 * 40)
    assert mosaic.shape == (MAX_TILES * (40 + gap) - gap, MAX_TILES * (20 + gap) - gap)
    assert np.array_equal(mosaic[:40, :20], sim[0, 0].numpy())  # the first position
    last = (MAX_TILES - 1) * (40 + gap), (MAX_TILES - 1) * (20 + gap)
    assert np.array_equal(mosaic[last[0]:last[0] + 40, last[1]:last[1] + 20], sim[39, 19].numpy())  # the last
    assert titles == [f"position embedding similarity ({MAX_TILES}x{MAX_TILES} of 40x20 positions)"]


def test_filter_pca_components_orthonormal_and_variance_sorted():
    model = tiny(embed_dim=64)
    comps, explained = embedding_filters_pca(model, k=28)
    assert comps.shape == (28, 3, 8, 8)
    flat = comps.reshape(28, -1)
    assert torch.allclose(flat @ flat.T, torch.eye(28), atol=1e-5)
    assert (explained[1:] <= explained[:-1]).all() and explained.sum() <= 1 + 1e-6


def test_inspection_never_changes_the_logits():
    model = tiny(drop_rate=0.0)
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    before = model(x)
    maps = attention_maps(model, x)
    attention_rollout(model, x)
    mean_attention_distance(model, x)
    assert len(maps) == 3 and maps[0].shape == (2, 4, 17, 17)
    assert torch.allclose(maps[0].sum(-1), torch.ones(2, 4, 17), atol=1e-5)
    assert torch.equal(model(x), before)  # the fused path is untouched afterwards
    logits, _ = model(x, return_attention=True)
    assert torch.allclose(logits, before, atol=1e-5)


def test_filters_of_a_hybrid_are_its_first_convolution_as_applied():
    from vitkit import create_model
    from vitkit.inspect import embedding_filters

    model = create_model("vit_fmnist_hybrid")
    filters = embedding_filters(model)
    first = model.patch_embed.backbone[0].conv
    assert filters.shape == (32, 1, 3, 3)
    assert torch.equal(filters, first.standardized_weight().detach())
    comps, explained = embedding_filters_pca(model, k=28)
    assert comps.shape == (9, 1, 3, 3) and explained.sum() <= 1 + 1e-6


def test_cait_talking_heads_maps_are_refused_as_no_distributions():
    """CaiT's talking heads mix the heads' weights after the softmax (proj_w): its maps' rows do not sum to 1 and
    hold negative weights, and the attention distance built on them came out at -1e12 px. Refused in one line, as
    differential attention is (timm's CaiT is the reference: its maps are the same)."""
    import timm

    from vitkit.models.cait import CaiT, CaiTConfig

    model = randomize(CaiT(CaiTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, cls_depth=2,
                                      num_heads=2, num_classes=3))).eval()
    ref = timm.create_model("cait_xxs24_224", img_size=32, patch_size=8, embed_dim=32, depth=2, depth_token_only=2,
                            num_heads=2, num_classes=3).eval()
    ref.load_state_dict(model.state_dict())
    seen = []
    ref.blocks[0].attn.proj_w.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        ref(torch.randn(2, 3, 32, 32))
    rows = seen[0].sum(dim=-1)  # (B, N, N, heads) after proj_w: summed over the keys
    assert (rows - 1).abs().max() > 1e-3 or (seen[0] < 0).any()  # no distribution, in timm's own model
    for analysis in (attention_maps, attention_rollout, mean_attention_distance):
        with pytest.raises(ValueError, match=r"need maps whose rows are distributions; this model's talking-heads "
                                             r"attention \(CaiT's\) mixes the heads' weights after the softmax"):
            analysis(model, torch.randn(2, 3, 32, 32))


def test_token_norms_are_the_last_blocks_tokens_and_fence_their_outliers():
    """The norm after the last block (before the final norm) of every patch and prefix token; Tukey's far-out
    fence over the patch norms marks outliers (one planted token is found, the rest are not)."""
    from vitkit.inspect import token_norms

    torch.manual_seed(0)
    model = vitkit.create_model("vit_small_patch14_reg4_dinov2", depth=2, img_size=56, num_classes=3).eval()
    x = torch.randn(2, 3, 56, 56)
    norms = token_norms(model, x)
    with torch.no_grad():
        tokens, _ = model.embed(x)
        for i, blk in enumerate(model.blocks):
            tokens, _ = model._layer(i, blk, tokens, (4, 4), False)
    expected = tokens.norm(dim=-1)
    assert norms.patches.shape == (2, 4, 4) and norms.prefix.shape == (2, 5)  # class + 4 registers
    assert torch.allclose(norms.patches.reshape(2, -1), expected[:, 5:], atol=1e-5)
    assert torch.allclose(norms.prefix, expected[:, :5], atol=1e-5)
    assert norms.outlier_share == 0.0
    q1, q3 = torch.quantile(norms.patches.flatten(), torch.tensor([0.25, 0.75]))
    outliers = token_norms(model, x, fence=float(norms.patches.max()) - 1e-4).outliers
    assert outliers.sum() == 1 and q3 + 3 * (q3 - q1) == pytest.approx(norms.fence)


def test_prefix_attention_splits_the_patches_attention_between_class_and_registers():
    from vitkit.inspect import attention_maps, prefix_attention

    torch.manual_seed(0)
    model = vitkit.create_model("vit_small_patch14_reg4_dinov2", depth=2, img_size=56, num_classes=3).eval()
    x = torch.randn(2, 3, 56, 56)
    shares = prefix_attention(model, x)
    maps = attention_maps(model, x)
    assert shares["class"].shape == shares["registers"].shape == (2,)
    assert torch.allclose(shares["registers"][1], maps[1][:, :, 5:, 1:5].sum(-1).mean(), atol=1e-6)
    assert torch.allclose(shares["class"][0], maps[0][:, :, 5:, 0].mean(), atol=1e-6)
    plain = vitkit.create_model("vit_fmnist", depth=1)
    assert prefix_attention(plain, torch.randn(1, 1, 28, 28))["registers"].tolist() == [0.0]


def test_a_flat_map_is_drawn_flat_and_a_cropped_margin_unread(tmp_path):
    """A uniform rollout (every patch 1/16, a spread of 6e-7 from rounding) was min-max stretched into a full
    black-to-white gradient, and the 'input x rollout' panel dimmed half the image; a crop_remainder model's map
    was stretched over the margin no patch reads."""
    import numpy as np
    from PIL import Image

    from vitkit.inspect import figures

    flat = torch.full((4, 4), 1 / 16) + torch.randn(4, 4) * 1e-9
    assert figures.is_flat(flat) and not figures.is_flat(torch.arange(16.0).reshape(4, 4))
    image = np.full((40, 40, 3), 200, np.uint8)
    figures.rollout_overlay(image, flat, tmp_path / "flat.png")
    drawn = np.asarray(Image.open(tmp_path / "flat.png").convert("L"), np.float32)
    third = drawn.shape[1] // 3  # the middle panel, the map: one colour, no gradient
    middle = drawn[drawn.shape[0] // 4: 3 * drawn.shape[0] // 4, third + third // 4: 2 * third - third // 4]
    assert middle.std() < 2, middle.std()
    config = SimpleNamespace(crop_remainder=True, patch_size=(16, 16))
    assert figures.covered_pixels(config, (2, 2)) == (32, 32)
    assert figures.covered_pixels(SimpleNamespace(crop_remainder=False, patch_size=(16, 16)), (2, 2)) is None
    assert figures.covered_pixels(SimpleNamespace(crop_remainder=True, patch_size=(16, 16), backbone={"x": 1}),
                                  (2, 2)) is None  # a hybrid reads every pixel through its CNN
    ramp = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    plt = __import__("vitkit.utils", fromlist=["pyplot"]).pyplot()
    drawn = []
    real = plt.Axes.imshow
    with pytest.MonkeyPatch.context() as patch:  # what the map panel is given: grey (masked) past the 32 px read
        patch.setattr(plt.Axes, "imshow", lambda self, data, **kw: drawn.append(data) or real(self, data, **kw))
        figures.rollout_overlay(image, ramp, tmp_path / "cropped.png", covered=(32, 32))
    heat = drawn[1]
    assert heat.shape == (40, 40) and heat.mask[32:, :].all() and heat.mask[:, 32:].all()
    assert not heat.mask[:32, :32].any() and heat[:32, :32].min() == 0 and heat[:32, :32].max() == 1


def test_bad_inputs_to_the_analyses_are_one_value_error_each():
    """No images gave 0 px of attention distance, NaN shares and torch's reshape error; a NaN fence found no
    outlier ever, a string fence or discard ratio ended in a TypeError."""
    from vitkit.inspect import prefix_attention, token_norms

    model = tiny()
    none = torch.randn(0, 3, 32, 32)
    for analysis in (mean_attention_distance, prefix_attention, token_norms, attention_rollout):
        with pytest.raises(ValueError, match=r"tensor of one image or more, got \(0, 3, 32, 32\)"):
            analysis(model, none)
    x = torch.randn(2, 3, 32, 32)
    for fence in (float("nan"), "3", float("inf")):
        with pytest.raises(ValueError, match="fence must be a finite number"):
            token_norms(model, x, fence=fence)
    with pytest.raises(ValueError, match="discard_ratio must be in"):
        attention_rollout(model, x, discard_ratio="0.5")


def test_a_model_without_a_table_says_how_it_knows_positions():
    """A RoPE model was said to have pos_embed='none', as if it knew nothing of where its patches are."""
    for model, said in ((vitkit.create_model("vit_small_patch16_rope_224", depth=1, img_size=32), "rotary"),
                        (tiny(pos_embed="relative"), "relative biases (relative)"),
                        (tiny(pos_embed="none"), "no position embedding (pos_embed='none')")):
        with pytest.raises(ValueError, match=re.escape(said)):
            pos_embed_similarity(model)
