"""Hugging Face transformers' ViT layout: ``ViTModel`` / ``ViTForImageClassification`` and the classes
that share its layers (``model_type`` of config.json):

- ``vit``, ``vit_msn`` (MSN's checkpoints are ViTs), ``vit_mae`` (its encoder);
- ``deit``: a distillation token after the class token (its slot in the position table too).
  ``DeiTForImageClassificationWithTeacher`` averages the class and distillation heads, as timm's DeiT does;
  ``DeiTForImageClassification`` and ``DeiTModel`` read the class token alone (``distill_head=False``: the
  distillation token is one more prefix token);
- ``ijepa``: I-JEPA's encoder, no class token, a table over the patches; its classifier reads the mean
  of the normalised tokens (``global_pool='avg'``, ``fc_norm=False``).

HF keeps query/key/value as separate Linear layers and names everything differently; its
ViT checkpoints use LayerNorm eps 1e-12 (read from their ``config.json``). ``ViTModel``'s
pooler (dense + tanh on the class token) is the paper's pre-logits layer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from ..files import write_json
from ..models import ViTConfig
from ..models.positions import full_table
from .hf_tower_parts import labels_from_hf, labels_to_hf, preprocessing, processor_fields
from .io import WeightsError

#: an image processor's config saved alone, and a whole processor's (its image processor's under "image_processor":
#: what transformers 5 writes for CLIP's, SigLIP's, a VLM's processor, and reads before the other)
PREPROCESSOR_FILE, PROCESSOR_FILE = "preprocessor_config.json", "processor_config.json"

#: a layer's parameters: ``encoder.layer.N.`` on the hub and in saved files, ``layers.N.`` in a
#: transformers 5 model's own state dict
_BLOCK = re.compile(r"^(?:encoder\.layer|layers)\.(\d+)\.(.+)$")
_BLOCK_NAMES = {
    "layernorm_before": "norm1",
    "layernorm_after": "norm2",
    "attention.output.dense": "attn.proj",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
}
#: transformers 5's in-memory names of the same parameters
_BLOCK_NAMES_V5 = {"attention.o_proj": "attn.proj", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
_QKV = re.compile(r"^attention\.(?:attention\.(query|key|value)|(q|k|v)_proj)\.(weight|bias)$")
_QKV_PARTS = {"q": "query", "k": "key", "v": "value"}
_TOP_NAMES = {
    "embeddings.cls_token": "cls_token",
    "embeddings.distillation_token": "dist_token",
    "embeddings.position_embeddings": "pos_embed",
    "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "layernorm.weight": "norm.weight",
    "layernorm.bias": "norm.bias",
    "pooler.dense.weight": "pre_logits.fc.weight",
    "pooler.dense.bias": "pre_logits.fc.bias",
    "classifier.weight": "head.weight",
    "classifier.bias": "head.bias",
    "cls_classifier.weight": "head.weight",
    "cls_classifier.bias": "head.bias",
    "distillation_classifier.weight": "head_dist.weight",
    "distillation_classifier.bias": "head_dist.bias",
}
#: model_type -> the base model's prefix in a classifier's checkpoint
MODEL_TYPES = {"vit": "vit.", "vit_mae": "vit.", "vit_msn": "vit.", "deit": "deit.", "ijepa": "ijepa."}
_PREFIXES = tuple(sorted(set(MODEL_TYPES.values())))
_GELU = {"gelu": "exact", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh"}


def is_hf(keys) -> bool:
    """Hugging Face names: ViT's and DINOv2's patch projection, CLIP's and SigLIP's, DINOv3's, AIMv2's, SAM's."""
    return any(k.endswith(("embeddings.patch_embeddings.projection.weight", "embeddings.patch_embedding.weight",
                           "embeddings.patch_embed.weight", "vision_encoder.patch_embed.projection.weight"))
               or k == "embeddings.patch_embeddings.weight" for k in keys)


class LayerNames:
    """Collects the parameters of HF transformer layers and gives them vitkit's block names
    (``{prefix}N.norm1`` ...), fusing query/key/value into one qkv projection."""

    def __init__(self, prefix: str = "blocks."):
        self.prefix = prefix
        self.out: Dict[str, torch.Tensor] = {}
        self.qkv: Dict[tuple, torch.Tensor] = {}

    def add(self, layer: str, rest: str, value: torch.Tensor) -> bool:
        """Take ``rest`` (the name within layer ``layer``); False when it is no layer parameter."""
        qm = _QKV.match(rest)
        if qm:
            part = qm.group(1) or _QKV_PARTS[qm.group(2)]
            self.qkv[(layer, qm.group(3), part)] = value
            return True
        name, _, leaf = rest.rpartition(".")
        native = _BLOCK_NAMES.get(name) or _BLOCK_NAMES_V5.get(name)
        if native is None:
            return False
        self.out[f"{self.prefix}{layer}.{native}.{leaf}"] = value
        return True

    def finish(self) -> Dict[str, torch.Tensor]:
        for (i, leaf) in sorted({(i, leaf) for (i, leaf, _) in self.qkv}):
            parts = [self.qkv.get((i, leaf, p)) for p in ("query", "key", "value")]
            if any(p is None for p in parts):
                raise WeightsError(f"layer {i}: query/key/value {leaf} incomplete in the HF checkpoint")
            self.out[f"{self.prefix}{i}.attn.qkv.{leaf}"] = torch.cat(parts, dim=0)
        return self.out


def _deit_pixel_decoder(keys) -> bool:
    """DeiTForMaskedImageModeling: its encoder under ``deit.``, SimMIM's pixel decoder beside it."""
    keys = set(keys)
    return "decoder.0.weight" in keys and "deit.embeddings.distillation_token" in keys


def to_native(sd: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """HF names -> vitkit names; q, k, v are fused into one qkv projection. DeiT's masked-image-modelling class
    is read as its encoder (its pixel decoder and mask token left out: vitkit's SimMIM has no distillation
    token)."""
    out: Dict[str, torch.Tensor] = {}
    layers = LayerNames()
    if _deit_pixel_decoder(sd):
        sd = {k: v for k, v in sd.items() if not k.startswith("decoder.") and k != "deit.embeddings.mask_token"}
    for key, value in sd.items():
        k = next((key[len(p):] for p in _PREFIXES if key.startswith(p)), key)
        if k in _TOP_NAMES:
            out[_TOP_NAMES[k]] = value
            continue
        m = _BLOCK.match(k)
        if m is None or not layers.add(m.group(1), m.group(2), value):
            out[f"unmapped:{key}"] = value  # reported as unexpected by name
    out.update(layers.finish())
    return out


def layers_from_native(sd: Mapping[str, torch.Tensor], prefix: str, hf_prefix: str, width: int
                       ) -> Dict[str, torch.Tensor]:
    """vitkit block parameters ``{prefix}N.*`` -> HF layer names ``{hf_prefix}N.*`` (the hub's)."""
    inv_block = {v: k for k, v in _BLOCK_NAMES.items()}
    out: Dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        m = re.match(rf"^{re.escape(prefix)}(\d+)\.(.+)\.(weight|bias)$", key)
        if not m:
            continue
        i, name, leaf = m.groups()
        if name == "attn.qkv":
            for part, chunk in zip(("query", "key", "value"), value.split(width, dim=0)):
                out[f"{hf_prefix}{i}.attention.attention.{part}.{leaf}"] = chunk.contiguous()
        elif name in inv_block:
            out[f"{hf_prefix}{i}.{inv_block[name]}.{leaf}"] = value.contiguous()
        else:
            raise _no_place(key)
    return out


def model_type_of(cfg: ViTConfig) -> str:
    """The class family a ViT exports as: DeiT with a distillation token, I-JEPA without a class token."""
    return "deit" if cfg.distill_token else "ijepa" if not cfg.class_token else "vit"


def from_native(model) -> Dict[str, torch.Tensor]:
    """vitkit model -> HF state dict (``ViTForImageClassification`` or ``ViTModel``, DeiT's or I-JEPA's)."""
    cfg = model.config
    _check_exportable(cfg)
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if cfg.global_pool == "token" and cfg.use_fc_norm:  # the class token's own LayerNorm: HF's final one, as alike
        sd.update({f"norm.{k}": sd.pop(f"fc_norm.{k}") for k in ("weight", "bias")})
    classify = cfg.num_classes > 0
    root = MODEL_TYPES[model_type_of(cfg)] if classify else ""
    inv_top = {v: k for k, v in _TOP_NAMES.items() if not k.startswith("cls_classifier.")}
    for key in sd:
        if not (key.startswith(("pos_embed", "cls_token", "head.", "pre_logits.", "blocks.")) or key in inv_top):
            raise _no_place(key)
    out = layers_from_native(sd, "blocks.", f"{root}encoder.layer.", cfg.embed_dim)
    for native, hf in inv_top.items():
        if native in sd and not native.startswith(("head.", "head_dist.", "pre_logits.")):
            out[root + hf] = sd[native].contiguous()
    out[root + "embeddings.position_embeddings"] = full_table(model).cpu().contiguous()
    if classify and "head_dist.weight" in sd:  # DeiTForImageClassificationWithTeacher
        out["cls_classifier.weight"], out["cls_classifier.bias"] = sd["head.weight"], sd["head.bias"]
        out["distillation_classifier.weight"] = sd["head_dist.weight"]
        out["distillation_classifier.bias"] = sd["head_dist.bias"]
    elif classify:
        out["classifier.weight"], out["classifier.bias"] = sd["head.weight"], sd["head.bias"]
    elif cfg.representation_size:
        out["pooler.dense.weight"], out["pooler.dense.bias"] = sd["pre_logits.fc.weight"], sd["pre_logits.fc.bias"]
    return out


def _no_place(key: str) -> WeightsError:
    """A parameter Hugging Face's ViT has no layer for (one _check_exportable does not name: said the same way)."""
    return WeightsError(f"cannot export to Hugging Face ViT: it has no layer for {key!r}; export it as 'vitkit' or "
                        f"'timm'")


def _check_exportable(cfg: ViTConfig) -> None:
    problems = []
    if getattr(cfg, "rope", "none") != "none":
        problems.append("HF ViT has no rotary positions (an EVA-style model: export it as 'vitkit' or 'timm')")
    if cfg.pre_norm:
        problems.append("HF ViT has no norm after the embedding (CLIP's ln_pre: a CLIP tower exports as "
                        "CLIPVisionModel)")
    if cfg.backbone is not None and cfg.backbone.get("type") == "resnetv2":
        problems.append("a ResNet hybrid is not an HF ViT (transformers' ViTHybrid/BiT layout is not "
                        "implemented); export it as 'vitkit', 'timm' or 'npz'")
    elif cfg.backbone is not None:  # (the official layout has only ResNet hybrids)
        problems.append(f"a hybrid of a {cfg.backbone.get('type')!r} stem is not an HF ViT; export it as 'vitkit' "
                        f"or 'timm'")
    if cfg.class_token and cfg.global_pool != "token":
        problems.append(f"HF ViT pools the class token (needs global_pool='token', not {cfg.global_pool!r}; "
                        f"without a class token, I-JEPA pools the mean of the normalised tokens)")
    if not cfg.class_token and (cfg.global_pool != "avg" or cfg.use_fc_norm or cfg.representation_size):
        problems.append("HF's ViT without a class token is I-JEPA: the mean of the normalised tokens "
                        "(global_pool='avg', fc_norm=False, no representation_size)")
    if cfg.init_values:
        problems.append("HF ViT has no LayerScale")
    if cfg.pos_embed == "none":
        problems.append("HF ViT always adds a position embedding")
    if cfg.pos_embed == "relative":
        problems.append("HF ViT has no relative position bias (export as 'vitkit' or 'timm')")
    if cfg.distill_token and cfg.distill_head and cfg.num_classes == 0:
        problems.append("DeiTModel reads the class token, where this model averages it with the distillation "
                        "token (give it its classes, or distill_head=False)")
    if cfg.representation_size and cfg.num_classes:
        problems.append("ViTForImageClassification has no pre-logits layer "
                        "(a ViTModel pooler needs num_classes=0 and representation_size == embed_dim)")
    if cfg.representation_size and cfg.representation_size != cfg.embed_dim:
        problems.append("HF's pooler keeps the width (representation_size must equal embed_dim)")
    if problems:
        raise WeightsError("cannot export to Hugging Face ViT: " + "; ".join(problems))


def config_to_hf(cfg: ViTConfig) -> Dict[str, Any]:
    square = cfg.img_size[0] == cfg.img_size[1] and cfg.patch_size[0] == cfg.patch_size[1]
    classify = cfg.num_classes > 0
    kind = model_type_of(cfg)
    name = {"vit": "ViT", "deit": "DeiT", "ijepa": "IJepa"}[kind]
    teacher = "WithTeacher" if cfg.distill_token and cfg.distill_head else ""
    out: Dict[str, Any] = {
        "model_type": kind,
        "architectures": [f"{name}ForImageClassification{teacher}" if classify else f"{name}Model"],
        "hidden_size": cfg.embed_dim,
        "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.mlp_dim,
        "hidden_act": "gelu" if cfg.gelu == "exact" else "gelu_pytorch_tanh",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "initializer_range": 0.02,
        "layer_norm_eps": cfg.norm_eps,
        "image_size": cfg.img_size[0] if square else list(cfg.img_size),
        "patch_size": cfg.patch_size[0] if square else list(cfg.patch_size),
        "num_channels": cfg.in_chans,
        "qkv_bias": cfg.qkv_bias,
        "encoder_stride": cfg.patch_size[0],
    }
    if classify:
        out.update(labels_to_hf(cfg))
    return out


def preprocessor_to_hf(cfg: ViTConfig) -> Dict[str, Any]:
    """The image processor of vitkit's preprocessing: ViT's (a resize to the size, nothing cropped) where it
    is that, else DeiT's (a resize to a height and width, then the centre crop) or BiT's (the shorter side,
    then the centre crop)."""
    fields = processor_fields(cfg)
    kind = "BitImageProcessor" if "shortest_edge" in fields["size"] else \
        "DeiTImageProcessor" if fields.get("do_center_crop") else "ViTImageProcessor"
    return {"image_processor_type": kind, **fields}


def read_json_object(path: Path) -> Optional[Dict[str, Any]]:
    """A JSON file that must hold an object (a config), or None where there is no file."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise WeightsError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise WeightsError(f"{path} must hold a JSON object, not {type(data).__name__}")
    return data


def read_image_processor(folder: Path) -> Tuple[Optional[Dict[str, Any]], str]:
    """A folder's image processor config and the file it is read from, as transformers' ``AutoImageProcessor``
    reads it: the ``image_processor`` inside ``processor_config.json`` (what a whole processor's ``save_pretrained``
    writes since transformers 5: CLIP's, SigLIP's, a VLM's), else ``preprocessor_config.json``."""
    processor = read_json_object(folder / PROCESSOR_FILE)
    nested = (processor or {}).get("image_processor")
    if nested is not None:
        if not isinstance(nested, dict):
            raise WeightsError(f"{folder / PROCESSOR_FILE}: its \"image_processor\" must be a JSON object, not "
                               f"{type(nested).__name__}")
        return nested, f"{PROCESSOR_FILE} (its image_processor)"
    return read_json_object(folder / PREPROCESSOR_FILE), PREPROCESSOR_FILE


def write_preprocessor(into: Path, held: Path, processor: Dict[str, Any]) -> None:
    """``processor`` written into ``into`` (the folder being written as ``held``) as ``preprocessor_config.json``;
    where ``held`` has a whole processor's ``processor_config.json``, whose image processor transformers reads
    first, that file too, its ``image_processor`` replaced and the rest (the processor's class, its text side's
    settings) kept: a stale one would give transformers the old model's preprocessing."""
    write_json(into / PREPROCESSOR_FILE, processor)
    try:
        whole = json.loads((held / PROCESSOR_FILE).read_text())
    except (OSError, ValueError):  # none (or none readable: replaced by nothing, as a model file the folder held)
        return
    if isinstance(whole, dict) and "image_processor" in whole:
        write_json(into / PROCESSOR_FILE, {**whole, "image_processor": processor})


def config_from_hf(hf: Mapping[str, Any], sd: Optional[Mapping[str, Any]] = None,
                   preprocessor: Optional[Mapping[str, Any]] = None, **overrides: Any) -> ViTConfig:
    """HF ``config.json`` (+ ``preprocessor_config.json``) -> ViTConfig."""
    kind = hf.get("model_type")
    if kind not in MODEL_TYPES:
        from .hf_towers import MODEL_TYPES as TOWERS

        raise WeightsError(f"Hugging Face model_type {kind!r} is not one vitkit reads "
                           f"({', '.join(list(MODEL_TYPES) + list(TOWERS))})")
    act = hf.get("hidden_act", "gelu")
    if act not in _GELU:
        raise WeightsError(f"unsupported hidden_act {act!r} in HF config")
    keys = set(sd or ())
    heads = [k for k in keys if k.startswith(("classifier.", "cls_classifier."))]
    classify = bool(heads) if sd is not None else \
        any("ForImageClassification" in a for a in hf.get("architectures", []))
    id2label = hf.get("id2label") or {}
    num_classes = len(id2label) if classify else 0
    head = next((k for k in heads if k.endswith(".weight")), None)
    if head is not None:
        num_classes = sd[head].shape[0]
    labels = labels_from_hf(hf, num_classes) if head is not None or classify else None
    has_pooler = any(k.startswith("pooler.") for k in keys)
    if has_pooler and kind == "ijepa":
        raise WeightsError("an I-JEPA pooler (a dense layer on the first patch token) is not read: vitkit's I-JEPA "
                           "pools the mean of the tokens, as IJepaForImageClassification does")
    if has_pooler and not classify and hf.get("pooler_act", "tanh") != "tanh":
        raise WeightsError(f"the HF pooler uses pooler_act {hf['pooler_act']!r}; vitkit's pre-logits layer is the "
                           f"paper's tanh: load it as ViTForImageClassification or without the pooler")
    if hf.get("pooler_output_size") not in (None, hf["hidden_size"]) and has_pooler and not classify:
        raise WeightsError(f"pooler_output_size {hf['pooler_output_size']} differs from the width "
                           f"{hf['hidden_size']}; vitkit's pre-logits layer keeps the width")
    kw: Dict[str, Any] = dict(
        img_size=hf.get("image_size", 224), patch_size=hf.get("patch_size", 16),
        in_chans=hf.get("num_channels", 3), embed_dim=hf["hidden_size"],
        depth=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
        mlp_dim=hf["intermediate_size"], norm_eps=hf.get("layer_norm_eps", 1e-12),
        qkv_bias=hf.get("qkv_bias", True), gelu=_GELU[act], num_classes=num_classes,
        representation_size=hf["hidden_size"] if has_pooler and not classify else None,
        crop_pct=1.0,  # ViTImageProcessor resizes the whole image, no centre crop
        pos_embed_antialias=False,  # transformers resamples the table bicubic, not antialiased (timm does)
    )
    if kind == "deit":  # the teacher class averages its two heads; the others read the class token
        teacher = "distillation_classifier.weight" in keys if sd is not None else \
            any("WithTeacher" in a for a in hf.get("architectures", []))
        kw.update(distill_token=True, distill_head=teacher)
    elif kind == "ijepa":
        kw.update(class_token=False, global_pool="avg", fc_norm=False)
    if labels:
        kw["label_names"] = labels
    if preprocessor:
        kw.update(preprocessing(preprocessor, kind, hf.get("num_channels", 3)))
    kw.update(overrides)
    return ViTConfig(**kw)
