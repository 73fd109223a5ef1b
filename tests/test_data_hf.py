"""Hugging Face datasets (--dataset hf:...): real Fashion-MNIST pictures saved by the ``datasets``
package itself, as a ``save_to_disk`` folder and as a folder of Parquet files.

The training split also holds the rows of real collections: an RGBA image, a 16-bit grey one
(both must decode as they do from a file) and bytes that are no image (skipped and counted); the
test split a row labelled -1 (an unlabelled test row, as ImageNet's on the Hub).
"""

import io
import json
import os
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import forks
from conftest import kill_at_checkpoint, vitkit_here
from vitkit.cli import main as cli
from vitkit.data import fashion_mnist as fm
from vitkit.data.images import Skipped, decode_image

datasets = pytest.importorskip("datasets")
pytestmark = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")

CLASSES = {0: "tshirt", 1: "trouser", 8: "bag"}  # three Fashion-MNIST classes, as ClassLabel names
NAMES = list(CLASSES.values())
TINY = {"in_chans": 1, "embed_dim": 48, "depth": 2, "num_heads": 2, "mlp_dim": 96}


def png(array, **kw) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array, **kw).save(out, format="PNG")
    return out.getvalue()


def rows(split: str, per_class: int):
    data = fm.load_split(split)
    images, labels = [], []
    for label, (source, _) in enumerate(CLASSES.items()):
        for i in np.flatnonzero(data.labels == source)[:per_class]:
            images.append({"bytes": png(data.images[i]), "path": None})
            labels.append(label)
    return images, labels


ODD = {"rgba": 0, "grey16": 1, "broken": 2}  # the odd training rows, appended in this order


def odd_rows():
    rgba = np.zeros((28, 28, 4), np.uint8)
    rgba[..., 0], rgba[..., 3] = 200, 128
    grey16 = (np.arange(28 * 28, dtype=np.uint16).reshape(28, 28) * 83)
    return [{"bytes": png(rgba, mode="RGBA"), "path": None}, {"bytes": png(grey16), "path": None},
            {"bytes": b"not an image at all", "path": None}], list(ODD.values())


def features(**extra):
    return datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES), **extra})


@pytest.fixture(scope="module")
def hf_data(tmp_path_factory):
    """(save_to_disk folder, Parquet folder, the cache folder the datasets package may write to)."""
    root = tmp_path_factory.mktemp("hf")
    train_x, train_y = rows("train", 300)
    odd_x, odd_y = odd_rows()
    test_x, test_y = rows("test", 100)
    splits = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"image": train_x + odd_x, "label": train_y + odd_y}, features=features()),
        "test": datasets.Dataset.from_dict({"image": test_x + test_x[:1], "label": test_y + [-1]},
                                           features=features())})
    splits.save_to_disk(str(root / "saved"))
    for name, split in splits.items():  # shuffled, as Hub files are (a stream's buffer only mixes nearby rows)
        split.shuffle(seed=0).flatten_indices().to_parquet(str(root / "parquet" / "data" /
                                                               f"{name}-00000-of-00001.parquet"))
    return root / "saved", root / "parquet", root / "cache"


@pytest.fixture(autouse=True)
def hf_cache(hf_data, monkeypatch):
    """The datasets package's cache in tmp (load_dataset of a Parquet folder writes Arrow files there).

    Also no 5-second sleep at the end of every shuffled pass over a Parquet stream (datasets 5.x
    sleeps there, after it has closed the pass's readers, to let pyarrow's threads wind down:
    apache/arrow#45214); a forked DataLoader worker keeps the setting. Those sleeps were most of
    the streaming tests' time (about 30 of 34 s of the resume-in-order test), spent idle."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(hf_data[2]))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", hf_data[2])
    monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0, raising=False)


def config(tmp_path, dataset, **kw):
    from vitkit.train import resolve_config

    base = dict(dataset=dataset, model="vit_fmnist", img_size=28, model_args=TINY, max_steps=60, batch_size=30,
                val_size=90, warmup_steps=10, lr=2e-3, runs_dir=str(tmp_path), name="run", checkpoint_every=30,
                log_every=10, progress=False, workers=0, eval_batch_size=100)
    base.update(kw)
    return resolve_config("fmnist", **base)


@pytest.fixture(scope="module")
def trained(hf_data, tmp_path_factory):
    """A tiny ViT trained on the save_to_disk folder: (its run folder, its summary)."""
    from vitkit.train import train

    tmp = tmp_path_factory.mktemp("hf_run")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", hf_data[2])
        summary = train(config(tmp, f"hf:{hf_data[0]}"))
    return tmp / "run", summary


# ------------------------------------------------------------------------------------ reading

def test_rows_decode_as_the_same_image_file_would(hf_data):
    """vitkit's decoder, not the datasets package's: 16-bit grey scaled (Pillow's convert clips),
    RGBA on white; plain rows give the pixels datasets' own decoding gives."""
    from vitkit.data.hf import HFImages, find_columns, load

    splits = load(f"hf:{hf_data[0]}")
    split = splits["train"]
    image_key, label_key, classes = find_columns(split.features, "x")
    assert (image_key, label_key, classes) == ("image", "label", NAMES)
    data = HFImages(split, "hf:x", "train", image_key, label_key, classes, channels=1)
    assert len(data) == 903 and data.skipped == []  # bad bytes show when decoded, not before
    plain, label = data[0]
    theirs = split[0]["image"]  # the datasets package's own decoding
    assert label == 0 and np.array_equal(np.asarray(plain), np.asarray(theirs.convert("L")))
    odd_x, _ = odd_rows()
    for position, cell in zip((900, 901), odd_x):
        ours, _ = data[position]
        assert np.array_equal(np.asarray(ours), np.asarray(decode_image(cell["bytes"], channels=1)))
    assert np.asarray(data[901][0]).max() > 200  # 16-bit scaled to 8 bits, not clipped to white
    broken = data[902]
    assert broken.name == "hf:x/train#902" and "not an image" in broken.reason


def test_a_label_outside_the_classes_is_skipped_by_name(hf_data):
    from vitkit.data.hf import HFImages, load

    split = load(f"hf:{hf_data[0]}")["test"]
    data = HFImages(split, "hf:x", "test", "image", "label", NAMES)
    assert len(data) == 300 and data.skipped == [("hf:x/test#300", "label -1 is outside the 3 classes (0-2)")]


def test_a_split_naming_its_classes_in_another_order_is_read_by_name(hf_data):
    """A test split whose ClassLabel lists the training split's names in another order: its label numbers were
    taken as the training split's (train --dataset hf: scored 1% where the weights score 35%; fewshot too).
    Each label now means its name, in a map-style split and a stream; a name the training split lacks is
    refused; a missing label (a None, read as NaN) is a skipped row, not "cannot convert float NaN"."""
    from vitkit.data.hf import HFImages, HFStream, load

    test = load(f"hf:{hf_data[0]}")["test"]
    images, labels = test["image"][:6], test["label"][:6]
    reversed_names = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES[::-1])})
    flipped = datasets.Dataset.from_dict({"image": images, "label": [2 - y for y in labels]}, features=reversed_names)
    assert HFImages(flipped, "hf:x", "test", "image", "label", NAMES).targets == labels
    stream = HFStream(flipped.to_iterable_dataset(), "hf:x", "test", "image", "label", NAMES)
    assert [y for _, y in stream] == labels
    other = datasets.Features({"image": datasets.Image(),
                               "label": datasets.ClassLabel(names=["tshirt", "coat", "bag"])})
    with pytest.raises(ValueError, match=r"hf:x split 'test': its label column names classes the training split "
                                         r"does not have \('coat'\)"):
        HFImages(datasets.Dataset.from_dict({"image": images, "label": labels}, features=other), "hf:x", "test",
                 "image", "label", NAMES)
    plain = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    holes = datasets.Dataset.from_dict({"image": images[:3], "label": [0, None, 1]}, features=plain)
    data = HFImages(holes, "hf:x", "test", "image", "label", NAMES)
    assert data.targets == [0, 1] and data.skipped == [("hf:x/test#1", "no label")]


def test_eval_reads_integer_labels_as_the_models_numbered_classes(hf_data, tmp_path, capsys):
    """Integer labels without names: a test split without the last class was read as one class fewer, and a model
    of three numbered classes was refused ("other classes, 3 vs 2"); it scores with the model's classes."""
    import vitkit

    model = vitkit.create_model("vit_fmnist", num_classes=3, label_names=["0", "1", "2"], **TINY)
    model.save_pretrained(tmp_path / "w")
    from vitkit.data.hf import load

    test = load(f"hf:{hf_data[0]}")["test"]
    keep = [i for i, y in enumerate(test["label"]) if y in (0, 1)][:20]
    plain = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    rows = test.select(keep)
    datasets.DatasetDict({"test": datasets.Dataset.from_dict({"image": rows["image"], "label": rows["label"]},
                                                             features=plain)}).save_to_disk(str(tmp_path / "d"))
    assert cli(["eval", "--weights", str(tmp_path / "w"), "--dataset", f"hf:{tmp_path / 'd'}", "--label-key",
                "label", "--json", "--no-progress"]) == 0, capsys.readouterr().err
    score = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert score["count"] == 20 and score["classes"] == ["0", "1", "2"] and score["per_class"]["2"] is None
    assert cli(["eval", "--weights", str(tmp_path / "w"), "--dataset", f"hf:{tmp_path / 'd'}", "--label-key",
                "label", "--no-progress"]) == 0
    said = capsys.readouterr().out  # three classes are all in any top 5 (it said "top-5 100.00%"); none in 2
    assert "top-5 n/a (3 classes)" in said and "  2                   n/a (no images)" in said, said


# ------------------------------------------------------------------------------------ training

@pytest.mark.slow
def test_a_saved_dataset_trains_counts_its_bad_rows_and_keeps_its_class_names(trained):
    run, summary = trained
    assert summary["test_top1"] > 0.75  # three classes: chance is 1/3
    assert summary["skipped_files"] in (1, 2)  # the -1 test row; the broken train row if it was drawn
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in metrics if "train_loss" in r]
    assert losses[-1] < 0.7 * losses[0]
    saved = json.loads((run / "model" / "config.json").read_text())
    assert saved["config"]["label_names"] == NAMES


@pytest.mark.slow
def test_a_parquet_folder_evaluates_with_the_class_names(trained, hf_data, capsys):
    """The same rows read from Parquet (load_dataset) and from the saved folder score the same, name
    the classes of the ClassLabel, and count the unlabelled row."""
    run, summary = trained
    scores = []
    for where in hf_data[:2]:
        assert cli(["eval", "--weights", str(run), "--dataset", f"hf:{where}", "--json", "--no-progress"]) == 0
        scores.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    saved, parquet = scores
    assert list(parquet["per_class"]) == NAMES and parquet["count"] == 300 and parquet["skipped"] == 1
    assert parquet["top1"] == saved["top1"] and parquet["split"] == "test"
    assert abs(parquet["top1"] - summary["test_top1"]) < 0.02  # the run scored in bf16, eval in fp32
    assert cli(["eval", "--weights", str(run), "--dataset", f"hf:{hf_data[1]}", "--max-images", "100", "--json",
                "--no-progress"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["count"] == 100 and first["split_images"] == 300
    assert cli(["fewshot", "--weights", str(run), "--dataset", f"hf:{hf_data[1]}", "--shots", "1", "5",
                "--seeds", "2", "--json", "--no-progress"]) == 0
    shots = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    assert [r["shots"] for r in shots] == [1, 5] and shots[1]["mean"] > 0.5
    # shots drawn from the split that is scored: fitted on the test images (it scored higher, in silence)
    assert cli(["fewshot", "--weights", str(run), "--dataset", f"hf:{hf_data[1]}", "--hf-split", "test",
                "--shots", "1", "--no-progress"]) == 2
    assert "--hf-split test: fewshot draws its shots from the test split (--hf-split) and scores the test split " \
        "(--hf-test-split): they must be two splits" in capsys.readouterr().err
    assert cli(["fewshot", "--weights", str(run), "--dataset", f"hf:{hf_data[1]}", "--hf-test-split", "train",
                "--shots", "1", "--no-progress"]) == 2  # (the line blamed --hf-split, not given)
    assert "--hf-test-split train: fewshot draws its shots from the train split" in capsys.readouterr().err
    # the split scored, named (the error for a dataset without a test split said to name it with a flag fewshot
    # did not have): the default's scores again, and another split's name is refused by the splits there are
    assert cli(["fewshot", "--weights", str(run), "--dataset", f"hf:{hf_data[1]}", "--hf-test-split", "test",
                "--shots", "1", "5", "--seeds", "2", "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"] == shots
    assert cli(["fewshot", "--weights", str(run), "--dataset", f"hf:{hf_data[1]}", "--hf-test-split", "holdout",
                "--shots", "1", "--no-progress"]) == 2
    assert "has no split 'holdout'; its splits: train, test" in capsys.readouterr().err
    assert cli(["fewshot", "--weights", str(run), "--dataset", "fashion-mnist", "--hf-test-split", "test"]) == 2
    assert "--hf-test-split applies only to Hugging Face datasets" in capsys.readouterr().err


def test_no_progress_silences_the_datasets_packages_bars_too(trained, hf_data, tmp_path):
    """`--no-progress` left datasets' own bars on stderr ("Generating train split: 0 examples ...", and
    "Downloading data: 100%" for files already on the disk); without it they stay, as the datasets package draws
    them. Each run reads the Parquet folder into a fresh cache, where the bars are drawn. (A forked process: the
    fork server has not imported the datasets package, so each child imports it under its own variables.)"""
    def stderr(*flags, cache):
        env = {k: v for k, v in os.environ.items() if not k.endswith("_DISABLE_PROGRESS_BARS")}
        done = forks.run("eval", "--weights", trained[0], "--dataset", f"hf:{hf_data[1]}", "--max-images", "20",
                         *flags, env={**env, "HF_DATASETS_CACHE": str(tmp_path / cache), "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stderr

    assert "Generating test split" in stderr(cache="shown")
    assert "Generating" not in stderr("--no-progress", cache="quiet")


def test_a_verbs_quiet_bars_end_with_it_and_the_users_variable_decides(monkeypatch):
    """The switch is the verb's, not the process's: on again after it (set by a variable read at import, the bars
    of a library first imported during a quiet verb stayed off for good); a variable the user set is theirs."""
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    from vitkit.progress import library_bars

    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS", raising=False)
    enable_progress_bars()
    with library_bars(shown=False):
        assert are_progress_bars_disabled()
    assert not are_progress_bars_disabled()
    with library_bars(shown=True):
        assert not are_progress_bars_disabled()
    monkeypatch.setenv("HF_DATASETS_DISABLE_PROGRESS_BARS", "0")  # the user's: they want the bars
    with library_bars(shown=False):
        assert not are_progress_bars_disabled()
    disable_progress_bars()  # off before the verb: still off after it
    monkeypatch.delenv("HF_DATASETS_DISABLE_PROGRESS_BARS")
    with library_bars(shown=False):
        pass
    assert are_progress_bars_disabled()
    enable_progress_bars()


def _damage_samples(shard, data, positions):
    """Rewrite tar shard ``shard`` from its bytes ``data`` with the images of the samples at ``positions`` cut."""
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(shard, "w") as out:
        keys = list(dict.fromkeys(m.name.rsplit(".", 1)[0] for m in src.getmembers()))
        cut = {keys[i] for i in positions}
        for member in src.getmembers():
            body = src.extractfile(member).read()
            if member.name.rsplit(".", 1)[0] in cut and not member.name.endswith(".cls"):
                body = body[:20]
            member.size = len(body)
            out.addfile(member, io.BytesIO(body))


def test_an_image_folder_evaluates_as_its_rows_do(trained, hf_data, tmp_path, capsys):
    """`vitkit eval --dataset folder --data-dir D` (what a folder-trained run is evaluated on) said
    "folder is a file dataset: it is read through a DataLoader, not into memory", and `--dataset
    shards` the same. Now it scores the folder's test/ split: the same report as the same images read
    by Hugging Face's imagefolder builder (hf:D), as the rows they were written from, and as tar
    shards of them; a broken file skipped and named; few-shot from train/ and test/, whose class
    folders must agree (and not from a stream)."""
    import vitkit

    run, _ = trained
    # an image folder's classes are its sorted folder names: the run's head in that order
    model = vitkit.from_pretrained(run / "model")
    order = sorted(range(len(NAMES)), key=NAMES.__getitem__)
    with torch.no_grad():
        model.head.weight.copy_(model.head.weight[order].clone())
        model.head.bias.copy_(model.head.bias[order].clone())
    model.config = model.config.replace(label_names=sorted(NAMES))
    model.save_pretrained(tmp_path / "sorted")
    run = tmp_path / "sorted"
    test_x, test_y = rows("test", 100)
    train_x, train_y = rows("train", 60)
    for split, images, labels in (("train", train_x, train_y), ("test", test_x, test_y)):
        for i, (image, label) in enumerate(zip(images, labels)):
            (tmp_path / "d" / split / NAMES[label]).mkdir(parents=True, exist_ok=True)
            (tmp_path / "d" / split / NAMES[label] / f"{i:04d}.png").write_bytes(image["bytes"])
    scores = {}
    for weights, how in ((run, ["folder", "--data-dir", str(tmp_path / "d")]), (run, [f"hf:{tmp_path / 'd'}"]),
                         (trained[0], [f"hf:{hf_data[0]}"])):  # the rows, on the run's own head
        assert cli(["eval", "--weights", str(weights), "--dataset", *how, "--json", "--no-progress"]) == 0
        scores[len(scores)] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ours, theirs, rows_score = scores[0], scores[1], scores[2]
    assert ours["count"] == theirs["count"] == 300 and ours["split"] == "test"
    for key in ("top1", "top5", "per_class", "confusion"):
        assert ours[key] == theirs[key], key
    assert abs(ours["top1"] - rows_score["top1"]) < 1e-9 and ours["per_class"] == {
        name: rows_score["per_class"][name] for name in sorted(NAMES)}  # (the rows' split: one unlabelled row more)
    # the same files as tar shards (a stream, read in its own order): the same report
    from vitkit.data.shard_writer import folder_to_shards

    for split in ("train", "test"):
        folder_to_shards(tmp_path / "d" / split, tmp_path / "s" / split, max_per_shard=70)
    assert cli(["eval", "--weights", str(run), "--dataset", "shards", "--data-dir", str(tmp_path / "s"), "--json",
                "--no-progress"]) == 0
    streamed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert streamed["split"] == "test" and streamed["count"] == 300
    for key in ("top1", "top5", "per_class", "confusion"):
        assert streamed[key] == ours[key], key
    assert cli(["eval", "--weights", str(run), "--dataset", "shards", "--data-dir", str(tmp_path / "s"), "--json",
                "--no-progress", "--max-images", "50"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["count"] == 50 and first["split_images"] == 300
    # the first 50 in the shards' order (read with tarfile), whatever the batch size: two workers interleaved their
    # batches, so a batch of 500 scored one worker's share (samples 0, 2, 4, ...) and a batch of 1 both
    import tarfile

    labels = []
    for shard in sorted((tmp_path / "s" / "test").glob("*.tar")):
        with tarfile.open(shard) as tar:
            labels += [int(tar.extractfile(m).read()) for m in tar.getmembers() if m.name.endswith(".cls")]
    names, order = (tmp_path / "s" / "test" / "classes.txt").read_text().split(), list(first["per_class"])
    counted = np.bincount([order.index(names[label]) for label in labels[:50]], minlength=len(order))
    assert np.sum(first["confusion"], axis=1).tolist() == counted.tolist()
    for batch in ("1", "7"):
        assert cli(["eval", "--weights", str(run), "--dataset", "shards", "--data-dir", str(tmp_path / "s"), "--json",
                    "--no-progress", "--max-images", "50", "--batch-size", batch]) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["confusion"] == first["confusion"], batch
    shard = sorted((tmp_path / "s" / "test").glob("*.tar"))[0]  # samples 0-69
    kept = shard.read_bytes()
    for damaged, skipped in (((55,), None), ((10, 55), 1)):  # past the first 50: not read, not counted as skipped
        _damage_samples(shard, kept, damaged)
        assert cli(["eval", "--weights", str(run), "--dataset", "shards", "--data-dir", str(tmp_path / "s"),
                    "--json", "--no-progress", "--max-images", "50", "--batch-size", "500"]) == 0
        scored = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert scored["count"] == 50 and scored.get("skipped") == skipped, damaged
    shard.write_bytes(kept)
    index = json.loads((tmp_path / "s" / "test" / "meta.json").read_text())  # out of date: one shard rewritten
    stale = dict(index, shards={**index["shards"], sorted(index["shards"])[0]: 60}, num_samples=290)
    (tmp_path / "s" / "test" / "meta.json").write_text(json.dumps(stale))
    assert cli(["eval", "--weights", str(run), "--dataset", "shards", "--data-dir", str(tmp_path / "s"), "--json",
                "--no-progress"]) == 0  # it scored the first 290 samples the stream gave, unsaid
    out = capsys.readouterr()
    assert json.loads(out.out.strip().splitlines()[-1])["top1"] == ours["top1"]
    assert "meta.json) counts 290 samples, its shards hold 300: every one was scored" in out.err, out.err
    (tmp_path / "s" / "test" / "meta.json").write_text(json.dumps(index))
    for name in ("meta.json", "classes.txt"):  # shards that name no classes: one line, as training says it
        (tmp_path / "s" / "test" / name).unlink()
    assert cli(["eval", "--weights", str(run), "--dataset", "shards", "--data-dir", str(tmp_path / "s")]) == 2
    assert f"no class names for the shards in {tmp_path / 's' / 'test'}: write meta.json" in capsys.readouterr().err
    (tmp_path / "d" / "test" / "bag" / "9999.png").write_bytes(b"half a png")
    assert cli(["eval", "--weights", str(run), "--dataset", "folder", "--data-dir", str(tmp_path / "d"),
                "--json", "--no-progress"]) == 0
    broken = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert broken["skipped"] == 1 and broken["top1"] == ours["top1"]
    assert cli(["fewshot", "--weights", str(run), "--dataset", "folder", "--data-dir", str(tmp_path / "d"),
                "--shots", "1", "5", "--seeds", "2", "--json", "--no-progress"]) == 0
    shots = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    assert [r["shots"] for r in shots] == [1, 5] and shots[1]["mean"] > 0.5
    unusable = sorted((tmp_path / "d" / "test").iterdir())[-1]  # a class none of whose test images reads: the
    kept = {p: p.read_bytes() for p in unusable.iterdir()}  # probes scored the other classes, unsaid
    try:
        for p in kept:
            p.write_bytes(b"not an image")
        assert cli(["fewshot", "--weights", str(run), "--dataset", "folder", "--data-dir", str(tmp_path / "d"),
                    "--shots", "1", "--seeds", "1", "--no-progress"]) == 0
        assert (f"note: the test split holds no images of 1 of the classes the probes are fitted on "
                f"({unusable.name}): the score is of the others only") in capsys.readouterr().err
    finally:
        for p, data in kept.items():
            p.write_bytes(data)
    (tmp_path / "d" / "train" / "coat").mkdir()  # a test folder without a class's folder: the rest scored, as eval
    for i in range(51):  # does (it was refused); the probe holds 50 images of each class out
        (tmp_path / "d" / "train" / "coat" / f"{i}.png").write_bytes(train_x[i]["bytes"])
    assert cli(["fewshot", "--weights", str(run), "--dataset", "folder", "--data-dir", str(tmp_path / "d"),
                "--shots", "1", "--seeds", "1", "--json", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert [r["shots"] for r in json.loads(out.strip().splitlines()[-1])["results"]] == [1]
    assert "note: the test split holds no images of 1 of the classes the probes are fitted on (coat)" in err
    (tmp_path / "d" / "test" / "hat").mkdir()  # a class the probes are not fitted on: refused
    (tmp_path / "d" / "test" / "hat" / "0.png").write_bytes(train_x[0]["bytes"])
    assert cli(["fewshot", "--weights", str(run), "--dataset", "folder", "--data-dir", str(tmp_path / "d"),
                "--no-progress"]) == 2
    assert "differ between its splits: other classes (train/: 4, test/: 4; only in train/: 'coat'; only in test/: " \
           "'hat')" in capsys.readouterr().err
    assert cli(["fewshot", "--weights", str(run), "--dataset", "shards", "--data-dir", str(tmp_path / "s")]) == 2
    assert "few-shot draws a random pool of training images, which tar shards (a stream) do not offer" in \
        capsys.readouterr().err


@pytest.mark.slow
def test_sigkill_then_resume_is_bitwise_identical(tmp_path, hf_data):
    args = ["train", "--dataset", f"hf:{hf_data[0]}", "--model", "vit_fmnist", "--model-args", json.dumps(TINY),
            "--max-steps", "12", "--checkpoint-every", "4", "--keep-checkpoints", "5", "--batch-size", "30",
            "--val-size", "90", "--warmup-steps", "4", "--hflip", "--no-progress", "--threads", "1",
            "--workers", "1", "--runs-dir", str(tmp_path)]
    env = dict(os.environ, PYTHONHASHSEED="0", HF_DATASETS_CACHE=str(hf_data[2]))
    assert vitkit_here(*args, "--name", "straight") == 0  # the run the killed one must match: in this process
    run = tmp_path / "killed"
    kill_at_checkpoint([*args, "--name", "killed"], env, run, 4)
    done = forks.run("train", "--resume", run, "--no-progress", env=env)
    assert done.returncode == 0, done.stderr
    a = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    b = load_file(run / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------ streaming

def test_a_stream_resumes_in_order_and_splits_between_ranks(hf_data):
    from vitkit.data.hf import HFStream, load
    from vitkit.train.batches import Layout, ShardBatches

    split = load(f"hf:{hf_data[1]}", streaming=True)["train"]

    def make(transform, seed, shuffle, rank=None, world=None):
        return HFStream(split, "hf:x", "train", "image", "label", NAMES, transform, 1, seed,
                        shuffle_buffer=100 if shuffle else 0, epoch_length="auto" if shuffle else None,
                        num_rows=903, rank=rank, world_size=world)

    layout = Layout(batch_size=30, accum_steps=1, world=1, rank=0)
    source = ShardBatches(make, workers=2)
    spe = 903 // 30
    def pixel_sum(im):  # tells the rows apart (the labels are in class order)
        return torch.tensor(float(np.asarray(im, dtype=np.float64).sum()))

    def augmented(im):  # a random draw too: a resumed run's were not the uninterrupted run's
        return pixel_sum(im) + torch.rand(())

    whole = [x for x, _, _ in source.train(augmented, 0, layout, 0, spe + 2, spe)]
    resumed = [x for x, _, _ in source.train(augmented, 0, layout, 3, spe + 2, spe)]
    assert len(whole) == spe + 2 and len(resumed) == spe - 1
    assert all(torch.equal(a, b) for a, b in zip(whole[3:], resumed))
    assert not torch.equal(whole[0], whole[spe])  # the next epoch is shuffled anew

    # evaluation: two ranks read disjoint rows that together are every row once
    def ids(stream):
        return [str(s.reason) if isinstance(s, Skipped) else pixel_sum(s[0]).item() for s in stream]

    halves = [ids(make(None, 0, False, rank, 2)) for rank in (0, 1)]
    everything = ids(make(None, 0, False, 0, 1))
    assert len(everything) == 903 and abs(len(halves[0]) - len(halves[1])) <= 1
    assert sorted(map(str, halves[0] + halves[1])) == sorted(map(str, everything))
    # training: every rank the same number of samples an epoch
    assert len(list(make(None, 0, True, 0, 2))) == len(list(make(None, 0, True, 1, 2))) == 451


def test_a_shuffled_pass_ends_without_datasets_five_second_sleep(hf_data, monkeypatch):
    import datasets.iterable_dataset as iterable

    from vitkit.data.hf import SHUTDOWN_SLEEP_S, HFStream, load
    monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 5, raising=False)  # its default
    slept = []
    monkeypatch.setattr(iterable.time, "sleep", slept.append)
    split = load(f"hf:{hf_data[1]}", streaming=True)["train"]
    stream = HFStream(split, "hf:x", "train", "image", "label", NAMES, None, 1, 0, shuffle_buffer=50,
                      epoch_length=40, num_rows=903)
    assert len(list(stream)) == 40  # a pass closed in its middle, as every epoch ends
    assert slept and max(slept) == SHUTDOWN_SLEEP_S  # datasets still waits for pyarrow's threads, briefly
    assert datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN == 5  # the process's own setting is back


@pytest.mark.slow
def test_a_streamed_dataset_trains(tmp_path, hf_data):
    from vitkit.train import train

    summary = train(config(tmp_path, f"hf:{hf_data[1]}", hf_streaming=True, val_size=0, workers=2,
                           shuffle_buffer=300))
    assert summary["test_top1"] > 0.75


# ------------------------------------------------------------------------------------ refusals

def test_bad_datasets_and_flags_are_one_line_each(tmp_path, hf_data, capsys):
    no_image = datasets.Dataset.from_dict({"pixels": [b"x"], "label": [0]},
                                          features=datasets.Features({"pixels": datasets.Value("binary"),
                                                                      "label": datasets.ClassLabel(names=NAMES)}))
    datasets.DatasetDict({"train": no_image, "test": no_image}).save_to_disk(str(tmp_path / "no_image"))
    two = datasets.Dataset.from_dict({"image": [{"bytes": png(np.zeros((4, 4), np.uint8)), "path": None}],
                                      "label": [0], "coarse": [1]},
                                     features=features(coarse=datasets.ClassLabel(names=["top", "bottom"])))
    datasets.DatasetDict({"train": two, "test": two}).save_to_disk(str(tmp_path / "two_labels"))
    runs = tmp_path / "runs"
    cases = [
        (["train", "--dataset", f"hf:{tmp_path / 'no_image'}"], "has no image column; its columns: pixels, label"),
        (["train", "--dataset", f"hf:{tmp_path / 'two_labels'}"], "has 2 label columns (label, coarse)"),
        (["train", "--dataset", f"hf:{hf_data[0]}", "--hf-split", "training"],
         "has no split 'training'; its splits: train, test"),
        (["train", "--dataset", f"hf:{hf_data[0]}", "--hf-test-split", "train"], "are both 'train'"),
        (["train", "--dataset", f"hf:{hf_data[0]}", "--label-key", "colour"], "no column 'colour' (--label-key)"),
        (["train", "--dataset", f"hf:{tmp_path / 'nowhere'}"], "no such folder"),
        (["train", "--dataset", "hf:"], "needs a Hub name or a folder"),
        (["train", "--hf-split", "train"], "hf_split applies only to Hugging Face"),  # a flag of hf: datasets alone
        (["train", "--dataset", f"hf:{hf_data[0]}", "--data-dir", str(tmp_path)], "data_dir does not apply"),
        (["train", "--dataset", f"hf:{hf_data[0]}", "--hf-streaming", "--train-fraction", "0.5"],
         "a stream cannot be subset"),
        (["train", "--dataset", f"hf:{hf_data[0]}", "--hf-streaming", "--test-size", "50"],
         "test_size needs indexable data"),
        (["eval", "--weights", str(tmp_path), "--image-key", "img"], "--image-key applies only to Hugging Face"),
    ]
    for args, message in cases:
        assert cli([*args, "--no-progress", *(["--runs-dir", str(runs)] if args[0] == "train" else [])]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert message in err[-1] and err[-1].startswith(f"vitkit {args[0]}: error: "), (args, err)
    assert not runs.exists() or not any(runs.iterdir())  # nothing half-made


def test_an_uncached_hub_name_offline_says_so_in_one_line(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
               HF_DATASETS_CACHE=str(tmp_path / "cache"))
    proc = forks.run("train", "--dataset", "hf:someone/nothing-here", "--runs-dir", tmp_path / "runs", "--no-progress",
                     env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "vitkit train: error: hf:someone/nothing-here: not in the local Hugging Face cache and the Hub cannot be "
        "reached")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_hub_that_does_not_resolve_is_read_as_offline_not_asked_again_and_again(tmp_path):
    """Without network (the Hub's host does not resolve) a name not in the cache was asked for six times, each
    failure logged ("... thrown while requesting HEAD"), about 25 s, before the same answer: the cache is read as
    offline, in one line that also says no folder has that name."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HTTP", "http", "ALL_PROXY", "all_proxy"))}
    env.update(HF_ENDPOINT="https://hub.vitkit-test.invalid", HF_HOME=str(tmp_path / "hf"),
               HF_DATASETS_CACHE=str(tmp_path / "cache"))
    proc = forks.run("train", "--dataset", "hf:mydata", "--runs-dir", tmp_path / "runs", "--no-progress", env=env,
                     timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "the Hub cannot be reached" in proc.stderr and "nor is there a folder mydata here" in proc.stderr


def test_a_missing_datasets_package_names_the_extra(monkeypatch, tmp_path):
    from vitkit.train import resolve_config
    from vitkit.utils import MissingExtra

    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(MissingExtra, match=r"datasets is needed for Hugging Face datasets .*\.\[hf\]"):
        resolve_config("fmnist", dataset=f"hf:{tmp_path}").validate()


@pytest.mark.slow
def test_a_saved_dataset_pre_trains_without_its_labels(tmp_path, hf_data, capsys):
    assert cli(["pretrain", "--objective", "mae", "--dataset", f"hf:{hf_data[0]}", "--max-steps", "6",
                "--model-args", json.dumps(TINY), "--batch-size", "30", "--workers", "0", "--runs-dir", str(tmp_path),
                "--name", "mae", "--no-progress", "--json"]) == 0  # (the small model: labels are what is tested)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["objective"] == "mae" and summary["steps"] == 6 and summary["dataset"] == f"hf:{hf_data[0]}"


def test_a_class_no_training_row_has_is_said_and_colour_rows_are_seen_as_colour(tmp_path):
    """A ClassLabel name that no training row carries was trained from nothing and scored (a test image of it can
    never be right), without a word; a colour dataset's rows are seen as colour for the one-channel note (which
    read a row number as a file and failed every Hugging Face run)."""
    from vitkit.train.data import open_data

    red, green = np.zeros((28, 28, 3), np.uint8), np.zeros((28, 28, 3), np.uint8)
    red[..., 0], green[..., 1] = 200, 130
    train_x = [{"bytes": png(red), "path": None}] * 6 + [{"bytes": png(green), "path": None}] * 6
    splits = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"image": train_x, "label": [0] * 6 + [1] * 6}, features=features()),
        "test": datasets.Dataset.from_dict({"image": train_x[:3], "label": [0, 1, 2]}, features=features())})
    splits.save_to_disk(str(tmp_path / "saved"))
    with pytest.warns(UserWarning, match=r"1 of the 3 classes have no training image in hf:.*saved's train split: "
                                         r"bag; they are learned from nothing"):
        data = open_data(config(tmp_path, f"hf:{tmp_path / 'saved'}", val_size=2), torch.device("cpu"), channels=1)
    assert data.train.holds_colour()
