"""The resume policy: ``--resume`` continues a run as its ``config.json`` says. Only the fields
that describe the machine or how the end is scored (RUNTIME_FIELDS) may change; any other option
given again must say what was saved, and the check that says so before anything runs
(:func:`check_resume`) is the command line's as much as the library's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from ..files import as_argument
from ..machine import usable_cores
from .chosen import file_choices
from .config import OBJECTIVE_OPTIONS, RENAMED, TrainConfig, deep_merge, field_kinds
from .config_types import as_saved, as_tuples
from .recipes import OPTIMIZER_FIELDS, RECIPES, recipe_optimizer

#: Fields that describe the machine a run executes on or how its end is scored, not what it
#: learns: ``--resume`` takes them from the new invocation where they are set (e.g. two threads
#: once the CPU is free again, or test-time augmentation for a run started without it),
#: everything else from the run's ``config.json``, so the run continues as it started.
RUNTIME_FIELDS = ("threads", "cpu_parallel", "workers", "progress", "tensorboard", "test_tta")

#: The flags of the runtime fields whose flag is not ``--FIELD``.
RUNTIME_FLAGS = {"progress": "--no-progress", "tensorboard": "--[no-]tensorboard"}


def saved_field(run_dir: str, name: str) -> Any:
    """One field of a run folder's saved configuration, its default where the file predates the
    field (None: not a run folder), e.g. what it learns (``objective``)."""
    values = saved_values(run_dir)
    return None if values is None else values.get(name, getattr(TrainConfig(), name))


def saved_values(run_dir: str) -> Optional[Dict[str, Any]]:
    """The fields a run saved in its ``config.json`` (None: not a run directory)."""
    values = read_run_json(Path(run_dir) / "config.json", "a run's configuration")
    if values is None:
        return None
    for old, new in RENAMED.items():
        if old in values:
            values.setdefault(new, values.pop(old))
    if values.get("init"):  # the architecture the --init weights built, as said: init_model.json builds it again
        values.pop("model", None)
    return values


def read_run_json(path: Path, what: str) -> Optional[Dict[str, Any]]:
    """A run folder's JSON object ``what`` (None: no such file); a damaged one is one line naming it."""
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text())
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path} is not valid JSON ({' '.join(str(e).split())[:120]}): {what} is damaged") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path} holds {type(values).__name__}, not {what}")
    return values


def resumed_config(run_dir: str, current: TrainConfig, asked: Optional[Iterable[str]] = None) -> TrainConfig:
    """The saved configuration of ``run_dir``, with the runtime fields of ``current`` that were
    asked for: ``asked`` names them (the command line's flags, so ``--tensorboard`` on a run
    saved without it counts although it is the default); None takes those that differ from the
    defaults (a call from Python, which cannot tell a default from a choice)."""
    values = saved_values(run_dir)
    if values is None:
        raise FileNotFoundError(f"cannot resume: {Path(run_dir) / 'config.json'} not found "
                                f"(is {run_dir} a run directory?)")
    defaults = TrainConfig()
    if asked is None:
        asked = [k for k in RUNTIME_FIELDS if getattr(current, k) != getattr(defaults, k)]
    values.update({k: getattr(current, k) for k in set(RUNTIME_FIELDS) & set(asked)})
    unknown = sorted(set(values) - set(field_kinds()))
    if unknown:
        raise ValueError(f"{Path(run_dir) / 'config.json'} has fields no training run has: {', '.join(unknown)}")
    values = as_tuples(values)
    if isinstance(values.get("threads"), int) and values["threads"] > usable_cores():
        values["threads"] = usable_cores()  # saved on a larger machine: this one's cores
    cfg = TrainConfig(**values)
    cfg.validate()
    return cfg


def resume_conflicts(run_dir: str, overrides: Dict[str, Any]) -> list:
    """Explicit options (None: not given) that ``--resume`` would have to ignore: any field
    outside RUNTIME_FIELDS whose value differs from the saved one."""
    values = saved_values(run_dir)
    if values is None:
        return []  # not a run directory: resuming says so
    out = []
    for k, v in overrides.items():
        if v is None or k in RUNTIME_FIELDS:
            continue
        old = values.get(k)
        v = as_saved(v)
        if k == "model_args" and isinstance(v, Mapping) and isinstance(old, Mapping):
            v = deep_merge(old, v)  # model_args given again only conflict where they change something
        said = json.dumps(old)
        if old is None and k in OBJECTIVE_OPTIONS:  # saved as none: the objective's own value, which it trained with
            old, said = _objective_default(values.get("objective"), k)
        if old != v:
            out.append(f"--{k.replace('_', '-')} (saved: {said}, given: {json.dumps(v)})")
    return out


def _objective_default(objective: Any, name: str) -> Tuple[Any, str]:
    """The value a pre-training option saved as none had in ``objective``'s run, and how to say it
    (an option the objective does not have stays none)."""
    from ..selfsup import OBJECTIVES

    if objective not in OBJECTIVES or objective not in OBJECTIVE_OPTIONS[name]:
        return None, "null"
    value = getattr(OBJECTIVES[objective].config_cls(), name)
    return value, f"{json.dumps(value)}, {objective}'s default"


def check_resume(run_dir: str, overrides: Dict[str, Any], verb: str,
                 config_file: Optional[str] = None, recipe: Optional[str] = None) -> Dict[str, Any]:
    """Refuse a ``--resume`` of ``run_dir`` that could not continue it as it started, before anything
    runs: a classification run resumed by ``vitkit pretrain`` (``verb``) or a pre-training run by
    ``vitkit train``, or options (``overrides``, None: not given) or a config file that would change
    what it learns. Returns the overrides to resolve, without an ``objective`` not given (pretrain
    --resume without --objective: the saved one)."""
    saved = saved_field(run_dir, "objective")
    if saved is not None and (saved == "classify") != (verb == "train"):
        kind, command = ("classification", "train") if saved == "classify" else (f"{saved} pre-training", "pretrain")
        raise ValueError(f"{run_dir} is a {kind} run: resume it with vitkit {command} --resume")
    overrides = dict(overrides)
    if "objective" in overrides and overrides["objective"] is None:
        overrides.pop("objective")
    conflicts = resume_conflicts(run_dir, overrides) + (["--config"] if config_file else [])
    saved_recipe = saved_field(run_dir, "recipe")
    if recipe is not None and saved_recipe is not None and recipe != saved_recipe:  # was taken and ignored
        conflicts.append(f"--recipe (saved: {json.dumps(saved_recipe)}, given: {json.dumps(recipe)})")
    if conflicts:
        free = ", ".join(RUNTIME_FLAGS.get(f, "--" + f.replace("_", "-")) for f in RUNTIME_FIELDS
                         if verb == "train" or f != "test_tta")  # (pre-training has no test-time augmentation)
        init = f"vitkit train --init {as_argument(run_dir)}"
        after = (f"{init} starts one from this run's model once it has finished" if verb == "train" else
                 f"{init} fine-tunes its encoder once it has finished")
        raise ValueError(f"--resume continues {run_dir} as its config.json says; only {free} can change there, not "
                         f"{'; '.join(conflicts)} (for another recipe, start a new run; {after})")
    return overrides


def with_saved(run_dir: str, overrides: Dict[str, Any]) -> Tuple[Optional[str], Dict[str, Any]]:
    """The run's recipe and the values a resume is checked with: the saved ones where no flag gives one (the
    flags alone were checked as a new run: a LoRA run's own --finetune lora was refused for lacking --init)."""
    values = saved_values(run_dir)
    if values is None:
        return None, overrides  # not a run folder: resuming says so
    recipe = values.pop("recipe", None)
    kinds, defaults = field_kinds(), TrainConfig().to_dict()
    # as choices, where saved (the machine's fields: this one's), unless the run's recipe set them (a folder run's
    # recipe padding, saved as 2 by older versions, was refused as a choice its own resume made)
    merged = {k: v for k, v in file_choices(values, RECIPES.get(recipe, {}), defaults).items()
              if k in kinds and k not in RUNTIME_FIELDS}
    optimizer = values.get("optimizer")  # another optimizer than the recipe's: its settings are the run's own, even
    if optimizer != recipe_optimizer(recipe, defaults):  # where equal to the recipe's
        merged.update({k: values[k] for k in (*OPTIMIZER_FIELDS.get(optimizer, ()), "lr") if k in values})
    merged.update({k: v for k, v in overrides.items() if v is not None})
    return recipe, merged


__all__ = ["RUNTIME_FIELDS", "RUNTIME_FLAGS", "check_resume", "resume_conflicts", "resumed_config", "saved_field",
           "with_saved"]
