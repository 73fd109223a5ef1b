"""Faults, third pass (issue 43): content compared rather than counts, sizes bounded before they are
allocated, adapters that reload, backbones without heads, signals with workers, flags that mean what
they say, Hugging Face data by name, and fine-tuning a small folder on the first try.

As in ``test_faults_hostile.py``: each case asserts the exit code, that no traceback is printed, the
words of the message and what is left on disk.
"""

import errno
import json
import re
import signal
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

import forks
import vitkit
from conftest import in_process
from test_faults_hostile import one_line


def ends_in(done, words, code=2):
    """The process ended with ``code``, no traceback, and its last line (after what it said on its
    way, such as "initialised from ...") holds ``words``."""
    assert done.returncode == code and "Traceback" not in done.stderr, (done.returncode, done.stderr[-800:])
    last = done.stderr.strip().splitlines()[-1]
    assert words in last, done.stderr[-800:]
    return last


def image_folder(root, classes, per_class=4, size=16, seed=0):
    """A folder dataset (``root/{train,test}/CLASS/i.png``) of small RGB images, a brightness per class."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", per_class), ("test", max(1, per_class // 2))):
        for k, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 60, (size, size, 3)) + 60 * (k % 3)
                Image.fromarray(pixels.astype(np.uint8)).save(root / split / name / f"{i}.png")
    return root


# ---------------------------------------------------------------- 1. content, not counts


def test_keeping_a_head_for_the_same_classes_in_another_order_is_refused(tmp_path, capsys):
    data = image_folder(tmp_path / "data", ["a", "b", "c"])  # a folder's classes come sorted: a, b, c
    torch.manual_seed(0)
    model = vitkit.create_model("vit_fmnist", img_size=16, in_chans=3, patch_size=4, num_classes=3,
                                mean=(0.5,) * 3, std=(0.5,) * 3, label_names=["b", "a", "c"])
    model.save_pretrained(tmp_path / "m")
    done = in_process(capsys, "train", "--dataset", "folder", "--data-dir", data, "--init", tmp_path / "m",
                      "--init-head", "keep", "--max-steps", "1", "--runs-dir", tmp_path / "runs", "--no-progress")
    one_line(done)
    assert "another order (class 0 is 'b' in the weights, 'a' in the data)" in done.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


#: a finished run's summary.json, as vitkit train writes its fields that a study reads
SUMMARY = {"test_top1": 0.5, "run_dir": "w/run", "model": "vit_fmnist", "params": 1000, "steps": 10,
           "train_images": 100, "precision": "fp32"}


def _finished_run(work, name, asked, summary=json.dumps(SUMMARY)):
    """A study's run as an earlier invocation left it: the settings it was given, and its summary."""
    (work / "configs").mkdir(parents=True, exist_ok=True)
    (work / "configs" / f"{name}.json").write_text(json.dumps(asked))
    (work / name).mkdir()
    (work / name / "summary.json").write_text(summary)


def test_a_study_reuses_a_finished_run_only_for_the_same_settings(tmp_path):
    from vitkit.studies import get_study
    from vitkit.studies.base import Options, run_name, train_run

    study = get_study("position-embeddings")
    arm = study.arms(Options(seeds=(0,)))[0]
    name = run_name(arm, 0)
    asked = {**arm.train, "seed": 0, "runs_dir": str(tmp_path), "name": name, "tensorboard": False}
    asked.pop("recipe", None)
    _finished_run(tmp_path, name, asked)
    assert train_run(arm, 0, Options(seeds=(0,), threads=1), study, tmp_path) == SUMMARY  # threads: the same run
    for options, words in ((Options(seeds=(0,), dataset="folder", data_dir="x"), "dataset: None then, 'folder' now"),
                           (Options(seeds=(0,), steps=7), "max_steps: 1290 then, 7 now"),
                           (Options(seeds=(0,), smoke=True), "then,")):
        with pytest.raises(ValueError, match=f"{name} was trained with other settings .*{re.escape(words)}.*--work"):
            train_run(arm, 0, options, study, tmp_path)


def test_a_torn_summary_of_a_study_run_is_named_and_the_last_results_stay(tmp_path, capsys, monkeypatch):
    from vitkit.studies import base, get_study

    study = get_study("position-embeddings")
    arms = study.arms(base.Options(seeds=(0,)))
    name = base.run_name(arms[0], 0)
    asked = {**arms[0].train, "seed": 0, "runs_dir": str(tmp_path / "w"), "name": name, "tensorboard": False}
    asked.pop("recipe", None)
    (tmp_path / "w").mkdir()
    _finished_run(tmp_path / "w", name, asked, summary='{"test_top1": 0.')
    with pytest.raises(ValueError, match=f"{name}/summary.json .*cannot be read.*remove the run's folder"):
        base.train_run(arms[0], 0, base.Options(seeds=(0,)), study, tmp_path / "w")
    # run_study: the second run fails; the results of the last complete study are kept as they were
    (tmp_path / "out").mkdir()
    before = '{"study": "position-embeddings", "runs": {"complete": 1}, "verdicts": [1]}'
    (tmp_path / "out" / "position-embeddings.json").write_text(before)
    calls = []

    def fake_run(arm, seed, options, study, work):
        calls.append(arm.key)
        if len(calls) == 2:
            raise ValueError("run 2 failed")
        return {"test_top1": 0.9}

    monkeypatch.setattr(base, "train_run", fake_run)
    monkeypatch.setattr(study, "prepare", lambda *a: {})
    monkeypatch.setattr(study, "fewshot", False)
    with pytest.raises(ValueError, match="run 2 failed"):
        base.run_study(study, base.Options(seeds=(0,), work=tmp_path / "w2", out=tmp_path / "out"), say=lambda *a: None)
    assert (tmp_path / "out" / "position-embeddings.json").read_text() == before
    partial = json.loads((tmp_path / "out" / "position-embeddings.partial.json").read_text())
    assert list(partial["runs"]) == [base.run_name(arms[0], 0)]
    # a full disk at the figure: the numbers and the table were rewritten beside the last study's figure
    monkeypatch.setattr(base, "train_run", lambda *a: {"test_top1": 0.9})
    done = base.run_study(study, base.Options(seeds=(0,), work=tmp_path / "w2", out=tmp_path / "out"),
                          say=lambda *a: None)
    assert done["figure"] == str(tmp_path / "out" / "position-embeddings.png")
    written = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert {"position-embeddings.json", "position-embeddings.md", "position-embeddings.png"} <= set(written)

    def full(results, path):
        path.write_bytes(b"half a figure")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(base, "train_run", lambda *a: {"test_top1": 0.5})
    monkeypatch.setattr(study, "figure", full)
    with pytest.raises(OSError, match="No space left"):
        base.run_study(study, base.Options(seeds=(0,), work=tmp_path / "w3", out=tmp_path / "out"),
                       say=lambda *a: None)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()
            if not p.name.endswith(".partial.json")} == written  # all three as they were, no staging left
    from vitkit.files import files_together

    with pytest.raises(ValueError, match="installs files, not folders"), files_together(tmp_path / "out") as stage:
        (stage / "position-embeddings.json").write_text("{}")  # (a folder renamed over a full one failed half-way)
        (stage / "figures").mkdir()
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()
            if not p.name.endswith(".partial.json")} == written
    (tmp_path / "o2" / "b.json").mkdir(parents=True)  # a folder where a file goes: named, not the staging file
    with pytest.raises(ValueError, match=r"o2/b.json is a folder, in the way of the file to write there"), \
            files_together(tmp_path / "o2") as stage:
        (stage / "a.json").write_text("{}")
        (stage / "b.json").write_text("{}")
    assert sorted(p.name for p in (tmp_path / "o2").iterdir()) == ["b.json"]  # nothing written, no staging left


def test_two_writers_of_files_that_belong_together_install_one_whole_set_after_the_other(tmp_path):
    """Two `vitkit eval --out DIR` at once renamed their files in one by one, interleaved: one's confusion matrix
    beside the other's numbers. The renames hold a lock on the folder: a writer waits for the other's whole set."""
    import fcntl
    import os
    import threading

    from vitkit.files import files_together

    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another writer, part-way through its renames

    def write():
        with files_together(out) as stage:
            (stage / "eval.json").write_text("b")
            (stage / "confusion_matrix.png").write_text("b")

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(timeout=1.0)
    assert writer.is_alive() and not (out / "eval.json").exists()  # it waits, with nothing of its set in place
    for name in ("eval.json", "confusion_matrix.png"):
        (out / name).write_text("a")  # the other's set, whole
    os.close(fd)
    writer.join(timeout=30)
    assert {p.name: p.read_text() for p in out.iterdir()} == {"eval.json": "b", "confusion_matrix.png": "b"}


def test_a_timm_safetensors_export_reads_back_with_the_model_named_as_the_pth_does(tmp_path, capsys):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_fmnist_hybrid").eval()  # sine-cosine positions: timm's files hold a table
    model.save_pretrained(tmp_path / "m")
    x = torch.rand(2, 1, 28, 28)
    for name in ("t.safetensors", "t.pth"):
        assert in_process(capsys, "convert", tmp_path / "m", tmp_path / name, "--to", "timm").returncode == 0
        back = vitkit.from_pretrained(tmp_path / name, model_name="vit_fmnist_hybrid").eval()
        with torch.no_grad():
            torch.testing.assert_close(back(x), model(x), atol=1e-5, rtol=1e-5)
    image = tmp_path / "x.png"
    Image.fromarray((np.random.default_rng(0).random((28, 28)) * 255).astype(np.uint8)).save(image)
    assert in_process(capsys, "predict", "--weights", tmp_path / "t.safetensors", "--model", "vit_fmnist_hybrid",
                      image).returncode == 0
    # a file that says what it is, read as another architecture: refused by what differs, not by tensor names
    done = in_process(capsys, "predict", "--weights", tmp_path / "t.safetensors", "--model", "vit_fmnist", image)
    one_line(done)
    assert "the file's config is another architecture than vit_fmnist: backbone" in done.stderr
    assert "depth 1 (not 4)" in done.stderr


# ---------------------------------------------------------------- 2. sizes bounded before they are allocated


def hf_folder(root, train_labels, test_labels, label_feature=None, size=8):
    """A Hugging Face ``save_to_disk`` folder of grey images with these labels (ints, or ClassLabel
    indices when ``label_feature`` is a ClassLabel)."""
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)

    def split(labels):
        images = [Image.fromarray(rng.integers(0, 255, (size, size), dtype=np.uint8)) for _ in labels]
        features = datasets.Features({"image": datasets.Image(),
                                      "label": label_feature or datasets.Value("int64")})
        return datasets.Dataset.from_dict({"image": images, "label": list(labels)}, features=features)

    datasets.DatasetDict({"train": split(train_labels), "test": split(test_labels)}).save_to_disk(str(root))
    return root


def hf_train(capsys, data, *flags):
    capsys.readouterr()  # what building the dataset printed
    return in_process(capsys, "train", "--dataset", f"hf:{data}", "--label-key", "label", "--max-steps", "1",
                      "--no-progress", *flags)


def test_an_integer_label_of_two_billion_is_refused_before_its_classes_are_made(tmp_path, capsys):
    data = hf_folder(tmp_path / "hf", [0, 1, 2_000_000_000, 1], [0, 1])
    started = time.time()
    done = hf_train(capsys, data, "--runs-dir", tmp_path / "runs")
    one_line(done)
    assert "holds 2,000,000,000 (row 2), which would make 2,000,000,001 classes, past 1,000,000" in done.stderr
    assert time.time() - started < 60 and not (tmp_path / "runs").exists()


def test_class_counts_pyramid_widths_and_lora_ranks_are_bounded_by_name(monkeypatch, tmp_path, capsys):
    from vitkit.train import memory

    with pytest.raises(ValueError, match="num_classes 2,000,000,000 is past 1,000,000"):
        vitkit.create_model("vit_fmnist", num_classes=2_000_000_000)
    with pytest.raises(ValueError, match="pyramid_channels 10,000,000 is past 65,536"):
        vitkit.create_model("vit_fmnist", features_only=True, pyramid=True, pyramid_channels=10_000_000)
    monkeypatch.setattr("vitkit.models.features.available_memory", lambda: 2 ** 30)
    with pytest.raises(ValueError, match=r"pyramid_channels 60,000 makes a pyramid of [\d,]+ parameters "
                                         r"\([\d,.]+ GiB in fp32\) and 1.0 GiB are free"):
        vitkit.create_model("vit_fmnist", features_only=True, pyramid=True, pyramid_channels=60_000)
    # a head that outweighs the blocks is named as what does not fit, not the blocks (nor the batch)
    monkeypatch.setattr(memory, "available_memory", lambda: 64 * 2 ** 30)
    with pytest.raises(ValueError, match=r"the model \(its head for 1,000,000 classes\) has at least"):
        memory.check_model_fits(vitkit.ViTConfig(num_classes=1_000_000, embed_dim=8192, num_heads=64, depth=1))
    torch.manual_seed(0)
    vitkit.create_model("vit_fmnist", depth=1).save_pretrained(tmp_path / "m")
    done = in_process(capsys, "train", "--init", tmp_path / "m", "--finetune", "lora", "--lora-rank", "500",
                      "--max-steps", "1", "--runs-dir", tmp_path / "runs", "--no-progress")
    ends_in(done, "--lora-rank 500 is past the rank of blocks.0.attn.qkv (96 -> 288: at most 96)")
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- 4. a backbone has no head


def test_a_backbone_has_no_head_and_loads_headless_or_headed_checkpoints_alike(tmp_path):
    timm = pytest.importorskip("timm")
    ref = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=64, num_classes=7).eval()
    headless = {k: v for k, v in ref.state_dict().items() if not k.startswith("head.")}
    backbone = vitkit.create_model("vit_small_patch16_224", img_size=64, features_only=True)
    assert not any(k.startswith("model.head.") for k in backbone.state_dict())  # timm's backbone has none either
    theirs = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=64, features_only=True)
    theirs.model.load_state_dict(headless, strict=False)
    x = torch.rand(2, 3, 64, 64)
    for source in (headless, ref.state_dict()):  # headless, or with a head of another class count
        vitkit.load_weights(backbone, source)
        with torch.no_grad():
            for a, b in zip(backbone.eval()(x), theirs.eval()(x)):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # from_pretrained's backbone is the same object, state dict for state dict
    vitkit.create_model("vit_small_patch16_224", img_size=64, num_classes=7).save_pretrained(tmp_path / "c")
    loaded = vitkit.from_pretrained(tmp_path / "c", features_only=True)
    assert loaded.state_dict().keys() == backbone.state_dict().keys()
    assert loaded.config.num_classes == backbone.config.num_classes == 0


# ---------------------------------------------------------------- 5. signals with workers


@pytest.mark.parametrize("to", ["main", "worker", "group"])
def test_sigterm_with_data_workers_stops_cleanly_wherever_it_lands(tmp_path, to):
    """SIGTERM to the main process, to one DataLoader worker alone, or to the whole process group
    (systemd, a terminal's job control): exit 143, one line after the checkpoint note, the checkpoint
    kept, the lock released, no worker left behind."""
    import os
    import signal
    import subprocess

    from test_faults_hostile import ENV, wait_for
    from vitkit.runlock import holder
    from vitkit.train.checkpoint import checkpoint_paths

    data = image_folder(tmp_path / "data", ["a", "b", "c"], per_class=40, size=32)
    run = tmp_path / "runs" / "r"
    proc = forks.popen("train", "--dataset", "folder", "--data-dir", data, "--workers", "2", "--model", "vit_fmnist",
                       "--img-size", "32", "--batch-size", "16", "--epochs", "50", "--checkpoint-every", "5",
                       "--threads", "1", "--runs-dir", tmp_path / "runs", "--name", "r", "--no-progress",
                       "--no-tensorboard", env=ENV, stderr=subprocess.PIPE, start_new_session=True)
    wait_for(lambda: checkpoint_paths(run), proc, what="a checkpoint")

    def children():
        return [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                               text=True).stdout.split()]

    # the training loader's two workers; an epoch's evaluation runs two more for a moment (seen once on a
    # loaded machine: four), so the count is read until it is the training loader's alone, and that reading
    # is the one kept (a second read could land in the next evaluation: seen once, three)
    seen: list = []

    def training_workers_alone() -> bool:
        seen[:] = children()
        return len(seen) == 2

    wait_for(training_workers_alone, proc, what="the training loader's two workers alone")
    workers = list(seen)
    if to == "main":
        proc.send_signal(signal.SIGTERM)
    elif to == "worker":
        os.kill(workers[0], signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 143 and "Traceback" not in err and "terminate called" not in err, err[-1500:]
    lines = err.strip().splitlines()
    assert lines[-1] == "vitkit train: stopped by SIGTERM; partial files were removed", lines
    assert f"vitkit train --resume {run} goes on from there" in lines[-2], lines
    assert checkpoint_paths(run) and holder(run) is None and not list(run.rglob("*.tmp"))
    for pid in workers:  # every worker ended (reaped by the main process before it exited)
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()


def test_sigterm_to_an_evaluation_worker_stops_it_as_a_stop(tmp_path):
    """`vitkit eval --dataset hf:...` reads through DataLoader workers too: a SIGTERM to one of them
    ended in "unexpected RuntimeError: DataLoader worker ... is killed by signal: Terminated ...
    please report it" (exit 2). Now the stop it is: 143, the one stopped line."""
    import os
    import signal
    import subprocess

    from test_faults_hostile import ENV, wait_for

    datasets = pytest.importorskip("datasets")
    data = hf_folder(tmp_path / "hf", [0, 1], [0, 1] * 2000, datasets.ClassLabel(names=["a", "b"]), size=32)
    vitkit.create_model("vit_fmnist", img_size=32, in_chans=1, num_classes=2,
                        label_names=["a", "b"]).save_pretrained(tmp_path / "m")
    proc = forks.popen("eval", "--weights", tmp_path / "m", "--dataset", f"hf:{data}", "--batch-size", "8",
                       "--no-progress", env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    seen: list = []

    def workers() -> bool:
        seen[:] = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        return len(seen) == 2

    wait_for(workers, proc, what="the evaluation's two workers")
    os.kill(int(seen[0]), signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in err, err[-1500:]
    assert err.strip().splitlines()[-1] == "vitkit eval: stopped by SIGTERM; partial files were removed", err
    assert "top-1" not in out  # no score of the part that ran


def test_a_forked_child_notes_an_inherited_sigterm_and_goes_on():
    """A DataLoader worker between its fork and its worker_init_fn still has the command line's
    handler: raised there, Terminated was a traceback and a worker that "exited unexpectedly", an
    error instead of a stop (seen in CI: SIGTERM to the process group as a worker was forked). It
    notes the stop (handed on to the main process by the worker_init_fn) and puts the default back."""
    import subprocess
    import sys

    from test_faults_hostile import ENV

    script = (
        "import os, signal\n"
        "from vitkit.cli.entry import _on_sigterm\n"
        "from vitkit.signals import Terminated, own_signals, stop_received\n"
        "own_signals()\n"
        "signal.signal(signal.SIGTERM, _on_sigterm)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    noted = isinstance(stop_received(), Terminated)\n"
        "    os._exit(0 if noted and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else 3)\n"
        "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), stop_received())\n")
    done = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "0 None\n", "")


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_stop_python_could_only_report_still_stops_the_run(tmp_path, monkeypatch, capsys):
    """A handler's Terminated raised inside a ``__del__`` or an at-fork hook (where a SIGTERM often
    lands as an evaluation's DataLoader worker is forked: seen in CI) is only reported by Python
    ("Exception ignored in", a traceback) and dropped, and the handler has put SIGTERM's default
    back: the run went on as if nothing came. It stops at its next step, without a traceback."""
    import signal

    import vitkit.train.loop as loop_module
    from vitkit.cli import main
    from vitkit.signals import stop_received
    from vitkit.train.checkpoint import checkpoint_paths

    finished = []

    class SendsSigtermWhenDropped:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)  # to this thread (os.kill's may go to another: xdist's)
            for _ in range(1000):  # the handler runs in this loop, inside __del__: only reported
                pass
            finished.append(self)

    real, steps = loop_module._step, []

    def step(run, at, lr, batches):
        steps.append(at)
        if at == 3:
            SendsSigtermWhenDropped()
        return real(run, at, lr, batches)

    monkeypatch.setattr(loop_module, "_step", step)
    data = image_folder(tmp_path / "data", ["a", "b"], per_class=16, size=16)
    code = main(["train", "--dataset", "folder", "--data-dir", str(data), "--workers", "0", "--model", "vit_fmnist",
                 "--img-size", "16", "--batch-size", "8", "--epochs", "20", "--checkpoint-every", "2", "--threads", "1",
                 "--runs-dir", str(tmp_path / "runs"), "--name", "r", "--no-progress", "--no-tensorboard"])
    err = capsys.readouterr().err
    assert finished == []  # the Terminated was raised inside __del__, where Python only reports it
    assert code == 143 and steps == [0, 1, 2, 3], (steps, err[-800:])
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert err.strip().splitlines()[-1] == "vitkit train: stopped by SIGTERM; partial files were removed"
    assert checkpoint_paths(tmp_path / "runs" / "r")  # step 2's checkpoint kept, to resume from
    assert stop_received() is None  # the command has ended: a later training in this process runs


def test_a_child_that_ended_just_before_a_sigterm_is_no_traceback(monkeypatch):
    """An evaluation's DataLoader worker that ends just before a SIGTERM leaves a SIGCHLD pending
    for Python; the stop put SIGCHLD's default back, and Python reported the pending one with a
    traceback ("Signal 17 ignored due to race condition", seen in CI). Both pending at once here."""
    import signal
    import sys

    import vitkit.cli as cli_module
    from vitkit.signals import stop_received

    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(unraisable.exc_value))
    both = {signal.SIGTERM, signal.SIGCHLD}
    previous = {s: signal.getsignal(s) for s in both}
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # as torch's DataLoader has one
    signal.signal(signal.SIGTERM, cli_module._on_sigterm)
    signal.pthread_sigmask(signal.SIG_BLOCK, both)
    try:  # both sent to this thread (os.kill's would go to any thread that does not block them: xdist's)
        signal.raise_signal(signal.SIGCHLD)  # a worker ended: its SIGCHLD waits behind the mask
        signal.raise_signal(signal.SIGTERM)
        with pytest.raises(cli_module.Terminated):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
            for _ in range(1000):  # Python runs the handlers here: SIGTERM's first
                pass
        for _ in range(1000):  # and SIGCHLD's at the next check
            pass
        assert stop_received() is None  # outside a command: nothing noted for a later training to find
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
        for s, handler in previous.items():
            signal.signal(s, handler)
    assert reported == []


# ---------------------------------------------------------------- 6. flags that mean what they say


@pytest.mark.parametrize("argv,words", [
    (["train", "--epoch", "3"], "unrecognized arguments: --epoch 3 (did you mean --epochs?)"),
    (["train", "--batch", "64"], "unrecognized arguments: --batch 64 (did you mean --batch-size?)"),
    (["predict", "--weight", "w", "x.png"], "the following arguments are required: --weights (--weight is no flag: "
                                            "did you mean --weights?)"),
    (["eval", "--weights", "w", "--max-image", "3"], "unrecognized arguments: --max-image 3 (did you mean "
                                                     "--max-images?)"),
    (["train", "--finetune", "full", "--lora-rank", "4", "--init", "w"],
     "--lora-rank applies with --finetune lora (this run: --finetune full)"),
    (["train", "--lora-alpha", "4", "--lora-targets", "qkv"],
     "--lora-alpha, --lora-targets apply with --finetune lora (this run: --finetune full)"),
    (["train", "--name", "a\nb"], "name must be a folder name (printable,"),
    (["train", "--name", "run\x1b[2J"], "name must be a folder name (printable,"),
    (["predict", "--weights", "w.onnx", "--img-size", "32", "a.png"],  # nargs: the image read as a size
     "invalid int value: 'a.png' (a.png looks like a file: put files before --img-size, or end its values with --)"),
    (["predict", "--weights", "w.onnx", "--img-size", "32", "x"], "invalid int value: 'x' (see vitkit predict"),
    (["serve", "--weights", "w"],  # predict's flag; serve's weights are its argument
     "unrecognized arguments: --weights (WEIGHTS is an argument of vitkit serve, without a flag: vitkit serve "
     "WEIGHTS ...)"),
    (["info", "--model", "Ti/16"],  # train's flag; info's model is its argument
     "unrecognized arguments: --model (MODEL is an argument of vitkit info, without a flag: vitkit info MODEL ...)"),
    (["predict", "--weights", "w.onnx", "--labels", "cat", "dog", "x/a.png", "b.png"],  # no images left
     "required: images (x/a.png, b.png were read as --labels's values: put files before --labels, or end its"),
    (["predict", "--weights", "w.onnx", "--mean", "-.5", "-0.5", "0", "x/a.png"],  # negative numbers are values
     "invalid float value: 'x/a.png' (x/a.png looks like a file: put files before --mean"),
])
def test_flags_mean_what_they_say(tmp_path, capsys, argv, words):
    argv = [*argv, *(["--runs-dir", tmp_path / "runs"] if argv[0] == "train" else [])]
    try:
        done = in_process(capsys, *argv)
    except SystemExit as e:  # the parser's own errors end as the command line ends them
        done = SimpleNamespace(returncode=e.code, **dict(zip(("stdout", "stderr"), capsys.readouterr())))
    line = one_line(done)
    assert words in line, line
    assert not (tmp_path / "runs").exists()


def test_an_image_among_the_labels_is_refused_by_name(tmp_path, monkeypatch, capsys):
    """`predict a.png --labels cat dog b.png`: b.png would be a third class name (or, with as many
    classes, a silent wrong label); an existing file among the names is refused, before any model."""
    monkeypatch.chdir(tmp_path)
    for name in ("a.png", "b.png"):
        (tmp_path / name).write_bytes(b"not read")
    with pytest.raises(SystemExit) as e:
        in_process(capsys, "predict", "a.png", "--weights", "missing.onnx", "--labels", "cat", "dog", "b.png")
    assert e.value.code == 2
    line = one_line(SimpleNamespace(returncode=2, **dict(zip(("stdout", "stderr"), capsys.readouterr()))))
    assert "argument --labels: b.png is a file, not a class name (put files before --labels" in line, line
    # the same name, no such file: a class name (the model is what is missing)
    done = in_process(capsys, "predict", "a.png", "--weights", "missing.onnx", "--labels", "cat", "dog", "c.png")
    assert done.returncode == 2 and "missing.onnx" in one_line(done)


def test_none_switches_init_off_by_value_not_presence():
    from vitkit.train import resolve_config
    from vitkit.train.config import OFF

    cfg = resolve_config("fmnist", init=OFF, model="vit_fmnist")  # --init none --model vit_fmnist: from scratch
    assert cfg.init is None and cfg.model == "vit_fmnist"
    with pytest.raises(ValueError, match="--model vit_fmnist does not apply with --init"):
        resolve_config("fmnist", init="runs/x", model="vit_fmnist")


# ---------------------------------------------------------------- 7. Hugging Face data edge cases, by name


def test_an_empty_split_and_a_torn_arrow_file_are_named(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    data = hf_folder(tmp_path / "empty", [0, 1, 0, 1], [], datasets.ClassLabel(names=["a", "b"]))
    line = one_line(hf_train(capsys, data, "--runs-dir", tmp_path / "runs"))
    assert "split 'test' holds no rows (no Arrow file in" in line, line
    torn = hf_folder(tmp_path / "torn", [0, 1] * 4, [0, 1], datasets.ClassLabel(names=["a", "b"]))
    arrow = next((torn / "train").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    line = one_line(hf_train(capsys, torn, "--runs-dir", tmp_path / "runs"))
    assert f"{arrow} is cut short or damaged" in line and "save the dataset again" in line, line
    assert not (tmp_path / "runs").exists()


def _parquet(path, cells, labels, names=("a", "b"), extra=None):
    """A Parquet file as the Hub holds them (image cells {bytes, path}, the features in its metadata)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": list(names)}}
    columns = {"image": pa.array(cells, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
               "label": pa.array(labels, pa.int64()), **(extra or {})}
    table = pa.table(columns).replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, str(path))


def _png(value=0, size=8):
    import io

    out = io.BytesIO()
    Image.fromarray(np.full((size, size), value, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def test_parquet_files_that_disagree_on_columns_are_one_line(tmp_path, capsys):
    pytest.importorskip("datasets")
    import pyarrow as pa

    cells = [{"bytes": _png(i), "path": None} for i in range(6)]
    _parquet(tmp_path / "mixed" / "data" / "train-00000-of-00002.parquet", cells, [0, 1] * 3)
    _parquet(tmp_path / "mixed" / "data" / "train-00001-of-00002.parquet", cells, [0, 1] * 3,
             extra={"extra": pa.array([1.0] * 6)})
    _parquet(tmp_path / "mixed" / "data" / "test-00000-of-00001.parquet", cells[:2], [0, 1])
    line = ends_in(hf_train(capsys, tmp_path / "mixed", "--runs-dir", tmp_path / "runs"),  # after datasets' bars
                   "do they all have the same columns")
    assert "train-00001-of-00002.parquet' with error CastError" in line, line
    assert "Traceback" not in capsys.readouterr().err


def test_image_paths_in_a_dataset_stay_inside_its_folder(tmp_path):
    from vitkit.data.hf import decode_cell
    from vitkit.data.images import BadImageError

    root = tmp_path / "data"
    (root / "imgs").mkdir(parents=True)
    (root / "imgs" / "x.png").write_bytes(_png(7))
    outside = tmp_path / "secret.png"
    outside.write_bytes(_png(9))
    (root / "imgs" / "link.png").symlink_to(outside)
    roots = (root.resolve(),)
    inside = decode_cell({"bytes": None, "path": "imgs/x.png"}, 1, "row 0", roots)  # relative: from the folder
    assert np.asarray(inside).max() == 7
    assert np.asarray(decode_cell({"bytes": None, "path": str(root / "imgs" / "x.png")}, 1, "row 1", roots)).max() == 7
    for path in (str(outside), "../secret.png", "imgs/link.png", "/etc/hostname"):
        with pytest.raises(BadImageError, match="outside the dataset's folder"):
            decode_cell({"bytes": None, "path": path}, 1, "row 2", roots)


def test_a_parquet_row_pointing_outside_its_folder_is_skipped_by_name(tmp_path, capsys, caplog):
    pytest.importorskip("datasets")
    from vitkit.data import hf

    outside = tmp_path / "secret.png"
    outside.write_bytes(_png(9))
    cells = [{"bytes": None, "path": str(outside)}] + [{"bytes": _png(i), "path": None} for i in range(5)]
    _parquet(tmp_path / "d" / "data" / "train-00000-of-00001.parquet", cells, [0, 1] * 3)
    _parquet(tmp_path / "d" / "data" / "test-00000-of-00001.parquet", cells[1:3], [0, 1])
    name = f"hf:{tmp_path / 'd'}"
    split = hf.load(name)["train"]
    images = hf.HFImages(split, name, "train", "image", "label", ["a", "b"])
    from vitkit.data.images import Skipped

    skipped = [x for x in (images[i] for i in range(len(images))) if isinstance(x, Skipped)]
    assert len(skipped) == 1 and "outside the dataset's folder" in skipped[0].reason


def test_pretraining_needs_no_labels_and_a_classifier_needs_two_classes(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    features = datasets.Features({"image": datasets.Image()})
    images = [Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)) for _ in range(12)]
    datasets.DatasetDict({s: datasets.Dataset.from_dict({"image": images}, features=features)
                          for s in ("train", "test")}).save_to_disk(str(tmp_path / "plain"))
    capsys.readouterr()
    done = in_process(capsys, "pretrain", "--objective", "mae", "--dataset", f"hf:{tmp_path / 'plain'}",
                      "--max-steps", "1", "--batch-size", "4", "--val-size", "2", "--runs-dir", tmp_path / "runs",
                      "--no-progress", "--no-tensorboard")
    assert done.returncode == 0, done.stderr[-800:]
    one = hf_folder(tmp_path / "one", [0] * 8, [0, 0], datasets.ClassLabel(names=["only"]))
    line = one_line(hf_train(capsys, one, "--runs-dir", tmp_path / "runs2"))
    assert "has 1 class ('only'): a classifier needs two or more" in line, line
    assert not (tmp_path / "runs2").exists()


def test_a_run_whose_every_image_is_broken_leaves_no_folder(tmp_path, capsys):
    pytest.importorskip("datasets")
    cells = [{"bytes": b"not an image", "path": None}] * 8
    _parquet(tmp_path / "b" / "data" / "train-00000-of-00001.parquet", cells, [0, 1] * 4)
    _parquet(tmp_path / "b" / "data" / "test-00000-of-00001.parquet", [{"bytes": _png(), "path": None}] * 2, [0, 1])
    done = hf_train(capsys, tmp_path / "b", "--runs-dir", tmp_path / "runs", "--batch-size", "4", "--val-size", "2",
                    "--max-steps", "2")
    ends_in(done, "saw no usable image: every sample was skipped")
    assert not any((tmp_path / "runs").iterdir())  # nothing to resume: no stub of a run


def test_a_run_resumed_at_its_last_step_says_so(tmp_path, capsys):
    from vitkit.train import resolve_config, train

    data = image_folder(tmp_path / "data", ["a", "b"], per_class=4, size=16)
    cfg = dict(dataset="folder", data_dir=str(data), model="vit_fmnist", model_args={"depth": 1}, img_size=16,
               batch_size=4, max_steps=2, checkpoint_every=2, val_size=1, runs_dir=str(tmp_path / "runs"),
               name="r", progress=False, tensorboard=False, workers=0)
    train(resolve_config("fmnist", **cfg), log=lambda *a: None)
    (tmp_path / "runs" / "r" / "summary.json").unlink()  # killed after its last checkpoint, before its summary
    lines = []
    summary = train(resolve_config("fmnist", **cfg), resume=str(tmp_path / "runs" / "r"), log=lines.append)
    assert any("all 2 steps done before" in line for line in lines), lines
    assert not any("steps 3-2" in line for line in lines) and summary["steps"] == 2


# ---------------------------------------------------------------- 8. a small folder on the first try


def shapes_folder(root, per_class=(54, 16), size=64, seed=0):
    """Circles, squares and triangles of random size, place and colour on dark backgrounds: 210 images."""
    from PIL import ImageDraw

    rng = np.random.default_rng(seed)
    for split, n in zip(("train", "test"), per_class):
        for shape in ("circle", "square", "triangle"):
            (root / split / shape).mkdir(parents=True)
            for i in range(n):
                im = Image.new("RGB", (size, size), tuple(int(v) for v in rng.integers(0, 80, 3)))
                r = int(rng.integers(size // 5, size // 3))
                cx, cy = (int(v) for v in rng.integers(r, size - r, 2))
                colour = tuple(int(v) for v in rng.integers(150, 255, 3))
                draw = ImageDraw.Draw(im)
                if shape == "circle":
                    draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
                elif shape == "square":
                    draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=colour)
                else:
                    draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
                im.save(root / split / shape / f"{i}.png")
    return root


@pytest.mark.slow
def test_fine_tuning_a_small_folder_with_default_flags_learns_and_says_what_it_does(tmp_path, capsys):
    """A newcomer's first hour: 210 images of 64 px in 3 classes, `vitkit train --dataset folder
    --init RUN` with no other flag. The batch and length fit the data (each said), the first line says
    the images are resized, the cost is said before the first step, and the test score is far from chance.
    (In this process: the command's own main, without a second start of Python and torch.)"""
    torch.manual_seed(0)
    vitkit.create_model("vit_fmnist_hybrid").save_pretrained(tmp_path / "start")
    data = shapes_folder(tmp_path / "shapes")
    done = in_process(capsys, "train", "--dataset", "folder", "--data-dir", data, "--init", tmp_path / "start",
                      "--runs-dir", tmp_path / "runs", "--name", "ft", "--threads", "1", "--no-progress", "--json")
    assert done.returncode == 0, done.stderr[-1500:]
    said = done.stderr
    assert re.search(r"batch 8 \(not the recipe's 128\): 1\d\d training images make 1\d steps an epoch", said), said
    # the recipe's own length depends on the precision this CPU trains in (fmnist-fp32: 3 epochs; fmnist: 9)
    assert re.search(r"\d+ epochs \(not the recipe's (\d+)\): \1 epochs of 1\d steps would be \d+ steps, too few",
                     said), said
    lines = said.splitlines()
    first = next(line for line in lines if line.startswith("training "))
    assert "its images (64x64, the first) resized to 28x28, the model's size (--img-size chooses)" in first, first
    fitted = lines[lines.index(first) + 1:lines.index(first) + 4]  # said after the first line, then the cost
    assert fitted[0].startswith("batch 8") and fitted[1].endswith("(--epochs chooses)"), fitted
    cost = lines[lines.index(first) + 4]
    assert re.match(r"cost: 0\.1\d GFLOPs of training per image x [\d,]+ images = [\d.]+ GFLOPs; about \d+ s here",
                    cost), cost
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] >= 300 and summary["test_top1"] > 0.8, summary  # chance: a third


def test_only_what_nobody_chose_is_fitted_to_small_data():
    from vitkit.train import TrainConfig, resolve_config
    from vitkit.train.fit import fit_to_data

    default = resolve_config("fmnist-fp32")
    assert fit_to_data(default, 55_000) == (default, [])  # the default run on its data: as it is
    fitted, notes = fit_to_data(default, 146)
    assert (fitted.batch_size, fitted.epochs, fitted.warmup_steps) == (8, 17.0, 30) and len(notes) == 3
    chosen = resolve_config("fmnist-fp32", batch_size=64, epochs=5)  # chosen: kept, and its shortness said
    kept, notes = fit_to_data(chosen, 146)
    assert (kept.batch_size, kept.epochs, kept.warmup_steps) == (64, 5, 200)
    assert notes == ["note: 10 steps are too few to learn much (under 100): more --epochs, or a smaller --batch-size"]
    assert fit_to_data(TrainConfig(), 146)[0] == TrainConfig()  # made directly: nothing is known to be free
    assert fit_to_data(default, 5)[0].batch_size == 5  # fewer images than the smallest batch: all of them
    assert fit_to_data(default, 5, world=2)[0].batch_size == 4  # a multiple of torchrun's processes
    assert fit_to_data(default, 146, world=3)[0].batch_size == 6
    long_enough = resolve_config("fmnist-fp32", max_steps=300)  # big data, a short run asked for: untouched
    assert fit_to_data(long_enough, 55_000) == (long_enough, [])


def test_the_cost_line_times_a_large_model_on_few_images(monkeypatch):
    """The timed step stays under TIMED_STEP_FLOPS: ViT-B/16 at 384 px was timed on 32 images twice
    (9.4 TFLOPs each: minutes before a run's first step on a laptop); the small default model is timed on its
    micro-batch (on 32 images, a part of 16 a thread, its estimate was 4 min for 3 min 8 s of training)."""
    from vitkit.models.complexity import complexity
    from vitkit.train import fit

    timed = []
    monkeypatch.setattr(fit, "_time_step", lambda model, n, amp, device, parallel: timed.append(n) or 0.5 * n)
    cpu = torch.device("cpu")
    for name, kw in (("vit_base_patch16_384", {}), ("vit_fmnist_hybrid", {})):
        model = vitkit.create_model(name, **kw)
        per_image = 6 * complexity(model.config).macs
        line = fit.cost_line(model, complexity(model.config).macs, 10_000, 128, None, cpu)
        assert timed[-1] * per_image <= fit.TIMED_STEP_FLOPS or timed[-1] == 1
        assert line.endswith(f"(one timed step of {timed[-1]} image{'s' if timed[-1] > 1 else ''})"), line
    assert timed == [1, 128]
    # a short run (VITKIT_TINY's 2 steps of 16, a smoke test): the timing sees at most 5% of its images
    fit.cost_line(model, complexity(model.config).macs, 32, 16, None, cpu)
    fit.cost_line(model, complexity(model.config).macs, 200, 64, None, cpu)
    assert timed[2:] == [1, 10]


def test_the_cost_line_times_the_step_as_the_run_takes_it():
    """The timed step ran on torch's own threads while the run's steps run in parts on single-threaded workers:
    beside a busy process the barriers stalled it ("about 59 min" for a run that took 208 s). It runs as the
    steps do now: in parts, each on one thread, leaving the model's gradients, mode and random streams as found."""
    import threading

    from vitkit.models.complexity import complexity
    from vitkit.parallel import BatchParallel
    from vitkit.train import fit

    model = vitkit.create_model("vit_fmnist", depth=1).train()
    seen = []
    model.register_forward_pre_hook(lambda m, args: seen.append(
        (len(args[0]), threading.current_thread().name.startswith("vitkit-part"), torch.get_num_threads())))
    parallel, before = BatchParallel(2), torch.random.get_rng_state()
    try:
        line = fit.cost_line(model, complexity(model.config).macs, 10_000, 32, None, torch.device("cpu"),
                             parallel=parallel)
    finally:
        parallel.close()
    assert line.endswith("(one timed step of 32 images)") and "about" in line, line
    assert sorted(seen) == [(16, True, 1)] * 4  # two passes of two parts, each on a worker with one thread
    assert all(p.grad is None for p in model.parameters()) and model.training
    assert torch.equal(torch.random.get_rng_state(), before)
    seen.clear()
    fit.cost_line(model, complexity(model.config).macs, 10_000, 32, None, torch.device("cpu"))  # (torch's threads)
    assert [(n, part) for n, part, _ in seen] == [(32, False)] * 2


# ---------------------------------------------------------------- 9. preprocessing in one call


def test_preprocess_takes_any_image_form_and_equals_timm_s_transform(tmp_path):
    timm = pytest.importorskip("timm")
    from timm.data import create_transform, resolve_data_config

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    path = tmp_path / "x.png"
    Image.fromarray(pixels).save(path)
    model = vitkit.create_model("vit_small_patch16_224")
    forms = [str(path), path, path.read_bytes(), Image.open(path), pixels, pixels / 255.0,
             torch.from_numpy(pixels).permute(2, 0, 1).float() / 255]
    batch = vitkit.preprocess(model, forms)
    assert batch.shape == (len(forms), 3, 224, 224)
    for row in batch[1:]:
        torch.testing.assert_close(row, batch[0], atol=1e-6, rtol=0)
    theirs = create_transform(**resolve_data_config({}, model=timm.create_model("vit_small_patch16_224")))
    torch.testing.assert_close(vitkit.preprocess(model, str(path))[0], theirs(Image.open(path).convert("RGB")),
                               atol=1e-5, rtol=0)
    grey = vitkit.create_model("vit_fmnist")  # its channels and size: one grey 28x28 input
    assert vitkit.preprocess(grey, path).shape == (1, 1, 28, 28)
    assert vitkit.preprocess(grey.config, path).shape == (1, 1, 28, 28)  # a config serves as well
    for bad, words in ((pixels * 2.0, r"float pixels must lie in \[0, 1\]"), (np.zeros((4, 4, 5)), "shape"),
                       (pixels.astype(np.int64), "pixels of int64"), (3, "not int")):
        with pytest.raises((ValueError, TypeError), match=words):
            vitkit.preprocess(model, bad)


# ---------------------------------------------------------------- 10. small things a newcomer met


def test_a_runtime_is_named_by_what_it_computes():
    from types import SimpleNamespace

    from vitkit.cli import _runtime_name

    ir = dict(export_flag="openvino", precision="fp32")
    assert _runtime_name(SimpleNamespace(quantization="int8-static", **ir)) == "openvino int8 (NNCF, calibrated)"
    assert _runtime_name(SimpleNamespace(quantization="none", **dict(ir, precision="bf16"))) == "openvino bf16"
    assert _runtime_name(SimpleNamespace(quantization="unknown", **ir)) == "openvino fp32"  # a foreign IR
    assert _runtime_name(SimpleNamespace(quantization="int8-dynamic", export_flag="onnx")) == \
        "onnxruntime int8-dynamic"
    assert _runtime_name(torch.nn.Linear(1, 1)) == "fp32"


def test_a_long_blocking_call_says_it_is_at_work_by_stage(monkeypatch):
    import io

    from vitkit import progress

    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    out = io.StringIO()
    with progress.working("exporting m.onnx to ONNX (dynamo)", stream=out) as said:
        time.sleep(1.3)
        said.label = "quantizing m.onnx (int8)"
        time.sleep(1.3)
    lines = out.getvalue().splitlines()  # not a terminal: a line at the start of the wait, then every 10 s
    assert lines and lines[0] == "exporting m.onnx to ONNX (dynamo) | 00:01", lines
    quiet = io.StringIO()
    monkeypatch.setattr(progress, "DELAY_S", 5.0)
    with progress.working("short", stream=quiet):  # a short wait says nothing
        time.sleep(0.2)
    assert quiet.getvalue() == ""


def test_the_command_line_page_lists_every_verb():
    from pathlib import Path

    from vitkit.cli import build_parser

    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    parser = build_parser()
    verbs = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices
    missing = [v for v in verbs if f"vitkit {v} " not in page]
    assert not missing, missing


def test_a_run_resumed_at_its_last_step_from_an_old_checkpoint_claims_no_speed():
    from types import SimpleNamespace

    from vitkit.cli.train import _img_s
    from vitkit.train.throughput import train_throughput
    cfg = SimpleNamespace(batch_size=32)
    at_end = SimpleNamespace(prior_train_seconds=None, total=100, start=100, train_seconds=0.0, cfg=cfg)
    speed = train_throughput(at_end)
    assert speed["train_img_s"] is None and "last step" in speed["train_img_s_covers"]
    assert _img_s(speed) == "no step timed in this process"
    midway = SimpleNamespace(prior_train_seconds=None, total=100, start=60, train_seconds=4.0, cfg=cfg)
    assert train_throughput(midway) == {"train_img_s": 320.0, "train_img_s_covers": "steps 61-100 (since the resume; "
                                        "earlier checkpoints kept no training time)"}
    assert _img_s(train_throughput(midway)) == "320 img/s"


def test_a_worker_gone_after_it_noted_a_sigterm_is_the_stop(monkeypatch):
    """A worker that noted a SIGTERM and then died of it before the main process asked ended evaluation in torch's
    "DataLoader worker (pid(s) N) exited unexpectedly", said as an unexpected error: it is the stop it means.
    Without such a note the error is torch's, as before."""
    from vitkit.data import loader
    from vitkit.signals import Terminated

    def fake(noted):
        class Loader:
            def __init__(self, dataset, worker_init_fn=None, **options):
                self.init = worker_init_fn

            def __iter__(self):
                yield 1
                if noted:
                    self.init.args[0].value = 1  # what a worker's SIGTERM handler sets
                raise RuntimeError("DataLoader worker (pid(s) 5449) exited unexpectedly")
        return Loader

    for noted, error in ((True, Terminated), (False, RuntimeError)):
        monkeypatch.setattr(loader, "DataLoader", fake(noted))
        batches = loader.loader_batches([0], num_workers=2)
        assert next(batches) == 1
        with pytest.raises(error):
            next(batches)


class _DiesOfSigterm(torch.utils.data.Dataset):
    """A worker that dies of SIGTERM with its default action, as torch's own handler has it before worker_init_fn."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 9:
            import os
            import signal

            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        return torch.tensor(i)


def test_a_worker_that_died_of_sigterm_before_its_note_is_the_stop():
    """torch puts its own SIGTERM handler in a worker before worker_init_fn installs vitkit's: a SIGTERM in that
    window ended the worker with no note, and a full run's evaluation stopped with "unexpected RuntimeError:
    DataLoader worker ... exited unexpectedly" (exit 2, 1 of 2,143). The worker's own end says which signal."""
    from vitkit.data.loader import loader_batches
    from vitkit.signals import Terminated

    with pytest.raises(Terminated):
        for _ in loader_batches(_DiesOfSigterm(), batch_size=4, num_workers=2):
            pass


class _ExitsWith(torch.utils.data.Dataset):
    """A worker that ends itself at sample 9: of SIGTERM with its default action, or with an exit code."""

    def __init__(self, code=None):
        self.code = code

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 9:
            import os

            time.sleep(0.3)  # while the main process is in its caller's code, past the first batch
            if self.code is not None:
                os._exit(self.code)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        return torch.tensor(i)


@pytest.mark.parametrize("code, stop", [(None, "Terminated"), (3, "RuntimeError")])
def test_a_worker_death_between_batches_is_raised_at_the_next_batch_not_in_the_callers_code(code, stop):
    """torch's SIGCHLD handler raised a worker's death wherever the main thread was: in the caller's own code
    between two batches (a test's loop body, pytest's traceback code: a crashed xdist worker), where nothing
    turns it into the stop it means. The death is noted and raised by the loader at its next batch: a SIGTERM
    as the stop it means, any other death as torch's error."""
    from vitkit.data.loader import loader_batches
    from vitkit.signals import Terminated

    before = signal.getsignal(signal.SIGCHLD)
    raised_in_caller, seen = [], 0
    with pytest.raises(Terminated if stop == "Terminated" else RuntimeError) as raised:
        for _ in loader_batches(_ExitsWith(code), batch_size=4, num_workers=2):
            seen += 1
            try:
                time.sleep(0.5)  # the worker dies while this process waits here
            except RuntimeError as e:
                raised_in_caller.append(str(e))
    assert raised_in_caller == [] and seen >= 1
    if code is not None:
        assert "exited unexpectedly" in str(raised.value)
    assert signal.getsignal(signal.SIGCHLD) is before  # the loader's handler is gone with it
