"""Classification metrics and `vitkit eval`."""

import json

import numpy as np
import pytest
import torch
from torch import nn

import vitkit
from conftest import Oracle
from vitkit.cli import main
from vitkit.data import fashion_mnist as fm
from vitkit.evaluate import classification_report, plot_confusion, prepare_batch
from vitkit.evaluate.dataset import scored_positions


def test_report_counts_and_confusion(tmp_path):
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    images = (10 * (labels + 1)).to(torch.uint8).view(-1, 1, 1, 1).expand(-1, 1, 4, 4).contiguous()
    truth = labels.clone()
    truth[5] = 0  # one image labelled 'a' that the oracle calls 'c'
    report = classification_report(Oracle(), images, truth, batch_size=4)
    assert report.top1 == pytest.approx(5 / 6) and report.top5 == 1.0 and report.count == 6
    assert report.confusion.tolist() == [[2, 0, 1], [0, 2, 0], [0, 0, 1]]
    assert report.per_class == {"a": pytest.approx(2 / 3), "b": 1.0, "c": 1.0}
    png = plot_confusion(report, tmp_path / "cm.png")
    assert png.stat().st_size > 5_000
    # a class without images has no score: JSON's null (it was NaN, which a strict JSON reader refuses)
    absent = classification_report(Oracle(), images[:4], truth[:4], batch_size=4, classes=["a", "b", "c"])
    assert absent.per_class == {"a": 1.0, "b": 1.0, "c": None}
    assert json.loads(json.dumps(absent.to_dict(), allow_nan=False))["per_class"]["c"] is None


@pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")
def test_cli_eval_on_fashion_mnist(tmp_path, capsys):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_fmnist", depth=1, label_names=list(fm.CLASSES))
    torch.nn.init.normal_(model.head.weight, std=0.1)
    model.save_pretrained(tmp_path / "m")
    code = main(["eval", "--weights", str(tmp_path / "m"), "--out", str(tmp_path), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["count"] == 10_000 and np.sum(out["confusion"]) == 10_000
    assert out["top5"] >= out["top1"] and set(out["per_class"]) == set(fm.CLASSES)
    assert (tmp_path / "confusion_matrix.png").is_file()


def test_an_eval_out_folder_that_takes_no_files_is_refused_before_the_evaluation(tmp_path, capsys, monkeypatch):
    """--out /proc/x passed the check (root may write anywhere, as access() says) and failed after the whole split was
    scored, in words that did not name --out."""
    import vitkit.evaluate

    vitkit.create_model("vit_fmnist", depth=1, label_names=list(fm.CLASSES)).save_pretrained(tmp_path / "m")
    monkeypatch.setattr(vitkit.evaluate, "score_dataset", lambda *a, **k: pytest.fail("scored before the check"))
    assert main(["eval", "--weights", str(tmp_path / "m"), "--out", "/proc/vitkit-eval-out"]) == 2
    assert capsys.readouterr().err.strip() == ("vitkit eval: error: --out /proc/vitkit-eval-out cannot be written: "
                                               "/proc takes no new files (No such file or directory)")
    import errno

    def full(*args, **kwargs):  # a file system without a free inode (or block): said naming --out, not replaced
        raise OSError(errno.ENOSPC, "No space left on device")  # by the bare disk-full line

    monkeypatch.setattr(vitkit.files.tempfile, "TemporaryFile", full)
    assert main(["eval", "--weights", str(tmp_path / "m"), "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == (f"vitkit eval: error: --out {tmp_path / 'x'} cannot be written: "
                                               f"{tmp_path} takes no new files (its file system is full)")


@pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")
def test_cli_eval_max_images_scores_a_fixed_sample_of_the_split(tmp_path, capsys):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_fmnist", depth=1, label_names=list(fm.CLASSES))
    model.save_pretrained(tmp_path / "m")
    assert main(["eval", "--weights", str(tmp_path / "m"), "--max-images", "300", "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["count"] == 300 and out["split_images"] == 10_000
    labels = fm.load_split("test").labels[scored_positions(10_000, 300).numpy()]  # the confusion rows count them
    assert np.sum(out["confusion"], axis=1).tolist() == np.bincount(labels, minlength=10).tolist()
    assert main(["eval", "--weights", str(tmp_path / "m"), "--max-images", "300", "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert "(300 of 10,000 images, a fixed sample, " in said and "classes: the score is of those" not in said
    # a folder is read class by class: its first images were one class's, and the score then was of that class
    from PIL import Image

    for split in ("train", "test"):
        for name in ("a", "b"):
            (tmp_path / "f" / split / name).mkdir(parents=True)
            for i in range(3):
                Image.new("L", (28, 28), 40 * i).save(tmp_path / "f" / split / name / f"{i}.png")
    vitkit.create_model("vit_fmnist", depth=1, num_classes=2, label_names=["a", "b"]).save_pretrained(tmp_path / "ab")
    assert main(["eval", "--weights", str(tmp_path / "ab"), "--dataset", "folder", "--data-dir", str(tmp_path / "f"),
                 "--max-images", "2", "--json", "--no-progress"]) == 0
    assert np.sum(json.loads(capsys.readouterr().out)["confusion"], axis=1).tolist() == [1, 1]  # positions 2 and 5
    # a test folder without one class's folder scores the others, as an empty folder of it does (it was refused:
    # "the weights were trained on other classes")
    import shutil

    scores = []
    for how in ("empty", "gone"):
        shutil.rmtree(tmp_path / "f" / "test" / "a")
        if how == "empty":
            (tmp_path / "f" / "test" / "a").mkdir()
        assert main(["eval", "--weights", str(tmp_path / "ab"), "--dataset", "folder", "--data-dir",
                     str(tmp_path / "f"), "--json", "--no-progress"]) == 0, how
        scores.append(json.loads(capsys.readouterr().out))
        shutil.copytree(tmp_path / "f" / "train" / "a", tmp_path / "f" / "test" / "a", dirs_exist_ok=True)
    assert scores[0]["count"] == 3 and scores[0]["confusion"][0] == [0, 0] and scores[0]["per_class"]["a"] is None
    assert {k: v for k, v in scores[1].items() if k != "skipped"} == {k: v for k, v in scores[0].items()
                                                                       if k != "skipped"}
    # scoring test/ needs no train/ (it was refused: "must hold train/ and test/")

    shutil.rmtree(tmp_path / "f" / "train")
    assert main(["eval", "--weights", str(tmp_path / "ab"), "--dataset", "folder", "--data-dir", str(tmp_path / "f"),
                 "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["count"] == 6
    assert main(["eval", "--weights", str(tmp_path / "ab"), "--dataset", "folder", "--data-dir", str(tmp_path / "f"),
                 "--split", "train", "--no-progress"]) == 2
    assert "must hold train/ and test/ (or val/)" in capsys.readouterr().err
    assert main(["eval", "--weights", str(tmp_path / "m"), "--max-images", "0"]) == 2
    err = capsys.readouterr().err
    assert "--max-images must be a positive integer, not 0" in err and "Traceback" not in err


class _LeftRight(torch.nn.Module):
    """Class 0 for images brighter on the left, class 1 for brighter on the right (a mirror swaps them)."""

    config = Oracle.config

    def forward(self, x):
        half = x.shape[-1] // 2
        d = x[..., :half].mean((1, 2, 3)) - x[..., half:].mean((1, 2, 3))
        return torch.stack([4 * d, -4 * d, torch.zeros_like(d)], -1)


@pytest.mark.parametrize("size", [(28, 40), (32, 32), (20, 20)])
def test_in_memory_images_are_resized_as_pil_resizes_a_file(size):
    """prepare_batch (in-memory training, eval and few-shot) resized with torch's plain bicubic (a = -0.75, no
    antialiasing), predict and serve a file with PIL's: a run at another size than its data saw other pixels in
    each, up to 0.32 apart at 20x20, and eval's per-class scores moved from predict's."""
    from PIL import Image

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (8, 28, 28), dtype=np.uint8)
    images[:4] = np.kron(rng.integers(0, 256, (4, 7, 7)), np.ones((4, 4))).astype(np.uint8)  # edges, as garments'
    config = vitkit.ViTConfig(img_size=size, in_chans=1, patch_size=4, mean=(0.0,), std=(1.0,))
    ours = prepare_batch(torch.from_numpy(images).unsqueeze(1), config)[:, 0].numpy()
    pil = np.stack([np.asarray(Image.fromarray(im).resize(size[::-1], Image.Resampling.BICUBIC)) for im in images])
    gap = np.abs(ours - pil / 255.0)
    assert gap.mean() < 2e-3 and gap.max() < 0.1, (gap.mean(), gap.max())


def test_flip_tta_scores_the_mean_probabilities_of_an_image_and_its_mirror():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 255, (8, 1, 4, 4), dtype=torch.uint8, generator=g)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    plain = classification_report(_LeftRight(), images, labels)
    flipped = classification_report(_LeftRight(), images, labels, tta="flip")
    x = (images.float() / 255).expand(-1, 1, -1, -1)
    both = (_LeftRight()(x).softmax(-1) + _LeftRight()(x.flip(-1)).softmax(-1)) / 2  # by hand
    assert flipped.confusion.sum(0)[0] == int((both.argmax(-1) == 0).sum())
    assert plain.confusion.tolist() != flipped.confusion.tolist()  # the mirror cancels the cue: all ties
    with pytest.raises(ValueError, match="tta must be one of none, flip, flip-shift, not 'rotate'"):
        classification_report(_LeftRight(), images, labels, tta="rotate")


def test_flip_shift_views_are_torchvisions_padded_crops_and_their_mirrors():
    """The 10 views: a crop of the image padded by one black pixel (torchvision's RandomCrop with
    padding, at the centre and one pixel up, down, left, right), each with its mirror."""
    from torchvision.transforms.v2 import functional as TF

    from vitkit.evaluate.tta import views

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (3, 1, 28, 28), dtype=torch.uint8, generator=g)
    config = vitkit.create_model("vit_fmnist", depth=1).config  # mean 0.286, std 0.353: black is not 0
    got = list(views(prepare_batch(images, config), "flip-shift", config))
    padded = TF.pad(images, [1], fill=0)
    crops = [TF.crop(padded, top, left, 28, 28) for top, left in ((1, 1), (0, 1), (2, 1), (1, 0), (1, 2))]
    expected = [prepare_batch(v, config) for c in crops for v in (c, TF.horizontal_flip(c))]
    assert len(got) == 10
    for view, want in zip(got, expected):
        torch.testing.assert_close(view, want, rtol=0, atol=1e-5)
    assert [v.shape for v in views(prepare_batch(images, config), "flip", config)] == [images.shape] * 2


def test_flip_shift_scores_the_mean_probabilities_of_the_ten_views():
    from torchvision.transforms.v2 import functional as TF

    class _TopLeft(nn.Module):  # a cue that a one-pixel shift moves: the brightness of the top-left pixels
        config = Oracle.config

        def forward(self, x):
            return torch.stack([x[:, 0, 0, 0], x[:, 0, 0, 1], x[:, 0, 1, 0]], -1) * 3

    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (64, 1, 4, 4), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 3, (64,), generator=g)
    report = classification_report(_TopLeft(), images, labels, tta="flip-shift", batch_size=16)
    padded = TF.pad(images, [1], fill=0)  # by hand, with torchvision's crops
    crops = [TF.crop(padded, top, left, 4, 4) for top, left in ((1, 1), (0, 1), (2, 1), (1, 0), (1, 2))]
    probs = sum(_TopLeft()(prepare_batch(v, Oracle.config)).softmax(-1)
                for c in crops for v in (c, TF.horizontal_flip(c))) / 10
    assert report.top1 == pytest.approx(float((probs.argmax(-1) == labels).float().mean()))
    assert report.top1 != classification_report(_TopLeft(), images, labels, tta="flip").top1


def test_the_tta_modes_are_the_config_and_cli_choices():
    from vitkit.evaluate.tta import TTA_MODES
    from vitkit.train.config import CHOICES

    assert CHOICES["test_tta"] == TTA_MODES  # restated there so the CLI parses without torch


def test_the_evaluation_helpers_refuse_what_they_would_misread():
    """Each of these was answered with a number: float images divided by 255 a second time (features 2.2 off),
    a label of -1 counted as the last class, features and labels of different lengths fitted; and a model's
    float32 features or a bare int for shots ended in a torch error deep inside."""
    from vitkit.evaluate import extract_features, fewshot_from_features

    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, depth=1, embed_dim=32, num_heads=2,
                                num_classes=3).eval()
    u8 = torch.randint(0, 255, (6, 3, 32, 32), dtype=torch.uint8)
    for bad in (u8.float() / 255, u8.float(), u8[0]):
        with pytest.raises(ValueError, match=r"images must be uint8 pixels \(N, C, H, W\) in 0-255"):
            extract_features(model, bad, progress=False)
        with pytest.raises(ValueError, match="images must be uint8 pixels"):
            classification_report(model, bad, torch.zeros(len(bad), dtype=torch.long), progress=False)
    with pytest.raises(ValueError, match=r"labels must be class numbers >= 0, not -1"):
        classification_report(model, u8, torch.tensor([0, 1, 2, 0, 1, -1]), progress=False)
    with pytest.raises(ValueError, match=r"labels: 6 images need 6 labels in one dimension, not \(4,\)"):
        classification_report(model, u8, torch.tensor([0, 1, 2, 0]), progress=False)
    report = classification_report(model, u8, torch.tensor([0, 1, 2, 0, 1, 2]), progress=False)
    assert report.count == 6 and report.confusion.sum(1).tolist() == [2, 2, 2]
    g = torch.Generator().manual_seed(0)
    tx, ty = torch.randn(180, 8, generator=g), torch.arange(3).repeat_interleave(60)
    vx, vy = torch.randn(30, 8, generator=g), torch.arange(3).repeat(10)
    with pytest.raises(ValueError, match=r"train_y: 180 images need 180 labels in one dimension, not \(175,\)"):
        fewshot_from_features(tx, ty[:-5], vx, vy, shots=[1], seeds=1, progress=False)
    with pytest.raises(ValueError, match=r"shots must be a list of whole numbers \(shots=\[1, 5\]\), not 5"):
        fewshot_from_features(tx, ty, vx, vy, shots=5, seeds=1, progress=False)
    with pytest.raises(ValueError, match=r"train_y must be integer class numbers, not torch.float32"):
        fewshot_from_features(tx, ty.float(), vx, vy, shots=[1], seeds=1, progress=False)
    with pytest.raises(ValueError, match=r"features must be \(images, width\) matrices of one width"):
        fewshot_from_features(tx, ty, vx[:, :4], vy, shots=[1], seeds=1, progress=False)
    as_float32 = fewshot_from_features(tx, ty, vx, vy, shots=[1], seeds=1, progress=False)  # a model's features
    assert as_float32[1].mean == fewshot_from_features(tx.double(), ty, vx.double(), vy, shots=[1], seeds=1,
                                                       progress=False)[1].mean


def test_a_folder_is_scored_in_the_models_class_order(tmp_path):
    """A folder lists its class folders alphabetically, which says nothing of a head's order: a model of the classes
    c, b, a was refused on a folder of a/, b/, c/ ("the same 3 classes in another order"). Each folder image is
    scored under the model's number for its class's name."""
    from PIL import Image

    from vitkit.evaluate.dataset import score_dataset
    from vitkit.models import get_model_config

    class Reversed(Oracle):
        config = get_model_config("vit_fmnist").replace(img_size=(4, 4), patch_size=(4, 4), num_classes=3, mean=(0.0,),
                                                       std=(1.0,), label_names=["c", "b", "a"], crop_pct=1.0)

    for brightness, name in ((10, "c"), (20, "b"), (30, "a")):  # the Oracle's class 0 is the darkest: "c" here
        (tmp_path / "test" / name).mkdir(parents=True)
        for i in range(2):
            Image.new("L", (4, 4), brightness).save(tmp_path / "test" / name / f"{i}.png")
    score = score_dataset(Reversed(), "folder", data_dir=str(tmp_path), progress=False)
    assert score.report.top1 == 1.0 and list(score.report.per_class) == ["c", "b", "a"]


def test_evaluation_leaves_the_model_in_its_mode_and_refuses_what_it_would_score_wrongly(tmp_path):
    """Each of these set the caller's model to eval and left it there (evaluating inside one's own training loop
    went on without dropout); classes= in another order than the model's label_names scored a perfect model 0%;
    a negative batch size scored 0% of 0 images; empty inputs, top_k=True, holdout_per_class=0 and k=-1 were
    taken, or failed deep inside."""
    from PIL import Image

    from vitkit.evaluate import extract_features, fewshot_from_features, predict_images
    from vitkit.inspect import attention_maps, embedding_filters_pca, token_norms

    torch.manual_seed(0)
    model = vitkit.create_model("vit_fmnist", depth=1, num_classes=3, label_names=["cat", "dog", "eel"],
                                drop_rate=0.1)
    images = torch.randint(0, 255, (6, 1, 28, 28), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    Image.fromarray(images[0, 0].numpy()).save(tmp_path / "a.png")
    x = prepare_batch(images[:2], model.config)
    for mode in (True, False):
        for call in (lambda: classification_report(model, images, labels, progress=False),
                     lambda: extract_features(model, images, progress=False),
                     lambda: predict_images(model, [tmp_path / "a.png"], progress=False),
                     lambda: attention_maps(model, x), lambda: token_norms(model, x)):
            model.train(mode)
            model.blocks[0].attn.eval()  # a part the caller keeps in eval (frozen) stays so
            call()
            assert model.training is mode and model.blocks[0].attn.training is False
            assert all(m.training is mode for m in model.modules() if m is not model.blocks[0].attn and
                       all(m is not c for c in model.blocks[0].attn.modules()))
    model.train()
    dropout_free = classification_report(model, images, labels, progress=False)
    assert dropout_free.top1 == classification_report(model.eval(), images, labels, progress=False).top1
    with pytest.raises(ValueError, match=r"classes= are not the model's label_names: the same 3 classes in another "
                                         r"order .*give the labels in the model's order"):
        classification_report(model, images, labels, classes=["eel", "dog", "cat"], progress=False)
    assert classification_report(model, images, labels, classes=["cat", "dog", "eel"], progress=False).count == 6
    assert classification_report(model, images, labels, batch_size=np.int64(4), progress=False).count == 6
    for batch_size in (-1, 0, True, 2.0):
        for call in (lambda: classification_report(model, images, labels, batch_size=batch_size, progress=False),
                     lambda: extract_features(model, images, batch_size=batch_size, progress=False),
                     lambda: predict_images(model, [tmp_path / "a.png"], batch_size=batch_size, progress=False)):
            with pytest.raises(ValueError, match="batch_size must be a positive integer"):
                call()
    with pytest.raises(ValueError, match="no images given"):
        classification_report(model, images[:0], labels[:0], progress=False)
    with pytest.raises(ValueError, match="no images given"):
        extract_features(model, images[:0], progress=False)
    with pytest.raises(ValueError, match="top_k must be a positive integer, got True"):
        predict_images(model, [tmp_path / "a.png"], top_k=True, progress=False)
    features = torch.randn(30, 4)
    for holdout in (0, -5):
        with pytest.raises(ValueError, match="holdout_per_class .* must be a whole number >= 1"):
            fewshot_from_features(features, torch.arange(30) % 3, features, torch.arange(30) % 3, [1],
                                  holdout_per_class=holdout, progress=False)
    for k in (-1, 0):
        with pytest.raises(ValueError, match="k \\(the components shown\\) must be a positive integer"):
            embedding_filters_pca(model, k=k)


def test_two_threads_evaluating_one_model_share_its_eval_mode():
    """Each call saved the modes it found and put them back: a second thread's call saved the first one's eval
    mode, the first put train mode back while the second still ran (its batches with dropout), and the second
    left the model in eval."""
    import threading

    from vitkit.evaluate import extract_features

    model = vitkit.create_model("vit_fmnist", depth=1, drop_rate=0.5).train()
    images = torch.randint(0, 255, (3, 1, 28, 28), dtype=torch.uint8)
    both_inside, seen = threading.Barrier(2, timeout=30), []

    def watch(module, inputs):
        seen.append(model.training or module.training)
        if getattr(threading.current_thread(), "first", True):
            threading.current_thread().first = False
            both_inside.wait()  # each thread's first batch waits until both calls have begun

    model.patch_embed.register_forward_pre_hook(watch)
    threads = [threading.Thread(target=extract_features, args=(model, images), kwargs=dict(batch_size=1,
                                                                                          progress=False))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(seen) == 6 and not any(seen), seen
    assert model.training and all(m.training for m in model.modules())
