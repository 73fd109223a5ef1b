"""What a training option's value may be, as people write it (flags, YAML, JSON): each kind of field
(int, float, bool, str, pair, size, mapping) checked and, for a config file, unambiguous numbers coerced
(a quoted "1e-3" is the number 0.001, JSON's 1e4 the count 10000), with a ConfigNote saying so; the words and
ranges the fields take (CHOICES, RANGES); and OFF, the command line's way to switch one off.

Which field has which kind is TrainConfig's (:func:`vitkit.train.config.field_kinds`): this module
knows the kinds alone, so that the config files' reader and the fields' checks share it, and it
loads without the dataclass (or torch).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Dict, Mapping, Optional, Tuple

#: A number written as text: YAML 1.1 reads 1e-3 and 1e4 (no dot) as strings.
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_EXPECTED = {"int": "an integer", "float": "a finite number", "bool": "true or false", "str": "text",
             "pair": "two numbers", "size": "an integer or two (height, width)",
             "mapping": "a mapping of model options"}
#: the fields read as tuples where a file or the command line gives lists
TUPLES = ("betas", "img_size")


class ConfigNote(UserWarning):
    """A value of a config file read in another type than written (``lr: 1e-3``, which YAML
    reads as text, as the number 0.001), said once per value."""


def kinds_of(cls: type) -> Dict[str, Tuple[str, bool]]:
    """Each field of a dataclass whose annotations are text (``from __future__ import annotations``)
    -> its kind (int, float, bool, str, pair, size, mapping) and whether it may be none."""
    kinds = {}
    for f in dataclasses.fields(cls):
        text = str(f.type)
        optional = text.startswith("Optional[")
        base = text[len("Optional["):-1] if optional else text
        kinds[f.name] = ({"Tuple[float, float]": "pair", "Union[int, Tuple[int, int]]": "size",
                          "Dict[str, Any]": "mapping"}.get(base, base), optional)
    return kinds


def _show(value: Any) -> str:
    """A value as the user wrote it, for messages (YAML's dates and JSON's floats included)."""
    value = list(value) if isinstance(value, tuple) else value  # (a size's two sides, as a file writes them)
    try:  # as JSON (and YAML) write it: null, not None; a date or another object as Python shows it
        text = json.dumps(value) if isinstance(value, (bool, int, float, str, type(None), list, dict)) else repr(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_value(name: str, value: Any, kind: str, optional: bool,
                coerce: bool = False) -> Tuple[Any, Optional[str], Optional[str]]:
    """``(value, problem, note)`` for field ``name`` of ``kind``: the value (coerced when ``coerce``
    and it is unambiguous: "1e-3" or 1e4 for a number, 1e4 for an integer), a problem naming the
    field, the value and what is allowed, or a note saying what was coerced."""
    if value is None:
        return None, None if optional else f"{name} cannot be none ({_EXPECTED[kind]} is expected)", None
    if kind == "size" and not isinstance(value, (list, tuple)):  # one side: a square
        read, bad, note = _number(name, value, "int", coerce)
        return read, bad and f"{name} {_show(value)} is not {_EXPECTED[kind]}", note
    if kind in ("pair", "size"):  # (a size's two sides: height and width)
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            return value, f"{name} {_show(list(value) if isinstance(value, tuple) else value)} is not " \
                          f"{_EXPECTED[kind]}", None
        pair = [_number(name, v, "float" if kind == "pair" else "int", coerce) for v in value]
        bad = next((p for _, p, _ in pair if p), None)
        if bad and kind == "size":  # the value as written, not one side of it ("img_size null")
            bad = f"{name} {_show(value)} is not {_EXPECTED[kind]}"
        notes = [n for _, _, n in pair if n]
        read = tuple(v for v, _, _ in pair)
        square = kind == "size" and not bad and read[0] == read[1]  # a square's two sides: its one (as --img-size)
        return read[0] if square else read, bad, "; ".join(notes) or None
    if kind == "mapping":
        if not isinstance(value, Mapping):
            return value, f"{name} must be a mapping of model options, e.g. {{\"depth\": 4}}, not {_show(value)}", None
        bad = _non_finite(value)
        return value, (f"{name}: {bad} is not finite" if bad else None), None
    if kind in ("int", "float"):
        return _number(name, value, kind, coerce)
    if kind == "bool":
        return value, None if isinstance(value, bool) else f"{name} {_show(value)} is not true or false", None
    if not isinstance(value, str):
        hint = " (YAML reads an unquoted date as a date: quote it)" if type(value).__name__ in ("date", "datetime") \
            else " (quote it)" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
        return value, f"{name} {_show(value)} is not text{hint}", None
    return value, None, None


def _number(name: str, value: Any, kind: str, coerce: bool) -> Tuple[Any, Optional[str], Optional[str]]:
    what = _EXPECTED[kind]
    read = value
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return value, f"{name} {_show(value)} is not {what}", None
    if isinstance(value, str):
        if not coerce or not _NUMBER.fullmatch(value.strip()):
            return value, f"{name} {_show(value)} is not {what}", None
        read = float(value)
    if not math.isfinite(read):
        return value, f"{name} {_show(value)} is not finite ({what} is expected)", None
    if kind == "int":
        if isinstance(read, float):
            if not read.is_integer():
                return value, f"{name} {_show(value)} is not {what}", None
            if not coerce:
                return value, f"{name} {_show(value)} is not {what} (write {int(read)})", None
            read = int(read)
        return read, None, (f"{name} {_show(value)} read as {read}" if read is not value else None)
    note = f"{name} {_show(value)} read as {float(read):g}" if isinstance(value, str) else None
    return float(read) if isinstance(read, float) else read, None, note


def sides(value: Any) -> tuple:
    """A value's numbers, for the range checks: a size's two sides, or the one number."""
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def as_tuples(values: Dict[str, Any]) -> Dict[str, Any]:
    """``values`` with TUPLES' fields as tuples, as TrainConfig holds them (a file and config.json hold lists)."""
    return {k: tuple(v) if k in TUPLES and isinstance(v, list) else v for k, v in values.items()}


def _non_finite(value: Any, where: str = "") -> Optional[str]:
    """The first NaN or infinite number inside nested lists and mappings, by its path."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where or 'a value'} {value}"
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, (list, tuple)) \
        else ()
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


class _Off:
    """The command line's ``none``: switch an optional field off. (None itself means "not given"
    there; in a config file, ``null`` is this.)"""

    def __repr__(self) -> str:
        return "none"

    def __bool__(self) -> bool:  # off is off: ``if cfg.init`` and ``chosen.get("init")`` read it so
        return False


OFF = _Off()


def as_saved(value: Any) -> Any:
    """A value as a config file or a run's config.json holds it: the command line's ``none`` as null, a tuple as a
    list (``--betas 0.9 0.95`` and a file's [0.9, 0.95] are one value), inside model_args too. Two values are one
    choice where their saved forms are equal (3 and 3.0 too): the one comparison of resume's and chosen's rules."""
    if isinstance(value, (tuple, list)):
        return [as_saved(v) for v in value]
    if isinstance(value, dict):
        return {k: as_saved(v) for k, v in value.items()}
    return None if value is OFF else value


#: The options of Hugging Face datasets (--dataset hf:...) that name a split or a column.
HF_FIELDS: Tuple[str, ...] = ("hf_split", "hf_test_split", "image_key", "label_key")

#: The fields that take one of a few words.
CHOICES: Dict[str, Tuple[str, ...]] = {
    "optimizer": ("adamw", "adam", "sgd", "muon"), "schedule": ("cosine", "linear", "constant"),
    "precision": ("auto", "bf16", "fp16", "fp32"), "init_head": ("new", "keep"),
    # vitkit.weights.resampling.LOAD_INTERPOLATIONS and auto (as the weights' library resamples);
    # vitkit convert --interpolation takes the same, auto aside
    "init_interpolation": ("auto", "bicubic", "bilinear", "bilinear-aligned"), "distill": ("none", "soft", "hard"),
    "cpu_parallel": ("auto", "batch", "ops"), "finetune": ("full", "lora", "bitfit", "head"),
    # vitkit.evaluate.tta.TTA_MODES, restated as this module loads without torch (a test keeps them equal)
    "test_tta": ("none", "flip", "flip-shift")}

#: The numeric fields' ranges: (field, low, high, what else to say); a bound is a number
#: (inclusive) or ("open", number) (exclusive); None: unbounded on that side. None values
#: (optional fields switched off) are not checked.
RANGES: Tuple[Tuple[str, Any, Any, str], ...] = (
    ("batch_size", 1, None, ""), ("accum_steps", 1, None, ""), ("micro_batch", 1, None, " (none: as accum_steps)"),
    ("max_steps", 1, 10 ** 9, " (or none: from epochs)"), ("epochs", None, 10 ** 6, ""),
    ("lr", ("open", 0), None, ""), ("min_lr", 0, None, ""),
    ("weight_decay", 0, None, ""), ("label_smoothing", 0, ("open", 1), ""),
    ("momentum", 0, ("open", 1), ""), ("muon_lr_scale", ("open", 0), None, ""),
    ("clip_grad", ("open", 0), None, " (none: no clipping)"), ("warmup_steps", 0, None, ""),
    ("warmup_epochs", 0, None, ""), ("lr_scale_batch", 1, None, ""), ("crop_pad", 0, None, ""),
    ("img_size", 1, None, ""), ("threads", 1, None, " (none: every core)"), ("workers", 0, None, ""),
    ("shuffle_buffer", 0, None, ""), ("alpha", 0, 1, ""), ("tau", ("open", 0), None, ""),
    ("layer_decay", ("open", 0), 1, " (none switches it off)"), ("ema_decay", ("open", 0), ("open", 1),
                                                                 " (none switches the EMA off)"),
    ("mixup", 0, None, " (a Beta alpha; 0 turns it off)"), ("cutmix", 0, None, " (a Beta alpha; 0 turns it off)"),
    ("mixup_switch_prob", 0, 1, ""), ("random_erasing", 0, 1, ""), ("repeated_aug", 1, None, " (1: off)"),
    ("train_fraction", ("open", 0), 1, ""), ("val_every", 1, None, " (none: every epoch)"),
    ("val_size", 0, None, " (0: validate on the test split)"), ("test_size", 1, None, " (none: every test image)"),
    ("keep_checkpoints", 1, None, ""),
    ("log_every", 1, None, ""), ("checkpoint_every", 1, None, ""), ("eval_batch_size", 1, None, ""),
    ("seed", 0, ("open", 2 ** 63), ""), ("lora_rank", 1, None, ""), ("lora_alpha", ("open", 0), None, ""),
    ("freeze_blocks", 0, None, ""))


def _above(value: float, low: Any) -> bool:
    return value > low[1] if isinstance(low, tuple) else value >= low


def _below(value: float, high: Any) -> bool:
    return value < high[1] if isinstance(high, tuple) else value <= high


def _range_words(low: Any, high: Any) -> str:
    """">= 1", "> 0", "in [0, 1)", "in (0, 1]" for a RANGES entry."""
    def number(bound):
        value = bound[1] if isinstance(bound, tuple) else bound
        return "2^63" if value == 2 ** 63 else f"{value:,}" if isinstance(value, int) else f"{value:g}"

    if low is None:
        return f"{'<' if isinstance(high, tuple) else '<='} {number(high)}"
    if high is None:
        return f"{'>' if isinstance(low, tuple) else '>='} {number(low)}"
    left = "(" if isinstance(low, tuple) else "["
    right = ")" if isinstance(high, tuple) else "]"
    return f"in {left}{number(low)}, {number(high)}{right}"


__all__ = ["CHOICES", "HF_FIELDS", "OFF", "RANGES", "TUPLES", "ConfigNote", "as_tuples", "check_value", "kinds_of",
           "sides"]
