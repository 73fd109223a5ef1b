"""Few-shot ridge evaluation: near 100% on separable features, near chance on random labels."""

import json
import statistics
import warnings

import pytest
import torch

import vitkit
from vitkit.cli import main
from vitkit.data import fashion_mnist as fm
from vitkit.evaluate import fewshot_from_features, ridge_fit
from vitkit.evaluate.dataset import check_fewshot_options, fewshot_on_dataset


def blobs(n_per_class, classes=10, dim=32, spread=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g, dtype=torch.float64) * 3
    y = torch.arange(classes).repeat_interleave(n_per_class)
    x = centres[y] + spread * torch.randn(len(y), dim, generator=g, dtype=torch.float64)
    return x, y


def test_separable_features_are_near_perfect():
    tr_x, tr_y = blobs(100, seed=2)
    te_x, te_y = blobs(50, seed=2)  # same seed: the same class centres
    res = fewshot_from_features(tr_x, tr_y, te_x, te_y, shots=[1, 5], seeds=3)
    assert res[5].mean > 0.99 and res[1].mean > 0.9
    assert len(res[5].per_seed) == 3 and all(lam > 0 for lam in res[5].lambdas)


def test_random_labels_are_near_chance():
    tr_x, _ = blobs(100, seed=3)
    te_x, _ = blobs(100, seed=3)
    g = torch.Generator().manual_seed(9)
    tr_y = torch.randint(0, 10, (len(tr_x),), generator=g)
    te_y = torch.randint(0, 10, (len(te_x),), generator=g)
    res = fewshot_from_features(tr_x, tr_y, te_x, te_y, shots=[10], seeds=3, holdout_per_class=20)
    assert abs(res[10].mean - 0.1) < 0.04
    # the spread over seeds is the sample's (n - 1), as the studies' are: it was numpy's default, the population's
    assert len(set(res[10].per_seed)) > 1 and res[10].std == pytest.approx(statistics.stdev(res[10].per_seed))
    one = fewshot_from_features(tr_x, tr_y, te_x, te_y, shots=[10], seeds=1, holdout_per_class=20)
    assert one[10].std == 0.0 and one[10].per_seed == res[10].per_seed[:1]


def test_ridge_closed_form_matches_least_squares_limit_and_dual_form():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 5, generator=g, dtype=torch.float64)
    w_true = torch.randn(5, 2, generator=g, dtype=torch.float64)
    y = x @ w_true + 0.7
    w, b = ridge_fit(x, y, 1e-9)  # primal (features < samples): recovers the exact solution
    assert torch.allclose(w, w_true, atol=1e-6) and torch.allclose(b, torch.full((2,), 0.7, dtype=torch.float64))
    xs = x[:4]  # dual form (features > samples) interpolates the targets when lambda -> 0
    w, b = ridge_fit(xs, y[:4], 1e-9)
    assert torch.allclose(xs @ w + b, y[:4], atol=1e-5)


def test_not_enough_images_per_class_is_a_clear_error():
    tr_x, tr_y = blobs(10)
    with pytest.raises(ValueError, match=r"need 35 training images per class; \d+ of \d+ classes have fewer "
                                         r"\(class \d+: 10\): give the probe"):
        fewshot_from_features(tr_x, tr_y, tr_x, tr_y, shots=[25], holdout_per_class=10)


def test_the_largest_shot_count_decides_and_the_advice_names_the_counts_that_fit():
    """`--shots 5 30` on 30 images a class named 5 shots (the first) and said "or fewer --shots" with 1 image."""
    tr_x, tr_y = blobs(30)
    with pytest.raises(ValueError, match=r"^30 shots \+ 10 held out .* need 40 training images per class; .* "
                                         r"\(class \d+: 30\): give the probe a training split with more images per "
                                         r"class, or only --shots 5$"):
        fewshot_from_features(tr_x, tr_y, tr_x, tr_y, shots=[5, 30], holdout_per_class=10)
    with pytest.raises(ValueError, match=r"images per class$"):  # no shot count fits: no "fewer" advice
        fewshot_from_features(tr_x, tr_y, tr_x, tr_y, shots=[25, 30], holdout_per_class=10)


def test_one_class_and_features_that_are_not_finite_are_refused_not_scored():
    """One class scored 100% and NaN features chance (10%), each as a normal result with exit 0."""
    tr_x, tr_y = blobs(30)
    one = tr_y == tr_y[0]
    with pytest.raises(ValueError, match="needs at least 2 classes; the training split has 1"):
        fewshot_from_features(tr_x[one], tr_y[one], tr_x[one], tr_y[one], shots=[1], holdout_per_class=10)
    broken = tr_x.clone()
    broken[3, 0] = float("nan")
    with pytest.raises(ValueError, match=r"features are not finite \(NaN or inf\): its weights overflow"):
        fewshot_from_features(broken, tr_y, tr_x, tr_y, shots=[1], holdout_per_class=10)
    with pytest.raises(ValueError, match=r"--seeds 100000000000: at most 1000"):
        check_fewshot_options([1], 10 ** 11, 0)
    # shots no pool can hold: said before any image is read (it took the features' 15 s, then advised a larger pool)
    with pytest.raises(ValueError, match=r"--shots 1000000: the probe draws 1000000 \+ 50 .* pool of 1,000: a larger"):
        check_fewshot_options([1, 10 ** 6], 1, 1000)
    check_fewshot_options([25], 1, 150)  # 2 x (25 + 50): may fit
    check_fewshot_options([10 ** 6], 1, 0)  # the whole split: its size decides
    check_fewshot_options([1.5], 1, 10)  # not whole: fewshot_from_features says so in its words, not this check


@pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")
def test_an_error_that_is_not_the_pools_gets_no_advice_on_the_pool():
    """Overflowing weights were refused with "...its weights overflow; only a pool of 1,000 training images was
    drawn: a larger pool": the pool's advice followed every error of the fit, where it mends only too few images."""
    torch.manual_seed(0)
    model = vitkit.create_model("vit_fmnist", depth=1, label_names=list(fm.CLASSES))
    with torch.no_grad():
        model.blocks[0].mlp.fc1.weight.mul_(1e37)
    with pytest.raises(ValueError, match="not finite") as caught:
        fewshot_on_dataset(model, "fashion-mnist", shots=(1,), seeds=1, pool=1000, progress=False)
    assert "pool" not in str(caught.value), caught.value


@pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")
def test_cli_fewshot_json(tmp_path, capsys):
    torch.manual_seed(0)
    vitkit.create_model("vit_fmnist", depth=1).save_pretrained(tmp_path / "m")
    code = main(["fewshot", "--weights", str(tmp_path / "m"), "--dataset", "fashion-mnist", "--shots", "1", "5",
                 "--seeds", "2", "--pool", "3000", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and [r["shots"] for r in out["results"]] == [1, 5]
    one, five = (r["mean"] for r in out["results"])
    # even random ViT features carry class information (chance is 10%), and more shots help
    assert 0.15 < one < five <= 1


@pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")
def test_a_pool_too_small_for_the_shots_names_the_pool(tmp_path, capsys):
    """500 of 60,000 training images hold about 50 per class, short of 25 shots + 50 held out: the split has
    enough, the pool drawn from it does not, and the line says so (it said to find a larger split)."""
    torch.manual_seed(0)
    vitkit.create_model("vit_fmnist", depth=1).save_pretrained(tmp_path / "m")
    code = main(["fewshot", "--weights", str(tmp_path / "m"), "--dataset", "fashion-mnist", "--shots", "25", "--seeds",
                 "1", "--pool", "500", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "only a pool of 500 training images was drawn" in err[0]
    assert "--pool 0" in err[0]


@pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")
def test_fewshot_without_dataset_takes_the_models_or_its_runs_or_asks(tmp_path, capsys, monkeypatch):
    """--dataset defaulted to fashion-mnist whatever the weights: a model trained on ImageNet folders was scored
    "1-shot 23.92%" on Fashion-MNIST without a word. The weights' class names pick the dataset, as eval's do; a
    pre-training run's encoder (no classes) takes the dataset its run trained on; anything else is asked for."""
    from vitkit.data.datasets import CLASS_NAMES

    monkeypatch.setenv("VITKIT_TINY", "1")  # the dataset chosen is checked, not the scores: 100 test images
    torch.manual_seed(0)
    args = ["--shots", "1", "--seeds", "1", "--pool", "1000", "--no-progress", "--json"]
    vitkit.create_model("vit_fmnist", depth=1, label_names=[f"n0{i}" for i in range(10)]).save_pretrained(
        tmp_path / "imagenet-like")
    assert main(["fewshot", "--weights", str(tmp_path / "imagenet-like"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass --dataset: few-shot fits its probes on the dataset named" in err[0], err
    vitkit.create_model("vit_fmnist", depth=1, label_names=CLASS_NAMES["fashion-mnist"]).save_pretrained(
        tmp_path / "named")
    assert main(["fewshot", "--weights", str(tmp_path / "named"), *args]) == 0
    assert json.loads(capsys.readouterr().out)["dataset"] == "fashion-mnist"
    run = tmp_path / "runs" / "mae"  # a pre-training run's folder: its config.json, its encoder in model/
    vitkit.create_model("vit_fmnist", depth=1, num_classes=0).save_pretrained(run / "model")
    (run / "config.json").write_text(json.dumps({"objective": "mae", "dataset": "fashion-mnist", "data_dir": None}))
    for weights in (run, run / "model", run / "model" / "model.safetensors"):
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # (a note is said once per place in a process)
            assert main(["fewshot", "--weights", str(weights), *args]) == 0
        said = capsys.readouterr()
        assert json.loads(said.out)["dataset"] == "fashion-mnist"
        assert f"note: fashion-mnist, the dataset the run {run} trained on (--dataset chooses another)" in said.err


@pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")
def test_the_python_fewshot_takes_the_models_dataset_or_asks_for_one():
    """``fewshot_on_dataset(model)`` scored any model on Fashion-MNIST (its default), as the command line did."""
    from vitkit.data.datasets import CLASS_NAMES

    torch.manual_seed(0)
    other = vitkit.create_model("vit_fmnist", depth=1, label_names=[f"n0{i}" for i in range(10)])
    with pytest.raises(ValueError, match=r"are none of fashion-mnist.*pass --dataset \(dataset= in Python\)"):
        fewshot_on_dataset(other, shots=(1,), seeds=1, pool=1000, progress=False)
    named = vitkit.create_model("vit_fmnist", depth=1, label_names=CLASS_NAMES["fashion-mnist"])
    assert fewshot_on_dataset(named, shots=(1,), seeds=1, pool=1000, progress=False).dataset == "fashion-mnist"
