"""Where the verbs write: ``--out`` is the folder a verb writes into, nothing lands in the
current directory unasked, a run folder stands for its model wherever weights are read, and a
run folder's name is never blocked or rewritten by a run that is over."""

import json
import os

import pytest
import torch

import vitkit
from vitkit.cli import main
from vitkit.data import fashion_mnist as fm

pytestmark = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")

TINY = ["--max-steps", "2", "--batch-size", "16", "--val-size", "100", "--threads", "1", "--no-progress",
        "--no-tensorboard"]


@pytest.fixture(scope="module", autouse=True)
def test_scale():
    """VITKIT_TINY=1: the first 100 test images (what is checked here is where files go, not scores)."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("VITKIT_TINY", "1")
        yield


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished two-step run of the default model: runs/r with model/, summary.json, checkpoints."""
    root = tmp_path_factory.mktemp("outputs")
    assert main(["train", *TINY, "--runs-dir", str(root / "runs"), "--name", "r"]) == 0
    return root / "runs" / "r"


@pytest.fixture(scope="module")
def one_image(tmp_path_factory):
    """One test image for the inspect reports whose folders are checked here: the default four images'
    figures would prove nothing more about where a report goes (each is a figure more per report)."""
    from PIL import Image

    path = tmp_path_factory.mktemp("image") / "boot.png"
    Image.fromarray(fm.load_split("test").images[0]).save(path)
    return ["--image", str(path)]


def files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_eval_writes_nothing_without_out_and_both_files_with_it(run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--weights", str(run), "--split", "test"]) == 0
    assert files(tmp_path) == []  # printed only
    said = capsys.readouterr()
    assert "top-1" in said.out and f"reading {run / 'model'}" in said.err
    assert main(["eval", "--weights", str(run), "--out", "ev", "--json"]) == 0
    assert files(tmp_path) == ["ev", "ev/confusion_matrix.png", "ev/eval.json"]
    printed = json.loads(capsys.readouterr().out)
    assert json.loads((tmp_path / "ev" / "eval.json").read_text()) == printed


def test_inspect_writes_beside_the_run_or_under_runs_never_into_the_current_folder(run, tmp_path, monkeypatch,
                                                                                   one_image):
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", "--weights", str(run), *one_image, "--json"]) == 0
    assert files(tmp_path) == []
    assert (run / "inspect" / "report.html").is_file()
    vitkit.from_pretrained(run).save_pretrained(tmp_path / "weights" / "my model")
    assert main(["inspect", "--weights", str(tmp_path / "weights" / "my model"), *one_image, "--json"]) == 0
    assert (tmp_path / "runs" / "inspect-my-model" / "report.html").is_file()
    assert {p.name for p in tmp_path.iterdir()} == {"weights", "runs"}


def test_inspect_names_the_folder_by_the_model_and_keeps_two_models_apart(run, tmp_path, monkeypatch, capsys,
                                                                          one_image):
    """A run's model.safetensors went to runs/inspect-model, as every model.safetensors did, and its checkpoint
    to runs/inspect-step_N: the next model of the same file name replaced the report without a word. A run's
    file goes beside the run, a generic file name takes its folder's, and a taken name another free one."""
    monkeypatch.chdir(tmp_path)
    checkpoint = sorted((run / "checkpoints").glob("*.pt"))[-1]
    for weights, folder in ((run, run / "inspect"), (run / "model", run / "inspect"),  # one model, three spellings
                            (run / "model" / "model.safetensors", run / "inspect"),
                            (checkpoint, run / f"inspect-{checkpoint.stem}")):
        assert main(["inspect", "--weights", str(weights), *one_image, "--no-progress"]) == 0
        assert (folder / "report.html").is_file() and "other weights" not in capsys.readouterr().err, weights
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("inspect")) == [
        "inspect", f"inspect-{checkpoint.stem}"]
    model = vitkit.from_pretrained(run)
    for i, where in enumerate(("a/net", "b/net")):
        model.save_pretrained(tmp_path / where)
        assert main(["inspect", "--weights", f"{where}/model.safetensors", *one_image, "--no-progress"]) == 0
        assert ("holds the report of other weights" in capsys.readouterr().err) == (i == 1)
    first, second = (tmp_path / "runs" / name / "report.html" for name in ("inspect-net", "inspect-net-2"))
    assert "a/net/model.safetensors" in first.read_text() and "b/net/model.safetensors" in second.read_text()
    assert main(["inspect", "--weights", str(tmp_path / "a/net/model.safetensors"), *one_image, "--no-progress"]) == 0
    assert "other weights" not in capsys.readouterr().err  # its own report, by another spelling of its path
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["inspect-net", "inspect-net-2"]


def test_a_run_folder_is_read_as_its_model_by_every_verb(run, tmp_path, monkeypatch, capsys):
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    image = tmp_path / "boot.png"
    Image.fromarray(fm.load_split("test").images[0]).save(image)
    direct = vitkit.from_pretrained(run / "model")
    via_run = vitkit.from_pretrained(run)
    x = torch.rand(2, 1, 28, 28)
    assert torch.equal(direct.eval()(x), via_run.eval()(x))
    verbs = [["predict", "--weights", str(run), str(image), "--top-k", "2"],
             # a pool of 1,000 (1 shot + 50 held out per class need 51 of each), not test scale's 3,000: a third of
             # the features, for a line that says what was read
             ["fewshot", "--weights", str(run), "--shots", "1", "--seeds", "1", "--pool", "1000"],
             ["convert", str(run), str(tmp_path / "w.safetensors"), "--to", "timm"]]
    for argv in verbs:
        assert main(argv) == 0, argv
        assert f"reading {run / 'model'}" in capsys.readouterr().err, argv
    assert main(["train", *TINY, "--runs-dir", str(tmp_path / "runs"), "--name", "ft", "--init", str(run)]) == 0
    assert json.loads((tmp_path / "runs" / "ft" / "summary.json").read_text())["init"] == str(run)


def test_resuming_a_finished_run_says_so_and_rewrites_nothing(run, capsys):
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "inspect" not in p.parts}
    assert main(["train", "--resume", str(run), "--json"]) == 0
    said = capsys.readouterr()
    assert "finished at step 2: nothing to resume" in said.err
    assert json.loads(said.out) == json.loads((run / "summary.json").read_text())
    assert main(["train", "--resume", str(run), "--test-tta", "flip"]) == 0  # scored by the command it names
    hint = capsys.readouterr().err.splitlines()[-1]
    assert hint == f"its test score with flip TTA: vitkit eval --weights {run} --tta flip"
    config = (run / "config.json").read_bytes()
    (run / "config.json").write_text(json.dumps({**json.loads(config), "test_tta": "flip"}))
    assert main(["train", "--resume", str(run), "--test-tta", "flip"]) == 0  # a run scored with them: no hint
    assert "vitkit eval" not in capsys.readouterr().err
    (run / "config.json").write_bytes(config)
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "inspect" not in p.parts}
    assert after == before
    assert main([*hint.split(": ", 1)[1].split()[1:], "--max-images", "20", "--no-progress"]) == 0


def test_an_unfinished_run_given_as_weights_is_one_line_everywhere(tmp_path, capsys):
    from vitkit.runlock import RunLock

    run = tmp_path / "r"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step_00000004.pt").write_bytes(b"x")
    (run / "config.json").write_text(json.dumps({"recipe": "mae-fmnist", "objective": "mae"}))
    tiny = ["--runs-dir", str(tmp_path / "runs"), "--max-steps", "1", "--no-progress"]
    for argv in (["fewshot", "--weights", str(run)], ["train", "--init", str(run), *tiny],
                 ["train", "--distill", "soft", "--teacher", str(run), *tiny]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "stopped before it finished" in err, err
        assert f"vitkit pretrain --resume {run}" in err, err
    lock = RunLock(run).acquire()  # a writer at work: wait for it, resuming would be refused
    try:
        assert main(["eval", "--weights", str(run)]) == 2
        err = capsys.readouterr().err
        assert f"still being written by process {os.getpid()}" in err and "--resume" not in err
    finally:
        lock.release()
    assert not (tmp_path / "runs").exists()  # refused before any run folder was made
    (run / "checkpoints" / "step_00000004.pt").unlink()  # killed before its first checkpoint
    (tmp_path / "x.png").write_bytes(b"an image to be (the weights are refused first)")
    assert main(["predict", "--weights", str(run), str(tmp_path / "x.png")]) == 2
    assert "stopped before its first checkpoint: it has no model and nothing to resume (vitkit pretrain --name r " \
           in capsys.readouterr().err


def test_inspect_refusing_an_image_leaves_no_folder(run, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not an image")
    for image in (tmp_path / "missing.png", tmp_path / "notes.txt"):
        assert main(["inspect", "--weights", str(run), "--image", str(image), "--out", str(tmp_path / "o")]) == 2
        assert capsys.readouterr().err.count("error:") == 1
    assert not (tmp_path / "o").exists()


def test_a_run_that_saved_nothing_does_not_block_its_name(tmp_path, capsys):
    runs = tmp_path / "runs"
    left = runs / "x"
    (left / "checkpoints").mkdir(parents=True)
    (left / "config.json").write_text("{}")  # what a run refused after its folder was made leaves
    (left / "metrics.jsonl").write_text("")
    (left / ".lock").write_text("")  # (a run's lock file stays after it)
    assert main(["train", *TINY, "--runs-dir", str(runs), "--name", "x"]) == 0
    assert f"reusing {left}" in capsys.readouterr().err and (left / "model").is_dir()
    kept = runs / "y"
    (kept / "checkpoints").mkdir(parents=True)
    (kept / "checkpoints" / "step_4.pt").write_bytes(b"x")  # something to resume: never reused
    assert main(["train", *TINY, "--runs-dir", str(runs), "--name", "y"]) == 2
    assert "already exists" in capsys.readouterr().err and (kept / "checkpoints" / "step_4.pt").is_file()
    mine = runs / "mine"  # a folder of someone's own settings, never a run's: not taken for an abandoned one
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "settings"}')
    for _ in range(2):  # (the first refusal left a .lock file, and the second took it for a run's and removed it)
        assert main(["train", *TINY, "--runs-dir", str(runs), "--name", "mine"]) == 2
        assert f"run directory {mine} exists and is no vitkit run's folder (no .lock file, no checkpoints): pass " \
               f"another --name" in capsys.readouterr().err
        assert (mine / "config.json").read_text() == '{"my": "settings"}' and sorted(os.listdir(mine)) == \
            ["config.json"]
    (runs / "afile").write_text("x")  # (it said "Not a directory: .../afile/.lock")
    assert main(["train", *TINY, "--runs-dir", str(runs), "--name", "afile"]) == 2
    assert "run directory " + str(runs / "afile") + " is a file, not a folder" in capsys.readouterr().err


def test_a_size_string_model_makes_one_flat_folder_named_after_it(tmp_path):
    from vitkit.train import resolve_config
    from vitkit.train.loop import Run, _new_run_dir

    run = Run.__new__(Run)
    run.cfg = resolve_config("fmnist", runs_dir=str(tmp_path), model="S/16")
    folder = _new_run_dir(run)
    run.lock.release()
    assert folder.parent == tmp_path and folder.name.startswith("S-16-")


def test_the_printed_summary_of_a_run_with_ema_gives_both_scores(tmp_path, capsys):
    assert main(["train", *TINY, "--runs-dir", str(tmp_path), "--name", "ema", "--ema-decay", "0.9"]) == 0
    said = capsys.readouterr()
    summary = json.loads((tmp_path / "ema" / "summary.json").read_text())
    assert f"EMA      top-1 {100 * summary['test_top1_ema']:.2f}%" in said.out
    assert said.err.startswith("training vit_fmnist_hybrid (279,786 parameters")  # the first line says what and where
    assert "test-scale run" in summary["tiny"] and summary["train_images"] < 3000  # never passes for a result


def test_a_run_without_validation_images_says_so_not_a_second_score(tmp_path, capsys):
    """--val-size 0: the validation rows score the test split; the summary line said "validation 12.00%" beside
    "test 12.00%", and a pushed card a validation top-1, as if two splits agreed."""
    from vitkit.weights.hub import save_for_hub

    args = [a for a in TINY if a not in ("--val-size", "100")]
    assert main(["train", *args, "--val-size", "0", "--ema-decay", "0.9", "--runs-dir", str(tmp_path),
                 "--name", "v0"]) == 0
    said = capsys.readouterr().out
    summary = json.loads((tmp_path / "v0" / "summary.json").read_text())
    assert summary["val_is_test"] is True and "(no validation split: its rows scored the test split)" in said
    assert "EMA      top-1" in said and "(model_ema/)" in said and "validation " not in said.replace(
        "no validation split", "")
    card = (save_for_hub(tmp_path / "v0", tmp_path / "card") / "README.md").read_text()
    assert "| test top-1 |" in card and "validation" not in card
    assert main(["train", *TINY, "--runs-dir", str(tmp_path), "--name", "v100"]) == 0  # with validation images
    assert "(validation " in capsys.readouterr().out
    assert "val_is_test" not in json.loads((tmp_path / "v100" / "summary.json").read_text())


def test_a_run_with_test_tta_reports_what_vitkit_eval_says_with_those_views(tmp_path, capsys, monkeypatch):
    # 60 real steps of a one-layer plain ViT (patch 4, no flips or shifts in training): a model of
    # 46-62% top-1, not a constant guess, whose flipped and shifted views change 40-70 of the 500
    # answers, for the worse on balance (its EMA lost 7-15 of them net, seeds 0-3)
    monkeypatch.delenv("VITKIT_TINY")
    assert main(["train", *TINY, "--max-steps", "60", "--batch-size", "64", "--test-size", "500", "--runs-dir",
                 str(tmp_path), "--name", "tta", "--ema-decay", "0.9", "--test-tta", "flip-shift",
                 "--precision", "fp32", "--model", "vit_fmnist", "--model-args", '{"depth": 1}',
                 "--warmup-steps", "10", "--lr", "4e-3"]) == 0
    said = capsys.readouterr().out
    run = tmp_path / "tta"
    summary = json.loads((run / "summary.json").read_text())
    assert f"; flip-shift TTA {100 * summary['test_top1_tta']:.2f}%)" in said
    assert f"; flip-shift TTA {100 * summary['test_top1_ema_tta']:.2f}%; model_ema/)" in said
    assert summary["test_tta"] == "flip-shift"
    assert summary["test_top1_ema_tta"] != summary["test_top1_ema"]  # the views changed some answers
    for weights, key in ((run, "test_top1_tta"), (run / "model_ema", "test_top1_ema_tta")):
        assert main(["eval", "--weights", str(weights), "--tta", "flip-shift", "--max-images",
                     str(summary["test_images"]), "--json", "--no-progress"]) == 0
        assert json.loads(capsys.readouterr().out)["top1"] == pytest.approx(summary[key], abs=1e-9)
    # resumed once finished with other views: its score keeps the label of those it was scored with,
    # a summary from before the field (no test_tta) too
    for written in (summary, {k: v for k, v in summary.items() if k != "test_tta"}):
        (run / "summary.json").write_text(json.dumps(written))
        assert main(["train", "--resume", str(run), "--test-tta", "flip"]) == 0
        said = capsys.readouterr()
        assert f"; flip-shift TTA {100 * summary['test_top1_tta']:.2f}%)" in said.out and "; flip TTA" not in said.out
        assert said.err.splitlines()[-1] == f"its test score with flip TTA: vitkit eval --weights {run} --tta flip"
    assert main(["train", *TINY, "--runs-dir", str(tmp_path), "--test-tta", "mirror"]) == 2
    err = capsys.readouterr().err
    assert "test_tta" in err and "flip-shift" in err and "Traceback" not in err


def test_a_finished_run_says_what_to_try_next_on_its_folder(tmp_path, capsys):
    assert main(["train", *TINY, "--runs-dir", str(tmp_path / "my runs"), "--name", "next"]) == 0
    out = capsys.readouterr().out
    run = f"'{tmp_path / 'my runs' / 'next'}'"  # quoted: a folder with a space broke the copied command
    assert f"next     vitkit eval --weights {run}" in out
    assert f"vitkit predict --weights {run} IMAGE..." in out and f"vitkit inspect --weights {run}" in out
