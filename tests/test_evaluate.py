"""Classification metrics and `vitkit eval`."""

import json

import numpy as np
import pytest
import torch

import vitkit
from conftest import Oracle
from vitkit.cli import main
from vitkit.data import fashion_mnist as fm
from vitkit.evaluate import classification_report, plot_confusion


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


@pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")
def test_cli_eval_max_images_scores_the_first_images_of_the_split(tmp_path, capsys):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_fmnist", depth=1, label_names=list(fm.CLASSES))
    model.save_pretrained(tmp_path / "m")
    assert main(["eval", "--weights", str(tmp_path / "m"), "--max-images", "300", "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["count"] == 300 and out["split_images"] == 10_000
    labels = fm.load_split("test").labels[:300]  # the confusion rows count the first 300 images' classes
    assert np.sum(out["confusion"], axis=1).tolist() == np.bincount(labels, minlength=10).tolist()
    assert main(["eval", "--weights", str(tmp_path / "m"), "--max-images", "300", "--no-progress"]) == 0
    assert "the first 300 of 10,000 images" in capsys.readouterr().out
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
    with pytest.raises(ValueError, match="tta must be one of none, flip"):
        classification_report(_LeftRight(), images, labels, tta="rotate")
