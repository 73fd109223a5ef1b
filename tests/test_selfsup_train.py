"""`vitkit pretrain` on real Fashion-MNIST images: the loss falls, the summary reports the frozen
encoder's few-shot accuracy, the run feeds `train --init`, `fewshot` and `inspect`; a run killed
with SIGKILL resumes to the same bits; bad input ends in one line with nothing written."""

import contextlib
import io
import json
import os

import pytest
import torch
from safetensors.torch import load_file

import forks
import vitkit
from conftest import in_process, kill_at_checkpoint, vitkit_here
from vitkit.cli import main
from vitkit.data import fashion_mnist as fm
from vitkit.selfsup import MAE, MaskedPatchPrediction, SimMIM
from vitkit.train import tasks

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")]

SHORT = ["--max-steps", "30", "--log-every", "5", "--warmup-steps", "10", "--batch-size", "64", "--no-progress",
         "--no-tensorboard", "--test-size", "200"]


cli = forks.run  # python -m vitkit ARGV, as a process of its own


def rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """One short run of each objective (30 steps of 64 images: the last loss row is 0.60-0.64 of the
    first for SimMIM, 0.72-0.73 for MPP, 0.41-0.51 for MAE, seeds 0-2); MAE's alone ends with the
    few-shot probe, the others show its off switch: its shots drawn from 1,000 training images, not
    10,000, scored on --test-size's 200 test images, not 500 (25-shot 0.61-0.64, seeds 0-2, where
    10,000 and 500 gave 0.60-0.63: their features were a third of this fixture's time). Run by the
    command line's own code in this process (on its threads): three more starts of Python and torch
    would prove nothing more."""
    out = tmp_path_factory.mktemp("pretrain")
    runs = {}
    for objective in ("simmim", "mpp", "mae"):
        probe = [] if objective == "mae" else ["--no-fewshot"]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), pytest.MonkeyPatch.context() as m:
            m.setattr(tasks, "FEWSHOT_POOL", 1000)
            code = main(["pretrain", "--objective", objective, *SHORT, *probe, "--runs-dir", str(out), "--name",
                         objective, "--json"])
        assert code == 0
        runs[objective] = (out / objective, json.loads(printed.getvalue().splitlines()[-1]))
    return runs


@pytest.mark.parametrize("objective,cls", [("simmim", SimMIM), ("mpp", MaskedPatchPrediction), ("mae", MAE)])
def test_pretraining_learns_and_saves_the_objective(pretrained, objective, cls):
    run, summary = pretrained[objective]
    train = [r for r in rows(run) if "train_loss" in r]
    assert train[-1]["train_loss"] < 0.85 * train[0]["train_loss"], [r["train_loss"] for r in train]
    assert ("train_acc" in train[0]) is (objective == "mpp")  # only MPP's colour classes have an accuracy
    assert summary["objective"] == objective and summary["model"] == "vit_fmnist"
    assert summary["train_images"] == 60_000  # every training image, no labels, nothing held out
    assert summary["test_images"] == 200  # --test-size: a fixed sample of 200 is scored
    if objective == "mae":
        assert set(summary["fewshot"]) == {"1", "5", "10", "25"}
        assert summary["fewshot"]["25"] > 0.5  # the frozen encoder's features carry the classes, already
    else:
        assert "fewshot" not in summary  # --no-fewshot
    model = vitkit.from_pretrained(run)  # the run's folder stands for its model
    assert isinstance(model, cls) and model.encoder.config.name == "vit_fmnist"
    assert (run / "training_curves.png").stat().st_size > 0


def test_fine_tuning_fewshot_and_inspect_read_a_pretraining_run(pretrained, tmp_path, capsys, monkeypatch):
    run, _ = pretrained["mae"]
    # 80 steps of 32: 44-46% test top-1 (seeds 0-2), where 40 of 64 gave 26-37%
    done = in_process(capsys, "train", "--init", str(run), "--max-steps", "80", "--batch-size", "32",
                      "--warmup-steps", "5", "--val-size", "200", "--test-size", "500", "--no-progress",
                      "--no-tensorboard", "--runs-dir", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    # what of the pre-training model is not taken is said beside what was (it said only "head: new")
    assert f"initialised from {run} (vitkit); head: new; its mae pre-training's decoder_blocks, decoder_embed, " \
           f"decoder_norm, decoder_pos_embed, decoder_pred, mask_token left out" in done.stderr, done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["model"] == "vit_fmnist" and summary["init"] == str(run)  # named after what was trained
    assert os.path.basename(summary["run_dir"]).startswith("vit_fmnist-")
    tuned = vitkit.from_pretrained(summary["run_dir"])
    encoder = load_file(run / "model" / "model.safetensors")
    start = encoder["encoder.blocks.0.mlp.fc1.weight"]
    assert tuned.state_dict()["blocks.0.mlp.fc1.weight"].shape == start.shape  # the encoder, fine-tuned
    assert not torch.equal(tuned.state_dict()["blocks.0.mlp.fc1.weight"], start)
    assert tuned.num_classes == 10 and summary["test_top1"] > 0.25  # learning (chance: 0.1)
    # at test scale (VITKIT_TINY: the pool from the first 3,000 training images, the first 200 test
    # images scored): the verb reads the run's encoder; its features are worth 46% at 5 shots here
    with monkeypatch.context() as m:
        m.setenv("VITKIT_TINY", "1")
        few = in_process(capsys, "fewshot", "--weights", str(run), "--shots", "5", "--pool", "2000", "--seeds", "1",
                         "--json")
    assert few.returncode == 0, few.stderr
    assert json.loads(few.stdout)["results"][0]["mean"] > 0.3
    from PIL import Image

    boot = tmp_path / "boot.png"  # one image: the report's figures for each of the default four prove nothing more
    Image.fromarray(fm.load_split("test").images[0]).save(boot)
    seen = in_process(capsys, "inspect", "--weights", str(run), "--image", str(boot), "--out",
                      str(tmp_path / "inspect"), "--json")
    assert seen.returncode == 0, seen.stderr
    figures = json.loads(seen.stdout)["figures"]
    assert "reconstruction" in figures and "attention_distance" in figures
    html = (tmp_path / "inspect" / "report.html").read_text()
    assert "pre-training" in html and "vitkit train --init" in html
    refused = in_process(capsys, "predict", str(tmp_path / "inspect" / "reconstruction.png"), "--weights", str(run))
    assert refused.returncode == 2 and "has no classifier" in refused.stderr and "Traceback" not in refused.stderr


def test_sigkill_then_resume_is_bitwise_identical(tmp_path, capsys):
    env = dict(os.environ, PYTHONHASHSEED="0")
    args = ["pretrain", "--objective", "mpp", "--max-steps", "20", "--checkpoint-every", "5", "--keep-checkpoints",
            "5", "--batch-size", "16", "--warmup-steps", "5", "--no-progress", "--threads", "1", "--no-tensorboard",
            "--no-fewshot", "--test-size", "100",
            "--model-args", '{"drop_path_rate": 0.1, "drop_rate": 0.1}', "--runs-dir", str(tmp_path)]
    assert vitkit_here(*args, "--name", "straight") == 0
    run = tmp_path / "killed"
    kill_at_checkpoint([*args, "--name", "killed"], env, run, 10)  # 10 steps left to resume
    assert main(["train", "--resume", str(run)]) == 2  # refused before anything runs: no process of its own
    assert "mpp pre-training run: resume it with vitkit pretrain --resume" in capsys.readouterr().err
    # resumed in this process: the killed one's checkpoint is all it has of that run, and a third start of
    # Python and torch would prove nothing more (the straight run, before it in this process, left state
    # the resume must not lean on: it restores its own)
    done = in_process(capsys, "pretrain", "--resume", str(run), "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "resuming" in done.stderr
    a = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    b = load_file(run / "model" / "model.safetensors")
    assert a.keys() == b.keys() and "mpp_head.weight" in a
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run"


@pytest.mark.parametrize("args,message", [
    (["--objective", "mae", "--mask-ratio", "1.5"], "mask_ratio must be in (0, 1)"),
    (["--objective", "mpp", "--mask-ratio", "0"], "mask_ratio must be in (0, 1)"),
    (["--objective", "simmim", "--mask-block", "8"], "mask_block 8 px does not tile the 28x28 image"),
    (["--objective", "mae", "--mask-block", "4"], "mask_block does not apply to mae"),
    (["--objective", "mae", "--model", "vit_fmnist_hybrid"], "cannot pre-train a hybrid"),
    (["--objective", "simmim", "--model", "convit_tiny", "--img-size", "32"], "ConViT's gated positional attention"),
    (["--objective", "mae", "--decoder-heads", "5"], "decoder_dim 64 is not divisible by decoder_heads 5"),
    ([], "--objective is required"),
    (["--objective", "mae", "--model", "beitv2_base_patch16_224", "--img-size", "32"],
     "a relative position bias over the whole grid cannot follow"),
    # a config file of classification beside a pre-training flag: it blamed the flag ("mask_ratio only applies to
    # pre-training")
    (["--config", "{tmp}/classify.yaml", "--mask-ratio", "0.5"], "classify.yaml says objective: classify, which "
                                                                  "vitkit train runs"),
])
def test_bad_pretraining_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    (tmp_path / "classify.yaml").write_text("objective: classify\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = cli("pretrain", *args, "--max-steps", "2", "--threads", "1", "--runs-dir", str(tmp_path / "runs"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "runs").exists()


def test_flags_of_the_other_verb_are_refused(tmp_path):
    assert cli("pretrain", "--objective", "mae", "--mixup", "0.8").returncode == 2  # no labels to mix
    assert cli("train", "--mask-ratio", "0.5").returncode == 2  # no masks in classification


def test_a_fine_tuning_source_whose_encoder_does_not_fit(pretrained, tmp_path):
    run, _ = pretrained["simmim"]
    done = cli("train", "--init", str(run), "--model-args", '{"mlp_dim": 128}', "--max-steps", "2", "--threads", "1",
               "--runs-dir", str(tmp_path / "runs"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--model-args mlp_dim=128 (the weights': 192) contradicts the --init weights" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()
    done = cli("train", "--init", str(run), "--init-head", "keep", "--max-steps", "2", "--threads", "1",
               "--runs-dir", str(tmp_path / "runs"))  # it said "the weights have 0 (classes), the data 10"
    assert done.returncode == 2 and f"keeps a classifier: {run} has none (a headless encoder)" in done.stderr, \
        done.stderr
    assert not (tmp_path / "runs").exists()


def test_a_pretraining_with_ema_says_its_ema_score(tmp_path, capsys):
    """The EMA's test loss and model_ema/ were written and not said (vitkit train says its EMA line)."""
    done = in_process(capsys, "pretrain", "--objective", "mae", "--max-steps", "2", "--batch-size", "16",
                      "--warmup-steps", "1", "--no-progress", "--no-tensorboard", "--test-size", "64", "--val-size",
                      "64", "--no-fewshot", "--ema-decay", "0.9", "--runs-dir", str(tmp_path), "--name", "ema")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "ema" / "summary.json").read_text())
    assert f"EMA       pre-training loss {summary['test_loss_ema']:.4f}  (model_ema/)" in done.stdout, done.stdout
    assert (tmp_path / "ema" / "model_ema").is_dir()
