"""What every model configuration shares: JSON round trips, checked copies, and the fields of
every patch-token family.

Each family's config is a dataclass that ``config.json`` stores. :class:`ConfigMixin` gives
them one ``to_dict`` / ``from_dict`` / ``replace`` and the input/output checks;
:class:`TokenConfig` declares the fields every patch-token family (ViT, CaiT, ConViT) has,
with their checks, once: a family subclasses it, adds its own fields, redeclares the defaults
its weights differ in, and lists its own problems in ``family_problems``. ``KIND`` names the
family in errors.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple, TypeVar

from .layers import ATTN_IMPLS, INTERPOLATIONS, RELATIVE_RESIZES, IntPair, to_2tuple

#: Normalisation of the two weight families (DESIGN: inputs travel with the weights): the
#: official Google weights expect [-1, 1], DeiT/CaiT/ConViT/MAE weights ImageNet statistics.
INCEPTION_MEAN = (0.5, 0.5, 0.5)
INCEPTION_STD = (0.5, 0.5, 0.5)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
GLOBAL_POOLS = ("token", "avg")
#: how evaluation resizes an image before its centre crop (``crop_mode``): the shorter side to the size, aspect
#: kept; the whole image squashed to it; or the longer side to it, the rest padded with the mean (timm's
#: ``'border'``: no pixel lost, DeepSeek's encoder)
CROP_MODES = ("center", "squash", "border")
#: how the centre crop's odd margin is split (``crop_offset``): rounded (torchvision's), floored (transformers'), or
#: none at all, the crop (or ``'border'``'s padding) anchored at the top left: SAM's processor pads at the right
#: and bottom ('start')
CROP_OFFSETS = ("round", "floor", "start")
#: what a head's outputs are (``head_kind``): class logits, or a projection into an image-text space (CLIP's
#: and SigLIP's towers as open_clip and transformers' ...WithProjection hold them), which are no classes
HEAD_KINDS = ("classes", "projection")
#: The largest image side a model is built for: 16,384 px is a million 16 px patches, past what
#: attention can hold in memory; larger sizes were typos (and allocation tracebacks).
MAX_IMG_SIZE = 16_384
#: The deepest and widest token model built: ViT-22B has 48 blocks of width 6,144; past these
#: bounds a value is a typo that would fill the memory while the model is being made.
MAX_DEPTH, MAX_WIDTH = 1_024, 65_536
#: The most classes a head is built for: ImageNet-21k has 21,841 and the largest classification
#: sets (Google Landmarks v2, iNaturalist) about 200,000; more is a typo, or labels that are not
#: class numbers (a row id, a price).
MAX_CLASSES = 1_000_000

C = TypeVar("C", bound="ConfigMixin")


class UnknownOption(ValueError, TypeError):
    """A keyword that is no field of the config (a TypeError as for any bad keyword, and a
    ValueError: bad input, one line on the command line)."""


#: other libraries' names for config fields (timm's, transformers', the CLI's), said beside a refusal of them
OTHER_NAMES = {"mlp_ratio": "mlp_dim (the MLP's width: mlp_ratio x embed_dim)", "model": "model_name=",
               "hidden_size": "embed_dim", "num_attention_heads": "num_heads", "num_hidden_layers": "depth",
               "intermediate_size": "mlp_dim", "image_size": "img_size", "num_channels": "in_chans",
               "in_channels": "in_chans", "width": "embed_dim", "layers": "depth", "heads": "num_heads"}


def _meant(unknown: Sequence[str], known: Set) -> str:
    """" (did you mean ...?)" for keywords another library names so (timm's mlp_ratio) or close to a field."""
    import difflib

    def other_name(word: str) -> Optional[str]:  # (one this config has: ResNetV2's width is no embed_dim)
        meant = OTHER_NAMES.get(word)
        return meant if meant and (meant.endswith("=") or meant.split()[0] in known) else None

    guesses = [other_name(word) or next(iter(difflib.get_close_matches(word, sorted(known), n=1)), None)
               for word in unknown]
    said = [f"{word}: {guess}" if len(unknown) > 1 else guess for word, guess in zip(unknown, guesses) if guess]
    return f" (did you mean {', '.join(said)}?)" if said else ""


def pixel_scale_problem(mean: Sequence[float], std: Sequence[float], flag: str = "") -> str:
    """Why a mean and std are not of 0-1 pixels ("" where they are): values on the 0-255 scale (ImageNet's 123.7,
    58.4) were taken and gave another model's answers, every image read as far outside its data. ``flag``: "--"
    where they were given as the command line's --mean and --std."""
    if any(not 0 <= m <= 1 for m in mean) or any(s > 1 for s in std):
        scale = ": on the 0-255 scale, divide them by 255" if max(*mean, *std) > 2 else ""  # (ImageNet's: 124, 58)
        return (f"{flag}mean {_shown(mean)} and {flag}std {_shown(std)} are not of pixels scaled to [0, 1] (a mean "
                f"within 0 to 1, a std at most 1), as vitkit reads them{scale}")
    return ""


def _shown(values: Sequence[float]) -> str:
    return "(" + ", ".join(f"{v:g}" for v in values) + ")"


class ConfigMixin:
    KIND: ClassVar[str] = "model"

    def _io_problems(self) -> List[str]:
        """Checks of the input/output fields every family has (in_chans, num_classes, mean,
        std, label_names); coerces mean/std to float tuples and spreads the RGB default over
        another channel count (its first value), as the configs always have."""
        problems = []
        try:
            self.mean = tuple(float(m) for m in self.mean)
            self.std = tuple(float(s) for s in self.std)
        except (TypeError, ValueError):
            return [f"mean and std must be lists of numbers, got {self.mean!r} and {self.std!r}"]
        if not all(math.isfinite(s) and s > 0 for s in self.std) or not all(math.isfinite(m) for m in self.mean):
            problems.append(f"std must be positive and mean finite (inputs are divided by std), got mean "
                            f"{self.mean} and std {self.std}")
        elif scale := pixel_scale_problem(self.mean, self.std):
            problems.append(scale)
        if not isinstance(self.crop_pct, (int, float)) or not 0 < self.crop_pct <= 1:
            problems.append(f"crop_pct must be in (0, 1], got {self.crop_pct!r}")
        if self.interpolation not in INTERPOLATIONS:
            problems.append(f"interpolation must be one of {INTERPOLATIONS}, got {self.interpolation!r}")
        if self.crop_mode not in CROP_MODES:
            problems.append(f"crop_mode must be one of {CROP_MODES}, got {self.crop_mode!r}")
        if self.crop_offset not in CROP_OFFSETS:
            problems.append(f"crop_offset must be one of {CROP_OFFSETS}, got {self.crop_offset!r}")
        chans = self.in_chans if isinstance(self.in_chans, int) and self.in_chans > 0 else None
        if chans and (len(self.mean) != chans or len(self.std) != chans):
            if len(self.mean) == 3 and len(self.std) == 3 and chans != 3:
                self.mean = (self.mean[0],) * chans
                self.std = (self.std[0],) * chans
            else:
                problems.append(f"mean/std need {chans} values")
        if self.head_kind not in HEAD_KINDS:
            problems.append(f"head_kind must be one of {HEAD_KINDS}, got {self.head_kind!r}")
        if isinstance(self.label_names, str):  # 'abc' was taken as the names 'a', 'b', 'c'
            problems.append(f"label_names must be a list of names, not the string {self.label_names!r}")
        elif self.label_names is not None:  # a copy: sorting the caller's list afterwards relabelled the head
            if isinstance(self.label_names, (bytes, Mapping, Set)) or not hasattr(self.label_names, "__iter__"):
                # (a dict gave its keys, a set its hash order, bytes their numbers)
                problems.append(f"label_names must be a list of names in class order, got "
                                f"{type(self.label_names).__name__} {str(self.label_names)[:60]}")
            else:
                self.label_names = [n.item() if hasattr(n, "item") else n for n in self.label_names]
        init = getattr(self, "init_values", None)  # a string was a TypeError deep in one family, taken by another
        if init is not None and (isinstance(init, bool) or not isinstance(init, (int, float))
                                 or not math.isfinite(init)):
            problems.append(f"init_values (LayerScale's start) must be a number or null, got {init!r}")
        rep = getattr(self, "representation_size", None)
        if rep is not None and rep != 0 and not (_is_int(rep) and rep > 0):
            problems.append(f"representation_size must be a positive integer or null, got {rep!r}")
        if isinstance(self.label_names, list) and self.num_classes and len(self.label_names) != self.num_classes:
            problems.append(f"{len(self.label_names)} label names for {self.num_classes} classes")
        if isinstance(self.num_classes, int) and self.num_classes > MAX_CLASSES:
            problems.append(f"num_classes {self.num_classes:,} is past {MAX_CLASSES:,} (ImageNet-21k has 21,841)")
        for f in dataclasses.fields(self):  # a string is not a switch: "false" was true (pre_norm="false" built one)
            kind, value = str(f.type), getattr(self, f.name)
            if kind in ("bool", "Optional[bool]") and not isinstance(value, bool) and not (
                    value is None and kind.startswith("Optional")):
                problems.append(f"{f.name} must be true or false, got {value!r}")
        return problems

    def _positive_int_problems(self, names: Sequence[str]) -> List[str]:
        """Each of ``names`` must be an int > 0 (not a bool, a float or a string)."""
        return [f"{name} must be a positive integer, got {getattr(self, name)!r}" for name in names
                if not _is_int(getattr(self, name)) or getattr(self, name) <= 0]

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready: tuples become lists."""
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def from_dict(cls: type[C], d: Dict[str, Any]) -> C:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown {cls.KIND} config fields: {', '.join(unknown)}")
        return cls(**d)

    def replace(self: C, **overrides: Any) -> C:
        """A copy with fields changed (validated again); a new class count drops stale label names."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise UnknownOption(f"unknown option(s) {', '.join(unknown)} of a {self.KIND} config"
                                f"{_meant(unknown, known)}; known: {', '.join(sorted(known))}")
        if "num_classes" in overrides and "label_names" not in overrides and self.label_names is not None \
                and overrides["num_classes"] != len(self.label_names):
            overrides["label_names"] = None
        if "num_classes" in overrides and "head_kind" not in overrides and overrides["num_classes"] != self.num_classes:
            overrides["head_kind"] = "classes"  # a new head is a classifier
        return dataclasses.replace(self, **overrides)


def fit_channel_stats(stored: Any, overrides: Dict[str, Any]) -> Dict[str, Any]:
    """A new ``in_chans`` brings per-channel mean/std of that length, the average of the stored ones, unless they
    are given (one route for create_model and from_pretrained: the first value was spread by one, the average by
    the other); given ones of another length are refused (a 3-value mean for 2 channels was cut in silence)."""
    chans = overrides.get("in_chans", stored.in_chans)
    out = dict(overrides)
    for key in ("mean", "std"):
        if key in overrides:
            given = overrides[key]
            if isinstance(chans, int) and isinstance(given, (list, tuple)) and len(given) != chans:
                raise ValueError(f"{key} {tuple(given)} has {len(given)} value{'s' if len(given) != 1 else ''} for "
                                 f"in_chans {chans}: give one a channel")
            continue
        values = tuple(getattr(stored, key))
        if isinstance(chans, int) and chans > 0 and len(values) != chans:
            out[key] = (sum(values) / len(values),) * chans
    return out


def fit_table_size(stored: Any, overrides: Dict[str, Any], every_call: bool = False) -> Dict[str, Any]:
    """A learned table held at another size (``pos_embed_size``) meets the overrides as timm's
    ``create_model(img_size=...)`` meets its saved table: another image size asked for, or a model of one size
    (``dynamic_img_size=False``), has it resampled to ``img_size`` once while loading; else it stays held.
    ``every_call``: the source's library resamples the table as stored to every input (transformers' DINOv2
    and SigLIP 2; timm's NaFlexViT, whose config says ``TABLE_HELD``): a model of any size built from it holds the
    table where it was stored, equal at every size."""
    if "pos_embed_size" in overrides:
        return overrides
    size = overrides.get("img_size")
    try:
        asked = size is not None and to_2tuple(size) != tuple(stored.img_size)
    except ValueError:
        asked = True  # (the config's own check says what is wrong with it)
    dynamic = overrides.get("dynamic_img_size", getattr(stored, "dynamic_img_size", False))
    every_call = every_call or getattr(stored, "TABLE_HELD", False)  # (a family whose library always does: NaFlex)
    if every_call and asked and dynamic and getattr(stored, "pos_embed", None) in ("learned", "factorized"):
        return {**overrides, "pos_embed_size": stored.pos_embed_size or stored.img_size}
    if getattr(stored, "pos_embed_size", None) is None:
        return overrides
    if asked or overrides.get("dynamic_img_size") is False:
        return {**overrides, "pos_embed_size": None}
    return overrides


def no_classes(config: Any) -> Optional[str]:
    """Why a model's outputs are no class scores (None: they are): no head, or a projection (``head_kind``)."""
    classes = getattr(config, "num_classes", 0)
    if not classes:
        return "no classifier head (num_classes 0)"
    if getattr(config, "head_kind", "classes") == "projection":
        return (f"no classifier: its head is a projection into an image-text space (CLIP's or SigLIP's image "
                f"embedding, {classes} wide), not {classes} classes")
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def per_channel(value: Any, channels: int = 3) -> Optional[Tuple[float, ...]]:
    """A mean or std as another library's file holds it: a number per channel, or one number for every
    channel (transformers' and open_clip's preprocessing spread it); None where it holds no numbers."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (float(value),) * channels
    try:
        return tuple(float(v) for v in value) if isinstance(value, (list, tuple)) else None
    except (TypeError, ValueError):
        return None


@dataclass
class ImageConfig(ConfigMixin):
    """The fields of every family: the input, the classes, and what the weights expect at the
    input and what their outputs mean (the preprocessing travels with the weights)."""

    img_size: Tuple[int, int] = (224, 224)
    in_chans: int = 3
    num_classes: int = 1000
    mean: Tuple[float, ...] = INCEPTION_MEAN
    std: Tuple[float, ...] = INCEPTION_STD
    #: evaluation keeps this share of the image (resize to size / crop_pct, centre crop)
    crop_pct: float = 0.9
    interpolation: str = "bicubic"
    #: how that resize treats the aspect: 'center' keeps it (the shorter side to size / crop_pct, timm's
    #: default), 'squash' does not (the whole image to size / crop_pct: timm's crop_mode='squash', the
    #: Hugging Face processors that resize to a height and width: ViT, DeiT, BEiT, SigLIP)
    crop_mode: str = "center"
    #: where the centre crop starts when its margin is odd: half the margin 'round'ed (torchvision's and
    #: timm's CenterCrop) or 'floor'ed (transformers' image processors): one pixel apart
    crop_offset: str = "round"
    label_names: Optional[List[str]] = None
    #: what the head's outputs are (``HEAD_KINDS``): 'projection' is an image-text embedding, not classes
    head_kind: str = "classes"
    #: the family (what ``config.json`` is rebuilt by); each family's config sets its own
    architecture: str = "vit"
    name: Optional[str] = None

    def _architecture_problems(self) -> List[str]:
        own = type(self).__dataclass_fields__["architecture"].default
        return [] if self.architecture == own else [f"architecture must be {own!r}, got {self.architecture!r}"]


@dataclass
class TokenConfig(ImageConfig):
    """The fields every patch-token family shares, and their checks.

    Defaults are the ViT-B/16 of the paper; families redeclare the defaults that differ.
    """

    KIND: ClassVar[str] = "token model"
    #: dropout-rate fields, each checked to lie in [0, 1)
    RATES: ClassVar[Tuple[str, ...]] = ("drop_rate", "attn_drop_rate", "drop_path_rate")
    #: the readouts the family has (``global_pool``'s values)
    POOLS: ClassVar[Tuple[str, ...]] = GLOBAL_POOLS

    patch_size: Tuple[int, int] = (16, 16)
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    #: the readout: the class token, or the mean of the patch tokens
    global_pool: str = "token"
    qkv_bias: bool = True
    norm_eps: float = 1e-6
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    #: stochastic depth (linear over depth, or as the family's paper says)
    drop_path_rate: float = 0.0
    #: 'auto' (fused SDPA; the explicit path for CPU training, faster there), 'sdpa', 'explicit'.
    attn_impl: str = "auto"
    #: any input size at run time, position embeddings resampled for its grid
    dynamic_img_size: bool = False
    #: the image size the learned position table is held at where it is not ``img_size`` (None: img_size's):
    #: timm's ``dynamic_img_size`` model saved at one size and served at another keeps its table and resamples
    #: it to each input's grid in the forward; so does vitkit, and every input size gets timm's answer
    pos_embed_size: Optional[Tuple[int, int]] = None
    #: How position embeddings are resampled for a new grid (dynamic size, set_input_size).
    pos_embed_interpolation: str = "bicubic"
    pos_embed_antialias: bool = True
    #: How a relative-bias table (``pos_embed='relative'``) meets another grid: 'keep' each offset's bias
    #: (vitkit's), 'bilinear': stretch the table as transformers' BEiT does (read from its folders), or
    #: 'geometric': as BEiT's fine-tuning code and timm do (timm's BEiT names).
    rel_pos_resize: str = "keep"

    def __post_init__(self) -> None:
        for name in ("img_size", "patch_size"):
            try:
                setattr(self, name, to_2tuple(getattr(self, name)))
            except (TypeError, ValueError):
                raise ValueError(f"invalid {self.KIND} config: {name} must be an int or a pair (H, W) of ints, "
                                 f"got {getattr(self, name)!r}") from None
        if self.pos_embed_size is not None:
            try:
                self.pos_embed_size = to_2tuple(self.pos_embed_size)
            except (TypeError, ValueError):
                raise ValueError(f"invalid {self.KIND} config: pos_embed_size must be an int or a pair (H, W) of "
                                 f"ints, got {self.pos_embed_size!r}") from None
            if self.pos_embed_size == self.img_size:  # one size: the table is img_size's
                self.pos_embed_size = None
        self.validate()

    def validate(self) -> None:
        """Raise one ValueError listing every problem of the configuration."""
        problems = self._architecture_problems()
        problems += self._positive_int_problems(("embed_dim", "depth", "num_heads", "in_chans"))
        if _is_int(self.num_heads) and self.num_heads > 0 and _is_int(self.embed_dim) and self.embed_dim > 0 \
                and self.embed_dim % self.num_heads:
            problems.append(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if not _is_int(self.num_classes) or self.num_classes < 0:
            problems.append(f"num_classes must be an integer >= 0, got {self.num_classes!r}")
        if self.global_pool not in self.POOLS:
            problems.append(f"global_pool must be one of {self.POOLS}, got {self.global_pool!r}")
        if self.attn_impl not in ATTN_IMPLS:
            problems.append(f"attn_impl must be one of {ATTN_IMPLS}, got {self.attn_impl!r}")
        if self.pos_embed_interpolation not in INTERPOLATIONS:
            problems.append(f"pos_embed_interpolation must be one of {INTERPOLATIONS}")
        if self.rel_pos_resize not in RELATIVE_RESIZES:
            problems.append(f"rel_pos_resize must be one of {RELATIVE_RESIZES}, got {self.rel_pos_resize!r}")
        for rate in self.RATES:
            value = getattr(self, rate)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                problems.append(f"{rate} must be in [0, 1), got {value!r}")  # (false passed as the rate 0)
        for name in ("img_size", "patch_size"):
            if min(getattr(self, name)) <= 0:
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        for name, bound in (("depth", MAX_DEPTH), ("embed_dim", MAX_WIDTH)):
            if _is_int(getattr(self, name)) and getattr(self, name) > bound:
                problems.append(f"{name} {getattr(self, name):,} is past {bound:,} (ViT-22B: depth 48, width 6,144)")
        too_large = max(self.img_size) > MAX_IMG_SIZE
        if too_large:
            problems.append(f"img_size {self.img_size} is past {MAX_IMG_SIZE:,} px a side (about a million 16 px "
                            f"patches; attention could not hold it)")
        if not isinstance(self.norm_eps, (int, float)) or not 0 < self.norm_eps < 1:
            problems.append(f"norm_eps must be in (0, 1), got {self.norm_eps!r}")
        problems += self.family_problems()
        if min(self.img_size) > 0 and min(self.patch_size) > 0 and not too_large:  # (its nearest multiples: too)
            problems += self.grid_problems()
        problems += self._table_size_problems()
        problems += self._io_problems()
        if problems:
            raise ValueError(f"invalid {self.KIND} config: " + "; ".join(problems))

    def family_problems(self) -> List[str]:
        """The checks of the family's own fields."""
        return []

    def grid_problems(self) -> List[str]:
        """img_size must be a whole number of patches (sizes are positive here)."""
        if not any(i % p for i, p in zip(self.img_size, self.patch_size)):
            return []
        near = [sorted({(i // p) * p, (i // p + 1) * p} - {0}) for i, p in zip(self.img_size, self.patch_size)]
        if near[0] == near[1]:  # a square size's sides: said once
            near = near[:1]
        return [f"img_size {self.img_size} is not divisible by patch_size {self.patch_size} "
                f"(nearest multiples: {' / '.join(' or '.join(map(str, n)) for n in near)})"]

    def _table_size_problems(self) -> List[str]:
        """``pos_embed_size``: a learned table's, whole patches, in a model that resamples it to each input."""
        size = self.pos_embed_size
        if size is None:
            return []
        if min(size) <= 0 or max(size) > MAX_IMG_SIZE:
            return [f"pos_embed_size must be positive and at most {MAX_IMG_SIZE:,} px a side, got {size}"]
        problems = []
        if self.dynamic_img_size is not True:
            problems.append("pos_embed_size needs dynamic_img_size=True: a table held at another size than img_size "
                            "is resampled to each input's grid, as timm's dynamic_img_size model does")
        kind = getattr(self, "pos_embed", "learned")
        if kind not in ("learned", "factorized"):
            problems.append(f"pos_embed_size is the size of a learned table: it needs pos_embed='learned' (or "
                            f"timm's NaFlex 'factorized'), not {kind!r}")
        if getattr(self, "backbone", None) is not None:
            problems.append("pos_embed_size is for a patch embedding's grid, not a hybrid's backbone")
        elif min(self.patch_size) > 0 and any(s < p for s, p in zip(size, self.patch_size)):
            problems.append(f"pos_embed_size {size} is smaller than one patch {self.patch_size}")
        elif min(self.patch_size) > 0 and any(s % p for s, p in zip(size, self.patch_size)) \
                and not getattr(self, "crop_remainder", False):  # (SigLIP so400m/14's 384 px: 27x27 patches)
            problems.append(f"pos_embed_size {size} is not divisible by patch_size {self.patch_size}")
        return problems

    @property
    def grid_size(self) -> IntPair:
        return (self.img_size[0] // self.patch_size[0], self.img_size[1] // self.patch_size[1])

    @property
    def table_grid(self) -> IntPair:
        """The grid the learned position table is held at: ``pos_embed_size``'s, else the image's."""
        if self.pos_embed_size is None:
            return self.grid_size
        return (self.pos_embed_size[0] // self.patch_size[0], self.pos_embed_size[1] // self.patch_size[1])

    @property
    def token_patch_size(self) -> IntPair:
        """Pixels per token side."""
        return self.patch_size
