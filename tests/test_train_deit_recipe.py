"""DeiT's training recipe: model EMA, the recipe's values, and a short run with every piece on."""

import json

import pytest
import torch
from torch import nn

import vitkit
from vitkit.data import fashion_mnist as fm
from vitkit.train import resolve_config, train
from vitkit.train.ema import ModelEma

real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")


def test_ema_follows_the_recurrence_after_every_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    decay, steps = 0.9, 7
    ema = ModelEma(model, decay)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    history = []
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(5, 3)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        ema.update(model)
        history.append({k: v.clone() for k, v in model.state_dict().items()})
    for name, value in ema.state_dict().items():
        if not value.is_floating_point():  # BatchNorm's step counter is copied
            assert torch.equal(value, history[-1][name])
            continue
        # e_N = d^N e_0 + sum_i (1 - d) d^(N - i) p_i
        expected = decay ** steps * start[name]
        for i, snap in enumerate(history, start=1):
            expected = expected + (1 - decay) * decay ** (steps - i) * snap[name]
        assert torch.allclose(value, expected, atol=1e-6), name
    assert not ema.module.training and not any(p.requires_grad for p in ema.module.parameters())
    with pytest.raises(ValueError, match="ema_decay"):
        ModelEma(model, 1.0)
    with pytest.raises(ValueError, match="ema_decay must be"):
        resolve_config("fmnist", ema_decay=1.5)


def tiny(tmp_path, name, **kw):
    base = dict(model="vit_fmnist", model_args={"depth": 1, "embed_dim": 32, "num_heads": 2, "mlp_dim": 64},
                max_steps=20, batch_size=32, warmup_steps=3, val_size=256, out=str(tmp_path), name=name,
                checkpoint_every=10, keep_checkpoints=5, progress=False, threads=1, eval_batch_size=512,
                tensorboard=False)
    base.update(kw)
    return resolve_config("fmnist", **base)


@real
def test_a_run_with_ema_reports_and_saves_the_average(tmp_path):
    summary = train(tiny(tmp_path, "ema", max_steps=6, checkpoint_every=3, ema_decay=0.9))
    assert 0.0 <= summary["test_top1_ema"] <= 1.0 and "val_top1_ema" in summary
    raw = vitkit.from_pretrained(tmp_path / "ema" / "model")
    avg = vitkit.from_pretrained(tmp_path / "ema" / "model_ema")
    assert raw.config == avg.config
    assert any(not torch.equal(a, b) for a, b in zip(raw.state_dict().values(), avg.state_dict().values()))
    ckpt = torch.load(tmp_path / "ema" / "checkpoints" / "step_00000006.pt", weights_only=True)
    assert all(torch.equal(ckpt["ema"][k], v) for k, v in avg.state_dict().items())


@pytest.mark.parametrize("world,accum", [(1, 1), (3, 1), (2, 2), (4, 1)])
def test_repeated_augmentation_shows_each_selected_sample_k_times_across_ranks(world, accum):
    from collections import Counter

    from vitkit.train.batches import Layout, index_plan

    n, batch, k = 600, 48, 3
    seen, per_rank = Counter(), []
    for rank in range(world):
        layout = Layout(batch, accum, world, rank)
        steps = n // batch
        mine = [layout.mine(idx) for _, _, idx in index_plan(n, 7, layout, 0, steps, repeats=k)]
        ranks_share = torch.cat(mine).tolist()
        per_rank.append(len(ranks_share))
        seen.update(ranks_share)
        # resuming mid-epoch gives the same indices from there on
        later = [layout.mine(idx) for _, _, idx in index_plan(n, 7, layout, 5, steps, repeats=k)]
        assert torch.equal(torch.cat(later), torch.cat(mine[5 * accum:]))
    assert sum(per_rank) == (n // batch) * batch  # an epoch keeps (about) the dataset's size
    counts = Counter(seen.values())
    # every index that appears appears k times, up to the rounding at the epoch's end
    assert counts[k] >= len(seen) - 2 and set(counts) <= set(range(1, k + 1))
    assert len(seen) == pytest.approx(n / k, abs=batch / k + 2)
    # timm's RepeatAugSampler: rank r deals positions r, r + world, ... of the repeated permutation
    if world == k:  # each rank then holds one copy of each selected index
        assert all(c == k for c in seen.values())
    # without repeats: a plain permutation
    plain = torch.cat([idx for _, _, idx in index_plan(n, 7, Layout(batch, 1, 1, 0), 0, n // batch)])
    assert len(set(plain.tolist())) == len(plain)


def test_repeated_aug_refuses_shards_and_bad_values(tmp_path):
    with pytest.raises(ValueError, match="repeated_aug must be"):
        resolve_config("fmnist", repeated_aug=0)
    with pytest.raises(ValueError, match="tar shards"):
        train(resolve_config("fmnist", dataset="shards", data_dir=str(tmp_path), repeated_aug=3,
                             out=str(tmp_path), name="x", progress=False))
    assert not (tmp_path / "x").exists()
