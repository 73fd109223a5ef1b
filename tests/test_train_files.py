"""Training from image files: an ImageFolder and tar shards of real Fashion-MNIST pictures.

The folder also holds the broken files of real collections (a truncated JPEG, a zero-byte
file) and odd modes that must decode (a CMYK JPEG, an RGBA PNG): the run skips and counts
the broken ones, or with strict_data stops naming them before anything is written.
"""

import json
import os
import re

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.cli import main as cli
from vitkit.data import fashion_mnist as fm
from vitkit.data.folder import BadImageError, ImageFolder
from vitkit.data.pipelines import from_model_config
from vitkit.data.shards import folder_to_shards
from vitkit.models import create_model
from vitkit.train import resolve_config, train
from vitkit.train.batches import FolderBatches, Layout, ShardBatches
from vitkit.train.data import open_data

real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")
CLASSES = {0: "tshirt", 1: "trouser", 8: "bag"}  # three Fashion-MNIST classes
TINY = {"in_chans": 1, "embed_dim": 48, "depth": 2, "num_heads": 2, "mlp_dim": 96}
#: the plain ViT: the recipe's default hybrid adds a conv stem (0.12 GFLOPs a training image, 0.01 without it)
#: that no test here is about (vitkit train --model-args TINY alone builds the hybrid)
PLAIN = ["--model", "vit_fmnist", "--model-args", json.dumps(TINY)]


def write_pngs(root, split, per_class):
    data = fm.load_split(split)
    for label, name in CLASSES.items():
        (root / split / name).mkdir(parents=True)
        for n, i in enumerate(np.flatnonzero(data.labels == label)[:per_class]):
            Image.fromarray(data.images[i]).save(root / split / name / f"{n:04d}.png")


def add_odd_files(folder):
    """Two files that must be skipped and two odd modes that must decode."""
    Image.new("CMYK", (28, 28), (0, 0, 0, 200)).save(folder / "cmyk.jpg")
    rgba = np.zeros((28, 28, 4), np.uint8)
    rgba[..., 3] = 255
    Image.fromarray(rgba, "RGBA").save(folder / "rgba.png")
    whole = folder / "whole.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(whole)
    data = whole.read_bytes()
    whole.unlink()
    (folder / "truncated.jpg").write_bytes(data[:len(data) // 2])
    (folder / "empty.png").write_bytes(b"")


@pytest.fixture(scope="module")
def fmnist_folder(tmp_path_factory):
    if not fm._complete(fm.DEBIAN_DIR):
        pytest.skip("Debian dataset-fashion-mnist not installed")
    root = tmp_path_factory.mktemp("fmnist_files")
    write_pngs(root, "train", 300)
    write_pngs(root, "test", 100)
    add_odd_files(root / "train" / "bag")
    return root


def config(tmp_path, data_dir, **kw):
    base = dict(dataset="folder", data_dir=str(data_dir), img_size=28, model="vit_fmnist", model_args=TINY,
                max_steps=60, batch_size=30, val_size=90, warmup_steps=10, lr=2e-3, runs_dir=str(tmp_path), name="run",
                checkpoint_every=30, log_every=10, progress=False, workers=0, eval_batch_size=100)
    base.update(kw)
    return resolve_config("fmnist", **base)


@real
@pytest.mark.slow
def test_image_folder_trains_skips_broken_files_and_counts_them(tmp_path, fmnist_folder, caplog):
    summary = train(config(tmp_path, fmnist_folder))
    # the plain TINY ViT, 60 steps (seeds 0-4, fp32): test top-1 0.85-0.91, last/first loss 0.60-0.67
    assert summary["test_top1"] > 0.75  # three classes: chance is 1/3
    # the zero-byte file at the scan; the truncated JPEG once, however often it is drawn (if it was)
    assert summary["skipped_files"] in (1, 2)
    assert any("empty.png" in r.getMessage() for r in caplog.records)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in rows if "train_loss" in r]
    assert losses[-1] < 0.7 * losses[0]
    saved = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert saved["config"]["label_names"] == ["bag", "trouser", "tshirt"]


def test_odd_modes_decode_and_broken_files_are_named(fmnist_folder):
    folder = ImageFolder(fmnist_folder / "train", channels=1)
    names = {p.split("/")[-1] for p, _ in folder.samples}
    assert {"cmyk.jpg", "rgba.png", "truncated.jpg"} <= names  # a truncated JPEG has a valid header
    assert [p.split("/")[-1] for p, _ in folder.skipped] == ["empty.png"]
    for name in ("cmyk.jpg", "rgba.png"):
        index = next(i for i, (p, _) in enumerate(folder.samples) if p.endswith(name))
        image, _ = folder[index]
        assert image.mode == "L" and image.size == (28, 28)
    truncated = next(i for i, (p, _) in enumerate(folder.samples) if p.endswith("truncated.jpg"))
    assert folder[truncated].name.endswith("truncated.jpg")


def test_strict_data_stops_before_writing_anything(tmp_path, fmnist_folder):
    with pytest.raises(BadImageError, match="empty.png"):
        train(config(tmp_path, fmnist_folder, strict_data=True))
    assert not (tmp_path / "run").exists()
    # a truncated JPEG passes the header check: it stopped the run when a batch reached it (hours in, on a large
    # folder); strict decodes every file while the data is opened, before the first step
    import shutil

    shutil.copytree(fmnist_folder, tmp_path / "data")
    (tmp_path / "data" / "train" / "bag" / "empty.png").unlink()
    with pytest.raises(BadImageError, match=r"truncated.jpg"):
        open_data(config(tmp_path, tmp_path / "data", strict_data=True), torch.device("cpu"), channels=1)


def test_missing_and_empty_datasets_are_clear_cli_errors(tmp_path, capsys):
    (tmp_path / "empty" / "train").mkdir(parents=True)
    (tmp_path / "empty" / "test").mkdir()
    cases = [(["--dataset", "folder"], "needs --data-dir"),
             (["--dataset", "folder", "--data-dir", str(tmp_path / "nowhere")], "not found"),
             (["--dataset", "folder", "--data-dir", str(tmp_path)], "must hold train/ and test/"),
             (["--dataset", "folder", "--data-dir", str(tmp_path / "empty")], "no class subfolders"),
             (["--dataset", "folder", "--data-dir", str(tmp_path / "empty" / "test")],  # a split given for its folder
              f"; {tmp_path / 'empty' / 'test'} looks like one split of {tmp_path / 'empty'}: give --data-dir "
              f"{tmp_path / 'empty'}"),
             (["--dataset", "imagenet"], "unknown dataset 'imagenet'"),
             (["--dataset", str(tmp_path / "empty")],  # a folder without the word: both ways to read one
              f"({tmp_path / 'empty'} is a folder: --dataset folder --data-dir {tmp_path / 'empty'} reads its "
              f"train/ and test/ class folders, --dataset hf:{tmp_path / 'empty'} reads it with Hugging Face")]
    for flags, message in cases:
        assert cli(["train", "--runs-dir", str(tmp_path / "runs"), "--no-progress", *flags]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_folder_batches_resume_at_any_step_with_the_same_pixels(fmnist_folder):
    """Per-sample seeds from (seed, step): starting at step 3 gives what step 3 gave, with workers too."""
    folder = ImageFolder(fmnist_folder / "train", channels=1)
    model = create_model("vit_fmnist", img_size=24, num_classes=3)
    transform = from_model_config(model.config, train=True)  # random crops and flips
    layout = Layout(batch_size=16, accum_steps=2, world=1, rank=0)
    whole = list(FolderBatches(folder, range(len(folder)), workers=0).train(transform, 7, layout, 0, 5))
    resumed = list(FolderBatches(folder, range(len(folder)), workers=2).train(transform, 7, layout, 3, 5))
    assert len(whole) == 10 and len(resumed) == 4
    for (xa, ya, _), (xb, yb, _) in zip(whole[6:], resumed):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
    assert not torch.equal(whole[0][0], whole[2][0])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_resumes_with_the_same_pixels(tmp_path, fmnist_folder, workers):
    """Shards gave the same samples after a resume but other crops and flips: the transform drew from the process's
    random state (the DataLoader's seed, or without workers the training's own), so a resumed run was not the
    uninterrupted one (losses apart from the first step after it, every weight different at the end)."""
    folder_to_shards(fmnist_folder / "train", tmp_path / "shards" / "train", max_per_shard=50)
    folder_to_shards(fmnist_folder / "test", tmp_path / "shards" / "test", max_per_shard=50)
    data = open_data(config(tmp_path, tmp_path / "shards", dataset="shards", workers=workers, shuffle_buffer=100,
                            val_size=0),
                     torch.device("cpu"), channels=1)
    transform = from_model_config(create_model("vit_fmnist", img_size=24, num_classes=3).config, train=True)
    layout = Layout(batch_size=20, accum_steps=1, world=1, rank=0)  # 2 workers' 451 each made 22 + 22 batches
    spe = data.steps_per_epoch(layout)
    assert spe == data.n_train // 20  # whatever the worker count: each one's share is whole batches (23 + 22)
    torch.manual_seed(1)
    end = spe + 4  # into the second epoch: a resume in each epoch is compared (not the whole second epoch)
    whole = list(data.train.train(transform, 5, layout, 0, end, spe))
    for start in (3, spe + 1):  # within the first epoch, and in the next
        torch.manual_seed(start)  # a resumed process's own random state is another
        resumed = list(data.train.train(transform, 5, layout, start, end, spe))
        assert len(resumed) == len(whole) - start
        for (xa, ya, _), (xb, yb, _) in zip(whole[start:], resumed):
            assert torch.equal(ya, yb) and torch.equal(xa, xb)
    assert not torch.equal(whole[0][0], whole[spe][0])  # the next epoch draws anew


def test_a_samples_seeded_draws_leave_a_gpus_random_state_alone(monkeypatch, fmnist_folder):
    """torch.manual_seed inside fork_rng(devices=[]) reseeded every GPU's generator, which fork_rng does not put
    back: without DataLoader workers each sample's seed became the GPU's (its dropout and masks), as a file
    sample's did too. Draws stay fixed by the sample, distinct between samples."""
    from vitkit.data.streams import RankedReader
    from vitkit.train.batches import _Seeded

    reseeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: reseeded.append(seed))
    reader = RankedReader()
    reader.transform = lambda im: torch.rand(())
    reader.for_training(1)
    first, again, other = (reader.transformed(None, 0, i) for i in (1, 1, 2))
    folder = ImageFolder(fmnist_folder / "train", channels=1)
    files = _Seeded(folder, range(2), lambda im: torch.rand(()))
    assert first == again != other and files[(0, 7)][0] == files[(0, 7)][0] != files[(1, 8)][0]
    assert reseeded == []


@real
@pytest.mark.slow
def test_shards_train_and_resume_in_order(tmp_path, fmnist_folder):
    data_dir = tmp_path / "shards"
    folder_to_shards(fmnist_folder / "train", data_dir / "train", max_per_shard=200)
    folder_to_shards(fmnist_folder / "test", data_dir / "test", max_per_shard=200)
    cfg = config(tmp_path, data_dir, dataset="shards", workers=2, shuffle_buffer=300)
    summary = train(cfg)
    assert summary["test_top1"] > 0.75  # the plain TINY ViT, 60 steps: 0.83-0.93 (seeds 0-4, fp32)
    assert summary["test_images"] == 3 * 100 and summary["skipped_files"] == 0  # a stream's, as read (none was said)
    # the stream from step 3 is the first run's stream from step 3 (deterministic pipeline)
    data = open_data(cfg, torch.device("cpu"), channels=1)
    model = create_model("vit_fmnist", num_classes=3)
    transform = from_model_config(model.config, train=False)
    layout = Layout(batch_size=30, accum_steps=1, world=1, rank=0)
    source: ShardBatches = data.train
    spe = data.steps_per_epoch(layout)
    whole = [y for _, y, _ in source.train(transform, 0, layout, 0, spe + 2, spe)]
    resumed = [y for _, y, _ in source.train(transform, 0, layout, 3, spe + 2, spe)]
    assert len(whole) == spe + 2 and len(resumed) == spe - 1
    for a, b in zip(whole[3:], resumed):
        assert torch.equal(a, b)


def test_the_final_scoring_keeps_what_it_read_and_what_it_skipped():
    """A stream's unreadable test samples were dropped from the summary (skipped_files 0, no test_images) where a
    folder's were counted: the final scoring keeps both on the run."""
    from types import SimpleNamespace

    from vitkit.train.tasks import _counted

    run = SimpleNamespace(skipped={"train#3"}, scored={})
    batches = [(torch.zeros(2, 1), torch.zeros(2), ("t/shard-0.tar#0",)), (None, torch.zeros(0), ("t/shard-1.tar",)),
               (torch.zeros(3, 1), torch.zeros(3), ())]
    assert list(_counted(run, "test", iter(batches))) == batches
    assert run.scored == {"test": 5} and run.skipped == {"train#3", "t/shard-0.tar#0", "t/shard-1.tar"}


def test_shards_without_val_say_they_validate_on_the_test_split(tmp_path):
    """A stream cannot be carved: without val/ the validation rows score test/, which is said."""
    import warnings

    for split in ("train", "test"):
        for name in ("a", "b"):
            (tmp_path / "img" / split / name).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(np.full((28, 28), 40 * i, np.uint8)).save(tmp_path / "img" / split / name / f"{i}.png")
        folder_to_shards(tmp_path / "img" / split, tmp_path / "shards" / split, max_per_shard=4)
    cfg = config(tmp_path, tmp_path / "shards", dataset="shards")
    with pytest.warns(UserWarning, match=r"have no val/ folder: validation rows score the test split \(test/"):
        open_data(cfg, torch.device("cpu"), channels=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_data(config(tmp_path, tmp_path / "shards", dataset="shards", val_size=0), torch.device("cpu"), channels=1)
        folder_to_shards(tmp_path / "img" / "test", tmp_path / "shards" / "val", max_per_shard=4)
        open_data(cfg, torch.device("cpu"), channels=1)
    # test shards written from a folder that lacks a class: its label numbers name other classes (the run scored
    # 1.8% where its weights score 53%); refused as the image folder's splits are
    import shutil

    shutil.rmtree(tmp_path / "img" / "test" / "a")
    (tmp_path / "img" / "test" / "c").mkdir()
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "img" / "test" / "c" / "0.png")
    shutil.rmtree(tmp_path / "shards" / "test")
    folder_to_shards(tmp_path / "img" / "test", tmp_path / "shards" / "test", max_per_shard=4)
    with pytest.raises(ValueError, match=r"the shards of .*test name other classes than those of .*train: other "
                                         r"classes \(train/: 2, test/: 2; only in train/: 'a'; only in test/: 'c'\)"):
        open_data(cfg, torch.device("cpu"), channels=1)


def test_a_folders_val_is_its_validation_a_linked_test_is_refused_and_a_class_left_untrained_is_said(tmp_path):
    """A val/ beside test/ was never read (validation was carved from train/, val/'s own classes unchecked); a
    test/ that links to train/ was scored as held out; a class whose only image was carved for validation was
    learned from nothing, without a word."""
    import os
    import shutil
    import warnings

    _noise_folder(tmp_path / "d", ["a", "b"], per_class=6)
    shutil.copytree(tmp_path / "d" / "test", tmp_path / "d" / "val")
    data = open_data(config(tmp_path, tmp_path / "d", val_size=5), torch.device("cpu"), channels=1)
    assert data.n_train == 12 and len(data.val) == 12 and data.val.folder.root == tmp_path / "d" / "val"
    (tmp_path / "d" / "val" / "c").mkdir()
    shutil.copy(tmp_path / "d" / "val" / "a" / "0.png", tmp_path / "d" / "val" / "c")
    with pytest.raises(ValueError, match=r"class folders of .*d/val differ from those of .*d/train: other classes "
                                         r"\(train/: 2, val/: 3; only in val/: 'c'\)"):
        open_data(config(tmp_path, tmp_path / "d"), torch.device("cpu"), channels=1)
    os.symlink("train", tmp_path / "d" / "linked")
    shutil.rmtree(tmp_path / "d" / "test")
    os.rename(tmp_path / "d" / "linked", tmp_path / "d" / "test")
    with pytest.raises(fm.DatasetNotFound, match=r"d/test is .*d/train \(a link to the same folder\): a score on "
                                                 r"it would be of the training images"):
        open_data(config(tmp_path, tmp_path / "d"), torch.device("cpu"), channels=1)
    # the same name in two Unicode forms (a Mac's NFD folder beside an NFC one) is said as such
    import unicodedata

    _noise_folder(tmp_path / "u", ["x"], per_class=2)
    for split, form in (("train", "NFC"), ("test", "NFD")):
        os.rename(tmp_path / "u" / split / "x", tmp_path / "u" / split / unicodedata.normalize(form, "caf\u00e9"))
    with pytest.raises(ValueError, match=r"the same names in two Unicode forms"):
        open_data(config(tmp_path, tmp_path / "u"), torch.device("cpu"), channels=1)
    # 14 images of a, 1 of b: the carve of one image for validation takes b's (seed 2021)
    _noise_folder(tmp_path / "lone", ["a"], per_class=14)
    (tmp_path / "lone" / "train" / "b").mkdir()
    (tmp_path / "lone" / "test" / "b").mkdir()
    for split in ("train", "test"):
        shutil.copy(tmp_path / "lone" / split / "a" / "0.png", tmp_path / "lone" / split / "b" / "0.png")
    with pytest.warns(UserWarning, match=r"1 of the 2 classes of .*lone/train have no training image left after 1 "
                                         r"were carved for validation: b; give them more images, a val/ folder"):
        data = open_data(config(tmp_path, tmp_path / "lone", val_size=1), torch.device("cpu"), channels=1)
    assert data.n_train == 14
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_data(config(tmp_path, tmp_path / "lone", val_size=0), torch.device("cpu"), channels=1)


def test_test_size_scores_a_fixed_sample_of_every_class_not_the_first_folders(tmp_path, capsys):
    """--test-size took the first N test images: a folder lists them class by class, so 12 of 36 were all of
    class a's and the score said nothing of b and c. It is a fixed random sample (Hugging Face's examples
    shuffle before max_eval_samples), the same in every run."""
    _noise_folder(tmp_path / "d", ["a", "b", "c"], per_class=12)
    picked = []
    for _ in range(2):
        data = open_data(config(tmp_path, tmp_path / "d", test_size=12), torch.device("cpu"), channels=1)
        picked.append(data.test.indices)
    assert picked[0] == picked[1] and len(picked[0]) == 12 and picked[0] == sorted(picked[0])
    classes = {data.test.folder.targets[i] for i in picked[0]}
    assert classes == {0, 1, 2} and data.test_split == 36
    whole = open_data(config(tmp_path, tmp_path / "d", test_size=100), torch.device("cpu"), channels=1)
    assert len(whole.test) == 36 and whole.test_split is None  # past the split: all of it, and no note says less
    from vitkit.cli.train import _quick_run_notes

    _quick_run_notes({"test_images": 36})
    _quick_run_notes({"test_images": 12, "test_split_images": 36})
    assert capsys.readouterr().out.splitlines() == [
        "note     test scores are of 12 of the split's 36 test images (--test-size: a fixed random sample)"]


def test_an_explicit_val_size_cut_to_a_tenth_is_said(tmp_path):
    """--val-size 5 of 24 images carved 2 without a word (the cap is a tenth); a default is cut in silence."""
    import warnings

    _noise_folder(tmp_path / "d", ["a", "b"])
    with pytest.warns(UserWarning, match=r"--val-size 5 is more than a tenth of the 24 training images: 2 are carved"):
        data = open_data(config(tmp_path, tmp_path / "d", val_size=5), torch.device("cpu"), channels=1)
    assert len(data.val) == 2 and data.n_train == 22
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = config(tmp_path, tmp_path / "d")
        cfg.chosen = frozenset()  # the recipe's val_size, not the user's
        open_data(cfg, torch.device("cpu"), channels=1)


def _noise_folder(root, classes, per_class=12):
    rng = np.random.default_rng(len(str(root)))
    for split in ("train", "test"):
        for name in classes:
            (root / split / name).mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 255, (28, 28), dtype=np.uint8)).save(root / split / name / f"{i}.png")


def test_resume_reads_the_folder_the_run_started_on_and_refuses_data_that_changed(tmp_path, monkeypatch):
    """config.json kept --data-dir as typed, so --resume from another folder trained on that folder's images
    (its classes became the model's labels), and renamed or added class folders were taken without a word."""
    from vitkit.train.checkpoint import checkpoint_paths

    _noise_folder(tmp_path / "data", ["c0", "c1", "c2"])
    _noise_folder(tmp_path / "elsewhere" / "data", ["x", "y", "z"])
    monkeypatch.chdir(tmp_path)
    cfg = config(tmp_path, "data", max_steps=4, checkpoint_every=2, batch_size=6, val_size=6, warmup_steps=1,
                 eval_batch_size=12)
    train(cfg)
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["data_dir"] == str(tmp_path / "data")
    checkpoint_paths(run)[-1].unlink()  # an unfinished run: it resumes at step 2
    monkeypatch.chdir(tmp_path / "elsewhere")
    resumed = train(cfg, resume=os.path.join("..", "run"))  # a relative --resume: the summary names the folder
    assert (resumed["resumed_at_step"], resumed["run_dir"]) == (2, str(run))  # as every other folder knows it
    assert json.loads((run / "model" / "config.json").read_text())["config"]["label_names"] == ["c0", "c1", "c2"]
    for split in ("train", "test"):
        (tmp_path / "data" / split / "c2").rename(tmp_path / "data" / split / "zebra")
    checkpoint_paths(run)[-1].unlink()
    with pytest.raises(ValueError, match=r"the data changed since step_0*2\S* \(its classes were c0, c1, c2, "
                                         r"now c0, c1, zebra\); put it back"):
        train(cfg, resume=str(run))
    for split in ("train", "test"):
        (tmp_path / "data" / split / "zebra").rename(tmp_path / "data" / split / "c2")
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(tmp_path / "data" / "train" / "c1" / "more.png")
    with pytest.raises(ValueError, match=r"it trained on (\d+) images, now (\d+)") as refused:
        train(cfg, resume=str(run))
    before, after = map(int, re.search(r"on (\d+) images, now (\d+)", str(refused.value)).groups())
    assert after == before + 1


def test_a_folders_flip_follows_no_hflip_and_crop_pad_is_refused_for_files(tmp_path, monkeypatch):
    """--no-hflip and --crop-pad 4 on a folder were written to config.json and never applied: its images were
    flipped at 0.5 and cut by RandomResizedCrop whatever they said. The flip follows the flag (none: timm's 0.5);
    --crop-pad, which pads in-memory images, is refused for files."""
    from vitkit.data import pipelines
    from vitkit.train import data as train_data
    from vitkit.train.batches import Layout

    _noise_folder(tmp_path / "d", ["a", "b"], per_class=12)
    flips = []
    real = pipelines.from_model_config
    monkeypatch.setattr(train_data, "from_model_config",
                        lambda *a, **kw: flips.append(kw.get("hflip")) or real(*a, **kw))
    import vitkit

    model = vitkit.create_model("vit_fmnist", depth=1, num_classes=2)
    for given, want in ((None, 0.5), (True, 0.5), (False, 0.0)):
        cfg = config(tmp_path, tmp_path / "d", val_size=4, **({} if given is None else {"hflip": given}))
        data = open_data(cfg, torch.device("cpu"), channels=1)
        next(iter(data.train_batches(model.config, cfg, Layout(8, 1, 1, 0), 0, 1)))
        assert flips[-1] == want, given
    with pytest.raises(ValueError, match=r"--crop-pad pads in-memory images .* cut by timm's RandomResizedCrop"):
        config(tmp_path, tmp_path / "d", crop_pad=4)


def test_test_images_that_are_training_images_are_said(tmp_path, monkeypatch):
    """A test image that is a training image byte for byte was scored as held out without a word; test/ was never
    compared with val/, and every process of a torchrun job read and hashed the files again."""
    import shutil
    import warnings

    _noise_folder(tmp_path / "d", ["a", "b"], per_class=12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # distinct images: nothing said
        open_data(config(tmp_path, tmp_path / "d", val_size=2), torch.device("cpu"), channels=1)
    shutil.copy(tmp_path / "d" / "train" / "b" / "3.png", tmp_path / "d" / "test" / "a" / "copy.png")
    with pytest.warns(UserWarning, match=r"1 of the 25 images of .*test are copies of training images, byte for "
                                         r"byte \(1 of them under another class there: one image, two labels\) "
                                         r"\(first: .*test/a/copy.png = .*train/b/3.png\)"):
        open_data(config(tmp_path, tmp_path / "d", val_size=2), torch.device("cpu"), channels=1)
    # a val/ beside test/: a test image that is a validation image is said too (test/ was compared with train/ only)
    shutil.copytree(tmp_path / "d" / "train", tmp_path / "d" / "val")
    for extra in (tmp_path / "d" / "val").rglob("*.png"):
        extra.write_bytes(extra.read_bytes() + b"\0")  # other bytes: no copies of training images
    shutil.copy(tmp_path / "d" / "val" / "a" / "5.png", tmp_path / "d" / "test" / "b" / "seen.png")
    with pytest.warns(UserWarning) as said:
        open_data(config(tmp_path, tmp_path / "d"), torch.device("cpu"), channels=1)
    words = [str(w.message) for w in said if "byte for byte" in str(w.message)]
    assert len(words) == 2 and "of the 26 images of" in words[1] and "are copies of validation images" in \
        words[1] and "test/b/seen.png = " in words[1] and words[1].endswith("val/a/5.png): its scores count them "
                                                                          "as held out; remove them from one split")
    monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun's other processes on the machine: its first reads and says it
    monkeypatch.setenv("LOCAL_RANK", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_data(config(tmp_path, tmp_path / "d"), torch.device("cpu"), channels=1)
    monkeypatch.delenv("LOCAL_RANK")
    # val/ a link to test/: said as one folder (it was "every test image is a copy of a validation image: remove them
    # from one split"); a copy under its own class is not said to be relabelled
    shutil.rmtree(tmp_path / "d" / "val")
    (tmp_path / "d" / "val").symlink_to(tmp_path / "d" / "test")
    (tmp_path / "d" / "test" / "a" / "copy.png").unlink()
    shutil.copy(tmp_path / "d" / "train" / "a" / "3.png", tmp_path / "d" / "test" / "a" / "same.png")
    with pytest.warns(UserWarning) as said:
        open_data(config(tmp_path, tmp_path / "d"), torch.device("cpu"), channels=1)
    words = [str(w.message) for w in said]
    assert not any("validation images" in w for w in words), words
    assert any(w.endswith("are one folder: the test score counts the images the run's choices (the checkpoint kept) "
                          "were made on") for w in words), words
    assert any("copies of training images, byte for byte (first:" in w for w in words), words


def test_a_recipes_padding_on_a_folder_is_not_saved_and_an_older_runs_resumes(tmp_path, capsys, monkeypatch):
    """A recipe's crop_pad 2 on a folder was taken silently, saved in config.json, and then refused by the run's own
    --resume as a choice ("--crop-pad pads in-memory images"): the run the stop message said to resume could never
    be. The padding (never applied to files) is not saved; a run saved that way resumes."""
    from vitkit.train import config as train_config
    from vitkit.train.checkpoint import checkpoint_paths

    _noise_folder(tmp_path / "d", ["a", "b"], per_class=12)
    common = ["--dataset", "folder", "--data-dir", str(tmp_path / "d"), *PLAIN,
              "--img-size", "28", "--batch-size", "8", "--val-size", "4", "--test-size", "8", "--no-progress",
              "--threads", "1", "--runs-dir", str(tmp_path / "runs"), "--checkpoint-every", "2", "--max-steps", "4"]
    for verb in (["train", "--recipe", "fmnist-long"], ["pretrain", "--objective", "simmim", "--no-fewshot"]):
        name = verb[0]
        assert cli([*verb, *common, "--name", name]) == 0, capsys.readouterr().err
        assert json.loads((tmp_path / "runs" / name / "config.json").read_text())["crop_pad"] == 0
        with monkeypatch.context() as older:  # as versions before saved it: the recipe's 2
            older.setattr(train_config, "in_memory_images", lambda dataset: True)
            assert cli([*verb, *common, "--name", f"{name}-older"]) == 0, capsys.readouterr().err
        run = tmp_path / "runs" / f"{name}-older"
        assert json.loads((run / "config.json").read_text())["crop_pad"] == 2
        assert cli([verb[0], "--resume", str(run)]) == 0, capsys.readouterr().err  # finished: its scores
        (run / "summary.json").unlink()
        checkpoint_paths(run)[-1].unlink()  # unfinished: it trains on from its step 2
        capsys.readouterr()
        assert cli([verb[0], "--resume", str(run)]) == 0, capsys.readouterr().err
    assert cli(["train", *common, "--crop-pad", "2", "--name", "padded"]) == 2  # asked for: refused, as before
    assert "--crop-pad pads in-memory images" in capsys.readouterr().err


def test_a_finished_run_whose_summary_or_model_is_damaged_is_scored_again_and_a_moved_one_says_where_it_is(
        tmp_path, capsys):
    """A damaged summary.json ended --resume in "Invalid control character at: line 1 column 12", naming no file; a
    finished run without its model/ was "finished: nothing to resume" to --resume and "stopped before it finished
    (--resume finishes it)" to --init, each verb sending the user to the other. Both are scored again from the last
    checkpoint, said in a note. A run moved since it finished said its old folder (from its summary.json)."""
    import shutil

    _noise_folder(tmp_path / "d", ["a", "b"], per_class=12)
    runs = tmp_path / "runs"
    assert cli(["train", "--dataset", "folder", "--data-dir", str(tmp_path / "d"), *PLAIN,
                "--img-size", "28", "--batch-size", "8", "--val-size", "4", "--test-size", "8", "--no-progress",
                "--threads", "1", "--runs-dir", str(runs), "--max-steps", "2", "--name", "r", "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)["test_top1"]
    (runs / "r" / "summary.json").write_text('{"trunc')
    assert cli(["train", "--resume", str(runs / "r"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert f"note: {runs / 'r'}: its summary.json cannot be read (JSONDecodeError: " in err, err
    assert json.loads((runs / "r" / "summary.json").read_text())["test_top1"] == scores == json.loads(out)["test_top1"]
    shutil.rmtree(runs / "r" / "model")
    assert cli(["train", "--resume", str(runs / "r")]) == 0
    assert f"note: {runs / 'r'}: its model/ is gone: the run is resumed from its last checkpoint" in \
        capsys.readouterr().err
    assert (runs / "r" / "model" / "model.safetensors").is_file()
    (runs / "r").rename(runs / "moved")
    assert cli(["train", "--resume", str(runs / "moved"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_dir"] == str((runs / "moved").resolve())
    # its checkpoints removed to save space: finished, as with its config.json removed ("no checkpoints", exit 2)
    shutil.rmtree(runs / "moved" / "checkpoints")
    for removed in ("checkpoints", "config.json"):
        (runs / "moved" / "config.json").unlink(missing_ok=removed == "config.json")
        assert cli(["train", "--resume", str(runs / "moved"), "--json"]) == 0, removed
        out, err = capsys.readouterr()
        assert "finished at step 2: nothing to resume" in err and json.loads(out)["test_top1"] == scores, err
    shutil.rmtree(runs / "moved" / "model")  # nothing left to resume from or to show: refused
    assert cli(["train", "--resume", str(runs / "moved")]) == 2
    assert "error: cannot resume: " in capsys.readouterr().err


def test_a_split_none_of_whose_images_can_be_read_is_no_zero_score(tmp_path, capsys):
    """Every test image unreadable (truncated past the header check) gave "test top-1 0.00% on 20 images" after
    training, "top-1 0.00% (0 images)" from eval and torch's "expected a non-empty list of Tensors" from fewshot,
    each with exit 0 or an internal error; one unreadable image was counted in train's test_images (61 for 60)."""
    _noise_folder(tmp_path / "d", ["a", "b"], per_class=12)
    common = ["--dataset", "folder", "--data-dir", str(tmp_path / "d"), *PLAIN,
              "--img-size", "28", "--batch-size", "8", "--val-size", "4", "--no-progress", "--threads", "1",
              "--runs-dir", str(tmp_path / "runs"), "--max-steps", "2"]
    def cut_jpeg(path):  # a JPEG cut short: its header reads, its pixels do not
        Image.open(path).convert("L").save(path.with_suffix(".jpg"), quality=95)
        data = path.with_suffix(".jpg").read_bytes()
        path.with_suffix(".jpg").write_bytes(data[: len(data) * 2 // 3])

    cut_jpeg(tmp_path / "d" / "test" / "a" / "0.png")
    assert cli(["train", *common, "--name", "one", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["test_images"] == 24 and summary["skipped_files"] == 1  # the 24 read, not 25
    for path in list((tmp_path / "d" / "test").rglob("*.png")):
        cut_jpeg(path)
        path.unlink()
    assert cli(["train", *common, "--name", "none"]) == 2
    err = capsys.readouterr().err
    assert "none of the test split's images could be read (first: " in err and "0.00%" not in err, err
    assert cli(["eval", "--weights", str(tmp_path / "runs" / "one"), "--dataset", "folder", "--data-dir",
                str(tmp_path / "d"), "--no-progress"]) == 2
    assert "folder test: none of the 24 images tried could be read (first: " in capsys.readouterr().err
    assert cli(["fewshot", "--weights", str(tmp_path / "runs" / "one"), "--dataset", "folder", "--data-dir",
                str(tmp_path / "d"), "--shots", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "none of the 24 test images read for few-shot could be read" in err and "torch.cat" not in err, err


def test_eval_of_a_run_reads_its_own_data_and_classes_by_name_in_any_layout(tmp_path, capsys):
    """A folder run's own "next: vitkit eval --weights RUN" was refused ("pass --dataset"); shards (and Hugging Face
    splits) holding the model's classes in another order were refused ("evaluate them on their own dataset")
    where a folder was scored by name; weights without names were scored by the data's order without a word;
    top-5 of 2 classes was 1.0 in the JSON ("n/a" printed); an earlier eval.json was replaced in silence; few-shot
    named a class by its index."""
    import vitkit
    from vitkit.data.shard_writer import folder_to_shards
    from vitkit.evaluate import score_dataset
    from vitkit.models import build_from_config

    _noise_folder(tmp_path / "d", ["a", "b"], per_class=12)
    assert cli(["train", "--dataset", "folder", "--data-dir", str(tmp_path / "d"), *PLAIN,
                "--img-size", "28", "--batch-size", "8", "--val-size", "4", "--no-progress", "--threads", "1",
                "--runs-dir", str(tmp_path / "runs"), "--max-steps", "2", "--name", "r"]) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    out.mkdir()
    evaluate = ["eval", "--weights", str(tmp_path / "runs" / "r"), "--no-progress", "--json", "--out", str(out)]
    for mine in ("eval.json", "confusion_matrix.png"):  # the user's own files of those names: refused, kept
        (out / mine).write_text("{}")
        assert cli(evaluate) == 2
        assert f"{out} holds {mine}, which no earlier vitkit eval there wrote" in capsys.readouterr().out
        assert (out / mine).read_text() == "{}"
        (out / mine).unlink()
    for _ in range(2):
        assert cli(evaluate) == 0
    said = capsys.readouterr()
    result = json.loads(said.out.splitlines()[-1])
    assert result["dataset"] == "folder" and result["count"] == 24 and result["top5"] is None
    assert f"note: {out} held eval.json and confusion_matrix.png before: replaced" in said.err  # its own: said
    model = vitkit.from_pretrained(tmp_path / "runs" / "r")
    flipped = model.config.replace(label_names=["b", "a"])  # the same head read with its rows named the other way
    other = build_from_config(flipped)
    other.load_state_dict({**model.state_dict(), "head.weight": model.head.weight.flip(0),
                           "head.bias": model.head.bias.flip(0)})
    by_folder = score_dataset(other, "folder", data_dir=str(tmp_path / "d"), progress=False).report
    folder_to_shards(tmp_path / "d" / "test", tmp_path / "shards" / "test")
    by_shards = score_dataset(other, "shards", data_dir=str(tmp_path / "shards"), progress=False).report
    want = score_dataset(model, "folder", data_dir=str(tmp_path / "d"), progress=False).report
    assert by_folder.top1 == by_shards.top1 == want.top1 and by_shards.classes == ["b", "a"]
    bare = build_from_config(model.config.replace(label_names=None))
    bare.load_state_dict(model.state_dict())
    with pytest.warns(UserWarning, match=r"the weights name no classes: folder's 2 classes, in its order \(a, b\), "
                                         r"are taken as the head's rows 0 to 1"):
        score_dataset(bare, "folder", data_dir=str(tmp_path / "d"), progress=False)
    for i in range(3):  # few-shot named the class too small for its shots by index ("class 1: 9")
        (tmp_path / "d" / "train" / "b" / f"{i}.png").unlink()
    assert cli(["fewshot", "--weights", str(tmp_path / "runs" / "r"), "--shots", "5", "--no-progress"]) == 2
    assert "2 of 2 classes have fewer (class 'b': 9)" in capsys.readouterr().err
