"""What every study shares: its arms and seeds as training runs, resumable; the numbers
over seeds; verdicts by one rule; the results file, table and figure.

A study (one file each in this package) names the paper's claim, the setting used here, its
arms (each a set of ``TrainConfig`` fields) and how its numbers decide the claim. Running it:

- every (arm, seed) is a run of :func:`vitkit.train.train` (what ``vitkit train`` calls, with its
  recipe and a config file of the arm's fields) with its own run folder under ``work``: a
  finished run (its ``summary.json``) is reused, an interrupted one resumed from its last
  checkpoint (bitwise what an uninterrupted run gives), so a study killed at any point loses at
  most the steps since a checkpoint; the study reads the summary the call returns;
- a study that asks for it scores each run's frozen features few-shot
  (:func:`vitkit.evaluate.fewshot_on_dataset`, cached beside the run as ``fewshot.json``);
- after every run the results file is rewritten (atomically): ``OUT/<name>.json`` with the
  machine, the settings, every run's summary; at the end its verdicts, the Markdown table
  (``OUT/<name>.md``) and the figure (``OUT/<name>.png``).

The rule for two arms (mean ± sample std over n seeds): they *differ* when their means are
further apart than twice the standard error of the difference, 2 sqrt(s_a^2/n_a + s_b^2/n_b);
*are level* when they do not and the gap is under the study's tolerance. A verdict is
*reproduced*, *not reproduced at this scale* or *inconclusive*, each with the numbers behind it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .. import tiny
from ..files import files_together, write_json, write_text

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced at this scale", "inconclusive"
#: few-shot evaluation of a run's frozen features: shots per class, seeds, training pool
FEWSHOT_SHOTS, FEWSHOT_SEEDS, FEWSHOT_POOL = (5, 25), 3, 10_000
#: --smoke's pool: ~100 images a class, enough for 25 shots and the 50 held out
SMOKE_FEWSHOT_POOL = 1_000


@dataclass(frozen=True)
class Arm:
    """One configuration of a study: ``key`` names its runs (``KEY-sSEED``), ``train`` holds the
    ``TrainConfig`` fields it sets; ``facts`` what the analysis needs to know of it."""

    key: str
    label: str
    train: Dict[str, Any]
    facts: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Options:
    """How a study runs (the command line's flags)."""

    seeds: Sequence[int] = (0, 1, 2)
    work: Optional[Path] = None
    out: Optional[Path] = None
    smoke: bool = False
    steps: Optional[int] = None
    threads: Optional[int] = None
    dataset: Optional[str] = None
    data_dir: Optional[str] = None
    progress: bool = True


class Study:
    """A paper claim, the arms that test it and the rule that decides it (subclasses fill these in)."""

    name: str = ""
    title: str = ""
    #: the paper's claim, in its words where it has them
    claim: str = ""
    #: the setting used here, in one paragraph
    setting: str = ""
    #: the paper's own numbers the claim rests on (quoted beside ours), with their source
    paper: Dict[str, Any] = {}
    #: what a reader should know to read the result (how the setting differs from the paper's)
    notes: str = ""
    #: score each run's frozen features few-shot
    fewshot: bool = False
    #: TrainConfig fields of a --smoke run (over each arm's)
    smoke_train: Dict[str, Any] = {"max_steps": 20, "val_every": 20, "checkpoint_every": 20}

    def arms(self, options: Options) -> List[Arm]:
        raise NotImplementedError

    def verdicts(self, results: Dict[str, Any]) -> List[Dict[str, Any]]:
        """[{"claim", "verdict", "why"}] from the results (its runs' scores)."""
        raise NotImplementedError

    def table(self, results: Dict[str, Any]) -> str:
        raise NotImplementedError

    def figure(self, results: Dict[str, Any], path: Path) -> Optional[Path]:
        return None

    def prepare(self, options: Options, work: Path, say) -> Dict[str, Any]:
        """Work the arms build on (pre-training), done before them; what it returns is kept in the
        results as ``prepared`` (default: nothing)."""
        return {}

    def extra(self, results: Dict[str, Any], options: Options) -> None:
        """Measurements beyond the runs' own scores, added to ``results`` (default: none)."""


# ------------------------------------------------------------------------------------ numbers


@dataclass(frozen=True)
class Spread:
    """A score over seeds."""

    values: Tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else float("nan")

    @property
    def std(self) -> float:
        return statistics.stdev(self.values) if self.n > 1 else float("nan")

    def text(self, scale: float = 100.0, digits: int = 1) -> str:
        if not self.values:
            return "–"
        mean = f"{scale * self.mean:.{digits}f}"
        return mean + (f" ± {scale * self.std:.{digits}f}" if self.n > 1 else "")


def spread(results: Dict[str, Any], arm: str, metric: str = "test_top1") -> Spread:
    """The ``metric`` of every seed of ``arm`` (``fewshot_K`` for K-shot accuracy)."""
    return Spread(tuple(r[metric] for r in results["runs"].values() if r["arm"] == arm and metric in r))


def differ(a: Spread, b: Spread) -> bool:
    """Means further apart than twice the standard error of their difference (needs 2+ seeds each)."""
    if a.n < 2 or b.n < 2:
        return False
    return abs(a.mean - b.mean) > 2 * math.sqrt(a.std ** 2 / a.n + b.std ** 2 / b.n)


def verdict(claim: str, outcome: str, why: str) -> Dict[str, str]:
    return {"claim": claim, "verdict": outcome, "why": why}


def too_few_seeds(results: Dict[str, Any]) -> bool:
    return len(results["settings"]["seeds"]) < 2


# ------------------------------------------------------------------------------------ running


def discard_unstarted(run: Path) -> None:
    """Remove a run folder that stopped before its first checkpoint (nothing to keep), unless a process writes it
    now: the same study run twice at once deleted the first one's live run (which then died) and trained it again."""
    from ..runlock import holder

    if not run.exists():
        return
    if not run.is_dir():  # (a bare "Not a directory")
        raise ValueError(f"{run} is a file where the study keeps that run's folder: move or remove it")
    if who := holder(run):
        raise study_locked(run, who)
    if (run / "summary.json").is_file() or any((run / "checkpoints").glob("*.pt")):  # run meanwhile by another
        raise study_raced(run)  # process (it was not when this one looked): kept, never removed
    shutil.rmtree(run)


def study_locked(run: Path, who: str) -> OSError:
    """The study's own words for a run another process writes (a run's would say --resume, which a study does)."""
    from ..runlock import RunLocked

    return RunLocked(f"{run} is being written by {who}: is this study running in another process? Wait for it "
                     f"to finish (the study then reuses its runs), or give this one another --work", run, who)


def study_raced(run: Path) -> FileExistsError:
    """The study's words for a run another process started or finished while this one was about to train it (a
    run's own would say --resume or --name, which a study has neither of)."""
    return FileExistsError(f"{run} was started by another process meanwhile: is this study running in another "
                           f"process? Run it again once that one ends (it then reuses the run), or give this one "
                           f"another --work")


def run_name(arm: Arm, seed: int) -> str:
    return f"{arm.key}-s{seed}"


def calling(what: str, call: Callable[[], Any]) -> Any:
    """``call()``'s result; a failure is a ValueError naming ``what`` with the error's own line
    (an interruption stays one: Ctrl-C and SIGTERM end the study as they end a run)."""
    from ..errors import describe_error

    try:
        with warnings.catch_warnings():  # a run's notes are the run's, not the study's lines
            warnings.simplefilter("ignore")
            return call()
    except Exception as e:
        raise ValueError(f"{what} failed: {describe_error(e)}") from e


def run_training(what: str, recipe: Optional[str] = None, file: Optional[str] = None, resume: Optional[str] = None,
                 threads: Optional[int] = None, **fields: Any) -> Dict[str, Any]:
    """The summary of a training (or pre-training, with ``objective``) run, as ``vitkit train``
    (``pretrain``) makes it from a recipe, a config file and fields (``resume``: the run folder
    to continue, as it saved its config; only ``threads`` may change), without a progress line."""
    from ..runlock import RunLocked
    from ..train import resolve_config, train

    def run() -> Dict[str, Any]:
        cfg = resolve_config(recipe, file, progress=False, **({"threads": threads} if threads else {}), **fields)
        try:
            return train(cfg, resume=resume, log=lambda line: None, asked=["progress"] + ["threads"] * bool(threads))
        except RunLocked as e:
            raise study_locked(e.folder or Path(resume or "."), e.writer) from None
        except FileExistsError:  # a new run's folder another process made meanwhile (train's words name --resume)
            if resume is not None or cfg.name is None:
                raise
            raise study_raced(Path(cfg.runs_dir) / cfg.name) from None

    return json.loads(json.dumps(calling(what, run)))  # as its summary.json holds it (string keys, lists)


def fewshot_of(weights: Path, shots: Sequence[int], seeds: int, options: "Options") -> Dict[int, Any]:
    """{shots: FewShotResult} of the frozen encoder ``weights`` hold, on the study's dataset."""
    from ..evaluate import fewshot_on_dataset
    from ..weights import from_pretrained

    def run() -> Dict[int, Any]:
        model = from_pretrained(str(weights), encoder_only=True)  # a pre-training model's ViT
        return fewshot_on_dataset(model, options.dataset or "fashion-mnist", shots, seeds, fewshot_pool(options),
                                  data_dir=options.data_dir, progress=False).results

    return calling(f"few-shot evaluation of {weights.name}", run)


#: what every finished run's summary.json holds, and a study reads
SUMMARY_FIELDS = ("run_dir", "model", "params", "steps", "train_images", "precision")

#: request fields that do not change what a run computes: a finished run is reused across them
_NOT_DECIDING = ("threads", "runs_dir", "tensorboard", "name")


def read_study_json(path: Path, what: str) -> Dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} ({what}) cannot be read ({type(e).__name__}: {e}); remove the run's folder "
                         f"to train it again") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} ({what}) is not a JSON object; remove the run's folder to train it again")
    return data


def _check_reuse(run: Path, asked: Dict[str, Any], saved: Path) -> None:
    """A run of an earlier invocation is reused (or resumed) only where it was asked for with the
    same settings: another --dataset, --steps or --smoke is another experiment."""
    if not saved.is_file():
        return
    before = read_study_json(saved, "the settings the study gave this run")
    keys = sorted((set(before) | set(asked)) - set(_NOT_DECIDING))
    changed = [k for k in keys if before.get(k) != asked.get(k)]
    if changed:
        said = "; ".join(f"{k}: {before.get(k)!r} then, {asked.get(k)!r} now" for k in changed[:3])
        raise ValueError(f"{run} was trained with other settings ({said}): give the study another --work "
                         f"folder, or remove that one to train it again")


def shorten_warmup(config: Dict[str, Any], recipe: str) -> None:
    """A run cut to --steps or --smoke's 20 warms up for a tenth of it, as training fits a run to small data: the
    arm's warm-up (200 steps) outlasted it, and the learning rate never reached its peak."""
    from ..train.config import TrainConfig
    from ..train.recipes import RECIPES

    warmup = config.get("warmup_steps", RECIPES[recipe].get("warmup_steps", TrainConfig.warmup_steps))
    if config.get("warmup_epochs", RECIPES[recipe].get("warmup_epochs")) is None and warmup >= config["max_steps"]:
        config["warmup_steps"] = max(1, config["max_steps"] // 10)


def train_run(arm: Arm, seed: int, options: Options, study: Study, work: Path) -> Dict[str, Any]:
    """The summary of the arm's run for ``seed``: reused when finished, resumed when interrupted,
    each only when the study asks for the same settings as when it was started."""
    name = run_name(arm, seed)
    run = work / name
    config = {**arm.train, "seed": seed, "runs_dir": str(work), "name": name, "tensorboard": False}
    if options.smoke:
        config.update(study.smoke_train)
    if options.steps:
        config.update(max_steps=options.steps, val_every=options.steps, checkpoint_every=options.steps)
    if options.dataset:
        config["dataset"] = options.dataset
        from ..train.config import in_memory_images

        if not in_memory_images(options.dataset):  # an arm's padding is of in-memory images: for image files it
            config.pop("crop_pad", None)  # was refused as the run's choice, after the study's pre-training
    if options.data_dir:
        config["data_dir"] = options.data_dir
    if options.threads:
        config["threads"] = options.threads
    # the recipe the study was measured with (fmnist-adamw unless it names one), on every machine (a run
    # that names none gets the one for the machine's precision); a config file cannot choose a recipe, a flag can
    recipe = config.pop("recipe", "fmnist-adamw")
    if options.smoke or options.steps:
        shorten_warmup(config, recipe)
    configs = work / "configs"
    finished = (run / "summary.json").is_file()
    started = finished or ((run / "checkpoints").is_dir() and any((run / "checkpoints").glob("step_*.pt")))
    if started:
        _check_reuse(run, config, configs / f"{name}.json")
    if finished:
        summary = read_study_json(run / "summary.json", "the summary of a finished run")
        lacking = [k for k in SUMMARY_FIELDS if not isinstance(summary.get(k), (int, float, str))]
        if lacking:  # an edited or foreign summary: read on, it ended in a TypeError of the study's arithmetic
            raise ValueError(f"{run / 'summary.json'} (the summary of a finished run) has no {', '.join(lacking)}: "
                             f"not what vitkit train writes; remove the run's folder to train it again")
        if bool(summary.get("tiny")) != tiny.enabled():  # a test-scale run is no result, and the reverse
            raise ValueError(f"{run} was trained {'with' if summary.get('tiny') else 'without'} VITKIT_TINY (a "
                             f"test-scale run), and this study runs {'with' if tiny.enabled() else 'without'} it: "
                             f"give the study another --work folder, or remove that one to train it again")
        return summary
    if started:
        return run_training(f"resuming {name}", resume=str(run), threads=options.threads)
    discard_unstarted(run)
    configs.mkdir(parents=True, exist_ok=True)
    write_json(configs / f"{name}.json", config)
    return run_training(f"run {name}", recipe, str(configs / f"{name}.json"))


def data_fields(options: Options) -> Dict[str, Any]:
    """The ``dataset`` / ``data_dir`` fields a study passes on to every run it starts."""
    return {k: v for k, v in (("dataset", options.dataset), ("data_dir", options.data_dir)) if v}


def fewshot_pool(options: Options) -> int:
    """Training images few-shot shots are drawn from: the full pool, or --smoke's small one."""
    return SMOKE_FEWSHOT_POOL if options.smoke else FEWSHOT_POOL


def scores_fewshot(options: Options) -> bool:
    """Whether a study scores few-shot on its dataset: not image folders and shards, which ``vitkit fewshot``
    does not read (the runs' rows and the self-supervision study's frozen encoders alike)."""
    from ..data.datasets import FILE_DATASETS, canonical

    return not (options.dataset and canonical(options.dataset) in FILE_DATASETS)


def fewshot_scores(run: Path, options: Options) -> Dict[str, float]:
    """{"fewshot_K": accuracy} of a run's frozen features, cached as ``RUN/fewshot.json`` (empty where the study
    scores no few-shot: :func:`scores_fewshot`)."""
    if not scores_fewshot(options):
        return {}
    cached = run / "fewshot.json"
    if cached.is_file():
        scores = read_study_json(cached, "the run's cached few-shot scores")
        wanted = {f"fewshot_{k}" for k in FEWSHOT_SHOTS}
        if set(scores) == wanted and all(isinstance(v, (int, float)) and 0 <= v <= 1 for v in scores.values()):
            return scores
        raise ValueError(f"{cached} (the run's cached few-shot scores) holds {sorted(scores)[:4]}, not "
                         f"{', '.join(sorted(wanted))} as accuracies in [0, 1]: remove the file to score the run again")
    results = fewshot_of(run, FEWSHOT_SHOTS, FEWSHOT_SEEDS, options)
    scores = {f"fewshot_{k}": r.mean for k, r in results.items()}
    write_json(cached, scores)
    return scores


def machine() -> Dict[str, Any]:
    import torch

    from .. import __version__
    from ..machine import cpu_info

    cpu = cpu_info().get("model name", "")
    return {"platform": platform.platform(), "cpu_model": cpu or platform.processor(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "vitkit": __version__}


def default_folders(study: Study, options: Options) -> Tuple[Path, Path]:
    """(runs folder, results folder): ``runs/studies/NAME`` (a smoke check: ``NAME-smoke``, never the
    real one's runs) unless given."""
    work = options.work or Path("runs") / "studies" / (study.name + ("-smoke" if options.smoke else ""))
    return Path(work), Path(options.out) if options.out else Path(work)


def run_study(study: Study, options: Options, say=print) -> Dict[str, Any]:
    """Run (or finish) every arm and seed, then decide; returns the results (also written to OUT)."""
    work, out = default_folders(study, options)
    arms = study.arms(options)
    results: Dict[str, Any] = {
        "study": study.name, "title": study.title, "claim": study.claim, "setting": study.setting,
        "paper": study.paper,
        "date": datetime.date.today().isoformat(), "machine": machine(),
        "settings": {"seeds": list(options.seeds), "smoke": options.smoke, "steps": options.steps,
                     "dataset": options.dataset or "fashion-mnist", "data_dir": options.data_dir,
                     "tiny": tiny.enabled()},
        "arms": {a.key: {"label": a.label, "train": a.train, **a.facts} for a in arms}, "runs": {}}
    path = out / f"{study.name}.json"
    # runs are recorded as they finish beside the results, never over them: a study stopped (or
    # failing) half-way leaves the last complete results as they were
    progress = out / f"{study.name}.partial.json"
    results["prepared"] = study.prepare(options, work, say)
    jobs = [(arm, seed) for seed in options.seeds for arm in arms]
    for i, (arm, seed) in enumerate(jobs, 1):
        name = run_name(arm, seed)
        t0 = time.perf_counter()
        summary = train_run(arm, seed, options, study, work)
        row = {"arm": arm.key, "seed": seed, "run_dir": str(work / name), **{k: summary.get(k) for k in (
            "test_top1", "test_top1_ema", "val_top1", "params", "train_images", "steps", "epochs", "seconds",
            "train_img_s", "precision")}}
        if study.fewshot:
            row.update(fewshot_scores(work / name, options))
        results["runs"][name] = row
        write_json(progress, results)
        shots = "".join(f", {k.split('_')[1]}-shot {100 * v:.1f}%" for k, v in row.items() if k.startswith("fewshot_"))
        say(f"[{i}/{len(jobs)}] {name}: test top-1 {100 * row['test_top1']:.2f}%{shots} "
            f"({time.perf_counter() - t0:.0f} s)")
    study.extra(results, options)
    results["verdicts"] = study.verdicts(results)
    results["table"] = study.table(results)
    with files_together(out) as stage:  # all three or none: a full disk rewrote the numbers beside an old figure
        write_json(stage / path.name, results)
        write_text(stage / f"{study.name}.md", results["table"] + "\n")
        figure = study.figure(results, stage / f"{study.name}.png")
    progress.unlink(missing_ok=True)
    if figure is not None:
        results["figure"] = str(out / Path(figure).name)
    return results


# ------------------------------------------------------------------------------------ the command line


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", type=int, nargs="+", help="seeds of every arm (default 0 1 2; --smoke: 0)")
    p.add_argument("--smoke", action="store_true", help="a few steps per run, one seed: checks the study end to "
                                                        "end in minutes (its runs go to NAME-smoke)")
    p.add_argument("--steps", type=int, help="optimiser steps of every run instead of the study's budget")
    # text, not Path: the parser refuses an empty value (Path("") was the current folder, which a study filled)
    p.add_argument("--work", help="the runs' folder (default runs/studies/NAME)")
    p.add_argument("--out", help="where NAME.json, NAME.md and NAME.png go (default: the runs' folder)")
    p.add_argument("--threads", type=int, help="CPU threads per run (default: every core)")
    p.add_argument("--dataset", help="another dataset for every run (fashion-mnist, cifar10, folder, shards, "
                                     "hf:NAME_OR_DIR; default: the study's, Fashion-MNIST)")
    p.add_argument("--data-dir", help="where that dataset is")


def options_from(args: argparse.Namespace) -> Options:
    seeds = args.seeds if args.seeds is not None else ([0] if args.smoke else [0, 1, 2])
    problems = []
    if any(s < 0 for s in seeds):
        problems.append(f"--seeds must be >= 0, not {seeds}")
    if len(set(seeds)) != len(seeds):
        problems.append(f"--seeds are given twice: {seeds}")
    if args.steps is not None and args.steps < 1:
        problems.append(f"--steps must be >= 1, not {args.steps}")
    if args.threads is not None and args.threads < 1:
        problems.append(f"--threads must be >= 1, not {args.threads}")
    if problems:
        raise ValueError("; ".join(problems))
    return Options(seeds=tuple(seeds), work=args.work and Path(args.work), out=args.out and Path(args.out),
                   smoke=args.smoke, steps=args.steps,
                   threads=args.threads, dataset=args.dataset, data_dir=args.data_dir)


def summary_lines(results: Dict[str, Any]) -> Iterable[str]:
    yield results["table"]
    yield ""
    for v in results["verdicts"]:
        yield f"- {v['claim']}: **{v['verdict']}** ({v['why']})"


__all__ = ["REPRODUCED", "NOT_REPRODUCED", "INCONCLUSIVE", "Arm", "Options", "Study", "Spread", "spread",
           "differ", "verdict", "too_few_seeds", "run_study", "add_options", "options_from", "summary_lines"]
