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
                max_steps=20, batch_size=32, warmup_steps=3, val_size=256, runs_dir=str(tmp_path), name=name,
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
                             runs_dir=str(tmp_path), name="x", progress=False))
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="test_size needs indexable data"):  # a stream has no "first N"
        train(resolve_config("fmnist", dataset="shards", data_dir=str(tmp_path), test_size=100,
                             runs_dir=str(tmp_path), name="x", progress=False))
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="test_size must be >= 1"):
        resolve_config("fmnist", test_size=0)
    with pytest.raises(ValueError, match="fewshot only applies to pre-training"):  # a config file's stray switch
        resolve_config("fmnist", fewshot=False)


def test_the_deit_recipe_resolves_to_the_papers_values():
    cfg = resolve_config("deit")
    assert cfg.optimizer == "adamw" and cfg.betas == (0.9, 0.999)
    assert cfg.lr == pytest.approx(5e-4 * cfg.batch_size / 512) and cfg.lr_scale_batch is None
    assert (cfg.weight_decay, cfg.schedule, cfg.warmup_epochs, cfg.min_lr, cfg.epochs, cfg.clip_grad) == \
        (0.05, "cosine", 5.0, 1e-5, 300.0, None)
    assert (cfg.randaugment, cfg.mixup, cfg.cutmix, cfg.mixup_switch_prob, cfg.random_erasing) == \
        ("m9-mstd0.5", 0.8, 1.0, 0.5, 0.25)
    assert cfg.model_args == {"drop_path_rate": 0.1}
    assert (cfg.repeated_aug, cfg.label_smoothing, cfg.ema_decay) == (3, 0.1, 0.99996)
    # the linear scaling rule follows the run's batch: DeiT's 1024 -> 1e-3, an explicit lr is scaled too
    assert resolve_config("deit", batch_size=1024).lr == pytest.approx(1e-3)
    assert resolve_config("deit", batch_size=256, lr=1e-3).lr == pytest.approx(5e-4)
    assert resolve_config("fmnist", lr_scale_batch=256, batch_size=512, lr=0.1).lr == pytest.approx(0.2)
    assert resolve_config("fmnist").lr == 2e-3  # other recipes are not scaled


@real
@pytest.mark.slow
def test_deit_pieces_train_and_resume_bitwise(tmp_path):
    """Every piece on (RandAugment, Mixup/CutMix, erasing, repeats, drop-path, smoothing, EMA, warm-up
    epochs, soft distillation): the loss is finite, and a run resumed from its step-10 checkpoint
    ends bitwise equal to the uninterrupted one, raw and EMA weights."""
    from safetensors.torch import load_file

    teacher = tmp_path / "teacher"
    vitkit.create_model("vit_fmnist", depth=1, embed_dim=32, num_heads=2, mlp_dim=64).save_pretrained(teacher)
    deit = resolve_config("deit")
    pieces = {k: getattr(deit, k) for k in ("randaugment", "mixup", "cutmix", "random_erasing", "repeated_aug",
                                             "label_smoothing", "optimizer", "weight_decay", "clip_grad")}

    def config(name):
        return tiny(tmp_path, name, **pieces, lr=1e-3, warmup_epochs=0.003, ema_decay=0.9, log_every=5,
                    model_args={"depth": 1, "embed_dim": 32, "num_heads": 2, "mlp_dim": 64,
                                "drop_path_rate": 0.1}, distill="soft", teacher=str(teacher))

    summary = train(config("straight"))
    rows = [json.loads(r) for r in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in rows if "train_loss" in r]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert summary["steps"] == 20 and "test_top1_ema" in summary

    train(config("resumed"))
    run = tmp_path / "resumed"
    (run / "checkpoints" / "step_00000020.pt").unlink()  # as if it had stopped after step 10
    for folder in ("model", "model_ema"):
        for f in (run / folder).iterdir():
            f.unlink()
        (run / folder).rmdir()
    first_process = torch.load(run / "checkpoints" / "step_00000010.pt", weights_only=True)["seconds"]
    logs = []
    resumed = train(config("ignored"), resume=str(run), log=logs.append)
    assert any("resuming" in line and "step 10/20" in line for line in logs)
    # the run's time counts the first process's seconds up to its checkpoint, then the second's
    assert resumed["resumed_at_step"] == 10 and resumed["seconds"] > first_process > 0
    for folder in ("model", "model_ema"):
        a = load_file(tmp_path / "straight" / folder / "model.safetensors")
        b = load_file(run / folder / "model.safetensors")
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), f"resumed {folder} differs from the uninterrupted run"
