"""The paper's experiments as studies (vitkit.studies, `vitkit study`): the verdict rule on known
numbers, each study end to end at tiny scale (VITKIT_TINY=1: a few steps of a few images), a
study killed mid-way finishing without repeating its runs, bad arguments in one line, and
docs/paper.md quoting only numbers that its results files hold."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import forks
from conftest import vitkit_here
from vitkit.cli import main as cli
from vitkit.data import fashion_mnist as fm
from vitkit.studies import get_study, list_studies
from vitkit.studies.base import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Options, Spread, differ, train_run

ROOT = Path(__file__).resolve().parents[1]
real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")


# ------------------------------------------------------------------------------------ the rule


def test_two_arms_differ_beyond_twice_the_standard_error_of_their_gap():
    a, b = Spread((0.90, 0.91, 0.92)), Spread((0.86, 0.87, 0.88))
    assert differ(a, b) and differ(b, a)  # 4 points apart, std 1 point: se of the gap 0.82
    assert not differ(a, Spread((0.89, 0.905, 0.915)))
    assert not differ(Spread((0.9,)), Spread((0.5,)))  # one seed: no spread, no judgement
    assert Spread((0.9, 0.92)).text() == "91.0 ± 1.4" and Spread(()).text() == "–"


def _results(scores, seeds=(0, 1, 2)):
    """Fake results of the position study: {arm: [test_top1 per seed]} (25-shot the same)."""
    runs = {f"{arm}-s{s}": {"arm": arm, "seed": s, "test_top1": v, "fewshot_25": v}
            for arm, values in scores.items() for s, v in zip(seeds, values)}
    arms = {arm: {"grid": arm.rsplit("-", 1)[1]} for arm in scores}
    return {"runs": runs, "arms": arms, "settings": {"seeds": list(seeds)}}


def test_the_position_study_decides_each_claim_from_its_numbers():
    study = get_study("position-embeddings")
    kinds = ("learned", "learned_2d", "sincos2d", "relative")
    paper_like = {"none-7x7": [0.80, 0.81, 0.82], **{f"{k}-7x7": [0.85, 0.86, 0.87] for k in kinds},
                  "none-14x14": [0.70, 0.71, 0.72], **{f"{k}-14x14": [0.80, 0.81, 0.82] for k in kinds}}
    verdicts = {v["claim"]: v["verdict"] for v in study.verdicts(_results(paper_like))}
    assert set(verdicts.values()) == {REPRODUCED}
    assert len(verdicts) == 5  # none worst and level, on two scores; the harder grid
    no_gain = dict(paper_like, **{"learned-7x7": [0.79, 0.80, 0.81]})  # one kind below none
    worst = study.verdicts(_results(no_gain))[0]
    assert worst["verdict"] == NOT_REPRODUCED and "learned at 7x7: -1.0" in worst["why"]
    noisy = dict(paper_like, **{"relative-7x7": [0.70, 0.86, 0.99]})  # far from the others, huge spread
    level = study.verdicts(_results(noisy))[1]
    assert level["verdict"] == INCONCLUSIVE and "within the seeds' spread" in level["why"]
    one_seed = study.verdicts(_results({k: v[:1] for k, v in paper_like.items()}, seeds=(0,)))
    assert {v["verdict"] for v in one_seed} == {INCONCLUSIVE}


def test_the_attention_study_judges_local_heads_only_where_there_are_some():
    study = get_study("attention-distance")

    def model(family, layers):
        return {"family": family, "label": family, "uniform_px": 10.0, "distance_px": layers}

    global_only = {"v": model("vit", [[9.0, 9.5], [9.8, 9.9]]), "h": model("hybrid", [[9.0, 9.2], [9.5, 9.6]])}
    third = study.verdicts({"models": global_only})[2]
    assert third["verdict"] == INCONCLUSIVE and "no head of any model is local" in third["why"]
    fewer = {"v": model("vit", [[2.0, 9.5], [3.0, 9.9]]), "h": model("hybrid", [[2.0, 9.2], [9.5, 9.6]])}
    verdicts = study.verdicts({"models": fewer})
    assert verdicts[2]["verdict"] == REPRODUCED  # 2 of 4 local heads against 1 of 4
    assert verdicts[0]["verdict"] == REPRODUCED and verdicts[1]["verdict"] == REPRODUCED  # mixed first layers; grows
    more = {"v": model("vit", [[9.0, 9.5], [9.8, 9.9]]), "h": model("hybrid", [[2.0, 9.2], [9.5, 9.6]])}
    assert study.verdicts({"models": more})[2]["verdict"] == NOT_REPRODUCED


def test_the_registers_study_tests_the_outlier_claim_only_where_there_are_outliers():
    study = get_study("registers")

    def results(outliers0, outliers4, rough0=(0.30, 0.31, 0.32), rough4=(0.20, 0.21, 0.22),
                top0=(0.90, 0.91, 0.92), top4=(0.90, 0.91, 0.92)):
        runs = {}
        for arm, o, r, t in (("reg0", outliers0, rough0, top0), ("reg4", outliers4, rough4, top4)):
            for seed, (oo, rr, tt) in enumerate(zip(o, r, t)):
                runs[f"{arm}-s{seed}"] = {"arm": arm, "seed": seed, "outlier_share": oo, "rollout_roughness": rr,
                                          "test_top1": tt, "max_norm_ratio": 2.0, "register_attention": 0.1}
        return {"runs": runs, "settings": {"seeds": [0, 1, 2]}}

    paper_like = study.verdicts(results((0.020, 0.021, 0.019), (0.0, 0.0, 0.001)))
    assert [v["verdict"] for v in paper_like] == [REPRODUCED, REPRODUCED, REPRODUCED]
    none = study.verdicts(results((0.001, 0.0, 0.002), (0.001, 0.0, 0.0)))[0]
    assert none["verdict"] == INCONCLUSIVE and "no outliers to remove" in none["why"]
    rougher = study.verdicts(results((0.02,) * 3, (0.0,) * 3, rough4=(0.40, 0.41, 0.42)))[1]
    assert rougher["verdict"] == NOT_REPRODUCED
    costly = study.verdicts(results((0.02,) * 3, (0.0,) * 3, top4=(0.80, 0.81, 0.82)))[2]
    assert costly["verdict"] == NOT_REPRODUCED and "test top-1" in costly["why"]
    assert "| 4 |" in study.table(results((0.02,) * 3, (0.0,) * 3))


# ------------------------------------------------------------------------------------ running


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setenv("VITKIT_TINY", "1")


@real
@pytest.mark.slow
@pytest.mark.full
def test_every_study_runs_end_to_end_with_the_smoke_flag(tmp_path, tiny, capsys):
    """The training studies, then the two that read them (the few-shot proxy ranks their models,
    attention distance measures the compute study's), into one results folder."""
    out = tmp_path / "out"
    for name in list_studies():
        assert cli(["study", name, "--smoke", "--work", str(tmp_path / name), "--out", str(out), "--threads",
                    "1"]) == 0, name
        printed = capsys.readouterr().out
        results = json.loads((out / f"{name}.json").read_text())
        arms = get_study(name).arms(Options(seeds=(0,), smoke=True))
        assert results["settings"]["smoke"] and results["settings"]["tiny"]
        assert len(results["runs"]) == len(arms) and all(0 <= r["test_top1"] <= 1 for r in results["runs"].values())
        assert results["verdicts"] and {v["verdict"] for v in results["verdicts"]} <= {REPRODUCED, NOT_REPRODUCED,
                                                                                        INCONCLUSIVE}
        assert (out / f"{name}.md").read_text().startswith("| ") and (out / f"{name}.png").stat().st_size > 10_000
        assert all(v["claim"] in printed for v in results["verdicts"]), name
    proxy = json.loads((out / "fewshot-proxy.json").read_text())
    assert proxy["correlation"]["all"]["models"] == 5 + 6 + 6  # every model of the three training studies
    distance = json.loads((out / "attention-distance.json").read_text())
    assert set(distance["models"]) == {"vit-s", "vit-m", "hybrid-s", "hybrid-m"}
    assert all(len(m["distance_px"][0]) >= 2 for m in distance["models"].values())


@real
@pytest.mark.slow
def test_a_study_runs_on_an_image_folder(tmp_path, tiny):
    """--dataset folder: the runs read image files; few-shot (in-memory and Hugging Face data only) is
    left out; attention distance reads the folder's test images through the evaluation pipeline."""
    import numpy as np
    from PIL import Image

    data = fm.load_split("test")
    for split in ("train", "test"):
        for i in range(60):
            folder = tmp_path / "photos" / split / str(int(data.labels[i]))
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.asarray(data.images[i])).save(folder / f"{i}.png")
    common = ["--smoke", "--out", str(tmp_path / "out"), "--threads", "1"]
    assert cli(["study", "compute", *common, "--work", str(tmp_path / "c"), "--dataset", "folder", "--data-dir",
                str(tmp_path / "photos")]) == 0
    compute = json.loads((tmp_path / "out" / "compute.json").read_text())
    assert compute["settings"]["dataset"] == "folder" and not any("fewshot_25" in r for r in compute["runs"].values())
    assert cli(["study", "attention-distance", *common, "--work", str(tmp_path / "a")]) == 0
    assert len(json.loads((tmp_path / "out" / "attention-distance.json").read_text())["models"]) == 4


@real
@pytest.mark.slow
def test_a_killed_study_finishes_without_repeating_its_runs(tmp_path, tiny, monkeypatch, capsys):
    """SIGKILL once the first run is done; started again, the study keeps that run as it was,
    finishes the rest and reports every arm; the arm the kill interrupted ends as a study never
    stopped would end it (run here again, alone, in a fresh folder)."""
    env = dict(os.environ, VITKIT_TINY="1")
    args = ["study", "position-embeddings", "--smoke", "--threads", "1", "--work", str(tmp_path / "runs"),
            "--out", str(tmp_path / "out")]
    first = tmp_path / "runs" / "none-7x7-s0" / "summary.json"
    proc = forks.popen(*args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not first.is_file():
        assert proc.poll() is None, "the study ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stamp = first.stat().st_mtime_ns
    # finished with three of its five kinds: the run kept, the one the kill interrupted and one never started
    # are all there is to prove; the other two were a third of this test's time
    from vitkit.studies import positions

    monkeypatch.setattr(positions, "KINDS", positions.KINDS[:3])
    assert vitkit_here(*args) == 0  # started again: in this process (VITKIT_TINY is set here too)
    assert first.stat().st_mtime_ns == stamp  # reused, not trained again
    results = json.loads((tmp_path / "out" / "position-embeddings.json").read_text())
    kept = json.loads(first.read_text())
    study = get_study("position-embeddings")
    options = Options(seeds=(0,), smoke=True, threads=1)
    arms = study.arms(options)
    assert len(results["runs"]) == len(arms) and results["verdicts"]
    assert results["runs"]["none-7x7-s0"]["test_top1"] == kept["test_top1"]
    interrupted = next(a for a in arms if a.key == "learned-7x7")  # the arm after the first
    straight = train_run(interrupted, 0, options, study, tmp_path / "straight")
    assert results["runs"]["learned-7x7-s0"]["test_top1"] == straight["test_top1"]
    # without VITKIT_TINY the same folder's test-scale runs were reused as results (the results file said not tiny)
    monkeypatch.setenv("VITKIT_TINY", "0")
    capsys.readouterr()
    assert vitkit_here(*args) == 2
    assert "none-7x7-s0 was trained with VITKIT_TINY (a test-scale run), and this study runs without it" in \
        capsys.readouterr().err


def test_a_damaged_or_edited_run_record_in_a_study_folder_is_one_line_naming_its_file(tmp_path):
    """An edited summary.json was believed (99%) and then ended in the study's TypeError; a damaged fewshot.json
    said only "Expecting value: line 2 column 1", and one of {} dropped the run's few-shot columns in silence."""
    from vitkit.studies.base import fewshot_scores, run_name

    study = get_study("compute")
    options = Options(seeds=(0,), smoke=True)
    arm = study.arms(options)[0]
    run = tmp_path / run_name(arm, 0)
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"test_top1": 0.99}))
    with pytest.raises(ValueError, match=r"summary.json \(the summary of a finished run\) has no run_dir, model, "
                                         r"params, steps, train_images, precision: not what vitkit train writes"):
        train_run(arm, 0, options, study, tmp_path)
    for cached in ("[", "{}", '{"fewshot_5": 0.5, "fewshot_25": "high"}'):
        (run / "fewshot.json").write_text(cached)
        with pytest.raises(ValueError, match=re.escape(str(run / "fewshot.json"))):
            fewshot_scores(run, options)
    (run / "fewshot.json").write_text('{"fewshot_5": 0.5, "fewshot_25": 0.75}')
    assert fewshot_scores(run, options) == {"fewshot_5": 0.5, "fewshot_25": 0.75}


@real
@pytest.mark.slow
def test_the_self_supervision_study_reuses_a_pre_training_and_its_scores_only_as_asked(tmp_path, tiny, capsys,
                                                                                        monkeypatch):
    """A --smoke pre-training (0.2 epochs) was reused by the full study and reported as a full result; an edited
    fewshot-encoder.json (5.0, "500%") went into the table, one of Fashion-MNIST stood in for a --dataset folder's;
    and --steps left the pre-training at its recipe's epochs. The run is checked against its own config.json,
    the scores against the settings they were made with (scored again where another)."""
    from vitkit.studies import selfsup
    from vitkit.studies.selfsup import REUSED_BY, encoder_fewshot, pretrain_run

    args = ["study", "self-supervision", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"), "--threads",
            "1"]
    assert cli([*args, "--smoke"]) == 0
    cached = tmp_path / "w" / "pretrain-mae" / "fewshot-encoder.json"
    held = json.loads(cached.read_text())
    assert held["settings"]["dataset"] == "fashion-mnist" and set(held["scores"]) == {"1", "5", "10", "25"}
    cached.write_text(json.dumps({**held, "scores": {**held["scores"], "5": 5.0}}))  # edited: scored again
    capsys.readouterr()
    assert cli([*args, "--smoke"]) == 0
    assert json.loads(cached.read_text()) == held
    with monkeypatch.context() as m:  # the full study pre-trains (and scores) SimMIM and MPP before MAE: half the
        m.setattr(selfsup, "OBJECTIVES", ("mae",))  # test's time, and nothing the reuse of MAE's run depends on
        assert cli([*args, "--seeds", "0"]) == 2  # the full study: another pre-training
    assert re.search(r"pretrain-mae was pre-trained with other settings \(epochs: 0\.2 then, the recipe's now\)",
                     capsys.readouterr().err)
    options = Options(seeds=(0,), smoke=True, dataset="folder", data_dir=str(tmp_path))
    assert encoder_fewshot(tmp_path / "w" / "pretrain-mae", options) == {}  # as the runs' rows for image files
    with pytest.raises(ValueError, match=r"dataset: 'fashion-mnist' then, 'folder' now"):
        pretrain_run("mae", tmp_path / "w", 1, 0.2, {"dataset": "folder", "data_dir": str(tmp_path)})
    # a run of a version before the study kept what it asked: read by its own config.json, where fitting to a
    # small dataset raised the epochs (reused) and a --smoke run's are fewer than the recipe's (refused)
    (tmp_path / "w" / "configs" / "pretrain-mae.json").unlink()
    config = tmp_path / "w" / "pretrain-mae" / "config.json"
    saved = json.loads(config.read_text())
    config.write_text(json.dumps({**saved, "epochs": 20.0}))
    assert pretrain_run("mae", tmp_path / "w", 1)["steps"] > 0
    config.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"epochs: 0\.2 then, the recipe's now"):
        pretrain_run("mae", tmp_path / "w", 1)
    assert set(REUSED_BY) == {"epochs", "max_steps", "dataset", "data_dir"}


def test_a_study_on_image_files_leaves_its_arms_padding_out(tmp_path, monkeypatch):
    """The self-supervision arms' crop_pad 2 (in-memory images' padding) was written into the runs' configs for a
    --dataset folder, which refused it as the run's choice, after the study had pre-trained for half an hour."""
    from vitkit.studies import base

    monkeypatch.setattr(base, "run_training", lambda *a, **k: {})
    study = get_study("self-supervision")
    for dataset, padded in (("folder", False), ("fashion-mnist", True)):
        options = Options(seeds=(0,), smoke=True, dataset=dataset, data_dir=str(tmp_path))
        arm = study.arms(options)[0]
        assert arm.train["crop_pad"] == 2
        train_run(arm, 0, options, study, tmp_path / dataset)
        written = json.loads((tmp_path / dataset / "configs" / f"{base.run_name(arm, 0)}.json").read_text())
        assert ("crop_pad" in written) == padded


def test_attention_distance_growth_needs_more_than_noise():
    """Two training steps moved the mean distance 14.2 -> 14.2 px (uniform 14.4) and the study said "attention
    distance grows with depth: reproduced"; a change within 5% of the uniform distance is none now."""
    study = get_study("attention-distance")

    def said(first, last):
        models = {"a": {"label": "ViT", "family": "vit", "uniform_px": 14.4,
                        "distance_px": [[first - 0.1, first + 0.1], [last - 0.1, last + 0.1]]}}
        return next(v for v in study.verdicts({"models": models}) if "grows with depth" in v["claim"])["verdict"]

    assert said(14.15, 14.2) == INCONCLUSIVE
    assert said(8.0, 13.0) == REPRODUCED
    assert said(13.0, 8.0) == NOT_REPRODUCED


def test_a_run_another_study_process_writes_is_never_removed(tmp_path):
    """The same study started twice at once: the second removed the first's run folder (it had no checkpoint
    yet, so it looked abandoned) while it trained, and the first died ("No such file ... metrics.jsonl")."""
    from vitkit.runlock import RunLock, RunLocked

    study = get_study("position-embeddings")
    options = Options(seeds=(0,), smoke=True, threads=1)
    arm = study.arms(options)[0]
    run = tmp_path / f"{arm.key}-s0"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    lock = RunLock(run).acquire()  # as the other process's run holds it
    try:
        with pytest.raises(RunLocked, match=r"is being written by process .*another process\? Wait for it"):
            train_run(arm, 0, options, study, tmp_path)
        assert (run / "metrics.jsonl").is_file()
    finally:
        lock.release()


def test_a_run_another_study_process_finished_meanwhile_is_kept_and_said_in_the_studys_words(tmp_path, monkeypatch):
    """The same study twice at once: the first copy finished a run between the second's look and its training. The
    second said train's "pass --resume ... or another --name" (a study has neither), and its clean-up of a run it
    took for abandoned could have removed the finished one."""
    from vitkit.studies import base

    study = get_study("position-embeddings")
    options = Options(seeds=(0,), smoke=True, threads=1)
    arm = study.arms(options)[0]
    run = tmp_path / f"{arm.key}-s0"
    run.mkdir()
    (run / "summary.json").write_text("{}")  # finished by the other copy, after this one looked
    with pytest.raises(FileExistsError, match=r"was started by another process meanwhile: is this study running in "
                                              r"another process\? Run it again once that one ends"):
        base.discard_unstarted(run)
    assert (run / "summary.json").is_file()
    (run / "summary.json").unlink()  # made after the clean-up: train refuses the taken name, in the study's words
    real = base.discard_unstarted

    def then_finished(r):  # the other copy makes and finishes the run right after this one's clean-up
        real(r)
        r.mkdir()
        (r / "summary.json").write_text("{}")

    monkeypatch.setattr(base, "discard_unstarted", then_finished)
    with pytest.raises(ValueError, match=r"failed: .* was started by another process meanwhile") as got:
        train_run(arm, 0, options, study, tmp_path)
    assert "--resume" not in str(got.value) and (run / "summary.json").is_file()
    monkeypatch.undo()
    shutil.rmtree(run)
    run.write_text("junk")  # a file where the run's folder goes: named, not a bare "Not a directory"
    with pytest.raises(ValueError, match=r"-s0 is a file where the study keeps that run's folder: move or remove it"):
        train_run(arm, 0, options, study, tmp_path)


def test_a_run_to_resume_that_another_process_writes_is_said_in_the_studys_words(tmp_path):
    """An interrupted run the study would resume, locked by another process: the study says what a study does
    (wait, or another --work), not the run's "--resume it then", which the study itself does."""
    from vitkit.runlock import RunLock
    from vitkit.studies.base import run_training
    from vitkit.train import resolve_config

    run = tmp_path / "arm-s0"
    (run / "checkpoints").mkdir(parents=True)
    cfg = resolve_config("fmnist", max_steps=2, val_size=100, test_size=100, threads=1, tensorboard=False)
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    (run / "checkpoints" / "step_00000001.pt").write_bytes(b"not reached")
    lock = RunLock(run).acquire()
    try:
        with pytest.raises(ValueError, match=r"resuming arm-s0 failed: .*arm-s0 is being written by process .*"
                                             r"is this study running in another process\?") as got:
            run_training("resuming arm-s0", resume=str(run), threads=1)
        assert "--resume" not in str(got.value)
    finally:
        lock.release()
    assert (run / ".lock").read_text() == ""  # released: it names no writer


def test_bad_arguments_are_one_line_each(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    cases = [(["study", "imagenet-scaling"], "unknown study 'imagenet-scaling'; the studies: position-embeddings"),
             (["study", "position-embeddings", "--seeds", "-1"], "--seeds must be >= 0"),
             (["study", "position-embeddings", "--seeds", "0", "0"], "--seeds are given twice"),
             (["study", "position-embeddings", "--steps", "0"], "--steps must be >= 1"),
             (["study", "position-embeddings", "--threads", "0"], "--threads must be >= 1"),
             (["study", "position-embeddings", "--out", str(tmp_path / "file")], "file"),
             # --work named as itself (it was said as --out)
             (["study", "position-embeddings", "--work", str(tmp_path / "file")], "--work"),
             (["study", "attention-distance", "--out", str(tmp_path / "torn")], "torn/compute.json is not a study's"),
             (["study", "fewshot-proxy", "--out", str(tmp_path / "torn")], "torn/compute.json is not a study's"),
             # met by the first run, after the study's folder and that run's config were written
             (["study", "compute", "--dataset", "nope", "--work", str(tmp_path / "w1")], "unknown dataset 'nope'"),
             (["study", "registers", "--dataset", "folder", "--work", str(tmp_path / "w2")],
              "--dataset folder needs --data-dir: a folder with train/ and test/ (or val/) subfolders"),
             (["study", "registers", "--dataset", "folder", "--data-dir", str(tmp_path / "nowhere"), "--work",
               str(tmp_path / "w3")], f"data folder not found: {tmp_path / 'nowhere'}")]
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "compute.json").write_text('{"runs": {')  # a results file cut short
    for args, message in cases:
        assert cli(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0] and err[0].startswith("vitkit study: error: "), (args, err)
    assert not any((tmp_path / w).exists() for w in ("w1", "w2", "w3"))
    assert cli(["study", "list"]) == 0
    assert "position-embeddings" in capsys.readouterr().out
    assert cli(["study", "list", "--json"]) == 0  # (it printed the table: json.load failed on it)
    listed = json.loads(capsys.readouterr().out)
    assert listed[0] == {"name": "position-embeddings", "title": get_study("position-embeddings").title}
    assert [s["name"] for s in listed] == list_studies()
    for flag in ("--work", "--out"):  # an empty one was the current folder, which the study filled
        with pytest.raises(SystemExit) as stop:
            cli(["study", "position-embeddings", flag, ""])
        assert stop.value.code == 2 and f"argument {flag}: an empty value" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ docs/paper.md


def _numbers(value, found: set) -> None:
    """Every number in a results file, as it would be quoted (x, and 100x for fractions), and
    every number written inside its text (tables, verdicts)."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        for v in (value, 100 * value):
            for digits in (0, 1, 2):
                found.add(f"{round(v, digits):.{digits}f}")
    elif isinstance(value, str):
        found.update(re.findall(r"\d+(?:\.\d+)?", value.replace(",", "")))
    elif isinstance(value, dict):
        for v in value.values():
            _numbers(v, found)
    elif isinstance(value, list):
        for v in value:
            _numbers(v, found)


def test_every_number_in_paper_md_is_in_a_results_file():
    paper = (ROOT / "docs" / "paper.md").read_text()
    files = sorted((ROOT / "docs" / "studies").glob("*.json"))
    quoted = {m for m in re.findall(r"`?[\w./-]+\.json`?", paper)}
    assert files, "docs/studies holds the studies' results"
    found: set = set()
    for path in files + [ROOT / "benchmarks" / "results" / q.strip("`") for q in quoted
                         if (ROOT / "benchmarks" / "results" / q.strip("`")).is_file()]:
        _numbers(json.loads(path.read_text()), found)
    prose = re.sub(r"```.*?```", "", paper, flags=re.S)  # commands are not results
    prose = re.sub(r"`[^`]*`", "", prose)  # nor are names in code
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # nor link targets
    missing = []
    for number in re.findall(r"(?<![\w/.-])\d+\.\d+(?![\w/])", prose.replace(",", "")):
        if number not in found:
            missing.append(number)
    assert missing == [], f"numbers in docs/paper.md that no results file holds: {missing}"


def test_paper_md_is_what_the_results_give():
    """docs/paper.md is written by scripts/paper_md.py from docs/studies/*.json, never by hand."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import paper_md
    finally:
        sys.path.pop(0)
    assert (ROOT / "docs" / "paper.md").read_text() == paper_md.page(), "run python scripts/paper_md.py"


def test_a_shortened_arm_warms_up_for_a_tenth_of_it():
    """--smoke's 20 steps and a short --steps kept the arms' 200-step warm-up: the learning rate never reached its
    peak. A warm-up in epochs (DeiT's) is the recipe's own measure and stays."""
    from vitkit.studies.base import shorten_warmup

    cases = (({"max_steps": 20}, "fmnist", 2), ({"max_steps": 20, "warmup_steps": 30}, "fmnist", 2),
             ({"max_steps": 1000, "warmup_steps": 30}, "fmnist", 30), ({"max_steps": 5}, "fmnist", 1),
             ({"max_steps": 20}, "deit", None))
    for config, recipe, want in cases:
        shorten_warmup(config, recipe)
        assert config.get("warmup_steps") == want, (config, recipe)


def test_another_studys_results_are_found_in_the_work_folder_given(tmp_path):
    """`study compute --work W` then `study attention-distance --work W` looked for compute.json in
    runs/studies/compute alone ("not found"), and only --out pointed it elsewhere."""
    from vitkit.studies.base import Options
    from vitkit.studies.fewshot_proxy import source_path

    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "compute.json").write_text("{}")
    assert source_path("compute", Options(work=tmp_path / "w", smoke=True)) == tmp_path / "w" / "compute.json"
    assert source_path("compute", Options(work=tmp_path, smoke=True)) == Path("runs/studies/compute-smoke/compute.json")
