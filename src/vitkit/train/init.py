"""Starting a run from existing weights (``--init``): the paper's fine-tuning set-up.

The architecture comes from the weights (any format the loader reads); the input size,
channels and class count come from the new data. Position embeddings are resampled to the
new grid, RGB patch filters are summed for grey data, and with ``head="new"`` the
pre-logits layer and the head are dropped for one zero-initialised linear layer, as the
paper fine-tunes ("we remove the pre-trained prediction head and attach a zero-initialized
D x K feedforward layer").
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Collection, Dict, List, Tuple

import torch
from torch import nn

from ..data.datasets import class_difference
from ..models import build_from_config
from ..models.config_base import fit_channel_stats, fit_table_size, no_classes
from ..runlock import unfinished_run
from ..weights.claims import check_claims
from ..weights.guesses import note_guesses, open_fields
from ..weights.io import WeightsError
from ..weights.load import AdaptNote, load_into, read_source
from ..weights.pretrained import processor_run_config, stored_config, weights_path
from ..weights.resampling import interpolation_unused
from .config import resolve_width
from .memory import check_model_fits

HEAD_MODES = ("new", "keep")

#: ``--model-args`` fields that may differ from the --init weights' config: regularisation, how attention
#: runs, how positions meet another size, and the readout (the head is new). Any other field that differs
#: (num_heads, gelu, norm_eps, the block ...) would make the same weights compute another function.
FREE_WITH_INIT = ("attn_impl", "dynamic_img_size", "pos_embed_interpolation", "pos_embed_antialias",
                  "rel_pos_resize", "representation_size", "global_pool", "fc_norm", "patch_size")


def model_from_init(source: str, data_args: Dict[str, Any], model_args: Dict[str, Any],
                    head: str = "new", log=print, interpolation: str = "auto") -> nn.Module:
    """A model shaped for the new data, holding the weights of ``source``.

    ``data_args``: img_size, in_chans, num_classes, label_names of the new data.
    ``model_args``: the run's ViTConfig overrides (e.g. drop_path_rate).
    ``interpolation``: how a position table of another grid is resampled (``auto``: as the weights' library does).
    """
    if head not in HEAD_MODES:
        raise ValueError(f"init_head must be one of {HEAD_MODES}, not {head!r}")
    if why := unfinished_run(source):
        raise FileNotFoundError(f"--init {why}")
    path = weights_path(source)
    if not path.exists():
        raise FileNotFoundError(f"--init weights not found: {path}")
    src = read_source(path)
    # the run's size reads a table its tensors leave open (a non-square grid, or 25 slots of two readings)
    stored = _stored(src, data_args.get("img_size"))
    check_claims(stored, src)  # a config.json that contradicts its weights is refused here too
    note_guesses(stored, src, model_args)
    _check_model_args(model_args, stored, source, open_fields(stored, src))
    overrides = {**data_args, **resolve_width(model_args, stored)}
    if head == "new":
        if hasattr(stored, "representation_size"):  # (CaiT's config has none: its new head was refused)
            overrides.setdefault("representation_size", None)
        overrides["head_kind"] = "classes"
    elif stored.head_kind != "classes" or not stored.num_classes:  # (a pre-trained encoder: "the weights have 0")
        raise WeightsError(f"init_head='keep' keeps a classifier: {source} has "
                           f"{no_classes(stored) if stored.num_classes else 'none (a headless encoder)'}; use "
                           f"--init-head new")
    elif stored.num_classes != data_args["num_classes"]:
        raise WeightsError(f"init_head='keep' needs the same classes: the weights have "
                           f"{stored.num_classes}, the data {data_args['num_classes']}")
    elif why := class_difference(stored.label_names, data_args.get("label_names")):
        raise WeightsError(f"init_head='keep' needs the same classes in the same order: {why}; "
                           f"use --init-head new for a new head")
    config = stored.replace(**fit_table_size(stored, fit_channel_stats(stored, overrides)))
    check_model_fits(config)  # before it is built: an image size past the memory must not fill it first
    model = build_from_config(config)
    # a new head: every classifier (a distilled DeiT's head_dist too) and the pre-logits layer start afresh
    exclude = (*(f"{name}." for name in model.head_names()), "pre_logits.") if head == "new" else ()
    changed = _readout_changed(stored, model)
    exclude = (*exclude, *(f"{part}." for part in changed))
    with warnings.catch_warnings():  # the log line below says what was adapted
        warnings.simplefilter("ignore", AdaptNote)
        # the position table resampled as the source's library resamples it (as from_pretrained does), or as named
        report = load_into(model, src, strict=True, exclude=exclude,
                           interpolation=None if interpolation == "auto" else interpolation)
    _check_resampled(interpolation, report.resampled, model.config)
    if head == "new":
        model.reset_classifier(config.num_classes)
    # what starts afresh beside the heads trains in every mode, as the heads do (a new MAP pool or pre-logits
    # layer stayed at its random start under --finetune head and lora)
    model.fresh_parts = tuple(p for p in (*changed, *(("pre_logits",) if head == "new" else ())) if _holds(model, p))
    dropped = [p for p in changed if p not in model.fresh_parts]
    log(f"initialised from {source} ({report.format}); head: {head}" + _objective_left_out(src)
        + (f"; started afresh beside it: {', '.join(model.fresh_parts)}" if model.fresh_parts else "")
        + (f"; the weights' {', '.join(dropped)} left out (the readout asked has none)" if dropped else "")
        + "".join(f"; {r}" for r in report.adapted + report.resampled))
    return model


def _check_resampled(interpolation: str, resampled: List[str], config: Any) -> None:
    """An --init-interpolation that resampled nothing did nothing: refused before the run, as convert refuses it."""
    why = interpolation_unused(resampled, config) if interpolation != "auto" else None
    if why:
        raise ValueError(f"init_interpolation={interpolation!r} resamples the --init weights' position table or patch "
                         f"filters to the data's size, and {why}: leave it out (or fine-tune at another --img-size)")


def _stored(src: Any, img_size: Any) -> Any:
    """The --init weights' config at ``img_size`` (a bare table's size), else as from_pretrained builds it: a
    transformers DINOv2 at its processor's size (224, not its config's 518: 5x the tokens), its table held."""
    stored = stored_config(src, {"img_size": img_size})
    return processor_run_config(src, stored) if img_size is None else stored


#: the parts of a readout (the pooling and the norm before the head) another global_pool or fc_norm makes or drops
READOUT_PARTS = ("attn_pool", "fc_norm", "norm")


def _readout_changed(stored: Any, model: nn.Module) -> Tuple[str, ...]:
    """The readout parts (:data:`READOUT_PARTS`) the model and the weights' own architecture do not both hold: a
    readout asked of the weights (another global_pool, fc_norm) starts them afresh or leaves the weights' out, as
    timm does (it was a loader's "missing from the checkpoint: fc_norm.bias, ...")."""
    with torch.device("meta"):
        own = build_from_config(stored.replace(num_classes=0))
    return tuple(p for p in READOUT_PARTS if _holds(own, p) != _holds(model, p))


def saved_fresh_parts(model: nn.Module, listed: Any, where: str) -> Tuple[str, ...]:
    """The parts a run's saved --init architecture says were started afresh, checked against the model it builds
    (a hand-edited list ended in a traceback, or froze a part the run had trained)."""
    if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
        raise ValueError(f"{where}: fresh_parts must be a list of the model's part names, got {listed!r}")
    unknown = [p for p in listed if not _holds(model, p)]
    if unknown:
        raise ValueError(f"{where}: fresh_parts names {', '.join(map(repr, unknown))}, which the model it builds has "
                         f"no trainable part of that name for (edited since the run wrote it?)")
    return tuple(listed)


def _holds(model: nn.Module, part: str) -> bool:
    """``model`` has a ``part`` with parameters (not None, not an Identity)."""
    module = getattr(model, part, None)
    return isinstance(module, nn.Module) and any(True for _ in module.parameters())


def _objective_left_out(src) -> str:
    """What of a pre-training model the fine-tuning does not take (its decoder, mask token, prediction head), said
    beside the line that says what it did take."""
    if not src.pretraining:
        return ""
    from ..weights import selfsup_format

    parts = sorted({key.split(".")[0] for key in selfsup_format.split(src.pretraining, src.format, src.tensors)[1]})
    return f"; its {src.pretraining} pre-training's {', '.join(parts)} left out" if parts else ""


def _check_model_args(model_args: Dict[str, Any], stored: Any, source: str, unheld: Collection[str] = ()) -> None:
    """``model_args`` that contradict what the --init weights are (:data:`FREE_WITH_INIT` aside, and ``unheld``: what
    a bare file's tensors leave open) are refused by name: the run would start from another function of the same
    tensors without a word."""
    if "img_size" in model_args and _differs(model_args["img_size"], getattr(stored, "img_size", None)):
        # (it was said to compute another function: it is a resampling, --img-size's)
        size = model_args["img_size"]
        shown = " ".join(map(str, size)) if isinstance(size, (list, tuple)) else size
        raise ValueError(f"--model-args img_size: with --init the size is --img-size {shown} (the weights' position "
                         f"tables are resampled to it as their library resamples them)")
    free = (*FREE_WITH_INIT, *getattr(stored, "RATES", ()), *unheld)
    changed = [f"{k}={json.dumps(v)} (the weights': {json.dumps(getattr(stored, k))})" for k, v in model_args.items()
               if k not in free and hasattr(stored, k) and _differs(v, getattr(stored, k))]
    if changed:
        raise ValueError(f"--model-args {', '.join(changed)} contradict{'s' if len(changed) == 1 else ''} the --init "
                         f"weights {source}: the same tensors would compute another function; drop "
                         f"{'it' if len(changed) == 1 else 'them'} (with --init, --model-args may set the drop "
                         f"rates, {', '.join(FREE_WITH_INIT)})")


def _differs(given: Any, stored: Any) -> bool:
    """A sequence given as a list differs from the config's tuple only where the values do; one side given for a
    square size (64 for (64, 64)) is that size."""
    given = list(given) if isinstance(given, (list, tuple)) else given
    stored = list(stored) if isinstance(stored, (list, tuple)) else stored
    if isinstance(stored, list) and len(stored) == 2 and not isinstance(given, list):
        given = [given, given]
    return given != stored
