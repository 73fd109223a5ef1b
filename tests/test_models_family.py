"""A model family is one file: a toy family defined here alone works everywhere.

The family below (a ViT whose residual branches are scaled by one learned gate per layer)
is a config, a module and its :class:`vitkit.models.Family`, registered from this file.
``create_model``, ``vitkit info``, save/load, the timm layout (export and import read off
the shapes) and ``vitkit inspect`` then work on it with no other file of vitkit touched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.cli import main as cli
from vitkit.models import Family, TokenConfig, TokenModel, positions, register_family, register_model
from vitkit.models.complexity import complexity, token_complexity
from vitkit.models.layers import Block, PatchEmbed
from vitkit.weights import WeightsError


@dataclass
class ToyConfig(TokenConfig):
    """A ViT with one learned gate per layer on its residual branches."""

    KIND: ClassVar[str] = "Toy"

    img_size: Any = (16, 16)
    patch_size: Any = (4, 4)
    num_classes: int = 5
    embed_dim: int = 32
    depth: int = 2
    num_heads: int = 2
    mlp_dim: int = 64
    gate_init: float = 0.5
    architecture: str = "toy"

    def family_problems(self) -> List[str]:
        return [] if self.gate_init > 0 else [f"gate_init must be > 0, got {self.gate_init}"]


class ToyModel(TokenModel):
    config_cls = ToyConfig

    def __init__(self, config=None, **overrides):
        super().__init__(config, **overrides)
        cfg, D = self.config, self.config.embed_dim
        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.num_prefix_tokens = 1
        positions.build(self, "learned", self.patch_embed.grid_size, D, slots=1)
        self.blocks = nn.ModuleList([Block(D, cfg.num_heads, cfg.mlp_dim) for _ in range(cfg.depth)])
        self.toy_gate = nn.Parameter(torch.full((cfg.depth,), cfg.gate_init))
        self.norm = nn.LayerNorm(D, eps=cfg.norm_eps)
        self.head = self._new_head(cfg.num_classes)
        nn.init.normal_(self.pos_embed, std=0.02)

    def prefix_tokens(self, batch):
        return [self.cls_token.expand(batch, -1, -1)]

    def _layer(self, i, blk, x, grid, return_attention):
        y, attn = self._checkpointed(blk, x, return_attention)
        return x + self.toy_gate[i] * (y - x), attn


def toy_complexity(config: ToyConfig):
    D, M, n = config.embed_dim, config.mlp_dim, config.grid_size[0] * config.grid_size[1] + 1
    (ph, pw), C = config.patch_size, config.in_chans
    mix = 2 * n * n * D
    per_block = 4 * n * D * D + mix + 2 * n * D * M
    macs = (n - 1) * D * C * ph * pw + config.depth * per_block + D * config.num_classes
    return token_complexity(config, macs, config.depth * mix, n)


def infer_toy_config(sd: Dict[str, torch.Tensor], **overrides) -> ToyConfig:
    D, C, ph, pw = sd["patch_embed.proj.weight"].shape
    side = int(round((sd["pos_embed"].shape[1] - 1) ** 0.5))
    kw = dict(embed_dim=D, in_chans=C, patch_size=(ph, pw), img_size=(side * ph, side * pw),
              depth=sd["toy_gate"].shape[0], mlp_dim=sd["blocks.0.mlp.fc1.weight"].shape[0],
              num_classes=sd["head.weight"].shape[0], num_heads=2)
    return ToyConfig(**{**kw, **overrides})


@pytest.fixture(scope="module")
def toy_family():
    family = register_family(Family(
        name="toy", config_cls=ToyConfig, model_cls=ToyModel, complexity=toy_complexity,
        matches=lambda keys: "toy_gate" in keys, infer_config=infer_toy_config, detect_priority=20))
    register_model("toy_tiny", ToyConfig(), "the test's toy family")
    yield family
    vitkit.models.unregister_family("toy")


def randomized(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


def test_create_model_builds_the_toy_and_its_config_is_checked(toy_family):
    model = vitkit.create_model("toy_tiny", num_classes=3)
    assert isinstance(model, ToyModel) and model.config.num_classes == 3
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 3)
    tokens, maps = model.forward_intermediates(torch.randn(1, 3, 16, 16), indices=1)
    assert tokens.shape == (1, 17, 32) and maps[0].shape == (1, 32, 4, 4)
    with pytest.raises(ValueError, match="invalid Toy config: .*gate_init must be > 0"):
        vitkit.create_model("toy_tiny", gate_init=0.0)
    assert "toy_tiny" in vitkit.list_models("toy*")


def test_vitkit_info_counts_the_toy_as_pytorch_does(toy_family, capsys):
    assert cli(["info", "toy_tiny", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    model = vitkit.create_model("toy_tiny")
    assert info["params"] == sum(p.numel() for p in model.parameters()) and info["tokens"] == 17
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():  # the explicit attention path: its matrix products are counted
        model(torch.randn(1, 3, 16, 16), return_attention=True)
    assert counter.get_total_flops() == complexity(model.config).flops == info["flops"]


def test_save_load_and_the_timm_layout_round_trip(toy_family, tmp_path):
    model = randomized(vitkit.create_model("toy_tiny"))
    x = torch.randn(2, 3, 16, 16)
    model.save_pretrained(tmp_path / "native")
    back = vitkit.from_pretrained(tmp_path / "native")
    assert isinstance(back, ToyModel) and back.config == model.config
    path = vitkit.export_weights(model, tmp_path / "toy.safetensors", "timm")
    bare = vitkit.from_pretrained(path)  # no config: the toy family recognises its keys and reads the shapes
    assert isinstance(bare, ToyModel) and bare.config.depth == 2
    with torch.no_grad():
        assert torch.equal(back(x), model(x)) and torch.equal(bare(x), model(x))
    with pytest.raises(WeightsError, match="architecture 'toy'.* no official JAX layout"):
        vitkit.export_weights(model, tmp_path / "toy.npz", "npz")


def test_vitkit_inspect_writes_every_figure_of_the_toy(toy_family, tmp_path, capsys):
    pytest.importorskip("skimage")
    randomized(vitkit.create_model("toy_tiny")).save_pretrained(tmp_path / "toy")
    assert cli(["inspect", "--weights", str(tmp_path / "toy"), "--out", str(tmp_path / "out"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"attention_per_layer", "attention_distance", "position_embedding_similarity",
            "filter_pca", "rollout_1"} <= set(result["figures"])
    assert (tmp_path / "out" / "report.html").stat().st_size > 10_000
