"""A run killed with SIGKILL and resumed ends bitwise equal to an uninterrupted run (CPU)."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

import forks
from conftest import kill_at_checkpoint, vitkit_here
from vitkit.data import fashion_mnist as fm

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")]

# 16 steps of 16, killed once step 8 is checkpointed (after the warm-up; the next checkpoint is the
# last, 8 steps later, so the kill lands between them): every random stream a resume must restore
# (crop, flip, dropout, stochastic depth) is drawn. Rows every 2 steps: each comes once in the
# end, a row the killed run wrote past its checkpoint included.
ARGS = ["--max-steps", "16", "--checkpoint-every", "8", "--keep-checkpoints", "5", "--log-every", "2",
        "--val-size", "200", "--batch-size", "16", "--warmup-steps", "4", "--crop-pad", "2", "--hflip", "--no-progress",
        "--threads", "1", "--model-args", '{"drop_path_rate": 0.1, "drop_rate": 0.1}', "--test-size", "200"]


def test_sigkill_then_resume_is_bitwise_identical(tmp_path):
    """The resume also asks for two runtime fields, one of them its default value: TensorBoard
    (the killed run had none) and flip TTA for the final score; neither changes the weights."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    assert vitkit_here("train", *ARGS, "--runs-dir", tmp_path, "--name", "straight") == 0
    run = tmp_path / "killed"
    kill_at_checkpoint(["train", *ARGS, "--runs-dir", str(tmp_path), "--name", "killed", "--no-tensorboard"],
                       env, run, 8)
    assert not (run / "tensorboard").exists()
    import vitkit

    # a run's checkpoint as weights: read with the architecture the finished run saved (its tensors alone were
    # read as a bare timm state dict: "timm weights do not match the model"); an unfinished run's says so
    with pytest.raises(vitkit.weights.WeightsError, match=r"is a checkpoint of the run .*killed, which has not "
                                                          r"finished: .*vitkit train --resume"):
        vitkit.from_pretrained(run / "checkpoints" / "step_00000008.pt")
    middle = vitkit.from_pretrained(tmp_path / "straight" / "checkpoints" / "step_00000008.pt")
    state = torch.load(tmp_path / "straight" / "checkpoints" / "step_00000008.pt", weights_only=True)
    assert middle.config == vitkit.from_pretrained(tmp_path / "straight").config
    assert all(torch.equal(v, state["model"][k]) for k, v in middle.state_dict().items())
    # config.json edited since the checkpoint: the run changed part-way and config.json claimed it for every step
    saved = (run / "config.json").read_text()
    config = json.loads(saved)
    (run / "config.json").write_text(json.dumps({**config, "lr": config["lr"] * 10}))
    edited = forks.run("train", "--resume", run, "--no-progress", env=env)
    assert edited.returncode == 2 and f"{run / 'config.json'} was changed after the checkpoint step_00000008.pt was " \
        f"written: lr {config['lr'] * 10} (the run trained with {config['lr']})" in edited.stderr, edited.stderr
    assert edited.stderr.strip().splitlines()[-1].startswith("vitkit train: error: ") and "Traceback" not in \
        edited.stderr and not (run / "summary.json").exists()
    for model in ("S/16", "vit_fmnist"):  # another model: one that does not build at 28 px was refused as that
        (run / "config.json").write_text(json.dumps({**config, "model": model}))  # model's problem, the other by
        edited = forks.run("train", "--resume", run, "--no-progress", env=env)  # its tensors' shapes
        assert edited.returncode == 2 and f"was changed after the checkpoint step_00000008.pt was written: model " \
            f"\"{model}\" (the run trained with \"{config['model']}\")" in edited.stderr, edited.stderr
    # as if written by a version without a field the run trained at its default (muon_lr_scale before 2026-12-05;
    # here mixup, at 0 in this run): no change (every run saved before muon_lr_scale was refused)
    (run / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "mixup"}))
    last = run / "checkpoints" / "step_00000008.pt"  # as if its first session had run on two processes (torchrun)
    state = torch.load(last, weights_only=True)
    assert state["processes"] == [1] and state["config"].pop("mixup") == 0.0
    torch.save({**state, "processes": [2]}, last)
    done = forks.run("train", "--resume", run, "--no-progress", "--tensorboard", "--test-tta", "flip", env=env)
    assert done.returncode == 0, done.stderr
    assert "resuming" in done.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_at_step"] == 8
    # processes said this session's count alone; the earlier session's two are said beside it
    assert (summary["processes"], summary["processes_earlier"]) == (1, [2])
    assert "processes_earlier" not in json.loads((tmp_path / "straight" / "summary.json").read_text())
    assert "test_top1_tta" in summary and "test_top1_tta" not in json.loads(
        (tmp_path / "straight" / "summary.json").read_text())
    assert any((run / "tensorboard").glob("events.out.tfevents.*"))
    a = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    b = load_file(run / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "train_loss" in r]
    assert steps == sorted(set(steps)), "rows written after the last checkpoint came twice after the resume"
    assert steps == list(range(2, 17, 2))  # and none went missing
