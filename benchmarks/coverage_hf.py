"""Which of transformers' ViT-family image classes vitkit loads with parity, from their ``save_pretrained`` folders.

The companion of ``coverage.py`` (timm's list) for Hugging Face: every class transformers registers for the
ViT-family model types below (its auto mappings, plus the classes they leave out: ``...WithProjection``,
DeiT's teacher class, BEiT's masked-image-modelling class) is built small (width 64, 2 layers, 32 px,
patch 8) with every parameter noised, saved with ``save_pretrained`` and read with
``vitkit.from_pretrained(folder)``; the fp32 outputs of two images are compared: logits for a classifier,
the image embeddings of a two-tower model or a ``...WithProjection``, else the pooled output (or, with
none, the last hidden state against ``forward_features``). Rows: ``parity`` (max |difference| <= 1e-5 x
max(1, max |reference|)), ``refused`` (one line, kept), ``mismatch`` (loads, computes something else: a
bug), ``error`` (another exception: a bug), ``loaded`` (a pre-training class: vitkit builds its
pre-training model, compared in the tests, not here), ``skipped`` (transformers cannot build it small). A
``...Backbone`` is read with ``features_only=True`` and its feature maps compared. Every class with parity is
compared again at a non-square 32 x 48 (``wide``), vitkit with ``dynamic_img_size`` against transformers with
``interpolate_pos_encoding``: the position tables resampled as each library resamples them.

    python benchmarks/coverage_hf.py                       # every class (a minute)
    python benchmarks/coverage_hf.py --markdown docs/weights.md
    python benchmarks/coverage_hf.py --only '*Beit*'        # a shell pattern of class names
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import inspect
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch
import transformers
from transformers.models.auto import configuration_auto, modeling_auto

import vitkit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, however run
from bench_inference import dated_name, git_revision, machine_info, results_path  # noqa: E402

_spec = importlib.util.spec_from_file_location("vitkit_bench_coverage", Path(__file__).with_name("coverage.py"))
_timm_coverage = importlib.util.module_from_spec(_spec)  # by path: a `coverage` package may be imported already
_spec.loader.exec_module(_timm_coverage)
TOLERANCE, noised, one_line = _timm_coverage.TOLERANCE, _timm_coverage.noised, _timm_coverage.one_line
write_markdown, write_results = _timm_coverage.write_markdown, _timm_coverage.write_results

#: the ViT-family image model types (dense-prediction heads on a ViT, DPT and the like, are out of scope)
MODEL_TYPES = ("vit", "vit_mae", "vit_msn", "deit", "ijepa", "beit", "data2vec-vision", "dinov2",
               "dinov2_with_registers", "dinov3_vit", "clip", "clip_vision_model", "siglip", "siglip_vision_model",
               "siglip2", "siglip2_vision_model", "aimv2", "aimv2_vision_model", "vitdet", "timm_wrapper",
               "metaclip_2", "metaclip_2_vision_model", "chinese_clip", "chinese_clip_vision_model", "altclip",
               "altclip_vision_model", "owlvit", "owlvit_vision_model", "sam", "sam_vision_model", "sam_hq",
               "sam_hq_vision_model", "gemma4_vision", "smolvlm", "smolvlm_vision", "idefics3", "idefics3_vision",
               "llava", "llava_next", "llava_onevision", "vipllava", "paligemma", "gemma3", "aya_vision", "mistral3",
               "internvl_vision", "internvl", "blip", "blip_vision_model", "blip-2", "blip_2_vision_model",
               "instructblip", "instructblip_vision_model", "deepseek_vl", "cohere2_vision", "llava_next_video",
               "lfm2_vl")
#: classes the auto mappings do not name
EXTRA = {"clip_vision_model": ("CLIPVisionModelWithProjection",), "beit": ("BeitForMaskedImageModeling",),
         "metaclip_2_vision_model": ("MetaClip2VisionModel", "MetaClip2VisionModelWithProjection"),
         "altclip_vision_model": ("AltCLIPVisionModel",), "owlvit_vision_model": ("OwlViTVisionModel",),
         "blip_vision_model": ("BlipVisionModel",), "blip_2_vision_model": ("Blip2VisionModel",),
         "instructblip_vision_model": ("InstructBlipVisionModel",), "blip": ("BlipForImageTextRetrieval",),
         "deit": ("DeiTForImageClassificationWithTeacher", "DeiTForImageClassification")}
VISION = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32,
              patch_size=8)
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64,
            max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1)
TWO_TOWERS = ("clip", "siglip", "siglip2", "aimv2", "metaclip_2", "chinese_clip", "altclip", "owlvit", "sam",
              "sam_hq")
#: VLMs whose tower vitkit reads beside their language model (compared: the tower's tokens), and VLMs of other
#: model_types around a tower (compared: its pooled output), with that tower's model_type and their language model's
VLMS = ("smolvlm", "idefics3")
TOWER_VLMS = {"llava": ("clip_vision_model", "llama"), "llava_next": ("clip_vision_model", "llama"),
              "llava_onevision": ("siglip_vision_model", "qwen2"), "vipllava": ("clip_vision_model", "llama"),
              "paligemma": ("siglip_vision_model", "gemma"), "gemma3": ("siglip_vision_model", "gemma3_text"),
              "aya_vision": ("siglip_vision_model", "cohere2"), "mistral3": ("pixtral", "mistral"),
              "internvl": ("internvl_vision", "qwen2"), "deepseek_vl": ("siglip_vision_model", "llama"),
              "cohere2_vision": ("siglip_vision_model", "cohere2"), "llava_next_video": ("clip_vision_model", "llama"),
              "lfm2_vl": ("siglip2_vision_model", "lfm2")}
VLM_CLASSES = ("Llava", "VipLlava", "PaliGemma", "Gemma3", "AyaVision", "Mistral3", "InternVLModel", "InternVLFor",
               "DeepseekVL", "Cohere2Vision", "Lfm2Vl")
BLIP_MODELS = ("blip", "blip-2", "instructblip")
#: what a VLM's config needs at this size (Gemma 3 pools the 4 x 4 grid to 2 x 2 tokens; OneVision's tiles)
VLM_EXTRA = {"gemma3": dict(mm_tokens_per_image=4), "llava_onevision": dict(image_grid_pinpoints=[[32, 32], [32, 64]]),
             "vipllava": dict(vision_feature_layers=[-2, -1])}
TABLE = ("<!-- hf-coverage-table:start -->", "<!-- hf-coverage-table:end -->")
#: the non-square size every class is compared at too (a 4 x 6 grid of 8-pixel patches)
WIDE = (32, 48)


def classes(only: str | None = None) -> list:
    """(model_type, class name) of every class of the model types, as transformers registers them (``only``:
    a shell pattern of class names)."""
    mappings = [getattr(modeling_auto, n) for n in dir(modeling_auto)
                if n.startswith("MODEL_") and n.endswith("_MAPPING_NAMES")]
    rows = []
    for kind in MODEL_TYPES:
        names = set(EXTRA.get(kind, ()))
        for mapping in mappings:
            value = mapping.get(kind) if isinstance(mapping, dict) else None
            names.update([value] if isinstance(value, str) else value or ())
        rows += [(kind, name) for name in sorted(names)
                 if hasattr(transformers, name) and (not only or fnmatch.fnmatch(name, only))]
    return rows


def config_for(kind: str, cls: str):
    config_class = configuration_auto.CONFIG_MAPPING[kind]
    labels = dict(num_labels=3) if "Classification" in cls else {}
    vision = VISION if not kind.startswith("siglip2") else {
        **{k: v for k, v in VISION.items() if k != "image_size"}, "num_patches": 16}  # NaFlex: a 4 x 4 base table
    if kind.startswith("aimv2"):
        vision = dict(VISION, use_head=False)  # the pre-trained models (the LiT ones' pooling head is refused)
    if kind.startswith("sam"):  # windows of 2 x 2 patches, the second block global, a neck of 32 channels
        vision = dict(VISION, mlp_dim=128, window_size=2, global_attn_indexes=[1], output_channels=32)
    if kind == "gemma4_vision":  # the soft tokens of 2 x 2 blocks (the released 3 x 3 need a grid of whole blocks)
        vision = dict(VISION, pooling_kernel_size=2, position_embedding_size=16, num_key_value_heads=2, head_dim=16)
    if kind in TWO_TOWERS:
        return config_class(vision_config=vision, text_config=TEXT, **labels)
    if kind in BLIP_MODELS:  # a text model (BLIP's decoder; BLIP-2's Q-Former and OPT) of one layer
        text = dict(TEXT, encoder_hidden_size=VISION["hidden_size"], vocab_size=128)
        if kind == "blip":
            return config_class(vision_config=vision, text_config=text, projection_dim=16)
        qformer = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       encoder_hidden_size=VISION["hidden_size"])
        return config_class(vision_config=vision, qformer_config=qformer, num_query_tokens=4, text_config=dict(
            model_type="opt", hidden_size=32, ffn_dim=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=128,
            word_embed_proj_dim=32))
    if kind in TOWER_VLMS:
        tower, language = TOWER_VLMS[kind]
        return config_class(vision_config=dict(vision, model_type=tower), text_config=dict(
            TEXT, num_key_value_heads=2, model_type=language, vocab_size=128, head_dim=16), **VLM_EXTRA.get(kind, {}))
    if kind in VLMS:  # a language model of one layer beside the tower
        return config_class(vision_config=vision, text_config=dict(TEXT, num_key_value_heads=2), scale_factor=2)
    if kind.startswith("siglip2"):
        return config_class(**vision, **labels)
    if kind == "timm_wrapper":
        return config_class(architecture="vit_small_patch16_224", model_args=dict(depth=2, img_size=32, patch_size=8),
                            **labels)
    extra = dict(out_indices=[0, 1, 2, 3], num_hidden_layers=4) if "Segmentation" in cls else \
        dict(out_indices=[1, 2]) if cls.endswith("Backbone") else {}  # a backbone: both blocks' maps
    if kind in ("beit", "data2vec-vision"):
        extra["use_relative_position_bias"] = True  # as their released fine-tuned checkpoints (not the default)
    if kind in ("vit", "deit"):
        extra["encoder_stride"] = VISION["patch_size"]  # masked-image modelling reconstructs whole patches
    if cls == "ViTMAEModel":
        extra["mask_ratio"] = 0.0  # the encoder sees every patch (in order: see outputs)
    return config_class(**{**vision, **extra}, **labels)


def inputs(cls: str, x: torch.Tensor) -> dict:
    """transformers' inputs of a batch: the pixels, or for SigLIP 2's NaFlex classes the patches flattened
    (row, column, channel) with their grid and an all-valid mask."""
    b, c, h, w = x.shape
    p = VISION["patch_size"]
    if cls.startswith("Gemma4"):  # each patch flattened channel first, its (column, row)
        rows, cols = torch.meshgrid(torch.arange(h // p), torch.arange(w // p), indexing="ij")
        where = torch.stack([cols.flatten(), rows.flatten()], dim=-1).expand(b, -1, -1)
        flat = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (w // p), -1)
        return dict(pixel_values=flat, pixel_position_ids=where)
    if not cls.startswith("Siglip2"):
        return dict(pixel_values=x)
    flat = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1).reshape(b, (h // p) * (w // p), -1)
    return dict(pixel_values=flat, spatial_shapes=torch.tensor([[h // p, w // p]] * b),
                pixel_attention_mask=torch.ones(b, flat.shape[1], dtype=torch.long))


def outputs(ref, ours, cls: str, x: torch.Tensor, **kw):
    """(transformers' output, vitkit's) of the same images: what the class is for (``kw``: transformers'
    options, ``interpolate_pos_encoding``)."""
    if cls.endswith("Backbone"):  # every map the config names, as one tensor
        return torch.cat([m.flatten() for m in ref(pixel_values=x).feature_maps]), torch.cat(
            [m.flatten() for m in ours(x)])
    if cls.startswith("Sam"):  # the neck's map (B, C, h, w), vitkit's as tokens
        out = ref.get_image_embeddings(pixel_values=x) if hasattr(ref, "get_image_embeddings") else ref(
            pixel_values=x).last_hidden_state
        return (out[0] if isinstance(out, (tuple, list)) else out).flatten(2).transpose(1, 2), ours.forward_features(x)
    if cls.startswith(("Blip", "InstructBlip")):  # the encoder's tokens (what their Q-Formers and decoders read)
        tower = ref if "Vision" in cls else ref.vision_model
        return tower(pixel_values=x, **kw).last_hidden_state, ours.forward_features(x)
    if cls.startswith(VLM_CLASSES):  # the tower's pooled output
        inner = ref.model if hasattr(ref, "model") else ref
        tower = getattr(inner, "vision_tower", None) or inner.vision_model  # (DeepSeek-VL's: vision_model)
        out = tower(**inputs("Siglip2" if cls.startswith("Lfm2Vl") else cls, x), **kw)  # (LFM2-VL's: NaFlex)
        pooled = getattr(out, "pooler_output", None)  # (InternViT's has none: its tokens)
        return (out.last_hidden_state, ours.forward_features(x)) if pooled is None else (pooled, ours(x))
    if cls.startswith(("SmolVLM", "Idefics3")):  # the tower's tokens (its language model is not read)
        tower = ref.model.vision_model if hasattr(ref, "model") else getattr(ref, "vision_model", ref)
        return tower(pixel_values=x).last_hidden_state, ours.forward_features(x)
    if cls.startswith("Gemma4"):  # the soft tokens
        return ref(**inputs(cls, x)).last_hidden_state.reshape(x.shape[0], -1, ref.config.hidden_size), \
            ours.forward_features(x)
    if cls.startswith("Aimv2"):  # no pooled output without the LiT head: the tokens
        tower = ref.vision_model if hasattr(ref, "vision_model") else ref
        return tower(pixel_values=x).last_hidden_state, ours.forward_features(x)
    if cls.endswith(("Model",)) and hasattr(ref, "get_image_features") and not cls.endswith("VisionModel"):
        out = ref.get_image_features(**inputs(cls, x), **kw)
        return (out if isinstance(out, torch.Tensor) else out.pooler_output), ours(x)
    if cls == "ViTMAEModel":  # MAE's shuffle keeps the order under increasing noise
        tokens = (x.shape[-2] // VISION["patch_size"]) * (x.shape[-1] // VISION["patch_size"])
        out = ref(pixel_values=x, noise=torch.arange(tokens, dtype=x.dtype).expand(x.shape[0], -1), **kw)
        return out.last_hidden_state, ours.forward_features(x)
    out = ref(**inputs(cls, x), **kw)
    for field in ("logits", "image_embeds", "pooler_output"):
        value = getattr(out, field, None)
        if isinstance(value, torch.Tensor):
            return value, ours(x)
    return out[0], ours.forward_features(x)


def check(kind: str, cls: str, workdir: Path) -> dict:
    row = dict(model_type=kind, cls=cls)
    start = time.perf_counter()
    try:
        ref = noised(getattr(transformers, cls)(config_for(kind, cls)))
    except Exception as e:  # a class transformers cannot build at this size (a dense head's layer indices)
        row.update(status="skipped", message=one_line(e))
        return row
    folder = workdir / cls
    ref.save_pretrained(folder)
    backbone = dict(features_only=True) if cls.endswith("Backbone") else {}  # the maps its config names
    try:
        ours = vitkit.from_pretrained(folder, **backbone)
    except vitkit.weights.io.WeightsError as e:
        row.update(status="refused", message=str(e).replace(str(folder), "FOLDER"))
        return row
    except Exception as e:
        row.update(status="error", message=one_line(e))
        return row
    if "ForPreTraining" in cls or "MaskedImageModeling" in cls:
        row.update(status="loaded", message=f"as {type(ours).__name__} (pre-training: compared in the tests)")
        return row
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    try:
        want, got = outputs(ref, ours, cls, x)
    except Exception as e:
        row.update(status="error", message=one_line(e))
        return row
    ok, diff = agreement(want, got)
    row.update(status="parity" if ok else "mismatch", max_diff=diff, shape=list(want.shape))
    if not ok:
        row["message"] = f"max |difference| {diff:.2e} ({list(want.shape)} vs {list(got.shape)})"
    row["wide"] = wide(ref, folder, cls, backbone)
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def wide(ref, folder: Path, cls: str, backbone: dict) -> dict:
    """The same comparison at a non-square size (32 x 48, its table resampled): vitkit with
    ``dynamic_img_size`` against transformers with ``interpolate_pos_encoding`` where its forward takes it
    (DINOv2's and the RoPE models' always resample). ``n/a``: transformers does not run the class there."""
    x = torch.randn(2, 3, WIDE[0], WIDE[1], generator=torch.Generator().manual_seed(2))
    takes = "interpolate_pos_encoding" in inspect.signature(ref.forward).parameters or cls.startswith(
        VLM_CLASSES + ("Blip", "InstructBlip"))  # (their tower takes it: outputs calls it)
    try:
        ours = vitkit.from_pretrained(folder, dynamic_img_size=True, **backbone)
    except Exception as e:
        return dict(status="error", message=one_line(e))
    try:
        want, got = outputs(ref, ours, cls, x, **({"interpolate_pos_encoding": True} if takes else {}))
    except Exception as e:  # transformers' class cannot run at this size (n/a), or vitkit's model (a bug)
        files = [frame.filename for frame in traceback.extract_tb(e.__traceback__)]
        theirs = not any("/vitkit/" in f for f in files)  # raised under the reference's call (timm's for TimmWrapper)
        return dict(status="n/a" if theirs else "error",
                    message=f"{'transformers' if theirs else 'vitkit'}: {one_line(e)}")
    ok, diff = agreement(want, got)
    return dict(status="parity" if ok else "mismatch", max_diff=diff)


def agreement(want: torch.Tensor, got: torch.Tensor) -> tuple:
    """(within the tolerance, max |difference|; inf for another shape)."""
    diff = (want - got).abs().max().item() if want.shape == got.shape else float("inf")
    return diff <= TOLERANCE * max(1.0, want.abs().max().item()), diff


def summary(rows: list) -> dict:
    counts = {s: sum(r["status"] == s for r in rows)
              for s in ("parity", "loaded", "refused", "mismatch", "error", "skipped")}
    counted = len(rows) - counts["skipped"]
    wide_counts = {s: sum(r.get("wide", {}).get("status") == s for r in rows)
                   for s in ("parity", "mismatch", "error", "n/a")}
    return dict(classes=counted, **counts, read_share=(counts["parity"] + counts["loaded"]) / max(1, counted),
                wide=wide_counts)


def _wide_cell(row: dict) -> str:
    w = row.get("wide")
    if not w:
        return ""
    size = f"{WIDE[0]}x{WIDE[1]}"
    if w["status"] == "parity":
        return f"; at {size} {w['max_diff']:.1e}"
    return f"; at {size} {w['status']}: {w.get('message', '')[:120]}" if w["status"] != "mismatch" else \
        f"; at {size} MISMATCH {w['max_diff']:.1e}"


def markdown(rows: list, info: dict) -> str:
    s = summary(rows)
    lines = [f"{s['parity']} of {s['classes']} classes load with parity and {s['loaded']} load without an output "
             f"compared here (pre-training classes as vitkit's pre-training model); "
             f"{s['refused']} are refused in one line, {s['mismatch']} load "
             f"with other outputs, {s['error']} fail otherwise (transformers {transformers.__version__}, vitkit "
             f"{str(info.get('git_revision'))[:12]}, {info.get('date')}). Of the classes with parity, "
             f"{s['wide']['parity']} keep it at a non-square {WIDE[0]}x{WIDE[1]} (the table resampled, against "
             f"transformers' `interpolate_pos_encoding`), {s['wide']['mismatch']} do not, and transformers does not "
             f"run {s['wide']['n/a']} there.", "",
             "| model_type | class | vitkit |", "|---|---|---|"]
    for r in rows:
        what = f"parity ({r['max_diff']:.1e}{_wide_cell(r)})" if r["status"] == "parity" else \
            f"{r['status']}: {r.get('message', '')}".replace("|", "\\|")
        lines.append(f"| {r['model_type']} | `{r['cls']}` | {what} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="results file or folder (default benchmarks/results/coverage_hf_<device>_<date>.json)")
    p.add_argument("--markdown", type=Path, help="rewrite the coverage table in this page")
    p.add_argument("--only", help="a shell pattern of class names (a smoke run)")
    args = p.parse_args(argv)
    info = machine_info(torch.device("cpu"), limits=False)
    info.update(git_revision=git_revision(), date=time.strftime("%Y-%m-%d"), transformers=transformers.__version__,
                torch=torch.__version__, tolerance=f"max|diff| <= {TOLERANCE} x max(1, max|reference|)")
    out = results_path(args.out, dated_name("coverage_hf", torch.device("cpu"), info), smoke=bool(args.only))
    rows = []
    todo = classes(args.only)
    with tempfile.TemporaryDirectory(prefix="vitkit-coverage-hf-") as tmp, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' and vitkit's notes: the row says what matters
        for i, (kind, cls) in enumerate(todo):
            row = check(kind, cls, Path(tmp))
            rows.append(row)
            said = f" {row['max_diff']:.1e}{_wide_cell(row)}" if row["status"] == "parity" else \
                f" -- {row.get('message', '')[:160]}"
            print(f"[{i + 1}/{len(todo)}] {kind} {cls}: {row['status']}{said}", flush=True)
    write_results(out, info, summary(rows), rows)
    if args.markdown:
        write_markdown(args.markdown, markdown(rows, info), TABLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
