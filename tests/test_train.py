"""Training on real Fashion-MNIST: it learns, it writes a usable run, it stops cleanly."""

import json

import pytest
import torch

import vitkit
from vitkit.data import fashion_mnist as fm
from vitkit.train import NonFiniteLoss, resolve_config, train
from vitkit.train.checkpoint import checkpoint_paths, load_latest
from vitkit.train.config import DEFAULT_MODEL
from vitkit.train.data import scored_positions
from vitkit.train.schedule import lr_at

real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")


def small(tmp_path, **kw):
    base = dict(max_steps=120, runs_dir=str(tmp_path), name="run", checkpoint_every=60, progress=False,
                val_size=2000, warmup_steps=20, test_size=500)
    base.update(kw)
    return resolve_config("fmnist-adamw", **base)  # AdamW, as the bars below were calibrated (Muon: test_train_muon)


@real
@pytest.mark.slow
def test_short_run_learns_and_writes_a_usable_run(tmp_path):
    # 200 steps of 32 images, rows every 50: 40% of the images of 120 steps of 128, as far past the bars
    # below (this early, small batches learn more per image). fp32, seeds 0-3: test top-1 0.70-0.76,
    # the last row's train loss 0.60-0.64 of the first's, train accuracy up 0.33-0.36 (120 of 128,
    # seed 0: 0.76, 0.61, 0.31)
    summary = train(small(tmp_path, max_steps=200, batch_size=32, warmup_steps=10, checkpoint_every=100,
                          val_size=500, test_size=700))  # 700 test images are scored, and said so
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train_loss" in r]
    assert train_rows[-1]["train_loss"] < 0.7 * train_rows[0]["train_loss"]  # erasing and smoothing on
    assert train_rows[-1]["train_acc"] > train_rows[0]["train_acc"] + 0.2
    assert summary["test_top1"] > 0.6  # chance is 0.1
    assert summary["steps"] == 200 and summary["seconds"] > 0
    assert (run / "training_curves.png").stat().st_size > 10_000
    assert json.loads((run / "config.json").read_text())["max_steps"] == 200
    model = vitkit.from_pretrained(run / "model")
    assert model.config.label_names[0] == "T-shirt/top" and model.config.in_chans == 1
    test = fm.load_split("test")
    scored = scored_positions(len(test.labels), 700).numpy()  # the run's fixed sample
    x = (torch.from_numpy(test.images[scored])[:, None].float() / 255 - 0.2860) / 0.3530
    # in the precision the run scored in (bf16 autocast on a CPU without native bf16 is emulated: seconds)
    with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=summary["precision"] == "bf16"):
        acc = (model(x).argmax(-1).numpy() == test.labels[scored]).mean()
    assert summary["test_images"] == 700
    assert abs(acc - summary["test_top1"]) <= 3 / 700  # the saved model, on those images (bf16 batching aside)
    assert [p.name for p in checkpoint_paths(run)] == ["step_00000100.pt", "step_00000200.pt"]
    _check_tensorboard_mirrors_metrics(run, train_rows)


def _check_tensorboard_mirrors_metrics(run, train_rows):
    """When tensorboard is installed (requirements-dev), its events hold the same numbers."""
    ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = ea.EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    losses = acc.Scalars("train/loss")
    assert [e.step for e in losses] == [r["step"] for r in train_rows]
    assert losses[-1].value == pytest.approx(train_rows[-1]["train_loss"], rel=1e-6)
    assert {"val/acc", "train/lr", "final/test_top1"} <= set(acc.Tags()["scalars"])


@real
def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    import torch.nn.functional as F

    real_ce, calls = F.cross_entropy, {"n": 0}

    def poisoned(*a, **k):
        calls["n"] += 1
        out = real_ce(*a, **k)
        return out * float("nan") if calls["n"] > 6 else out

    monkeypatch.setattr(F, "cross_entropy", poisoned)  # the training loss's, wherever the loop computes it
    with pytest.raises(NonFiniteLoss, match=r"at step 6 .*step_00000005\.pt"):
        # one loss per step (parts would call it once per part)
        train(small(tmp_path, max_steps=20, checkpoint_every=5, cpu_parallel="ops", batch_size=32))
    state = load_latest(tmp_path / "run")
    assert state["step"] == 5 and all(torch.isfinite(v).all() for v in state["model"].values())


def test_bad_inputs_have_clear_messages(tmp_path):
    with pytest.raises(ValueError, match="unknown recipe"):
        resolve_config("imagenet-in-5-minutes")
    with pytest.raises(ValueError, match="unknown training option"):
        resolve_config("fmnist", learning_rate=1.0)
    with pytest.raises(ValueError, match="optimizer must be"):
        resolve_config("fmnist", optimizer="lion")
    with pytest.raises(FileNotFoundError, match="no Fashion-MNIST files in"):
        train(small(tmp_path, data_dir=str(tmp_path / "nothing-here")))
    with pytest.raises(FileNotFoundError, match="cannot resume"):
        train(small(tmp_path), resume=str(tmp_path / "not-a-run"))


@real
def test_paper_pretrain_recipe_builds_the_tanh_pre_logits_head(tmp_path):
    cfg = small(tmp_path, max_steps=2, batch_size=32, checkpoint_every=2, val_size=200, test_size=200)
    cfg = resolve_config("paper-pretrain", **{k: v for k, v in cfg.to_dict().items()
                                               if k in ("max_steps", "batch_size", "runs_dir", "name", "progress",
                                                        "val_size", "test_size", "checkpoint_every")})
    assert cfg.optimizer == "adamw" and cfg.weight_decay == 0.1 and cfg.schedule == "linear"
    train(cfg)
    model = vitkit.from_pretrained(tmp_path / "run" / "model")
    assert model.config.representation_size == model.config.embed_dim == 96
    assert isinstance(model.pre_logits.act, torch.nn.Tanh) and model.config.drop_rate == 0.1


def test_schedule_warmup_then_cosine_and_linear():
    assert lr_at(0, 100, 1.0, 10) == pytest.approx(0.1)
    assert lr_at(9, 100, 1.0, 10) == pytest.approx(1.0)
    assert lr_at(10, 100, 1.0, 10) == pytest.approx(1.0)
    assert lr_at(55, 100, 1.0, 10, "cosine") == pytest.approx(0.5)
    assert lr_at(99, 100, 1.0, 10, "linear", 0.0) == pytest.approx(1 / 90, abs=1e-6)
    assert lr_at(50, 100, 1.0, 0, "constant") == 1.0


def test_the_schedule_never_rises_and_a_floor_above_the_peak_is_refused():
    """--min-lr 1 with --lr 0.0015 "decayed" the rate up to 0.99 (a run that diverged, exit 0), and a peak below
    the default floor (--lr 5e-6) rose to 1e-5: the floor is the peak at most; one given above it is refused.
    --freeze-blocks without --init was recorded and ignored."""
    from vitkit.train import resolve_config

    assert max(lr_at(s, 100, 5e-6, 0, "cosine", 1e-5) for s in range(100)) == pytest.approx(5e-6)
    assert lr_at(99, 100, 5e-6, 0, "linear", 1e-5) == pytest.approx(5e-6)
    with pytest.raises(ValueError, match=r"--min-lr 1.0 is above the peak learning rate .*: the schedule decays"):
        resolve_config("fmnist", min_lr=1.0)
    assert resolve_config("fmnist", lr=5e-6).min_lr == 1e-5  # the default floor, not chosen: held at the peak
    with pytest.raises(ValueError, match=r"freeze_blocks=2 needs --init WEIGHTS"):
        resolve_config("fmnist", freeze_blocks=2)
    with pytest.raises(ValueError, match=r"freeze_blocks=1 does nothing with finetune='head'"):  # (taken in silence)
        resolve_config("fmnist", init="x", finetune="head", freeze_blocks=1)
    with pytest.raises(ValueError, match=r"layer_decay=0.5 does nothing with finetune='head'"):  # (taken in silence)
        resolve_config("fmnist", init="x", finetune="head", layer_decay=0.5)
    assert resolve_config("fmnist", init="x", finetune="lora", layer_decay=0.5).layer_decay == 0.5
    with pytest.raises(ValueError, match=r"init_interpolation='bilinear-aligned' needs --init WEIGHTS"):
        resolve_config("fmnist", init_interpolation="bilinear-aligned")
    with pytest.raises(ValueError, match=r"init_interpolation must be auto, bicubic, bilinear or bilinear-aligned, "
                                         r"not 'zoom'"):
        resolve_config("fmnist", init="x", init_interpolation="zoom")
    with pytest.raises(ValueError, match=r"epochs must be >= 0, not -1"):  # beside max_steps: stored all the same
        resolve_config("fmnist", max_steps=5, epochs=-1.0)
    # options the run would ignore: Adam's betas with SGD, SGD's momentum with AdamW, a stream's buffer in memory
    with pytest.raises(ValueError, match=r"--betas apply to --optimizer adamw, adam and muon"):
        resolve_config("fmnist", optimizer="sgd", betas=(0.5, 0.5))
    with pytest.raises(ValueError, match=r"--momentum applies to --optimizer sgd and muon, not adamw"):
        resolve_config("fmnist-adamw", momentum=0.5)
    with pytest.raises(ValueError, match=r"--shuffle-buffer applies to streamed data .* not fashion-mnist"):
        resolve_config("fmnist", shuffle_buffer=0)
    assert resolve_config("fmnist", optimizer="sgd", momentum=0.5).momentum == 0.5


def test_config_file_and_recipe_precedence(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"lr": 0.5, "batch_size": 64}))
    cfg = resolve_config("paper-finetune", str(tmp_path / "c.json"), batch_size=32)
    assert (cfg.optimizer, cfg.lr, cfg.batch_size, cfg.weight_decay) == ("sgd", 0.5, 32, 0.0)
    pre = resolve_config("paper-pretrain")
    assert (pre.batch_size, pre.warmup_steps, pre.weight_decay, pre.schedule) == (4096, 10_000, 0.1, "linear")


@real
def test_resume_with_a_checkpoint_of_another_architecture_is_a_clear_error(tmp_path):
    train(small(tmp_path, max_steps=4, checkpoint_every=2, batch_size=32, val_size=200, test_size=100))
    config_path = tmp_path / "run" / "config.json"
    cfg = json.loads(config_path.read_text())
    cfg["model_args"] = {"embed_dim": 64, "num_heads": 2, "mlp_dim": 128}
    cfg["max_steps"] = 6
    config_path.write_text(json.dumps(cfg))
    (tmp_path / "run" / "summary.json").unlink()  # a run stopped at step 4 of 6: resuming runs
    with pytest.raises(ValueError, match=r"config.json was changed after the checkpoint step_00000004.pt was written: "
                                         r"max_steps 6 \(the run trained with 4\); model_args \{\"embed_dim\": 64"):
        train(small(tmp_path), resume=str(tmp_path / "run"))  # (said as the edit, before the shapes it makes)
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_00000004.pt", weights_only=True)
    del state["config"]  # a checkpoint from before configs were recorded: the shapes say it
    torch.save(state, tmp_path / "run" / "checkpoints" / "step_00000004.pt")
    with pytest.raises(ValueError, match=f"does not fit model '{DEFAULT_MODEL}'"):
        train(small(tmp_path), resume=str(tmp_path / "run"))


def test_resume_takes_only_the_machine_fields_from_the_new_invocation(tmp_path, capsys):
    """--resume continues the saved run: threads/workers/progress/tensorboard (the machine) and
    test_tta (the final scoring) may change, a changed hyper-parameter is refused by name instead
    of being silently dropped."""
    from vitkit.cli import main
    from vitkit.train.resume import resumed_config

    run = tmp_path / "run"
    run.mkdir()
    saved = small(tmp_path, threads=1, epochs=3.0, lr=1e-3)
    (run / "config.json").write_text(json.dumps(saved.to_dict()))
    cfg = resumed_config(str(run), resolve_config("fmnist", threads=2, lr=5.0, progress=True))
    assert (cfg.threads, cfg.lr, cfg.progress, cfg.max_steps) == (2, 1e-3, False, 120)
    assert resumed_config(str(run), resolve_config("fmnist")).threads == 1  # not given: as saved
    asked = resumed_config(str(run), resolve_config("fmnist", progress=True, test_tta="flip"),
                           asked=["progress", "test_tta"])  # the CLI names its flags: a default counts too
    assert (asked.progress, asked.test_tta, asked.threads, asked.lr) == (True, "flip", 1, 1e-3)
    assert main(["train", "--resume", str(run), "--lr", "0.001", "--epochs", "9", "--name", "run",
                 "--model-args", '{"depth": 4}']) == 2
    err = capsys.readouterr().err
    assert "--epochs (saved: 3.0, given: 9.0)" in err and '--model-args (saved: {}, given: {"depth": 4})' in err
    assert "--lr" not in err and "--name" not in err and "--threads" in err  # equal values are no conflict
    assert "--cpu-parallel, --workers, --no-progress, --[no-]tensorboard, --test-tta can change" in err
    assert "--progress," not in err and "cpu_parallel" not in err  # real flags only
    assert main(["train", "--resume", str(run), "--config", str(run / "config.json")]) == 2
    assert "not --config" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == ["config.json"]  # refused before anything was written


def test_micro_batch_adds_accumulation_until_the_batch_fits():
    from vitkit.train.batches import Layout

    assert Layout.fitting(4096, 1, 1, 0, None).accum_steps == 1
    assert (Layout.fitting(4096, 1, 1, 0, 256).accum_steps, Layout.fitting(4096, 1, 1, 0, 256).local) == (16, 256)
    assert Layout.fitting(4096, 1, 8, 3, 256).accum_steps == 2  # 8 processes x 2 x 256
    assert Layout.fitting(100, 1, 1, 0, 30).local == 25  # the fewest even steps: 4 x 25
    assert Layout.fitting(512, 4, 1, 0, 1000).accum_steps == 4  # never fewer than asked
    with pytest.raises(ValueError, match="must divide"):
        Layout.fitting(7, 1, 2, 0, None)


@real
def test_the_cnn_baseline_trains_through_the_same_loop(tmp_path):
    """The ResNetV2 classifier (the paper's CNN baseline) has no embed_dim; the loop does not need one."""
    summary = train(small(tmp_path, model="resnetv2_50_nopreact", model_args={"layers": [1]}, max_steps=3,
                          batch_size=32, checkpoint_every=3, val_size=200))
    assert summary["steps"] == 3
    model = vitkit.from_pretrained(tmp_path / "run" / "model")
    assert model.config.architecture == "resnetv2" and model.config.in_chans == 1


def test_width_pre_logits_need_a_vit():
    from vitkit.models import get_model_config
    from vitkit.train.config import resolve_width

    assert resolve_width({"representation_size": "width"}, get_model_config("S/16"))["representation_size"] == 384
    with pytest.raises(ValueError, match="has no embed_dim"):
        resolve_width({"representation_size": "width"}, get_model_config("resnetv2_50_nopreact"))


def test_busy_cpu_note_only_when_the_cpu_is_busy_and_threads_are_not_split(monkeypatch):
    from vitkit.train import throughput

    monkeypatch.setattr(throughput.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(throughput.os, "getloadavg", lambda: (2.1, 1.0, 0.5))
    monkeypatch.setattr(throughput.torch, "get_num_threads", lambda: 2)
    note = throughput.busy_cpu_note(None)
    assert "load 2.1" in note and "2 cores" in note and "uses 2 threads" in note and "--threads 1 each" in note
    assert throughput.busy_cpu_note(1) is None  # the user already split the CPU
    monkeypatch.setattr(throughput.torch, "get_num_threads", lambda: 1)
    assert throughput.busy_cpu_note(None) is None  # so did OMP_NUM_THREADS=1: no advice to do what it does
    monkeypatch.setattr(throughput.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(throughput.os, "getloadavg", lambda: (0.4, 1.0, 0.5))
    assert throughput.busy_cpu_note(None) is None
