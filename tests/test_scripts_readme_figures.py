"""scripts/readme_figures.py: the README's inspection figures and the numbers its text quotes."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import vitkit
import vitkit.data.fashion_mnist as fm
from conftest import randomize
from vitkit.evaluate.metrics import prepare_batch
from vitkit.inspect import mean_attention_distance, pos_embed_similarity
from vitkit.train.data import load_split_tensors

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "readme_figures.py"
real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")


def _script():
    spec = importlib.util.spec_from_file_location("readme_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_folder(root: Path, top1: float = 0.875) -> Path:
    """A finished-looking `vitkit train` run: model/, a training config.json, summary.json."""
    run = root / "runs" / "demo"
    # two layers (the default has one): the per-layer rows and the growth with depth are checked
    randomize(vitkit.create_model("vit_fmnist_hybrid", depth=2)).save_pretrained(run / "model")
    (run / "config.json").write_text(json.dumps({"epochs": 6}))
    (run / "summary.json").write_text(json.dumps({"test_top1": top1, "test_top1_ema": 0.5}))
    return run


def test_similarity_by_grid_distance_separates_near_from_far():
    script = _script()
    model = vitkit.create_model("vit_fmnist")  # fixed 2D sine-cosine positions, 7x7
    stats = script.similarity_by_grid_distance(pos_embed_similarity(model))
    assert stats["neighbours"] > stats["diagonal_neighbours"] > stats["half_the_grid_or_more_apart"]
    assert stats["same_row_or_column"] > stats["other_rows_and_columns"]


def test_attention_distance_in_batches_is_one_pass(monkeypatch):
    script = _script()
    model = randomize(vitkit.create_model("vit_fmnist_hybrid"))
    x = torch.randn(7, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(script, "BATCH", 3)  # batches of 3, 3 and 1
    torch.testing.assert_close(script.attention_distance(model, x), mean_attention_distance(model, x))


def test_garment_facts_measure_the_rollout_on_bright_pixels():
    script = _script()
    views = torch.zeros(2, 4, 4, dtype=torch.uint8)
    views[:, :, :1] = 200  # the garment: the left column, a quarter of the image
    heat = torch.zeros(2, 4, 4)
    heat[0, :, 0] = 0.25  # all the rollout on the garment
    heat[1] = 1 / 16  # spread evenly
    heat[1, 3, 3] = 1 / 16 + 1e-3  # brightest on the background
    first, second = script.garment_facts(views, heat)
    assert first == {"garment_pixels_pct": 25.0, "rollout_on_garment_pct": 100.0, "brightest_pixel": [0, 0],
                     "brightest_on_garment": True}
    assert second["rollout_on_garment_pct"] == 25.0 and second["brightest_pixel"] == [3, 3]
    assert not second["brightest_on_garment"]


def test_resolve_model_reads_the_runs_summary(tmp_path):
    script = _script()
    run = _run_folder(tmp_path)
    assert script.resolve_model(run) == (run / "model", run / "summary.json", 87.5)
    assert script.resolve_model(run / "model") == (run / "model", run / "summary.json", 87.5)
    vitkit.create_model("vit_fmnist_hybrid").save_pretrained(run / "model_ema")
    assert script.resolve_model(run / "model_ema")[2] == 50.0  # the EMA's own score
    vitkit.create_model("vit_fmnist_hybrid").save_pretrained(tmp_path / "loose")
    assert script.resolve_model(tmp_path / "loose") == (tmp_path / "loose", None, None)


def test_the_model_is_never_guessed(tmp_path, capsys):
    script = _script()
    _run_folder(tmp_path)  # a run exists, but nothing picks it
    with pytest.raises(SystemExit) as e:
        script.main(["--out", str(tmp_path / "figures")])
    assert e.value.code == 2 and "--weights runs/NAME" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        script.main(["--weights", str(tmp_path / "runs" / "missing"), "--out", str(tmp_path / "figures")])
    assert e.value.code == 2 and "no such file or folder" in capsys.readouterr().err
    assert not (tmp_path / "figures").exists()


@real
def test_script_writes_the_figures_and_stats_from_the_same_images(tmp_path, capsys, monkeypatch):
    script = _script()
    run = _run_folder(tmp_path)
    drawn = {}
    scatter = script.figures.attention_distance_scatter

    def spy(distance, path, **kw):
        drawn["distance"] = distance
        return scatter(distance, path, **kw)

    monkeypatch.setattr(script.figures, "attention_distance_scatter", spy)
    out = tmp_path / "figures"
    assert script.main(["--weights", str(run), "--out", str(out), "--images", "16"]) == 0
    for name in script.FIGURES:
        assert (out / f"{name}.png").stat().st_size > 1000
    stats = json.loads((out / "inspect_stats.json").read_text())
    captured = capsys.readouterr()
    assert stats == json.loads(captured.out)
    assert f"model: {run / 'model'} (vit_fmnist_hybrid" in captured.err and "test top-1 87.5%" in captured.err
    assert stats["model"]["weights"] == str(run / "model") and stats["model"]["test_top1_pct"] == 87.5
    assert stats["model"]["summary"] == str(run / "summary.json") and stats["images"] == 16

    # the figure's distances are the stats' (the same 16 images), not the 4 images of `vitkit inspect`
    model = vitkit.from_pretrained(run).eval()
    images, _, _ = load_split_tensors("fashion-mnist", "test")
    expected = mean_attention_distance(model, prepare_batch(images[:16], model.config))
    torch.testing.assert_close(drawn["distance"], expected)
    layers = stats["attention_distance_px"]
    assert list(layers) == ["layer 1", "layer 2"]
    for row, d in zip(layers.values(), expected):
        assert row == {"min_head": round(float(d.min()), 1), "max_head": round(float(d.max()), 1),
                       "mean": round(float(d.mean()), 1)}
    assert 0 < stats["uniform_attention_px"] < 28 * 2 ** 0.5 and stats["heads"] == 6
    assert isinstance(stats["mean_grows_with_depth"], bool)  # two layers: a real comparison (one: None)

    rollout = stats["rollout"]
    assert [s["figure"] for s in rollout["shown"]] == ["rollout_1.png", "rollout_2.png"]
    assert [s["label"] for s in rollout["shown"]] == ["Ankle boot", "Pullover"]  # test images #0 and #1
    for fact in [*rollout["shown"], rollout["all_images"]]:
        assert 0 < fact["garment_pixels_pct"] < 100 and 0 <= fact["rollout_on_garment_pct"] <= 100
    for fact in rollout["shown"]:
        assert fact["token_share_min_pct"] <= rollout["uniform_token_share_pct"] == 2.0 <= fact["token_share_max_pct"]
    assert set(stats["pos_embed_similarity"]) == {"same_row_or_column", "neighbours", "diagonal_neighbours",
                                                  "other_rows_and_columns", "half_the_grid_or_more_apart"}
    pca = stats["filter_pca"]
    assert pca["filters"] == 32 and pca["filter_shape"] == [1, 3, 3] and len(pca["explained_pct"]) == 9
    assert 99 <= sum(pca["explained_pct"]) <= 101
