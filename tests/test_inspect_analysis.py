"""The paper's analyses, checked by properties with known answers (not snapshots)."""

import itertools
import math
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


def test_cait_class_attention_layers_in_rollout_and_distance():
    """CaiT: self-attention over patches, then class attention where only the class token's
    row is updated. The rollout is a distribution over the patches; the distance has one row
    per self-attention layer (class attention has no patch queries)."""
    from vitkit.models.cait import CaiT, CaiTConfig

    model = randomize(CaiT(CaiTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, cls_depth=2,
                                      num_heads=2, num_classes=3))).eval()
    x = torch.randn(2, 3, 32, 32)
    maps = attention_maps(model, x)
    assert [tuple(m.shape[-2:]) for m in maps] == [(16, 16), (16, 16), (1, 17), (1, 17)]
    rollout = attention_rollout(model, x)
    assert rollout.shape == (2, 4, 4) and torch.allclose(rollout.sum(dim=(1, 2)), torch.ones(2), atol=1e-5)
    assert mean_attention_distance(model, x).shape == (2, 2)


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
