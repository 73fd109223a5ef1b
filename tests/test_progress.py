"""Progress lines on long waits: on stderr, silent for short waits and when turned off.

A fake clock stands in for time (no sleeping): each reading advances it by a fixed step, so
a loop of N items "lasts" N steps. The library functions are run with ``DELAY_S`` set to 0,
which makes every wait long enough to show.
"""

import io
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from conftest import Oracle
from vitkit import progress
from vitkit.progress import Progress, copy_with_progress, track


def fake_clock(step_s: float):
    """A clock that advances ``step_s`` seconds each time it is read."""
    t = [0.0]

    def clock() -> float:
        t[0] += step_s
        return t[0]
    return clock


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_wait_prints_the_label_count_and_eta():
    out = io.StringIO()
    items = list(track(range(20), "evaluating test", unit="batches", stream=out, clock=fake_clock(1.0)))
    assert items == list(range(20))  # the items pass through unchanged
    lines = out.getvalue().splitlines()
    # not a terminal: a line once 5 s have passed, then every 10 s, and the end
    assert lines[0].startswith("evaluating test [") and " 5/20 batches | 00:05 < 00:15" in lines[0]
    assert "15/20 batches" in lines[1]
    assert lines[-1].endswith("20/20 batches | 00:20 < 00:00") and len(lines) == 3


def test_a_short_wait_and_a_disabled_one_print_nothing():
    out = io.StringIO()
    assert list(track(range(4), "quick", stream=out, clock=fake_clock(1.0))) == [0, 1, 2, 3]  # 4 s < 5 s
    assert list(track(range(50), "off", enabled=False, stream=out, clock=fake_clock(1.0))) == list(range(50))
    assert out.getvalue() == ""


def test_a_terminal_line_is_redrawn_in_place_and_ended_once():
    out = Terminal()
    list(track(range(8), "inspecting", stream=out, clock=fake_clock(1.0)))
    text = out.getvalue()
    assert text.startswith("\r") and text.count("\n") == 1 and text.endswith("\n")
    assert "inspecting [" in text and "8/8" in text.rsplit("\r", 1)[-1]
    quiet = Terminal()
    list(track(range(3), "inspecting", stream=quiet, clock=fake_clock(1.0)))
    assert quiet.getvalue() == ""  # no stray newline after a wait that drew nothing


def test_an_unknown_length_shows_the_count_without_a_bar_or_eta():
    out = io.StringIO()
    list(track(iter(range(7)), "counting samples in shards", unit="shards", stream=out, clock=fake_clock(1.0)))
    first = out.getvalue().splitlines()[0]
    assert first == "counting samples in shards 5 shards | 00:05"


def test_only_the_reporting_process_draws(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    out = io.StringIO()
    list(track(range(20), "evaluating", stream=out, clock=fake_clock(1.0)))
    assert out.getvalue() == ""


def test_the_training_bar_is_unchanged_and_importable_from_train():
    from vitkit.train.progress import Progress as TrainProgress

    assert TrainProgress is Progress
    out = io.StringIO()
    bar = Progress(100, 0, stream=out, clock=fake_clock(2.0))  # no delay: its first update draws
    bar.update(10, {"loss": 0.5, "img/s": 1234.5})
    bar.close()
    assert out.getvalue() == "[##----------------------] 10/100 loss 0.5 img/s 1234 | 00:02 < 00:18\n"


def test_a_download_counts_megabytes(monkeypatch):
    out, dst = io.StringIO(), io.BytesIO()
    src = io.BytesIO(b"x" * (3 * progress.MB + 5))
    monkeypatch.setattr(progress, "Progress", lambda *a, **k: Progress(*a, **{**k, "stream": out,
                                                                              "clock": fake_clock(3.0)}))
    assert copy_with_progress(src, dst, "downloading x.tar.gz", total_bytes=len(src.getvalue())) == 3 * progress.MB + 5
    assert dst.getvalue() == src.getvalue()
    lines = out.getvalue().splitlines()  # read every 3 s: drawn at 6 s (2 MB), and at the end
    assert len(lines) == 2 and lines[-1].startswith("downloading x.tar.gz [") and " 4/4 MB | 00:12" in lines[-1]


# ------------------------------------------------------------------ wired into the library


@pytest.fixture
def no_delay(monkeypatch):
    """Every wait counts as long."""
    monkeypatch.setattr(progress, "DELAY_S", 0.0)




def oracle_data(n=12):
    labels = torch.arange(n) % 3
    return (10 * (labels + 1)).to(torch.uint8).view(-1, 1, 1, 1).expand(-1, 1, 4, 4).contiguous(), labels


def test_classification_report_shows_progress_on_stderr_only(no_delay, capsys):
    from vitkit.evaluate import classification_report

    images, labels = oracle_data()
    report = classification_report(Oracle(), images, labels, batch_size=4, label="evaluating test")
    captured = capsys.readouterr()
    assert report.top1 == 1.0 and captured.out == ""
    assert captured.err.splitlines()[-1].startswith("evaluating test [########################] 3/3 batches | ")
    classification_report(Oracle(), images, labels, batch_size=4, progress=False)
    assert capsys.readouterr() == ("", "")


def test_fewshot_shows_feature_extraction_and_fits(no_delay, capsys):
    from vitkit.evaluate import extract_features, fewshot_from_features

    images, labels = oracle_data(300)
    feats = extract_features(Oracle(), images, batch_size=100)
    res = fewshot_from_features(feats, labels, feats, labels, shots=[1, 5], seeds=2, holdout_per_class=10)
    captured = capsys.readouterr()
    assert captured.out == "" and set(res) == {1, 5}
    assert "extracting features [########################] 3/3 batches" in captured.err
    assert "fitting few-shot ridge [########################] 4/4 fits" in captured.err
    extract_features(Oracle(), images, batch_size=100, progress=False)
    fewshot_from_features(feats, labels, feats, labels, shots=[1], seeds=1, holdout_per_class=10, progress=False)
    assert capsys.readouterr() == ("", "")


class FakeTask:
    def evaluate(self, model, batches, amp, parallel=None):
        seen = [len(y) for _, y, _ in batches]
        return float(sum(seen)), None


def fake_run(progress_on: bool, main: bool = True, n: int = 10):
    batch = lambda size: ([0] * size, [0] * size, ())  # noqa: E731 (inputs, labels, none unreadable)
    data = SimpleNamespace(test=list(range(n)), val=list(range(n)),
                           eval_batches=lambda split, config, size: iter([batch(size)] * -(-n // size)))
    return SimpleNamespace(cfg=SimpleNamespace(progress=progress_on, eval_batch_size=4), main=main, data=data,
                           input_config=None, task=FakeTask(), amp=None, parallel=None, skipped=set(), scored={})


def test_the_final_scoring_of_a_run_shows_progress_on_rank_0_only(no_delay, capsys):
    from vitkit.train.tasks import final_score

    assert final_score(fake_run(True), None, "test", "EMA") == (12.0, None)  # the batches reach the task
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("evaluating EMA test [########################] 3/3 batches | ")
    final_score(fake_run(False), None, "val")  # --no-progress
    final_score(fake_run(True, main=False), None, "val")  # another rank
    assert capsys.readouterr() == ("", "")


def test_image_folder_scan_shows_the_files_checked(no_delay, tmp_path, capsys):
    pytest.importorskip("PIL")
    from vitkit.data.folder import ImageFolder

    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(3):
            Image.new("RGB", (8, 8), (i, 0, 0)).save(tmp_path / cls / f"{i}.png")
    folder = ImageFolder(tmp_path)
    err = capsys.readouterr().err
    assert len(folder) == 6
    assert f"listing {tmp_path} [########################] 2/2 classes" in err
    assert f"checking {tmp_path} (header) [########################] 6/6 files" in err
    ImageFolder(tmp_path, progress=False)
    assert capsys.readouterr().err == ""


def test_cli_inspect_json_keeps_stdout_clean(no_delay, tmp_path, capsys):
    from vitkit.cli import main

    model = vitkit.create_model("vit_fmnist", in_chans=3, img_size=32, num_classes=3, depth=1,
                                label_names=["a", "b", "c"], mean=(0.5,) * 3, std=(0.5,) * 3)
    model.save_pretrained(tmp_path / "model")
    photos = []
    for i in range(3):
        photos.append(tmp_path / f"photo{i}.png")
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(photos[-1])
    args = ["inspect", "--weights", str(tmp_path / "model"), "--out", str(tmp_path / "out"), "--json", "--image"]
    assert main(args + [str(p) for p in photos]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)  # stdout is the JSON and nothing else
    assert len(result["predictions"]) == 3
    # 3 loaded + 1 chunk + 3 rollout figures + 6 model figures and the report: the count ends at its total
    last = captured.err.splitlines()[-1]
    assert last.startswith("inspecting [########################] 13/13 steps | "), last


def test_cli_inspect_takes_a_folder_as_its_images(no_delay, tmp_path, capsys):
    """`--image photos/` was "a folder, not an image file"; it stands for the images under it, as
    predict reads one, in the same order (the report is the same as with the files named)."""
    from vitkit.cli import main

    vitkit.create_model("vit_fmnist", in_chans=3, img_size=32, num_classes=3, depth=1, label_names=["a", "b", "c"],
                        mean=(0.5,) * 3, std=(0.5,) * 3).save_pretrained(tmp_path / "model")
    (tmp_path / "photos").mkdir()
    for i in (2, 0, 1):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(
            tmp_path / "photos" / f"{i}.png")
    results = []
    for images in ([str(tmp_path / "photos")], [str(tmp_path / "photos" / f"{i}.png") for i in range(3)]):
        assert main(["inspect", "--weights", str(tmp_path / "model"), "--out", str(tmp_path / f"out{len(results)}"),
                     "--json", "--no-progress", "--image", *images]) == 0
        results.append(json.loads(capsys.readouterr().out)["predictions"])
    assert results[0] == results[1] and [p["image"] for p in results[0]] == [str(tmp_path / "photos" / f"{i}.png")
                                                                       for i in range(3)]
    # a folder of more than a report's images: one line before any is read, no folder made
    from vitkit.inspect.report import MAX_IMAGES

    for i in range(3, MAX_IMAGES + 1):
        (tmp_path / "photos" / f"{i}.png").write_bytes(b"never read")
    assert main(["inspect", "--weights", str(tmp_path / "model"), "--out", str(tmp_path / "many"), "--no-progress",
                 "--image", str(tmp_path / "photos")]) == 2
    assert f"{MAX_IMAGES + 1} images to inspect: at most {MAX_IMAGES}" in capsys.readouterr().err
    assert not (tmp_path / "many").exists()
