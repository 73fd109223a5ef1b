"""Faults and bad input (issue 16): each ends in one clear line, and nothing is written or lost.

One test or more per class of the hostile-user report: non-finite state never checkpointed,
one writer per run folder (real processes), checkpoints that do not load skipped on resume,
full disks said in words, leftovers of killed writers removed, file modes from the umask,
every export read back, honest words for bad files and flags.
"""

import errno
import io
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import time
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import forks
import vitkit
from vitkit.data import fashion_mnist as fm
from vitkit.data.shards import decode_record, folder_to_shards, iter_records
from vitkit.runlock import RunLock, RunLocked, holder
from vitkit.train import NonFiniteLoss, resolve_config, train
from vitkit.train.checkpoint import NonFiniteState, checkpoint_paths, load_intact, save_checkpoint
from vitkit.weights import UnsafeCheckpointError, WeightsError

real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")


def small(tmp_path, **kw):
    base = dict(max_steps=12, runs_dir=str(tmp_path), name="run", checkpoint_every=4, progress=False, val_size=500,
                warmup_steps=2, log_every=4, eval_batch_size=500, tensorboard=False, test_size=500)
    base.update(kw)
    return resolve_config("fmnist", **base)


def listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


cli = forks.run  # python -m vitkit ARGV, as a process of its own


# ---------------------------------------------------------------- 1. the last good checkpoint is good


def test_a_non_finite_state_is_never_written_and_the_finite_one_is_kept(tmp_path):
    good = {"model": {"w": torch.ones(3)}, "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}}}, "step": 1}
    first = save_checkpoint(tmp_path, 1, good, keep=1)
    bad = {"model": {"w": torch.ones(3)}, "optimizer": {"state": {0: {"exp_avg": torch.tensor([0, float("nan"), 0])}}},
           "step": 2}
    with pytest.raises(NonFiniteState, match="optimizer state at step 2 is not finite"):
        save_checkpoint(tmp_path, 2, bad, keep=1)
    assert checkpoint_paths(tmp_path) == [first]  # keep=1 did not rotate the finite one away
    assert load_intact(tmp_path)[0]["step"] == 1


@real
@pytest.mark.slow
def test_a_diverging_run_names_a_finite_checkpoint_that_still_loads(tmp_path):
    cfg = small(tmp_path, lr=1e6, warmup_steps=0, clip_grad=None, keep_checkpoints=1, checkpoint_every=1,
                log_every=1, max_steps=30)
    with pytest.raises(NonFiniteLoss, match=r"at step \d+ .*last good checkpoint is .*step_\d+\.pt") as info:
        train(cfg)
    named = str(info.value).split("last good checkpoint is ")[1].split(".pt")[0] + ".pt"
    state = torch.load(named, weights_only=True)
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert checkpoint_paths(tmp_path / "run") == [tmp_path / "run" / "checkpoints" / os.path.basename(named)]


# ---------------------------------------------------------------- 2. one writer per run folder


@real
@pytest.mark.slow
def test_a_running_run_cannot_be_resumed_or_reused_and_its_lock_dies_with_it(tmp_path, capsys):
    from vitkit.cli import main

    env = dict(os.environ, PYTHONHASHSEED="0")
    first = forks.popen("train", "--runs-dir", tmp_path, "--name", "run", "--max-steps", "400", "--batch-size", "32",
                        "--checkpoint-every", "2", "--log-every", "1", "--val-size", "500", "--threads", "1",
                        "--no-progress", "--no-tensorboard", env=env, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
    run = tmp_path / "run"
    threads = torch.get_num_threads()  # the refused resume sets the saved run's threads before it is refused
    try:
        deadline = time.time() + 120
        while len(checkpoint_paths(run)) < 2:
            assert first.poll() is None and time.time() < deadline, "no checkpoints appeared"
            time.sleep(0.05)
        # the writer stays alive with its lock, stopped: it takes no core while the two writers below
        # (this process: vitkit's entry point, what `python -m vitkit` exits with) are refused
        first.send_signal(signal.SIGSTOP)

        def metrics():  # a row every step (log_every 1), written before the step's checkpoint
            return (run / "metrics.jsonl").read_bytes() if (run / "metrics.jsonl").exists() else b""

        before = metrics()
        assert before.count(b"\n") >= 4  # steps 1-4 at least: the check that nothing was overwritten bites
        assert main(["train", "--resume", str(run), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "is being written by process" in err and "Traceback" not in err and str(first.pid) in err
        assert main(["train", "--runs-dir", str(tmp_path), "--name", "run", "--max-steps", "2"]) == 2
        assert "is being written by process" in capsys.readouterr().err  # a new run, same name
        assert metrics()[:len(before)] == before  # nothing overwritten
    finally:
        torch.set_num_threads(threads)
        first.send_signal(signal.SIGKILL)
        first.wait()
    RunLock(run).acquire().release()  # the killed process's lock died with it: --resume may take it at once
    # a torn newest checkpoint: a real resume falls back to the one before and says so
    newest, previous = checkpoint_paths(run)[-1], checkpoint_paths(run)[-2]
    newest.write_bytes(newest.read_bytes()[:100])
    resumed = forks.popen("train", "--resume", run, "--no-progress", env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
    try:
        said = []
        for line in resumed.stderr:
            said.append(line)
            if "resuming" in line:
                break
        assert any("does not load" in line and newest.name in line for line in said), said
        assert previous.name in said[-1], said
    finally:
        resumed.send_signal(signal.SIGKILL)
        resumed.wait()


def test_unnamed_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    from vitkit.train.loop import Run, _new_run_dir

    cfg = resolve_config("fmnist", runs_dir=str(tmp_path), model="S/16")
    runs = [Run.__new__(Run) for _ in range(3)]
    folders = []
    for run in runs:
        run.cfg = cfg
        folders.append(_new_run_dir(run))
    assert len(set(folders)) == 3 and all(f.parent == tmp_path for f in folders)  # "S/16" is no subfolder
    for run in runs:
        run.lock.release()


# ---------------------------------------------------------------- 5. resume, disks, checkpoints


def fake_run(tmp_path, steps=(4, 8)):
    run = tmp_path / "run"
    for s in steps:
        save_checkpoint(run, s, {"model": {"w": torch.full((2,), float(s))}, "step": s}, keep=5)
    return run


def test_resume_skips_a_zero_byte_or_truncated_checkpoint_and_says_so(tmp_path):
    run = fake_run(tmp_path)
    newest = checkpoint_paths(run)[-1]
    said = []
    for damage in (b"", newest.read_bytes()[:40]):
        newest.write_bytes(damage)
        state, path = load_intact(run, log=said.append)
        assert state["step"] == 4 and path.name == "step_00000004.pt"
    assert len(said) == 2 and all("does not load" in s and "step_00000008.pt" in s for s in said)
    # set aside by the resume: kept for a look, and not one of the checkpoints keep_checkpoints counts (a junk step 8
    # was kept over the good step 4 the run had resumed from)
    from vitkit.train.checkpoint import set_aside_unreadable

    set_aside_unreadable(run, path, log=said.append)
    assert said[-1] == "set step_00000008.pt, which does not load, aside as step_00000008.pt.unreadable"
    save_checkpoint(run, 5, {"model": {"w": torch.full((2,), 5.0)}, "step": 5}, keep=2)
    assert [p.name for p in checkpoint_paths(run)] == ["step_00000004.pt", "step_00000005.pt"]
    assert len((run / "checkpoints" / "step_00000008.pt.unreadable").read_bytes()) == 40  # the torn file, kept


def test_resume_refuses_a_crafted_checkpoint_by_name(tmp_path):
    run = fake_run(tmp_path)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    newest = checkpoint_paths(run)[-1]
    torch.save({"model": {}, "step": 8, "x": Evil()}, newest)
    with pytest.raises(ValueError, match="refused to resume from .*step_00000008.pt.*posix.system"):
        load_intact(run)
    assert not marker.exists()


def test_a_full_disk_is_said_in_words_and_the_previous_checkpoint_stays(tmp_path, monkeypatch):
    run = fake_run(tmp_path, steps=(4,))
    real_save = torch.save

    def full(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match="no space left on device while writing .*step_00000008.pt.*intact"):
        save_checkpoint(run, 8, {"model": {"w": torch.ones(2)}, "step": 8}, keep=1)
    monkeypatch.undo()
    assert listing(run) == ["checkpoints", "checkpoints/step_00000004.pt"]  # no temporary left either
    assert load_intact(run)[0]["step"] == 4


@pytest.mark.parametrize("flag,value,words", [
    ("--max-steps", "0", "max_steps must be in [1, 1,000,000,000]"),
    ("--max-steps", "-5", "max_steps must be in [1, 1,000,000,000]"),
    ("--log-every", "0", "log_every"), ("--checkpoint-every", "0", "checkpoint_every"),
    ("--batch-size", "0", "batch_size"), ("--model-args", '{"num_heads": 0}', "num_heads must be a positive"),
    ("--model-args", '{"embed_dim": "wide"}', "embed_dim must be a positive integer"),
    ("--model-args", "null", "--model-args must be a JSON object"),
    ("--model-args", "[1]", "--model-args must be a JSON object"),
    ("--model-args", '{"heads": 4}', "unknown option(s) heads of a ViT config"),
    ("--model-args", '{"std": [0]}', "std must be positive"),
    ("--model-args", '{"mean": [72.9]}', "mean (72.9) and std (0.353) are not of pixels scaled to [0, 1]"),
    ("--model-args", '{"mean": [-0.5]}', "a std at most 1), as vitkit reads them\n"),  # no 0-255 advice
    ("--lr", "-1", "lr must be > 0"), ("--lrr", "1", "(did you mean --lr?)"),
    ("--recipe", "deit2", "invalid choice: 'deit2'"),
])
def test_bad_values_end_in_one_line_and_leave_no_folder(tmp_path, flag, value, words):
    done = cli("train", "--runs-dir", str(tmp_path), "--name", "run", flag, value, "--no-progress", "--threads", "1")
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_vitkit_debug_shows_the_traceback_of_an_input_error(tmp_path):
    done = cli("train", "--runs-dir", str(tmp_path), "--max-steps", "0", env=dict(os.environ, VITKIT_DEBUG="1"))
    assert done.returncode == 1 and "Traceback" in done.stderr
    assert "max_steps must be in [1, 1,000,000,000]" in done.stderr


# ---------------------------------------------------------------- 6. leftovers and modes


@real
@pytest.mark.slow
def test_resume_removes_partial_files_and_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        train(small(tmp_path, max_steps=8, batch_size=32))
    finally:
        os.umask(old)
    run = tmp_path / "run"
    for name in ("config.json", "summary.json", "model/model.safetensors"):
        assert stat.S_IMODE((run / name).stat().st_mode) == 0o644, name
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in checkpoint_paths(run))
    # a kill after step 8's rows were logged but before its checkpoint, mid-write of two files
    (run / "checkpoints" / "step_00000008.pt").unlink()
    for leftover in (run / "checkpoints" / ".step_00000008.pt.abc123.tmp", run / ".summary.json.x.tmp"):
        leftover.write_bytes(b"\0" * 1000)
    train(small(tmp_path, max_steps=8, batch_size=32), resume=str(run))
    assert not list(run.rglob("*.tmp"))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for kind in ("train_loss", "val_acc"):
        steps = [r["step"] for r in rows if kind in r]
        assert steps == sorted(set(steps)) and steps[-1] == 8, f"{kind} rows: {steps}"


# ---------------------------------------------------------------- 7. every export reads back


@pytest.mark.parametrize("name,kw", [
    ("vit_fmnist_hybrid", {}), ("vit_fmnist", {}), ("deit_tiny_distilled_patch16_224", dict(img_size=32, depth=1)),
    ("cait_xxs24_224", dict(img_size=32, depth=2)), ("convit_tiny", dict(img_size=32, depth=2, local_up_to_layer=1)),
    ("resnetv2_50_nopreact", dict(layers=(1, 1), img_size=64)),
])
def test_every_model_reads_back_from_its_timm_export_with_the_same_logits(tmp_path, name, kw):
    from conftest import randomize

    model = randomize(vitkit.create_model(name, **kw))
    x = torch.randn(2, model.config.in_chans, *model.config.img_size)
    path = vitkit.export_weights(model, tmp_path / "w.safetensors", "timm")
    back = vitkit.from_pretrained(path)
    with torch.no_grad():
        assert torch.equal(back(x), model(x))
    assert back.config.mean == model.config.mean  # the preprocessing travels too


def test_a_bare_pth_says_what_its_shapes_cannot_give_back(tmp_path):
    from conftest import randomize

    model = randomize(vitkit.create_model("vit_fmnist"))
    with pytest.warns(UserWarning, match=r"num_heads \(3 in the model, 1 read off the shapes\)"):
        path = vitkit.export_weights(model, tmp_path / "w.pth", "timm")
    back = vitkit.from_pretrained(path, num_heads=3, pos_embed="learned")
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.allclose(back(x), model(x), atol=1e-6)
    for name in ("vit_tiny_patch16_224", "vit_base_patch16_clip_224"):  # their default patch bias, present or not,
        plain = vitkit.create_model(name, depth=1, img_size=32)       # is what the shapes say: no note
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            if name.startswith("vit_tiny"):
                vitkit.export_weights(plain, tmp_path / "t.pth", "timm")
                continue
            with pytest.warns(UserWarning) as said:  # CLIP's eps is lost, its patch bias is not
                vitkit.export_weights(plain, tmp_path / "c.pth", "timm")
        assert "norm_eps" in str(said[0].message) and "patch_bias" not in str(said[0].message)


# ---------------------------------------------------------------- 8. honest words


def test_random_bytes_are_not_called_a_pickle_and_no_unsafe_hint_is_given(tmp_path):
    (tmp_path / "noise.pth").write_bytes(np.random.default_rng(0).integers(0, 256, 500, dtype=np.uint8).tobytes())
    with pytest.raises(WeightsError, match="is not a PyTorch checkpoint") as info:
        vitkit.from_pretrained(tmp_path / "noise.pth")
    assert not isinstance(info.value, UnsafeCheckpointError) and "weights_only" not in str(info.value)
    # a malformed pickle stream: the unpickler's own IndexError was "unexpected" (a traceback-class line), and a
    # checkpoint of the same bytes stopped a resume
    from vitkit.train.checkpoint import read_checkpoint

    for name, data in (("stack.pth", b"\x80\x02R."), ("t.pth", b"t")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(WeightsError, match=rf"{name} is not a readable PyTorch checkpoint \(pop from empty"):
            vitkit.from_pretrained(tmp_path / name)
        with pytest.raises(OSError, match=rf"{name} is not a readable checkpoint \(IndexError"):
            read_checkpoint(tmp_path / name)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"w": Evil()}, tmp_path / "evil.pth")
    with pytest.raises(UnsafeCheckpointError, match="Python object 'print'") as info:
        vitkit.from_pretrained(tmp_path / "evil.pth")
    assert "weights_only=False" not in str(info.value) and "weights_only` set to `False" not in str(info.value)


def test_predict_on_a_folder_without_images_and_top_k_zero_say_what_is_wrong(tmp_path):
    vitkit.create_model("vit_fmnist").save_pretrained(tmp_path / "m")
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "a.png")
    done = cli("predict", "--weights", str(tmp_path / "m"), str(tmp_path / "m"))  # a folder of weights, no image
    assert done.returncode == 2 and "no image files (.jpg, .jpeg, .jfif, .png, .bmp, .gif, .webp, .tif, .tiff, " \
                                    f".ppm, .pgm, .pbm, .pnm) in the folder {tmp_path / 'm'}" in done.stderr
    done = cli("predict", "--weights", str(tmp_path / "m"), str(tmp_path / "a.png"), "--top-k", "0")
    assert done.returncode == 2 and "--top-k must be a positive integer" in done.stderr


def test_differing_class_folders_are_named(tmp_path):
    for split, classes in (("train", ("ant", "bee")), ("test", ("ant", "cow"))):
        for c in classes:
            (tmp_path / split / c).mkdir(parents=True)
            Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / split / c / "x.png")
    with pytest.raises(ValueError, match="only in train/: 'bee'; only in test/: 'cow'"):
        train(resolve_config("fmnist", dataset="folder", data_dir=str(tmp_path), runs_dir=str(tmp_path / "runs"),
                             model="vit_fmnist", max_steps=1, workers=0, progress=False))
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- 3. no sample vanishes without a word


def make_shards(root, per_class=24, max_per_shard=16, bad_images=False):
    """train/ and test/ shards of 28x28 grey noise images of two classes (or undecodable bytes)."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        folder = root / "images" / split
        for c in ("a", "b"):
            (folder / c).mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(folder / c / f"{i}.png")
        paths = folder_to_shards(folder, root / "shards" / split, max_per_shard=max_per_shard)
        for path in paths if bad_images else ():
            with tarfile.open(path) as tar:
                members = [(m, tar.extractfile(m).read()) for m in tar if m.isfile()]
            with tarfile.open(path, "w") as tar:
                for m, data in members:
                    data = b"not a png" if m.name.endswith(".png") else data
                    m.size = len(data)
                    tar.addfile(m, io.BytesIO(data))
    return root / "shards"


def shard_config(tmp_path, data_dir, **kw):
    base = dict(dataset="shards", data_dir=str(data_dir), model="vit_fmnist", max_steps=6, batch_size=8,
                val_size=8, warmup_steps=1, runs_dir=str(tmp_path / "runs"), name="run", log_every=2,
                checkpoint_every=3,
                progress=False, workers=0, eval_batch_size=16, tensorboard=False, shuffle_buffer=4)
    base.update(kw)
    return resolve_config("fmnist", **base)


def test_a_truncated_shard_is_counted_and_a_garbage_one_named(tmp_path):
    data = make_shards(tmp_path)
    shard = sorted((data / "train").glob("*.tar"))[0]
    shard.write_bytes(shard.read_bytes()[:len(shard.read_bytes()) // 2])  # cut at a block boundary
    usable = 0
    for record in iter_records(str(shard)):
        try:
            decode_record(record)
            usable += 1
        except Exception:
            pass
    # meta.json knows the shard held 16: every lost sample is counted once, over two epochs
    summary = train(shard_config(tmp_path, data, max_steps=12, name="counted"))
    assert summary["skipped_files"] == 16 - usable > 0
    (data / "train" / "meta.json").unlink()  # no counts: the lost rest is one named skip
    summary = train(shard_config(tmp_path, data, max_steps=8))
    assert summary["skipped_files"] >= 1
    (data / "train" / "zz-garbage.tar").write_bytes(b"\x00garbage" * 100)
    with pytest.raises(ValueError, match=r"zz-garbage\.tar is not a readable tar file"):
        train(shard_config(tmp_path, data, name="again"))
    assert not (tmp_path / "runs" / "again").exists()


def test_every_sample_undecodable_stops_with_a_line_not_an_empty_run(tmp_path):
    data = make_shards(tmp_path, bad_images=True)
    with pytest.raises(ValueError, match="saw no usable image: every sample was skipped"):
        train(shard_config(tmp_path, data))


def test_fewer_batches_than_workers_train_and_do_not_hang(tmp_path):
    """48 images, batches of 16, 4 workers: each worker's share (12) held no full batch, and every epoch was empty
    (it hung; then an error). Workers share an epoch by whole batches: three of them take one each."""
    data = make_shards(tmp_path, per_class=24, max_per_shard=12)  # 48 images in 4 shards
    done = cli("train", "--dataset", "shards", "--data-dir", str(data), "--model", "vit_fmnist", "--workers", "4",
               "--batch-size", "16", "--max-steps", "6", "--val-size", "8", "--runs-dir", str(tmp_path / "runs"),
               "--no-progress", "--threads", "1", "--no-tensorboard", "--json", timeout=240)
    assert done.returncode == 0, done.stderr[-500:]
    assert json.loads(done.stdout)["steps"] == 6 and json.loads(done.stdout)["epochs"] == 2


# ---------------------------------------------------------------- 4. no wrong answer with exit code 0


@real
def test_eval_takes_the_dataset_from_the_weights_or_refuses_a_mismatch(tmp_path, capsys):
    """`vitkit eval`'s own entry point (what ``python -m vitkit`` exits with), in this process."""
    from vitkit.cli import main

    def run(*argv):
        code = main(["eval", *argv, "--out", str(tmp_path)])
        return code, capsys.readouterr()

    model = vitkit.create_model("vit_fmnist", num_classes=10, label_names=[f"c{i}" for i in range(10)])
    model.save_pretrained(tmp_path / "other")
    code, out = run("--weights", str(tmp_path / "other"))
    assert code == 2 and "pass --dataset" in out.err
    code, out = run("--weights", str(tmp_path / "other"), "--dataset", "fashion-mnist")
    assert code == 2 and "trained on other classes" in out.err
    vitkit.create_model("vit_fmnist", num_classes=3).save_pretrained(tmp_path / "three")
    code, out = run("--weights", str(tmp_path / "three"), "--dataset", "fashion-mnist")
    assert code == 2 and "predicts 3 classes and the data has 10" in out.err
    vitkit.create_model("vit_fmnist", label_names=fm.CLASSES).save_pretrained(tmp_path / "fmnist")  # found alone
    code, out = run("--weights", str(tmp_path / "fmnist"), "--json", "--max-images", "500")  # not all 10,000
    scores = json.loads(out.out.strip().splitlines()[-1])
    assert code == 0 and scores["dataset"] == "fashion-mnist" and scores["count"] == 500
    assert not list(tmp_path.glob("confusion_matrix.png"))[1:]  # written once, where asked


# ---------------------------------------------------------------- 9. no silent divergence from the reference


def test_an_hf_pooler_with_another_activation_is_refused_by_name(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                    image_size=32, patch_size=8, pooler_act="relu")
    transformers.ViTModel(config).save_pretrained(tmp_path / "hf")
    with pytest.raises(WeightsError, match="pooler_act 'relu'"):
        vitkit.from_pretrained(tmp_path / "hf")


def test_an_hf_folder_without_model_type_is_said_as_such(tmp_path):
    """A config.json without "model_type" was told to "pass the folder that holds both", the folder it
    had been given; transformers' AutoConfig refuses it too, for the missing key."""
    import json

    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                    image_size=32, patch_size=8)
    transformers.ViTModel(config).save_pretrained(tmp_path / "hf")
    cj = json.loads((tmp_path / "hf" / "config.json").read_text())
    del cj["model_type"]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cj))
    with pytest.raises(ValueError, match="model_type"):
        transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    with pytest.raises(WeightsError, match=rf'^{tmp_path / "hf" / "config.json"} has no "model_type", which '
                                           r'transformers writes and reads to know the model \("vit"'):
        vitkit.from_pretrained(tmp_path / "hf")


def test_a_forked_child_does_not_keep_a_killed_writer_s_lock(tmp_path):
    """A DataLoader worker is a fork of the writer; SIGKILL the writer while its child lives on
    (as a worker does for a few seconds) and the run must be free to resume at once."""
    code = ("import os, sys, time\n"
            "from vitkit.runlock import RunLock\n"
            f"RunLock({str(tmp_path)!r}).acquire()\n"
            "child = os.fork()\n"
            "if child == 0:\n"
            "    os.write(1, b'child\\n'); time.sleep(60); os._exit(0)\n"  # one write each: lines whole
            "os.write(1, f'{child}\\n'.encode()); time.sleep(60)\n")
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = 0
    try:
        lines = [writer.stdout.readline().strip() for _ in range(2)]  # locked, forked, and the child
        child = int(next(line for line in lines if line != "child"))  # past its fork handlers (on a
        assert "child" in lines  # busy machine it may not have run yet when the parent prints)
        assert holder(tmp_path) is not None
        with pytest.raises(RunLocked, match=f"process {writer.pid} on "):
            RunLock(tmp_path).acquire()
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        os.kill(child, 0)  # the child is still asleep
        assert holder(tmp_path) is None
        RunLock(tmp_path).acquire().release()
    finally:
        writer.kill()
        writer.wait()
        if child:
            os.kill(child, signal.SIGKILL)
