"""The training run as four named steps over one state: build, restore, loop, summarise.

``build`` opens the data and makes the model, its optimiser, precision and batch layout;
``restore`` continues from the last checkpoint or makes the run folder; ``loop`` trains;
``summarise`` scores, saves and writes ``summary.json``. They share a :class:`Run`
(:mod:`.state`); the optimiser is :mod:`.optim`'s, the metrics window :mod:`.throughput`'s and
the run folder's housekeeping :mod:`.run_folder`'s.

The data order is a function of (seed, epoch) and augmentation randomness of (seed, step),
so the position in the data is the step counter alone (what resuming needs). The loop body
never waits for the device: losses and accuracy accumulate there and the host reads them --
one sync and, under DDP, one all-reduce -- at the logging interval and before every
validation and checkpoint (nanoGPT's rule: host syncs only at the logging interval). A
non-finite loss therefore stops the run within one interval, naming its first step, and a
checkpoint is written only once every step before it is known to be finite.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, Optional, Tuple

import torch

from .. import tiny
from ..files import as_argument, remove_stale_temporaries, said_as_disk_full, write_json
from ..machine import first_process_alive, launcher_number
from ..models import get_model_config
from ..models.complexity import complexity
from ..parallel import add_in_order, choose
from ..runlock import RunLock
from ..selfsup import encoder_of
from ..signals import Terminated, expect_worker_deaths, stop_received, worker_stop
from ..utils import seed_for
from ..weights.load import shape_problems
from . import distributed, finetune
from .batches import Layout, MicroBatch
from .checkpoint import (
    NonFiniteState,
    checkpoint_paths,
    checkpoint_step,
    load_intact,
    save_checkpoint,
    set_aside_unreadable,
)
from .config import TrainConfig
from .data import RunData, load_split_tensors, open_data, to_tensors  # noqa: F401 (re-exported)
from .distill import InputSpec, load_teacher
from .ema import ModelEma
from .fit import cost_line, fit_to_data, refuse_an_undividable_batch
from .memory import check_batches_fit
from .optim import layer_decay_line, layer_of, make_optimizer  # noqa: F401 (layer_of: vitkit.train.loop's, where it was)
from .plot import plot_curves
from .precision import pick_precision, why_precision
from .progress import Progress
from .resume import RUNTIME_FIELDS, read_run_json, resumed_config, saved_values
from .run_folder import ABANDONED_FILES, finished_summary, is_finished, new_run_dir, refuse_a_taken_name  # noqa: F401
from .run_folder import new_run_dir as _new_run_dir  # noqa: F401 (vitkit.train.loop._new_run_dir, where it was)
from .schedule import lr_at
from .state import Run  # noqa: F401 (vitkit.train.loop.Run, where it was)
from .tasks import FRESH_PARTS, INIT_MODEL, autocast, task_for
from .throughput import NonFiniteLoss, Window, busy_cpu_note, train_throughput
from .tracking import MetricsLog

# ----------------------------------------------------------------------------- the four steps


def train(cfg: TrainConfig, resume: Optional[str] = None, log=print,
          asked: Optional[Iterable[str]] = None) -> Dict[str, Any]:
    """Run a training job; returns the summary (also written to ``summary.json``). With
    ``resume``, ``asked`` names the runtime fields of ``cfg`` to keep (see ``resumed_config``)."""
    if resume and is_finished(Path(resume)):
        return finished_summary(Path(resume), log, cfg.test_tta)
    cfg = _config_to_run(cfg, resume, asked)
    refuse_a_taken_name(cfg.runs_dir, None if resume else cfg.name)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dist_info = distributed.setup()
    run = None
    discard = finished = False
    try:
        with _said_as_an_edit(resume):
            run = build(cfg, dist_info, log, saved_init_model(resume) if resume and cfg.init else None)
        restore(run, resume)
        run.note(_starting(run))
        for line in run.fit_notes:  # none on resume: a resumed config records no chosen fields
            run.note(line)
        if cfg.layer_decay is not None and cfg.layer_decay != 1:
            run.note(layer_decay_line(run.model, cfg.layer_decay))
        if run.main and run.start < run.total:
            run.note(_cost(run))
        with run.parallel.single_threaded_ops() if run.parallel is not None else contextlib.nullcontext():
            loop(run)
            summary = summarise(run)
        finished = True
        return summary
    except (KeyboardInterrupt, RuntimeError) as e:  # Ctrl-C or SIGTERM, to this process or a data worker
        stop = e if isinstance(e, KeyboardInterrupt) else worker_stop(e) or stop_received()  # (see stop_received)
        if stop is None and distributed.peer_lost(dist_info, e):  # (said by gloo as an "unexpected" error)
            raise _peer_stopped(run) from None
        if stop is None:
            raise
        expect_worker_deaths()
        if _first_killed(run, stop):  # torchrun's SIGTERM came before the next all-reduce would have met the loss
            raise _peer_stopped(run) from None
        if run is not None and run.run_dir is not None and run.main:
            log(_interrupted(run))
        if stop is e:
            raise
        raise stop from None
    except Exception:  # a new run that failed before its first checkpoint has nothing to resume: its
        discard = bool(run is not None and run.main and not resume and run.run_dir is not None  # folder goes
                       and _last_checkpoint(run) is None)
        raise
    finally:
        if run is not None and run.parallel is not None:
            run.parallel.close()
        if discard:
            if run.metrics is not None:  # TensorBoard's writer thread must not write into a removed folder
                run.metrics.close()
            shutil.rmtree(run.run_dir, ignore_errors=True)
        if run is not None and run.lock is not None:
            run.lock.release()
        distributed.cleanup(dist_info, finished)


def _starting(run: Run) -> str:
    """The first line a run prints: what it trains, how long, and where it writes (so piped output
    says something before the first progress line)."""
    cfg = run.cfg
    what = "training" if cfg.objective == "classify" else f"{cfg.objective} pre-training of"
    params = sum(p.numel() for p in run.model.parameters())
    threads = torch.get_num_threads() if run.parallel is None else run.parallel.workers
    where = f"{cfg.dataset}" if run.dist.device.type != "cpu" else \
        f"{cfg.dataset} ({threads} CPU thread{'s' if threads != 1 else ''}, parallel over {run.parallel_how})"
    why = why_precision(cfg.precision, run.dist.device)
    stored = run.data.train.first_size() if run.data.kind == "folder" else run.data.img_size
    size = tuple(encoder_of(run.model).config.img_size)
    if stored and tuple(stored) != size:  # the images are resized to the model's input: say so
        first = ", the first" if run.data.kind == "folder" else ", whole" if run.data.kind == "memory" else ""
        where += (f"; its images ({stored[0]}x{stored[1]}{first}) resized to {size[0]}x{size[1]}, the model's "
                  f"size (--img-size chooses)")
    if run.data.kind == "folder" and encoder_of(run.model).config.in_chans == 1 and run.data.train.holds_colour():
        where += "; its colour images read as grey, the model's one channel (--model-args '{\"in_chans\": 3}' keeps " \
                 "the colour)"
    steps = (f"steps {run.start + 1:,}-{run.total:,} of {cfg.batch_size:,} images" if run.start < run.total else
             f"all {run.total:,} steps done before (the checkpoint is the last step's): only the scores are left")
    return (f"{what} {run.model_name} ({params:,} parameters, {run.precision}: {why}; recipe {cfg.recipe}) on "
            f"{where}: {steps}, writing {run.run_dir}")


def _last_checkpoint(run: Run) -> Optional[Path]:
    """The newest checkpoint in the run folder: a stop that lands after a checkpoint's rename into
    place and before ``run.last_ckpt`` is set leaves a whole file to resume from all the same."""
    on_disk = checkpoint_paths(run.run_dir)
    return on_disk[-1] if on_disk else run.last_ckpt


def _peer_stopped(run: Optional[Run]) -> distributed.PeerLost:
    """Another torchrun process's stop, with where the run keeps its checkpoint: said by each rank that knows it
    (the one that stopped may be rank 0, which would have said it)."""
    kept = f": {_interrupted(run)}" if run is not None and run.run_dir is not None else ""
    lost = distributed.PeerLost(f"another process of the job stopped, so this one did{kept}")
    lost.said_by_each = bool(kept)
    return lost


def _first_killed(run: Optional[Run], stop: BaseException) -> bool:
    """Whether this rank's stop is torchrun's SIGTERM after its machine's first process was killed outright (which
    said nothing), reaching here before the next all-reduce would have met the loss (a Ctrl-C, which reaches every
    rank, is no such stop: a rank that met it late may find the first one gone)."""
    return isinstance(stop, Terminated) and run is not None and not run.main and not first_process_alive()


def _interrupted(run: Run) -> str:
    """What an interrupted run keeps: its last checkpoint and the command that goes on from it."""
    verb = "train" if run.cfg.objective == "classify" else "pretrain"
    last = _last_checkpoint(run)
    if last is None:
        return f"interrupted before the first checkpoint of {run.run_dir}: nothing to resume (vitkit {verb} " \
               f"--name {as_argument(run.run_dir.name)} starts it again there)"
    return f"interrupted; {run.run_dir} keeps its checkpoint of step {checkpoint_step(last)}: " \
           f"vitkit {verb} --resume {as_argument(run.run_dir)} goes on from there"


def build(cfg: TrainConfig, dist_info: distributed.DistInfo, log=print,
          saved_init: Optional[Dict[str, Any]] = None) -> Run:
    """The data, the model (with its teacher), the optimiser, the precision and the batch layout;
    ``saved_init``: the architecture a resumed --init run saved (:func:`saved_init_model`)."""
    device, world, main = dist_info.device, dist_info.world, dist_info.main
    # file datasets decode to the model's channels (RGB for --init: the loader adapts the filters)
    in_chans = cfg.model_args.get("in_chans", 3 if cfg.init else get_model_config(cfg.model).in_chans)
    data = open_data(cfg, device, channels=1 if in_chans == 1 else 3)
    if cfg.objective == "classify" and len(data.classes) < 2:  # nothing to tell apart: every answer is right
        raise ValueError(f"{cfg.dataset} has {len(data.classes)} class{'' if len(data.classes) == 1 else 'es'} "
                         f"({', '.join(map(repr, data.classes)) or 'none'}): a classifier needs two or more "
                         f"(vitkit pretrain learns from images alone)")
    if data.skipped and main:
        log(f"skipped {len(data.skipped)} unreadable image files (first: {data.skipped[0][0]}: "
            f"{data.skipped[0][1]}); --strict-data makes them an error")
    cfg, fitted = fit_to_data(cfg, data.n_train, dist_info.world)  # a small dataset: a batch and a length that train
    task = task_for(cfg)
    torch.manual_seed(seed_for(cfg.seed, "init"))  # initialisation, then dropout and drop-path
    model = task.build_model(cfg, data, log if main else (lambda *a: None), saved_init).to(device)
    model.set_grad_checkpointing(cfg.grad_checkpointing)
    amp = pick_precision(cfg.precision, device)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else None
    layout = Layout.fitting(cfg.batch_size, cfg.accum_steps, world, dist_info.rank, cfg.micro_batch)
    if layout.accum_steps != cfg.accum_steps and main:
        log(f"batch {cfg.batch_size} as {layout.accum_steps} accumulation steps of {layout.local} images "
            f"x {world} processes (micro_batch {cfg.micro_batch})")
    check_batches_fit(encoder_of(model).config, layout.local, cfg.eval_batch_size)
    steps_per_epoch = data.steps_per_epoch(layout)
    run = Run(cfg, dist_info, log, data, model, make_optimizer(model, cfg),
              torch.amp.GradScaler(device.type, enabled=amp is torch.float16), amp, layout, steps_per_epoch,
              total=cfg.max_steps or math.ceil(cfg.epochs * steps_per_epoch),
              warmup=cfg.warmup_steps if cfg.warmup_epochs is None else round(cfg.warmup_epochs * steps_per_epoch),
              forward=torch.compile(ddp or model) if cfg.compile else (ddp or model), task=task, ddp=ddp,
              ema=ModelEma(model, cfg.ema_decay) if cfg.ema_decay is not None else None,
              fit_notes=fitted)  # said after the run's first line, once nothing can refuse it
    if run.warmup > run.total > 1 and not tiny.enabled():  # the schedule never reaches its peak, nor decays
        run.fit_notes = [*run.fit_notes, f"the warm-up of {run.warmup:,} steps is longer than the run's "
                         f"{run.total:,}: the learning rate never reaches its peak {cfg.lr:g} (--warmup-steps sets "
                         f"the warm-up)"]
    run.parallel, run.parallel_how = choose(cfg.cpu_parallel, torch.get_num_threads(), device, world, model,
                                            cfg.compile)
    if run.parallel is not None and hasattr(run.optimizer, "spread"):  # Muon's matrices on every worker
        run.optimizer.spread = run.parallel.spread
    note = busy_cpu_note(cfg.threads) if run.parallel is None and main and world == 1 and device.type == "cpu" else None
    if note:
        log(note)
    if cfg.distill != "none":  # DeiT: a frozen teacher; a distillation token gets its own head's loss
        run.teacher = load_teacher(cfg.teacher, model.config.num_classes, device)
        run.student_input = InputSpec.of(model.config)
        if getattr(model, "head_dist", None) is not None:  # not a distillation token read as a prefix alone
            model.set_distilled_training(True)
        (th, tw), (sh, sw) = run.teacher.spec.img_size, run.student_input.img_size
        run.note(f"distilling ({cfg.distill}) from {cfg.teacher}" + (f", which sees each {sh}x{sw} batch resized to "
                                                                      f"its {th}x{tw}" if (th, tw) != (sh, sw) else ""))
    return run


def restore(run: Run, resume: Optional[str]) -> None:
    """Continue from the run's newest intact checkpoint (model, optimiser, scaler, RNG, EMA, step,
    seconds), or make the run's folder and write its config.json; the writer (rank 0) holds the
    folder's lock from here to the end, and clears what killed writers left behind."""
    if not resume:
        main_dir = str(new_run_dir(run)) if run.main else None
        run.run_dir = Path(distributed.broadcast(run.dist, main_dir))
        if run.main:
            values = _located(run.cfg.to_dict())
            if run.cfg.init:  # the model trained: the --init weights' architecture, not the recipe's model
                values["model"] = run.model_name
            write_json(run.run_dir / "config.json", values)
            if run.cfg.init:  # what the --init weights built: a resume needs neither them nor their reading again
                fresh = list(getattr(run.model, "fresh_parts", ()))  # (started afresh: trains as the heads do)
                write_json(run.run_dir / INIT_MODEL, {**run.model.config.to_dict(), FRESH_PARTS: fresh})
    else:
        run.run_dir = Path(resume)
        if run.main:
            run.lock = RunLock(run.run_dir).acquire()
            removed = remove_stale_temporaries(run.run_dir)
            if removed:
                run.log(f"removed {removed} partial file(s) that an interrupted process left in {run.run_dir}")
        _load_state(run, run.run_dir)
    run.metrics = MetricsLog(run.run_dir, enabled=run.main, tensorboard=run.cfg.tensorboard)
    if resume and run.main:
        run.metrics.truncate_after(run.start)  # rows written after the checkpoint come again
    run.t_start = time.perf_counter()


def saved_init_model(run_dir: str) -> Optional[Dict[str, Any]]:
    """The model config an --init run wrote at its start (None: a run folder from before it was written)."""
    return read_run_json(Path(run_dir) / INIT_MODEL, "the run's model config")


def _load_state(run: Run, run_dir: Path) -> None:
    found = load_intact(run_dir, log=run.note)
    if found is None:
        raise FileNotFoundError(f"cannot resume: no checkpoints in {run_dir / 'checkpoints'}")
    state, path = found
    if run.main:
        set_aside_unreadable(run_dir, path, log=run.note)
    _check_same_config(run, state.get("config"), path)  # (an edited model said as the edit, before its shapes)
    problems = shape_problems(state["model"], run.model.state_dict())
    if problems:  # a config.json edited since the checkpoint was written
        built = f"the model --init {run.cfg.init} builds" if run.cfg.init else f"model {run.cfg.model!r}"
        raise ValueError(f"the checkpoint {path} does not fit {built} as its run's config.json says: "
                         f"{'; '.join(problems)}")
    _check_same_data(run, state.get("data"), path)
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
    if run.ema is not None:
        if "ema" not in state:
            raise ValueError(f"the checkpoint {path} has no EMA weights but ema_decay is set")
        run.ema.load_state_dict(state["ema"])
    run.start = int(state["step"])
    run.prior_seconds = float(state.get("seconds", 0.0))
    run.prior_train_seconds = state.get("train_seconds")  # None: written before it was recorded
    run.prior_processes = tuple(state.get("processes", ()))
    run.last_ckpt = path
    run.note(f"resuming {run_dir} at step {run.start}/{run.total} ({path.name})")


#: the fields of a run's config.json that name local files: saved absolute, so that --resume from another
#: folder reads the same ones (a relative data_dir resumed elsewhere trained on another folder's images)
PATH_FIELDS = ("data_dir", "init", "teacher")


def _located(values: Dict[str, Any]) -> Dict[str, Any]:
    """``values`` with each local path of :data:`PATH_FIELDS` absolute (a Hub name stays as given)."""
    return {k: os.path.abspath(v) if k in PATH_FIELDS and isinstance(v, str) and os.path.exists(v) else v
            for k, v in values.items()}


def _deciding(cfg: TrainConfig) -> Dict[str, Any]:
    """The settings that decide what a run computes (not the machine's, which a resume may change), as JSON
    holds them: what a checkpoint records for --resume to compare with the run's config.json."""
    values = _located(cfg.to_dict())
    return json.loads(json.dumps({k: v for k, v in values.items() if k not in RUNTIME_FIELDS}))


def _check_same_config(run: Run, saved: Optional[Dict[str, Any]], path: Path) -> None:
    """A config.json edited since ``path`` was written would change the run part-way (an lr 10x from step 40 on,
    and config.json then claiming it for every step): refused, naming what changed (None: an older checkpoint)."""
    if saved is None:
        return
    saved = {**_deciding(TrainConfig()), **saved}  # a field newer than the checkpoint trained at its default
    if said := _changes(_deciding(run.cfg), saved):
        raise ValueError(_changed_since(run.run_dir, path, said))


def _changes(now: Dict[str, Any], saved: Dict[str, Any]) -> str:
    """The fields ``now`` holds otherwise than a checkpoint's ``saved`` ones, in words ('' for none)."""
    changed = [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
    return "; ".join(f"{k} {json.dumps(now.get(k))} (the run trained with {json.dumps(saved.get(k))})"
                     for k in changed[:3])


def _changed_since(run_dir: Path, path: Path, said: str) -> str:
    return (f"{run_dir / 'config.json'} was changed after the checkpoint {path.name} was written: {said}; a run "
            f"continues as it started: undo the change, or start a new run")


def _cost(run: Run) -> str:
    """The line of what the steps still to run cost (:func:`~.fit.cost_line`)."""
    encoder, steps = encoder_of(run.model), run.total - run.start
    return cost_line(encoder, complexity(encoder.config).macs, steps * run.cfg.batch_size, run.layout.local, run.amp,
                     run.dist.device, timed=run.cfg.objective == "classify", parallel=run.parallel,
                     optimizer=run.optimizer, steps=steps, processes=run.dist.world)


def _config_to_run(cfg: TrainConfig, resume: Optional[str], asked: Optional[Iterable[str]]) -> TrainConfig:
    """The checked config the run trains with: ``cfg``, or a resume's saved one with the machine's fields. A new
    run's batch that the launcher's processes cannot share is refused here, before the data is read and the job
    joined (a resumed run's batch is its saved one)."""
    with _said_as_an_edit(resume):
        cfg = resumed_config(resume, cfg, asked) if resume else cfg
        cfg.validate()
    if not resume:
        refuse_an_undividable_batch(cfg, launcher_number("WORLD_SIZE", 1, least=1))
    return cfg


@contextlib.contextmanager
def _said_as_an_edit(resume: Optional[str]):
    """A resumed run's config.json edited since its checkpoint into one that does not build (a model of another
    patch: "img_size is not divisible by patch_size") is said as the edit it is."""
    try:
        yield
    except ValueError:
        if resume and (edited := _edited_since_checkpoint(Path(resume))):
            raise ValueError(edited) from None
        raise


def _edited_since_checkpoint(run_dir: Path) -> Optional[str]:
    """Why a run's config.json that no longer builds was edited since its last checkpoint (None: it was not, or
    nothing tells): its model renamed to one of another patch, say, was refused as that model's problem."""
    try:  # (as a resume reads it: an --init run's model is the architecture its weights built, not a field)
        raw = saved_values(str(run_dir))
        found = load_intact(run_dir, log=lambda line: None)
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or found is None or not isinstance(found[0].get("config"), dict):
        return None
    saved = {k: v for k, v in found[0]["config"].items() if k in raw}
    said = _changes({k: raw[k] for k in saved}, saved)
    return _changed_since(run_dir, found[1], said) if said else None


def _data_facts(run: Run) -> Dict[str, Any]:
    """What a checkpoint records of the data it was trained on, for --resume to compare."""
    return {"classes": list(run.data.classes), "train_images": int(run.data.n_train)}


def _check_same_data(run: Run, saved: Optional[Dict[str, Any]], path: Path) -> None:
    """A resume on data that changed since ``path`` was written (classes renamed, added or removed, images
    added or removed) would go on learning something else without a word: refused, saying what changed."""
    if not isinstance(saved, dict):
        return  # a checkpoint written before it recorded its data
    now = _data_facts(run)
    changes = []
    if saved.get("classes") != now["classes"]:
        changes.append(f"its classes were {_listed(saved.get('classes'))}, now {_listed(now['classes'])}")
    if saved.get("train_images") != now["train_images"]:
        changes.append(f"it trained on {saved.get('train_images'):,} images, now {now['train_images']:,}")
    if changes:
        raise ValueError(f"cannot resume {run.run_dir}: the data changed since {path.name} ({'; '.join(changes)}); "
                         f"put it back as it was, or start a new run (--init {run.run_dir} once it has finished)")


def _listed(names: Any, limit: int = 6) -> str:
    names = list(names or [])
    return ", ".join(map(str, names[:limit])) + (f" ... ({len(names)} in all)" if len(names) > limit else "")


def loop(run: Run) -> None:
    """Train from ``run.start`` to ``run.total``: log, validate and checkpoint at their intervals."""
    cfg = run.cfg
    progress = Progress(run.total, run.start, enabled=cfg.progress and run.main)
    run.model.train()
    batches = run.data.train_batches(run.input_config, cfg, run.layout, run.start, run.total)
    window = Window(run.start)
    shown_val: Dict[str, float] = {}  # the last validation accuracy rides along on the bar
    try:
        for step in range(run.start, run.total):
            stop = stop_received()  # raised where Python could only report it (an at-fork hook, a __del__)
            if stop is not None:
                raise stop
            t0 = time.perf_counter()
            lr = lr_at(step, run.total, cfg.lr, run.warmup, cfg.schedule, cfg.min_lr)
            window.add(*_step(run, step, lr, batches))
            run.train_seconds += time.perf_counter() - t0
            done = step + 1
            last = done == run.total
            if done % cfg.log_every == 0 or last:
                row = window.row(run, done, lr)
                run.metrics.write(row)
                progress.update(done, {"loss": row["train_loss"], **({"acc": row["train_acc"]} if "train_acc" in row
                                                                     else {}),
                                       "img/s": row["img_s"], "epoch": row["epoch"], **shown_val})
                window = Window(done)
            if done % (cfg.val_every or run.steps_per_epoch) == 0 or last:
                window.check(run)
                val_loss, val_acc = run.final_val = run.score(run.model, "val")
                run.metrics.write({"step": done, "epoch": round(done / run.steps_per_epoch, 3), "val_loss": val_loss,
                                   **({"val_acc": val_acc} if val_acc is not None else {})})
                shown_val = {"val_acc": val_acc} if val_acc is not None else {"val_loss": val_loss}
            if done % cfg.checkpoint_every == 0 or last:
                window.check(run)
                run.last_ckpt = _checkpoint(run, done)
    except NonFiniteLoss:
        run.metrics.close()
        raise
    finally:
        progress.close()


def seed_random_layers(run: Run, step: int) -> None:
    """Under torchrun, dropout and drop-path draw from (seed, step, rank): every rank started from the one seed
    the weights were initialised with, so each drew the same masks for its part of the batch (half the
    independent draws of one process at the global batch, with two ranks); seeded per step, a resume draws them
    again exactly without each rank's generator saved. One process keeps its one generator (saved with each
    checkpoint)."""
    if run.dist.world > 1:
        torch.manual_seed(seed_for(run.cfg.seed, "layers", step, run.dist.rank))


def _step(run: Run, step: int, lr: float, batches: Iterator[MicroBatch]) -> Tuple[torch.Tensor, int]:
    """One optimiser step over the step's micro-batches -> ((summed loss, correct) on the device, images)."""
    seed_random_layers(run, step)
    for group in run.optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
    stats, n = torch.zeros(2, device=run.dist.device), 0
    for k in range(run.layout.accum_steps):
        x, y, bad = next(batches)
        run.skipped.update(bad)
        if x is None:  # every sample of this micro-batch was unreadable
            continue
        stats += _micro_batch(run, step, k, x.to(run.dist.device, non_blocking=True),
                              y.to(run.dist.device, non_blocking=True))
        n += len(y)
    cfg = run.cfg
    if cfg.clip_grad:
        run.scaler.unscale_(run.optimizer)
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.clip_grad)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    if run.ema is not None:
        run.ema.update(run.model)
    return stats, n


def _micro_batch(run: Run, step: int, k: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Forward and backward of micro-batch ``k`` of ``step`` -> its (summed loss, correct) on the
    device. With batch parts, each part's gradient (its loss weighted by its share of the images)
    is computed at once and added to ``.grad`` in part order: what accumulating the parts as
    micro-batches would give, bitwise."""
    x, y, extra = run.task.inputs(run, step, k, x, y)
    accum = run.layout.accum_steps
    if run.parallel is None:
        with run.no_sync(k), autocast(run.dist.device, run.amp):
            loss, stats = run.task.loss(run, x, y, extra)
        run.scaler.scale(loss / accum).backward()
        return stats
    params = [p for p in run.model.parameters() if p.requires_grad]

    def part(s: slice) -> Tuple[Tuple[Optional[torch.Tensor], ...], torch.Tensor]:
        with autocast(run.dist.device, run.amp):
            loss, stats = run.task.loss(run, x[s], y[s], {name: v[s] for name, v in extra.items()})
        share = (s.stop - s.start) / len(y)
        return torch.autograd.grad(run.scaler.scale(loss * share / accum), params, allow_unused=True), stats

    results = run.parallel.run(part, len(y))
    for p, grads in zip(params, zip(*(grads for grads, _ in results))):
        g = add_in_order(grads)
        if g is not None:
            p.grad = g if p.grad is None else p.grad.add_(g)
    return add_in_order([stats for _, stats in results])


def _checkpoint(run: Run, step: int) -> Optional[Path]:
    """Save the state that resuming needs (rank 0); only called once the steps before are known finite."""
    if not run.main:
        return None
    state = {"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(),
             "scaler": run.scaler.state_dict(), "rng": torch.get_rng_state(), "step": step,
             "seconds": run.seconds(), "data": _data_facts(run), "config": _deciding(run.cfg),
             "processes": sorted({*run.prior_processes, run.dist.world})}
    if run.prior_train_seconds is not None:
        state["train_seconds"] = run.prior_train_seconds + run.train_seconds
    if run.ema is not None:
        state["ema"] = run.ema.state_dict()
    try:
        return save_checkpoint(run.run_dir, step, state, run.cfg.keep_checkpoints,
                               getattr(run.model, "UNBOUNDED", ()))
    except NonFiniteState as e:
        raise NonFiniteLoss(f"{e} although every loss before was finite: {run.stopping()}") from None


def summarise(run: Run) -> Dict[str, Any]:
    """Score the model (and its EMA) on test and validation, save it and the curves, write summary.json."""
    cfg, data, model = run.cfg, run.data, run.model
    trained = finetune.trainable(model)[0]
    if run.main:
        finetune.save_adapters(model, run.run_dir / "adapter")
    finetune.merge(model)  # adapters folded into plain weights: what is scored is what is saved
    if run.ema is not None:
        finetune.merge(run.ema.module)
    results = run.task.results(run)
    if run.main:  # a full disk here: the steps are in the checkpoints, and a resume writes what is missing
        verb = "train" if cfg.objective == "classify" else "pretrain"
        with said_as_disk_full(run.run_dir, "the run's checkpoints hold its steps: free some space, then "
                               f"vitkit {verb} --resume {as_argument(run.run_dir)} writes the model"):
            model.save_pretrained(run.run_dir / "model")
            if run.ema is not None:
                run.ema.module.save_pretrained(run.run_dir / "model_ema")
            plot_curves(run.metrics.path, run.run_dir / "training_curves.png")
    summary = {"run_dir": os.path.abspath(run.run_dir),  # a study reads it from elsewhere
               "model": run.model_name, "init": cfg.init, "dataset": cfg.dataset,
               "params": sum(p.numel() for p in model.parameters()), "trainable_params": trained, **results,
               **({"val_is_test": True} if data.val_is_test else {}),  # its val_ scores are the test split's
               **({"test_split_images": data.test_split} if data.test_split else {}),  # --test-size scored fewer
               "train_images": data.n_train,
               # the images scored (a file skipped as unreadable was counted: "on 61 images" for 60), else the split's
               **({"test_images": run.scored["test"]} if "test" in run.scored else
                  {"test_images": len(data.test)} if hasattr(data.test, "__len__") else {}),
               "steps": run.total, "epochs": round(run.total / run.steps_per_epoch, 3),
               "seconds": round(run.seconds(), 2), **({"resumed_at_step": run.start} if run.start else {}),
               **train_throughput(run), "precision": run.precision,
               "device": str(run.dist.device), "processes": run.dist.world,  # this session's; earlier ones':
               **({"processes_earlier": sorted(set(run.prior_processes))} if {*run.prior_processes} - {run.dist.world}
                  else {}),
               "skipped_files": len({name for name, _ in data.skipped} | run.skipped),
               **({"tiny": "VITKIT_TINY was set: a test-scale run, not a result"} if tiny.enabled() else {})}
    run.metrics.close(summary)
    if run.main:
        write_json(run.run_dir / "summary.json", summary)
    return summary
