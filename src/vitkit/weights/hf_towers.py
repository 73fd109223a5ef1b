"""Hugging Face layouts of the later ViTs: CLIP, SigLIP, DINOv2 (with registers), DINOv3 and BEiT, both ways.

Each ``model_type`` of ``config.json`` is one row of :data:`TOWERS`: how its tensor names become
vitkit's (timm's), what vitkit architecture its config describes, and the reverse. What each class is
and how vitkit reads it (the facts that decide parity):

- ``clip_vision_model`` (``CLIPVisionModel``, ``...WithProjection``) and ``clip`` (``CLIPModel``: its vision
  tower and ``visual_projection``; the text tower is left out): the class embedding is ``cls_token``,
  ``pre_layrnorm`` is ``norm_pre`` (the patch projection has no bias), q/k/v are fused into ``qkv``,
  ``post_layernorm`` normalises the class token (vitkit normalises every token, then reads the class
  one: the same numbers); ``visual_projection`` (no bias) is the head, with a zero bias. ``quick_gelu``
  is CLIP's QuickGELU (OpenAI's weights).
- ``siglip_vision_model`` and ``siglip`` (vision tower): no class token, a position table over the
  patches; the MAP head's ``probe`` is ``attn_pool.latent``, its ``nn.MultiheadAttention`` packs q, k, v
  in ``in_proj_weight`` (q to ``attn_pool.q``, k and v to ``attn_pool.kv``); ``gelu_pytorch_tanh`` is the
  tanh GELU.
- ``siglip2_vision_model`` and ``siglip2``: SigLIP 2's NaFlex tower, SigLIP's with a Linear patch projection
  over flattened patches (the convolution's kernel, reordered) and a square base table that transformers
  resamples to every image's grid (bilinear, antialiased): vitkit does the same at every input size
  (one size per batch; NaFlex's padded batches of mixed sizes are transformers' own).
- ``dinov2`` and ``dinov2_with_registers``: LayerScale ``lambda1``; registers enter after the positions
  are added, so the class token's slot of the table is folded into ``cls_token`` (a constant added to a
  constant: exact) and the table covers the patches (timm's ``reg4_dinov2`` layout); the SwiGLU giant's
  ``weights_in`` / ``weights_out`` are the packed SwiGLU. ``mask_token`` (masked pre-training) is dropped.
  The pooled output is the normalised class token.
- ``dinov3_vit``: DINOv3's rotary positions (theta 100), registers, q and v biases without a k bias,
  ``up_proj``/``down_proj`` (or ``gate_proj`` too: SwiGLU); its pooled output is the normalised class
  token (``global_pool='token'``, where timm's DINOv3 averages the patches).
- ``sam_vision_model`` and ``sam`` (``SamVisionModel``, ``SamModel``'s ``vision_encoder``; the prompt encoder and
  mask decoder are left out): Segment Anything's encoder, windows, decomposed relative positions and the neck;
  see :mod:`.hf_tower_sam`.
- ``beit`` and ``data2vec-vision`` (``BeitModel``, ``BeitForImageClassification`` and data2vec-vision's
  same layout): the classifier too; relative position bias tables per layer, or one shared (read into
  each); see :mod:`.hf_tower_beit`.

Hub folders and ``save_pretrained`` folders store the hub's names; transformers 5's in-memory names
(``o_proj``, ``model.layer``) are read too.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from .hf_tower_aimv2 import AIMV2_TOWER
from .hf_tower_beit import BEIT_TOWER, DATA2VEC_VISION_TOWER
from .hf_tower_blip import BLIP_TOWER
from .hf_tower_clip import CLIP_TOWER, SIGLIP2_TOWER, SIGLIP_TOWER
from .hf_tower_dino import DINOV2_REGISTERS_TOWER, DINOV2_TOWER, DINOV3_TOWER
from .hf_tower_internvl import INTERNVL_TOWER
from .hf_tower_parts import (
    _OTHER_TOWER,
    _VISION_PREFIX,
    Tower,
    labels_from_hf,
    labels_to_hf,
    preprocessing,
    processor_fields,
    processor_size,
    sam_processor_fields,
)
from .hf_tower_sam import SAM_TOWER
from .io import WeightsError

# ----------------------------------------------------------------------------- the table

#: each tower's row lives with its layout (:mod:`.hf_tower_clip`, :mod:`.hf_tower_dino`)
TOWERS: Dict[str, Tower] = {
    "clip_vision_model": CLIP_TOWER,
    "siglip_vision_model": SIGLIP_TOWER,
    "siglip2_vision_model": SIGLIP2_TOWER,
    "dinov2": DINOV2_TOWER,
    "dinov2_with_registers": DINOV2_REGISTERS_TOWER,
    "dinov3_vit": DINOV3_TOWER,
    "beit": BEIT_TOWER,
    "data2vec-vision": DATA2VEC_VISION_TOWER,
    "aimv2_vision_model": AIMV2_TOWER,
    "sam_vision_model": SAM_TOWER,
    "internvl_vision": INTERNVL_TOWER,
    **dict.fromkeys(("blip_vision_model", "blip_2_vision_model", "instructblip_vision_model"), BLIP_TOWER),
}
#: other releases' towers that are another tower's layout (its names, its function): read as it, written as it
#: (MetaCLIP 2's, Chinese-CLIP's, AltCLIP's and OWL-ViT's image towers are CLIP's; SAM-HQ's encoder is SAM's;
#: SmolVLM's and Idefics3's are SigLIP's without its head, the positions of a whole image at its size its own)
SAME_LAYOUT = {**dict.fromkeys(("metaclip_2_vision_model", "chinese_clip_vision_model", "altclip_vision_model",
                                "owlvit_vision_model"), "clip_vision_model"), "sam_hq_vision_model": "sam_vision_model",
               **dict.fromkeys(("smolvlm_vision", "idefics3_vision"), "siglip_vision_model")}
#: VLMs whose tower is read from beside their language model (``model.vision_model.``; the rest is not read)
VLMS = {"smolvlm": "siglip_vision_model", "idefics3": "siglip_vision_model"}
VLM_PREFIX = "model.vision_model."
#: where a VLM of another model_type (LLaVA's, PaliGemma's, Aya Vision's: a ``vision_config`` of a tower vitkit
#: reads) keeps its tower, as transformers saves it and as the hub's files have it; then SmolVLM's
VLM_TOWER_PREFIXES = ("model.vision_tower.vision_model.", "vision_tower.vision_model.", "model.vision_tower.",
                      "vision_tower.", VLM_PREFIX)
#: the language model's names beside a VLM's tower (what tells a VLM's checkpoint from a tower's)
LANGUAGE_PREFIXES = ("model.text_model.", "language_model.", "model.language_model.")
#: two-tower (image and text) checkpoints: their vision config and tower
TWO_TOWERS = {"clip": "clip_vision_model", "siglip": "siglip_vision_model", "siglip2": "siglip2_vision_model",
              "aimv2": "aimv2_vision_model", "sam": "sam_vision_model",
              **dict.fromkeys(("metaclip_2", "chinese_clip", "altclip", "owlvit"), "clip_vision_model"),
              "sam_hq": "sam_vision_model", **VLMS}
MODEL_TYPES = tuple(TOWERS) + tuple(SAME_LAYOUT) + tuple(TWO_TOWERS)
#: the towers whose position table transformers resamples (``interpolate_pos_encoding``) bicubic without
#: antialiasing, where timm antialiases: vitkit reads them with transformers' resampling, so at any image
#: size it computes what transformers computes (DINOv2 with registers antialiases; SigLIP 2 resamples its own
#: way; DINOv3 has no table)
PLAIN_BICUBIC = ("clip_vision_model", "siglip_vision_model", "dinov2", "beit", "data2vec-vision", "internvl_vision",
                 "blip_vision_model", "blip_2_vision_model", "instructblip_vision_model")
#: towers transformers runs at whatever size their processor makes (DINOv2's table is resampled on each call,
#: DINOv3's rotations follow the grid): read at the processor's size, not the config's. facebook/dinov2-*
#: folders say image_size 518 and crop 224: vitkit ran them at 518 px, other features than transformers' (0.4 off)
AT_PROCESSOR_SIZE = ("dinov2", "dinov2_with_registers", "dinov3_vit")
#: towers whose learned table transformers resamples from the stored one to every input's grid: a model built
#: at another size holds it where it was stored (``pos_embed_size``), not resampled once (then again from there:
#: 1.7e-4 off SigLIP 2 at the size asked, its table resampled bicubic at loading where transformers' is bilinear)
TABLE_EVERY_CALL = ("dinov2", "dinov2_with_registers", "siglip2_vision_model", "internvl_vision")


#: detectors of a model_type vitkit reads the towers of: refused by class, naming the class that holds the tower
DETECTORS = {"OwlViTForObjectDetection": "OwlViTModel"}


def vlm_vision_config(hf: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    """The ``vision_config`` of a VLM of a model_type vitkit does not list whose tower is one it reads (LLaVA's
    CLIP, PaliGemma's SigLIP, ...), else None."""
    vision = hf.get("vision_config")
    if hf.get("model_type") in MODEL_TYPES or not isinstance(vision, Mapping):
        return None
    return vision if vision.get("model_type") in tuple(TOWERS) + tuple(SAME_LAYOUT) else None


def reads(hf: Optional[Mapping[str, Any]]) -> bool:
    """Whether a config.json is one of the towers' (its model_type, or a VLM's tower: :func:`vlm_vision_config`)."""
    return isinstance(hf, Mapping) and (hf.get("model_type") in MODEL_TYPES or vlm_vision_config(hf) is not None)


def tower_of(hf: Mapping[str, Any]) -> Tuple[str, Mapping[str, Any]]:
    """(the tower's model_type, the tower's own config) of a config.json."""
    for cls in set(hf.get("architectures") or ()) & set(DETECTORS):
        raise WeightsError(f"{cls} is an object detector (its class and box heads read every image token), where "
                           f"vitkit reads image towers and classifiers: its image tower is {DETECTORS[cls]}'s "
                           f"(transformers' {DETECTORS[cls]}.from_pretrained loads it from this folder; save that)")
    kind = hf.get("model_type")
    if (vision := vlm_vision_config(hf)) is not None:  # LLaVA's, PaliGemma's, ...: a tower vitkit reads inside
        return SAME_LAYOUT.get(vision["model_type"], vision["model_type"]), vision
    if kind in TWO_TOWERS:
        vision = hf.get("vision_config")
        if not isinstance(vision, Mapping):
            raise WeightsError(f"a {kind} config.json without a vision_config object")
        return TWO_TOWERS[kind], vision
    kind = SAME_LAYOUT.get(kind, kind)
    if kind not in TOWERS:
        raise WeightsError(f"Hugging Face model_type {kind!r} is not one of vitkit's ({', '.join(MODEL_TYPES)}, vit)")
    return kind, hf


def vision_part(sd: Mapping[str, torch.Tensor], only_tower: bool = False) -> Dict[str, torch.Tensor]:
    """The vision tower's tensors of a (possibly two-tower) checkpoint, without its prefix (the text
    tower, text projection and logit scale are left out: a vision model has no use for them)."""
    prefix = next((p for p in VLM_TOWER_PREFIXES + (_VISION_PREFIX,) + _BASE_PREFIXES
                   if any(k.startswith(p) for k in sd)), None)
    out = {}
    for key, value in sd.items():
        if key.startswith(_OTHER_TOWER) or ((only_tower or prefix in VLM_TOWER_PREFIXES) and prefix and
                                            not key.startswith(prefix)):
            continue  # (a VLM's language model, connector and projector: not the tower's)
        if prefix and key.startswith(prefix):
            key = key[len(prefix):]
        out[key] = value
    return out


#: transformers' ``CLIPForImageClassification`` / ``SiglipForImageClassification``: the tower's config fields
#: their ``classifier`` reads through, and the tower's parts it does not read (kept out: they change no logit).
#: CLIP's: the mean of the patch tokens as the encoder leaves them (``post_layernorm`` normalises only the
#: pooled class token, which the classifier does not read); SigLIP's: the mean of the normalised tokens
#: (the MAP head is computed and not read)
_CLASSIFIERS = {
    "clip_vision_model": (dict(global_pool="avg", final_norm=False, fc_norm=False), ("post_layernorm.",)),
    "siglip_vision_model": (dict(global_pool="avg", fc_norm=False), ("head.",)),
    "siglip2_vision_model": (dict(global_pool="avg", fc_norm=False), ("head.",)),
    # Dinov2(WithRegisters)ForImageClassification: the normalised class token beside the patches' mean
    "dinov2": (dict(global_pool="token_avg"), ()),
    "dinov2_with_registers": (dict(global_pool="token_avg"), ()),
}
#: the base model's prefix in a one-tower ...ForImageClassification checkpoint
_BASE_PREFIXES = ("dinov2.", "dinov2_with_registers.")
#: a classifier's config as its tower's (what the tower's checks and export take), and its classes' names
_AS_TOWER = {"clip_vision_model": (dict(global_pool="token", final_norm=True), "CLIPForImageClassification", "clip"),
             "siglip_vision_model": (dict(global_pool="map"), "SiglipForImageClassification", "siglip"),
             "dinov2": (dict(global_pool="token"), "Dinov2ForImageClassification", None)}


def _classifier_kind(config: Any) -> Optional[str]:
    """The tower whose ...ForImageClassification ``config`` is (its pooling and a head), or None."""
    if not getattr(config, "num_classes", 0) or getattr(config, "architecture", "vit") != "vit":
        return None  # (the classifiers are of ViT towers: another family's config cannot take their pooling)
    for kind, (fields, _, _) in _AS_TOWER.items():
        if kind == "siglip_vision_model" and config.gelu != "tanh":
            continue  # a class-token-free ViT of another activation is written as I-JEPA's (:mod:`.hf_format`)
        pooling = _CLASSIFIERS[kind][0]
        if all(getattr(config, k, None) == v for k, v in pooling.items()) and \
                not TOWERS[kind].problems(config.replace(num_classes=0, **fields)):
            return kind
    return None


def _without_classifier(kind: str, sd: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A ...ForImageClassification's ``classifier`` popped out of ``sd`` as vitkit's ``head`` (with the parts
    of the tower its logits do not read); {} for a tower without one."""
    if "classifier.weight" not in sd or kind not in _CLASSIFIERS:  # BEiT's tower reads its own classifier
        return {}
    for key in [k for k in sd if k.startswith(_CLASSIFIERS[kind][1])]:
        sd.pop(key)
    return {f"head.{leaf}": sd.pop(f"classifier.{leaf}") for leaf in ("weight", "bias") if f"classifier.{leaf}" in sd}


def to_native(sd: Mapping[str, torch.Tensor], hf: Mapping[str, Any]) -> Dict[str, torch.Tensor]:
    kind, tower = tower_of(hf)
    tensors = {k: v if isinstance(v, torch.Tensor) else torch.as_tensor(v)
               for k, v in vision_part(sd, vlm_vision_config(hf) is not None).items()}
    head = _without_classifier(kind, tensors)
    return {**TOWERS[kind].to_native(tensors, tower), **head}


def config_from_hf(hf: Mapping[str, Any], sd: Mapping[str, Any], preprocessor: Optional[Mapping[str, Any]] = None,
                   **overrides: Any):
    kind, tower = tower_of(hf)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads"):
        if not isinstance(tower.get(key), int) or isinstance(tower.get(key), bool):
            raise WeightsError(f"the {kind} config needs an integer {key}, got {tower.get(key)!r}")
    try:
        tensors = dict(vision_part(sd, vlm_vision_config(hf) is not None))
        head = _without_classifier(kind, tensors)
        if not head:
            _check_parts_held(hf, tower, tensors)
        config = TOWERS[kind].config(tower, tensors)
        if head:  # transformers' ...ForImageClassification: its pooling and labels (in the outer config)
            count = int(head["head.weight"].shape[0])
            labels = labels_from_hf(hf, count)
            config = config.replace(num_classes=count, label_names=labels, **_CLASSIFIERS[kind][0])
        if preprocessor and hf.get("model_type") in TILING:
            preprocessor = whole_image_view(preprocessor, tower)
        fields = preprocessing(preprocessor, hf.get("model_type"), tower.get("num_channels", 3)) if preprocessor \
            else {}  # (a processor config naming no class: the folder's model_type's, as AutoImageProcessor picks)
        if kind in PLAIN_BICUBIC:
            fields["pos_embed_antialias"] = False
        if hf.get("model_type") in TILING:  # its positions at another grid: the table's nearest slots (bucketed)
            fields.update(pos_embed_interpolation="nearest", pos_embed_antialias=False)
        return config.replace(**{**fields, **overrides})
    except WeightsError:  # said by the part that read it (a processor's field, a classifier's labels)
        raise
    except (ValueError, TypeError) as e:
        raise WeightsError(f"the {kind} config describes no model vitkit builds: {e}") from None


#: the part a class always holds, by the class its config names: (the part's tensors' prefix, the part in words)
_PARTS_OF_CLASS = {**dict.fromkeys(("CLIPModel", "CLIPVisionModelWithProjection", "MetaClip2Model",
                                     "MetaClip2VisionModelWithProjection", "ChineseCLIPModel", "AltCLIPModel",
                                     "OwlViTModel"), ("visual_projection.", "its visual_projection")),
                   "SiglipModel": ("head.", "its attention-pool head"),
                   "SiglipVisionModel": ("head.", "its attention-pool head"),
                   "Siglip2Model": ("head.", "its attention-pool head"),
                   "Siglip2VisionModel": ("head.", "its attention-pool head")}


#: the towers whose processor cuts each image into tiles and adds the whole image (SmolVLM's, Idefics3's)
TILING = ("smolvlm", "idefics3", "smolvlm_vision", "idefics3_vision")


def whole_image_view(pre: Mapping[str, Any], tower: Mapping[str, Any]) -> Dict[str, Any]:
    """SmolVLM's or Idefics3's processor as the view of the whole image it adds to the tiles: every image resized to
    the tower's size, its aspect not kept (SigLIP's processor), with the processor's scaling and statistics; its
    LANCZOS filter, which vitkit's resize does not use, read as bicubic, and its three resizes in a row as one
    (0.7% of the range apart on average; said on loading: pretrained's note)."""
    side = tower.get("image_size", 224)
    kept = {k: pre[k] for k in ("do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std") if k in pre}
    return {"image_processor_type": "SiglipImageProcessor", "size": {"height": side, "width": side}, "resample": 3,
            **kept}


def _check_parts_held(hf: Mapping[str, Any], tower: Mapping[str, Any], tensors: Mapping[str, Any]) -> None:
    """A file whose class always holds a part (CLIP's projection, SigLIP's attention-pool head) without any of its
    tensors: read as the tower without it, it gave other features (the pooled width, not the projection's; the
    tokens' mean, not the pool's), without a word, where transformers fills the part anew and says so."""
    for cls in hf.get("architectures") or ():
        prefix, part = _PARTS_OF_CLASS.get(cls, (None, None))
        if prefix is None or (prefix == "head." and not tower.get("vision_use_head", True)):
            continue
        if not any(key.startswith(prefix) for key in tensors):
            raise WeightsError(f"its config names {cls}, which holds {part}, where its weights hold no {prefix}* "
                               f"tensor: it was edited or mixed with other weights; fix or re-save it")


def run_size(hf: Mapping[str, Any], preprocessor: Optional[Mapping[str, Any]]) -> Optional[Tuple[int, int]]:
    """The image size transformers runs a tower at where its processor, not its config, decides it
    (:data:`AT_PROCESSOR_SIZE`); None for the others, or a processor that makes no fixed size."""
    kind = tower_of(hf)[0]
    return processor_size(preprocessor, kind) if preprocessor and kind in AT_PROCESSOR_SIZE else None


def table_every_call(hf: Mapping[str, Any]) -> bool:
    """transformers resamples this tower's stored table to each input's grid (:data:`TABLE_EVERY_CALL`)."""
    return tower_of(hf)[0] in TABLE_EVERY_CALL or hf.get("model_type") in TILING


def run_config(hf: Mapping[str, Any], preprocessor: Optional[Mapping[str, Any]], stored: Any) -> Any:
    """``stored`` as transformers runs the tower: at its processor's size (:func:`run_size`), the table held where
    transformers resamples it from on every call (:data:`TABLE_EVERY_CALL`); as it is where no other size is made."""
    from ..models.config_base import fit_table_size

    size = run_size(hf, preprocessor)
    if size is None or size == tuple(stored.img_size):
        return stored
    return stored.replace(**fit_table_size(stored, {"img_size": size}, table_every_call(hf)))


def holds_table_apart(config: Any) -> bool:
    """The tower ``config`` exports to keeps its table held at another size (``pos_embed_size``, square) as it is:
    transformers resamples it to each input, as the model does (its config's ``image_size`` is the table's)."""
    size = getattr(config, "pos_embed_size", None)
    return size is not None and size[0] == size[1] and layout_of(config) in TABLE_EVERY_CALL


def layout_of(config: Any) -> Optional[str]:
    """The tower's model_type a vitkit config exports to (the first whose problems are none), or None."""
    kind = next((k for k in ("clip_vision_model", "siglip_vision_model", "dinov2", "dinov3_vit", "beit",
                             "sam_vision_model")
                 if not TOWERS[k].problems(config)), None) or _classifier_kind(config)
    return "dinov2_with_registers" if kind == "dinov2" and config.reg_tokens else kind


def export_problems(config: Any) -> Dict[str, List[str]]:
    """Per tower of the config's family, what keeps ``config`` from its layout (for one message naming the
    nearest): an EVA-style model can only be DINOv3, a ViT one of the others."""
    arch = getattr(config, "architecture", "vit")
    kinds = ("dinov3_vit", "beit") if arch == "eva" else ("sam_vision_model",) if arch == "sam" else (
        "clip_vision_model", "siglip_vision_model", "dinov2")
    out: Dict[str, List[str]] = {}
    for kind in kinds:  # a classifier's own class first ("dinov2 cannot hold num_classes=3" hid that one)
        if getattr(config, "num_classes", 0) and kind in _AS_TOWER:
            fields, name, _ = _AS_TOWER[kind]
            try:
                as_tower = TOWERS[kind].problems(config.replace(num_classes=0, **fields))
            except ValueError:  # the tower's pooling is none this model can have (a class token's, without one)
                as_tower = [f"{k}={getattr(config, k, None)!r} (its tower reads {v!r})" for k, v in fields.items()
                            if getattr(config, k, None) != v and k not in _CLASSIFIERS[kind][0]]
            out[name] = as_tower + [
                f"{k}={getattr(config, k, None)!r} (it reads {v!r})" for k, v in _CLASSIFIERS[kind][0].items()
                if getattr(config, k, None) != v]
        out[kind] = TOWERS[kind].problems(config)
    return out


_PROCESSORS = {"clip_vision_model": "CLIPImageProcessor", "siglip_vision_model": "SiglipImageProcessor",
               "dinov2": "BitImageProcessor", "dinov2_with_registers": "BitImageProcessor",
               "dinov3_vit": "DINOv3ViTImageProcessor", "beit": "BeitImageProcessor",
               "sam_vision_model": "SamImageProcessor"}


def preprocessor_to_hf(config: Any, kind: str) -> Dict[str, Any]:
    """The tower's image processor config for vitkit's preprocessing (:func:`.hf_tower_parts.processor_fields`;
    SAM's processor pads: :func:`.hf_tower_parts.sam_processor_fields`)."""
    fields = sam_processor_fields(config) if kind == "sam_vision_model" else processor_fields(config)
    return {"image_processor_type": _PROCESSORS[kind], **fields}


def from_native(model) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """vitkit model -> (hub state dict, config.json) of the tower it is."""
    kind = layout_of(model.config)
    if kind is None:
        raise WeightsError("no Hugging Face vision tower expresses this model")
    sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    base = "dinov2" if kind == "dinov2_with_registers" else kind
    if _classifier_kind(model.config) != base:
        return TOWERS[kind].from_native(sd, model.config), TOWERS[kind].hf_config(model.config)
    return _classifier_from_native(sd, model.config, kind, base)


def _classifier_from_native(sd: Dict[str, torch.Tensor], config: Any, kind: str, base: str):
    """A classifier as transformers' ...ForImageClassification of its tower: the tower's tensors under the
    class's prefix, the head as ``classifier``. The tower's parts the classifier does not read are written as
    what changes nothing: CLIP's ``post_layernorm`` as an identity, SigLIP without its MAP head
    (``vision_use_head: false``)."""
    fields, cls, two_tower = _AS_TOWER[base]
    head = {f"classifier.{leaf}": sd.pop(f"head.{leaf}") for leaf in ("weight", "bias")}
    tower_config = config.replace(num_classes=0, **fields)
    if base == "clip_vision_model":
        sd["norm.weight"], sd["norm.bias"] = torch.ones(config.embed_dim), torch.zeros(config.embed_dim)
    tower = TOWERS[kind].from_native(sd, tower_config)
    prefix = _VISION_PREFIX if two_tower else f"{kind}."
    hf = TOWERS[kind].hf_config(tower_config)
    if base == "siglip_vision_model":
        hf["vision_use_head"] = False
    labels = labels_to_hf(config)
    if two_tower:
        hf.pop("architectures", None)
        hf = dict(model_type=two_tower, architectures=[cls], vision_config=hf, **labels)
    else:
        hf.update(architectures=[cls.replace("Dinov2", "Dinov2WithRegisters") if config.reg_tokens else cls],
                  **labels)
    return {**{prefix + k: v for k, v in tower.items()}, **head}, hf


__all__ = ["TOWERS", "TWO_TOWERS", "MODEL_TYPES", "reads", "vlm_vision_config", "tower_of", "to_native",
           "config_from_hf", "preprocessing", "layout_of", "table_every_call", "run_config", "holds_table_apart",
           "from_native", "export_problems", "vision_part", "preprocessor_to_hf"]
