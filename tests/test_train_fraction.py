"""train_fraction: a fixed, class-balanced, nested labelled subset; val_every spaces validation."""

import json
import warnings

import pytest
import torch

from vitkit.data import fashion_mnist as fm
from vitkit.train import resolve_config, train
from vitkit.train.data import class_subset

real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")


def test_subset_keeps_the_same_share_of_every_class_and_nests():
    labels = torch.tensor([0] * 500 + [1] * 300 + [2] * 200)[torch.randperm(1000, generator=torch.Generator()
                                                                              .manual_seed(0))]
    small, large = class_subset(labels, 0.01), class_subset(labels, 0.1)
    assert torch.bincount(labels[small]).tolist() == [5, 3, 2]
    assert torch.bincount(labels[large]).tolist() == [50, 30, 20]
    assert set(small.tolist()) <= set(large.tolist())  # 1% of the labels within 10%
    assert torch.equal(small, class_subset(labels.clone(), 0.01))  # fixed: no dependence on global RNG
    assert torch.equal(class_subset(labels, 1.0), torch.arange(1000))
    tiny = class_subset(labels, 1e-6)  # every class keeps at least one image
    assert torch.bincount(labels[tiny]).tolist() == [1, 1, 1]
    from vitkit.train.data import _labelled_subset

    with pytest.warns(UserWarning, match=r"--train-fraction 1e-06 of 1,000 training images keeps 3, not 0\.0: every "
                                         r"class keeps at least one"):  # (it was said nowhere)
        _labelled_subset(torch.arange(1000), labels, 1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _labelled_subset(torch.arange(1000), labels, 0.01)


def test_bad_fraction_and_val_every_are_refused():
    with pytest.raises(ValueError, match="train_fraction must be in"):
        resolve_config("fmnist", train_fraction=0.0)
    with pytest.raises(ValueError, match="train_fraction must be in"):
        resolve_config("fmnist", train_fraction=1.5)
    with pytest.raises(ValueError, match="val_every must be"):
        resolve_config("fmnist", val_every=0)


@real
def test_a_run_on_one_percent_trains_on_that_subset_and_validates_when_told(tmp_path):
    cfg = resolve_config("fmnist", train_fraction=0.01, max_steps=30, batch_size=64, val_every=10,
                         warmup_steps=5, val_size=500, runs_dir=str(tmp_path), name="run", progress=False,
                         checkpoint_every=30, test_size=1000)
    summary = train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val_acc" in r] == [10, 20, 30]
    # 1% of the 59,500 images left after validation, ~595 images: 9 batches of 64 per epoch
    assert 590 <= summary["train_images"] <= 605
    assert summary["epochs"] == pytest.approx(30 / 9, abs=1e-3)
    assert summary["test_top1"] > 0.3  # it still learns from 595 labels (chance 0.1)
