"""The run folder's housekeeping: a new run's folder made, named and locked (a name left by a run
that stopped before saving anything is reused), and whether a run there has finished, whose
``--resume`` then shows its summary as it was written."""

from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Dict, Optional

from ..files import as_argument
from ..runlock import RunLock, holder
from .checkpoint import checkpoint_paths, checkpoint_step
from .resume import saved_field
from .state import Run


def new_run_dir(run: Run) -> Path:
    """The new run's folder, made and locked: ``--name``, or the model's name (after the objective
    for pre-training: ``mae-vit_fmnist-...``) and the time with a number added until the name is
    free (two runs started in the same second get two folders)."""
    cfg = run.cfg
    what = run.model_name if cfg.objective == "classify" else f"{cfg.objective}-{run.model_name}"
    base = (cfg.name or f"{what}-{time.strftime('%Y%m%d-%H%M%S')}").replace("/", "-")
    Path(cfg.runs_dir).mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = Path(cfg.runs_dir) / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            if cfg.name is None:
                continue  # taken: the next number
            if not path.is_dir():
                raise FileExistsError(f"run directory {path} is a file, not a folder: pass another --name") from None
        ran_here = (path / ".lock").is_file()  # a vitkit run's folder (its lock file stays): before it is taken
        run.lock = RunLock(path).acquire()  # an existing named folder may be another run's, just made
        if cfg.name and any(p.name != ".lock" for p in path.iterdir()):
            if not ran_here or not _abandoned(path):
                if not ran_here:  # a folder without vitkit's lock file is left as it was: the lock file made goes
                    run.lock.path.unlink(missing_ok=True)  # (left, it made someone's folder a run's the next time,
                run.lock.release()  # whose config.json was then removed as an abandoned run's)
                if not ran_here and not _holds_a_run(path):
                    raise FileExistsError(f"run directory {path} exists and is no vitkit run's folder (no .lock "
                                          f"file, no checkpoints): pass another --name")
                raise _taken(path)
            for leftover in ABANDONED_FILES:  # a run that stopped before saving anything: its name is free
                target = path / leftover
                shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
            run.log(f"reusing {path}: the run there stopped before its first checkpoint (nothing to resume)")
        return path
    raise FileExistsError(f"no free run directory named {base}-N in {cfg.runs_dir}")


def refuse_a_taken_name(runs_dir: str, name: Optional[str]) -> None:
    """A --name whose folder holds a run (a checkpoint or its summary) is refused before the data and the model are
    read, so that the refusal is the only line (an --init run said what it loaded first); new_run_dir decides the
    rest (a folder that is no run's, one a refused run left)."""
    path = Path(runs_dir) / name.replace("/", "-") if name else None
    if path is None or not path.is_dir():
        return
    if holder(path):  # a run writing there: RunLocked names it, as new_run_dir would
        RunLock(path).acquire().release()
    if _holds_a_run(path):
        raise _taken(path)


def _holds_a_run(path: Path) -> bool:
    """Whether a folder holds what a run leaves worth resuming or keeping: a checkpoint, or its summary."""
    return (path / "summary.json").is_file() or any((path / "checkpoints").glob("*.pt"))


def _taken(path: Path) -> FileExistsError:
    return FileExistsError(f"run directory {path} already exists; pass --resume {as_argument(path)} to continue it "
                           f"or another --name")


#: What a run writes before its first checkpoint: a folder holding only these (its lock free)
#: was left by a run that was refused or stopped with nothing to resume.
ABANDONED_FILES = ("config.json", "init_model.json", "metrics.jsonl", "tensorboard", "checkpoints")


def _abandoned(path: Path) -> bool:
    if any(p.name not in ABANDONED_FILES + (".lock",) for p in path.iterdir()):
        return False
    return not (path / "checkpoints").is_dir() or not any((path / "checkpoints").iterdir())


def is_finished(run_dir: Path) -> bool:
    """A run is complete when its summary.json (written last) stands and its newest checkpoint is
    the step the summary ends at; without that checkpoint (a kill before it, or a file removed),
    resuming goes on from the newest one there is. With no checkpoint at all (removed to save space
    after the run) a summary and a model that stand are a finished run: "no checkpoints to resume"
    said of it disagreed with the same run whose config.json was removed ("finished")."""
    summary, checkpoints = run_dir / "summary.json", checkpoint_paths(run_dir)
    if not summary.is_file():
        return False
    model = (run_dir / "model" / "config.json").is_file()
    try:
        steps = json.loads(summary.read_text()).get("steps")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:  # (said without a file: "Invalid
        # control character at: line 1 column 12")
        why = f"its summary.json cannot be read ({type(e).__name__}: {e})"
        return bool(checkpoints) and _resumed_anew(run_dir, why)
    if not checkpoints:
        return model and isinstance(steps, int)
    done = isinstance(steps, int) and checkpoint_step(checkpoints[-1]) >= steps
    if done and not model:  # (each verb sent the user to the other)
        return _resumed_anew(run_dir, "its model/ is gone")
    return done


def _resumed_anew(run_dir: Path, why: str) -> bool:
    """A finished run whose summary or model is damaged or gone: not finished, resumed from its last checkpoint
    (the last step's: only the scores are made again), which saves the model and writes the summary. Said."""
    warnings.warn(f"{run_dir}: {why}: the run is resumed from its last checkpoint, which writes its model and "
                  f"summary anew", stacklevel=3)
    return False


def finished_summary(run_dir: Path, log=print, tta: str = "none") -> Dict[str, Any]:
    """``--resume`` of a run that has finished: its summary as it was written, with nothing run
    again and nothing rewritten (re-scoring it would replace ``summary.json``'s timings); a
    test-time augmentation asked for says which command scores it. A summary written before it
    named its views (``test_tta``) gets the run's saved ones, so its TTA score is never labelled
    with the views asked for now."""
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["run_dir"] = str(run_dir.resolve())  # where it is now (a run moved since: not where it was written)
    init = f"--init {as_argument(run_dir)}"
    then = (f"to train longer, start a new run with {init}" if saved_field(str(run_dir), "objective")
            in (None, "classify") else f"vitkit train {init} fine-tunes its encoder on labels")
    log(f"{run_dir} finished at step {summary.get('steps', '?')}: nothing to resume (its summary.json, "
        f"unchanged; {then})")
    scored = saved_field(str(run_dir), "test_tta")
    if "test_top1_tta" in summary:
        summary.setdefault("test_tta", scored)
    if tta not in ("none", scored):  # its summary holds no score with these views
        log(f"its test score with {tta} TTA: vitkit eval --weights {as_argument(run_dir)} --tta {tta}")
    return summary


__all__ = ["ABANDONED_FILES", "finished_summary", "is_finished", "new_run_dir"]
