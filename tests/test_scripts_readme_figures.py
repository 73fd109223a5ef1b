"""scripts/readme_figures.py: the README's inspection figures and the numbers its text quotes."""

import importlib.util
import json
from pathlib import Path

import pytest

import vitkit
import vitkit.data.fashion_mnist as fm
from conftest import randomize
from vitkit.inspect import pos_embed_similarity

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "readme_figures.py"
real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")


def _script():
    spec = importlib.util.spec_from_file_location("readme_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_similarity_by_grid_distance_separates_near_from_far():
    script = _script()
    model = vitkit.create_model("vit_fmnist")  # fixed 2D sine-cosine positions, 7x7
    stats = script.similarity_by_grid_distance(pos_embed_similarity(model))
    assert stats["neighbours"] > stats["diagonal_neighbours"] > stats["far (>= half the grid)"]
    assert stats["same_row_or_column"] > stats["other rows and columns"]


@real
def test_script_writes_the_figures_and_stats(tmp_path, capsys):
    script = _script()
    runs = tmp_path / "runs"
    randomize(vitkit.create_model("vit_fmnist")).save_pretrained(runs / "demo" / "model")
    out = tmp_path / "figures"
    assert script.main(["--runs", str(runs), "--out", str(out), "--images", "16"]) == 0
    for name in script.FIGURES:
        assert (out / f"{name}.png").stat().st_size > 1000
    stats = json.loads((out / "inspect_stats.json").read_text())
    assert stats == json.loads(capsys.readouterr().out)
    assert stats["images"] == 16 and stats["weights"] == str(runs / "demo" / "model")
    layers = stats["mean_attention_distance_px"]
    assert list(layers) == [f"layer {i}" for i in range(1, 5)]
    diagonal = 28 * 2 ** 0.5
    assert 0 < stats["uniform_attention_px"] < diagonal
    for row in layers.values():
        assert 0 < row["min_head"] <= row["mean"] <= row["max_head"] < diagonal


def test_script_without_a_run_says_what_to_do(tmp_path):
    with pytest.raises(SystemExit, match="make demo"):
        _script().newest_run_model(tmp_path)
