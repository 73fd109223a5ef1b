"""Options a person chose that the run would leave unread, refused by name before anything runs: a LoRA
option without LoRA, a model with ``--init``, Adam's betas with SGD, a shuffle buffer for data that is
shuffled whole, a learning-rate floor above the peak. (``chosen``: the flags and config-file fields given,
not the recipe's.)"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Set

from .config_types import _show, as_saved


def file_choices(from_file: Mapping[str, Any], *below: Mapping[str, Any]) -> Dict[str, Any]:
    """The config file's fields whose value no layer ``below`` sets. Against the recipe over the defaults: what the
    file changes (a floor above the peak is refused). Against both apart: what an option can leave unread, since a
    run's own config.json lists every field, and its defaults (LoRA's rank without LoRA, SGD's momentum beside AdamW,
    also where a recipe changed since: a run of the AdamW recipe before Muon) are refused by no rule. Every field a
    file writes still counts as chosen (kept from fitting: a study's batch 128 was fitted to 32)."""
    return {k: v for k, v in from_file.items()
            if not any(k in layer and as_saved(v) == as_saved(layer[k]) for layer in below)}


def flags_over_file(file: str, from_file: Mapping[str, Any], given: Mapping[str, Any]) -> List[str]:
    """A note for each flag that replaces a value of the config file (flags win, as documented, but in silence:
    pretrain --objective mae over objective: simmim); one equal to the file's value (a dataset by another of its
    names, a list given as a tuple, none as null) is no news. model_args merge, key by key."""
    from ..data.datasets import canonical

    def same(key: str, a: Any, b: Any) -> bool:
        return as_saved(a) == as_saved(b) or (key == "dataset" and isinstance(a, str) and isinstance(b, str)
                                              and canonical(a) == canonical(b))

    return [f"--{k.replace('_', '-')} {_show(given[k])} is taken over {file}'s {k}: {_show(v)}"
            for k, v in from_file.items() if k in given and k != "model_args" and not same(k, given[k], v)]


def refuse_unknown(values: Mapping[str, Any], known: Set[str], renamed: Mapping[str, str], file: Optional[str],
                   from_file: Mapping[str, Any]) -> None:
    """Options no TrainConfig has (``known``), named with what they became (``renamed``) or the closest field."""
    unknown = sorted(map(str, set(values) - known))
    if unknown:
        import difflib

        def meant(key: str) -> str:
            if key in renamed:
                return f"{key} (now {renamed[key]})"
            close = difflib.get_close_matches(key.strip().lower().replace("-", "_"), sorted(known), n=1)
            return f"{_show(key)} (did you mean {close[0]}?)" if close else _show(key)

        where = f"{file}: " if file and any(k in from_file for k in unknown) else ""
        raise ValueError(f"{where}unknown training option(s): {', '.join(map(meant, unknown))}")


def refuse_ignored(values: Mapping[str, Any], chosen: Mapping[str, Any], typed: Mapping[str, Any]) -> None:
    """Before the values are checked: a LoRA option without LoRA, a model typed with --init (``typed``: the flags;
    a config file's model beside its init, as a run's own config.json holds them, must name the weights'
    architecture: the task checks it once the weights are read)."""
    lora = [k for k in ("lora_rank", "lora_alpha", "lora_targets") if chosen.get(k) is not None]
    if lora and values.get("finetune") != "lora":  # a LoRA option without LoRA would be ignored: say so
        raise ValueError(f"{', '.join('--' + k.replace('_', '-') for k in lora)} "
                         f"appl{'y' if len(lora) > 1 else 'ies'} with --finetune lora (this "
                         f"run: --finetune {values.get('finetune') or 'full'})")
    if chosen.get("init") and "model" in typed:  # the architecture comes from the weights: say so, never ignore it
        raise ValueError(f"--model {chosen['model']} does not apply with --init: the architecture comes from the "
                         f"weights (for a bare state dict's heads: --model-args '{{\"num_heads\": N}}')")


def refuse_unused(cfg: Any, chosen: Mapping[str, Any], changing: Mapping[str, Any]) -> None:
    """Once the run's configuration is checked (``cfg``, its lr scaled): what its other choices leave unread, and a
    learning-rate floor above the peak (``changing``: also a file's value at the field's default, over a recipe's)."""
    decided = sorted(k for k in ("num_classes", "label_names") if k in (cfg.model_args or {}))
    if decided:  # the data's classes: a head of another size failed at the first step, names were replaced
        raise ValueError(f"model_args {', '.join(decided)}: the data decides the classes (its class folders, its "
                         f"labels); leave {'them' if len(decided) > 1 else 'it'} out")
    size = (cfg.model_args or {}).get("img_size")
    if cfg.img_size is not None and size is not None and _sizes_differ(cfg.img_size, size):
        raise ValueError(f"--img-size {_show(cfg.img_size)} and model_args img_size {_show(size)} differ (the model "
                         f"was built at the second and the run's config said the first): give the size once")
    if "min_lr" in changing and cfg.min_lr > cfg.lr:  # the floor is never above the peak (schedule.lr_at)
        raise ValueError(f"--min-lr {_show(cfg.min_lr)} is above the peak learning rate {_show(cfg.lr)}: the "
                         f"schedule decays from lr to min_lr, so it would rise instead")
    if "betas" in chosen and cfg.optimizer == "sgd":
        raise ValueError("--betas apply to --optimizer adamw, adam and muon (Adam's moments), not sgd: --momentum is "
                         "SGD's")
    if "momentum" in chosen and cfg.optimizer in ("adamw", "adam"):
        raise ValueError(f"--momentum applies to --optimizer sgd and muon, not {cfg.optimizer}: --betas are Adam's")
    if why := _unread(cfg, chosen):
        raise ValueError(why)
    if chosen.get("crop_pad"):
        from ..data.datasets import canonical, is_in_memory

        if not is_in_memory(canonical(cfg.dataset)):  # taken, written to config.json, and never applied
            raise ValueError(f"--crop-pad pads in-memory images (Fashion-MNIST, CIFAR); {canonical(cfg.dataset)}'s "
                             f"image files are cut by timm's RandomResizedCrop instead")
    if "shuffle_buffer" in chosen:
        from ..data.datasets import canonical, is_hf

        dataset = canonical(cfg.dataset)
        if not (dataset == "shards" or (is_hf(dataset) and cfg.hf_streaming)):
            raise ValueError(f"--shuffle-buffer applies to streamed data (tar shards, --hf-streaming), not {dataset}, "
                             f"which is shuffled whole")


def _unread(cfg: Any, chosen: Mapping[str, Any]) -> str:
    """A chosen option another one leaves unread (each was taken and changed nothing): '' where none is."""
    soft_only = [k for k in ("alpha", "tau") if k in chosen]
    if "teacher" in chosen and cfg.distill == "none":
        return "--teacher applies with --distill soft or hard (this run: --distill none)"
    if soft_only and cfg.distill != "soft":
        return (f"--{' and --'.join(soft_only)} appl{'y' if len(soft_only) > 1 else 'ies'} to --distill soft (hard "
                f"distillation weighs its two terms equally; this run: --distill {cfg.distill})")
    if "muon_lr_scale" in chosen and cfg.optimizer != "muon":
        return f"--muon-lr-scale applies to --optimizer muon (this run: --optimizer {cfg.optimizer})"
    if "init_head" in chosen and not cfg.init:
        return "--init-head applies with --init (a new model's head is new)"
    if "mixup_switch_prob" in chosen and not (cfg.mixup and cfg.cutmix):
        return "--mixup-switch-prob chooses between Mixup and CutMix: it applies when both --mixup and --cutmix are on"
    return ""


def _sizes_differ(given: Any, in_args: Any) -> bool:
    """--img-size and model_args' img_size name other sizes (a malformed one is the model config's to refuse)."""
    from ..models.sizes import to_2tuple

    try:
        return to_2tuple(given) != to_2tuple(in_args)
    except ValueError:
        return False


__all__ = ["file_choices", "refuse_ignored", "refuse_unknown", "refuse_unused"]
