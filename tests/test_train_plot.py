"""The multi-run validation figure and the results collector that draws it."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitkit.train.plot import plot_val_curves

ROOT = Path(__file__).resolve().parents[1]


def _curve(final, epochs):
    return [[e, final - 0.3 * (epochs - e) / epochs] for e in range(1, epochs + 1)]


def test_val_curves_figure_draws_every_run(tmp_path):
    out = plot_val_curves({"short": _curve(0.90, 10), "long": _curve(0.93, 40)}, tmp_path / "c.png", goal=0.94)
    img = np.asarray(Image.open(out).convert("RGB"))
    assert img.shape == (495, 880, 3)  # 8 x 4.5 inches at 110 dpi
    # matplotlib's first two colours (blue, orange) are both drawn: one line per run
    blue = np.all(np.abs(img.astype(int) - (31, 119, 180)) < 30, axis=-1).sum()
    orange = np.all(np.abs(img.astype(int) - (255, 127, 14)) < 30, axis=-1).sum()
    assert blue > 200 and orange > 200


def test_val_curves_refuse_nothing_to_draw(tmp_path):
    with pytest.raises(ValueError, match="no runs"):
        plot_val_curves({}, tmp_path / "c.png")
    with pytest.raises(ValueError, match="'empty' has no validation points"):
        plot_val_curves({"empty": []}, tmp_path / "c.png")
    assert not (tmp_path / "c.png").exists()


def test_collect_runs_writes_results_and_figure(tmp_path, monkeypatch):
    run = tmp_path / "r1"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"epochs": 3}))
    (run / "summary.json").write_text(json.dumps({"model": "m", "test_top1": 0.9, "seconds": 10.0,
                                                  "train_img_s": 100.0}))
    rows = [{"step": 10 * e, "epoch": e, "img_s": 90.0 + e} for e in (1, 2, 3)] + \
           [{"step": 10 * e, "epoch": e, "val_acc": 0.8 + 0.03 * e, "val_loss": 0.5} for e in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("collect_runs", None)
    import collect_runs

    out, fig = tmp_path / "res.json", tmp_path / "fig.png"
    assert collect_runs.main([str(run), "--kind", "t", "--out", str(out), "--plot", str(fig),
                              "--goal-top1", "0.95", "--note", "r1=a note"]) == 0
    data = json.loads(out.read_text())
    assert data["notes"] == {"r1": "a note"}
    assert "limits" not in data["machine"]  # the runs ran earlier: no peaks of the collecting moment
    rec = data["runs"]["r1"]
    assert rec["val_curve"] == [[1, pytest.approx(0.83)], [2, pytest.approx(0.86)], [3, pytest.approx(0.89)]]
    assert rec["img_s_spread"] == {"min": 91.0, "median": 92.0, "max": 93.0}
    assert Image.open(fig).size == (880, 495)
    # a pre-training run has no top-1: it was a KeyError after the file was written; its loss is said instead
    (run / "summary.json").write_text(json.dumps({"model": "m", "test_loss": 0.43, "seconds": 10.0,
                                                  "train_img_s": 100.0}))
    assert collect_runs.main([str(run), "--kind", "t", "--out", str(out)]) == 0
