"""`vitkit inspect`: every analysis of a model as PNG figures and one self-contained report.html.

The report embeds its images as data URIs, so it is one file that opens offline and can be
mailed or attached. Without images given, the inputs are the photos that ship inside
scikit-image (astronaut, chelsea, coffee, rocket), or the first test images of the dataset whose
classes the model names (Fashion-MNIST, CIFAR-10, CIFAR-100; at any image size) where they are on
disk, and Fashion-MNIST's for a 28x28 one-channel model without class names.
"""

from __future__ import annotations

import base64
import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from PIL import Image
from torch import nn

from ..data.transforms import EvalTransform, load_image
from ..evaluate.predict import NOT_FINITE, label_for
from ..extras import require
from ..files import weights_folder, write_text
from ..models import family_of
from ..models.config_base import no_classes
from ..models.layers import in_eval_mode
from ..progress import Progress, waiting_bar
from ..selfsup import is_pretrainer
from ..utils import positive_whole
from . import figures
from .analysis import (
    attention_maps,
    attention_rollout,
    convit_gates,
    embedding_filters_pca,
    maps_not_distributions,
    mean_attention_distance,
    no_table_why,
    patch_distances,
    pos_embed_similarity,
    token_norms,
)

SKIMAGE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")


def _gates_figure(model: nn.Module, path: Path) -> Optional[Path]:
    gates = convit_gates(model) if model.gates().numel() else None
    return None if gates is None else figures.convit_gates_plot(gates, path)


#: Analyses a family may ask for beside the paper's (``Family.analyses``): name -> (figure
#: name, writer of the figure from the model; None when the model has nothing to show).
EXTRA_ANALYSES: Dict[str, Tuple[str, Callable[[nn.Module, Path], Optional[Path]]]] = {
    "gates": ("convit_gates", _gates_figure),
}


@dataclass
class InspectResult:
    out_dir: Path
    figures: Dict[str, Path] = field(default_factory=dict)
    predictions: List[Tuple[str, str, float]] = field(default_factory=list)  # (image, label, probability)
    report: Optional[Path] = None
    #: what the report says it left out, and why
    notes: List[str] = field(default_factory=list)
    #: how many images the analyses ran on
    images: int = 0

    def to_dict(self) -> dict:
        return {"out_dir": str(self.out_dir), "report": str(self.report), "notes": list(self.notes),
                "figures": {k: str(v) for k, v in self.figures.items()},
                "predictions": [{"image": i, "label": lab, "probability": p} for i, lab, p in self.predictions]}


def default_images(model: nn.Module) -> List[Tuple[str, Image.Image]]:
    """(name, PIL image) inputs when none are given (see the module notes): a Fashion-MNIST model
    trained at 28x40 was shown the astronaut, where it should see what it learned."""
    from ..data import cifar, fashion_mnist
    from ..data.datasets import dataset_for_labels

    cfg = model.config
    name = dataset_for_labels(getattr(cfg, "label_names", None))
    if name is None and cfg.in_chans == 1 and tuple(cfg.img_size) == (28, 28):
        name = "fashion-mnist"
    if name is not None:
        try:  # what is on disk: nothing is downloaded for a figure
            test = fashion_mnist.load_split("test", download=False) if name == "fashion-mnist" else \
                cifar.load_split("test", variant=name, download=False)
            return [(f"{name} test #{i} (true: {test.classes[test.labels[i]].replace('/', ' or ')})",
                     Image.fromarray(test.images[i])) for i in range(4)]
        except (OSError, ValueError):
            pass
    data = require("skimage.data", "inspect", "the default photos of vitkit inspect (or pass --image FILE ...)")
    return [(name, Image.fromarray(getattr(data, name)())) for name in SKIMAGE_PHOTOS]


def _model_view(im: Image.Image, transform: EvalTransform, channels: int) -> Tuple[np.ndarray, torch.Tensor]:
    """What the model sees: the resized, centre-cropped pixels (for display) and its input tensor."""
    im = im.convert("L" if channels == 1 else "RGB")
    return np.asarray(transform.view(im)), transform(im)


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


#: What each figure shows, under it in report.html ({n}: the images the figure is computed on).
CAPTIONS = {
    "rollout": "Attention rollout (Abnar &amp; Zuidema; the paper's Fig. 6): the attention that reaches the "
               "output, heads averaged and the residual path added, multiplied through the layers; bright "
               "regions are what the prediction draws on: the row of what the output reads (the class token's; a "
               "distilled DeiT's class and distillation tokens' mean; the patches' mean where the model pools "
               "them). The class, distillation and register tokens have no place in the image: the map is the "
               "patches' share, renormalised; a flat map is drawn flat.",
    "attention_per_layer": "What the class token (without one, the mean patch row) attends to in each layer, "
                           "for the first image, heads averaged (a model that pools the patches' mean reads its "
                           "output from them: its rollout reads that row).",
    "attention_distance": "Mean attention distance (the paper's Fig. 7 right) of every head in every layer, "
                          "averaged over the {n} of this report: how far in pixels a head looks; the "
                          "dashed line is attention spread evenly over the grid.",
    "position_embedding_similarity": "Cosine similarity of each patch's position embedding to every other's "
                                     "(Fig. 7 centre): the small map at row i, column j belongs to patch (i, j).",
    "filter_pca": "Principal components of the filters that look at pixels (Fig. 7 left), with the share of "
                  "the variance each explains.",
    "reconstruction": "The pre-training objective at work on the same images: the image, what the model is "
                      "given, and what it predicts.",
    "convit_gates": "ConViT's gate of every head against the layer (its paper's Fig. 6): 1 is positional, "
                    "convolution-like attention, 0 is content attention.",
    "token_norms": "The norm of every token after the last block (\"Vision Transformers Need Registers\", Darcet et "
                   "al. 2024): large ViTs trained without registers grow a few patch tokens with norms far above "
                   "the rest (crossed: above Q3 + 3 IQR of the patch norms of the {n}), which hold global information "
                   "and spoil attention maps; register tokens take that role. The map and the class and register "
                   "tokens' norms marked on the histogram are the first image's; the histogram is every image's.",
}


def _caption(name: str, images: int, predicts: bool = True) -> str:
    counted = f"{images:,} image" + ("s" if images != 1 else "")
    text = CAPTIONS.get(name.split("_")[0] if name.startswith("rollout_") else name, "").format(n=counted)
    return text if predicts else text.replace("what the prediction draws on", "what the output draws on")


def write_report(result: InspectResult, model: nn.Module, title: str, pretraining: Optional[dict] = None) -> Path:
    """report.html with every figure embedded, the configuration and the predictions (a
    pre-training model's encoder has no classes: its objective instead)."""
    cfg = model.config
    rows = "".join(f"<tr><td>{html.escape(img)}</td><td>{html.escape(label)}</td><td>{100 * p:.1f}%</td></tr>"
                   for img, label, p in result.predictions)
    if pretraining is not None:
        options = ", ".join(f"{k} {v}" for k, v in pretraining.items() if k != "objective")
        table = (f"<h2>pre-training</h2><p>{html.escape(pretraining['objective'])} ({html.escape(options)}): the "
                 f"encoder below has no classifier yet; fine-tune it with <code>vitkit train --init</code>.</p>")
    elif rows:
        table = (f"<h2>predictions</h2><table><tr><th>image</th><th>predicted</th><th>probability</th></tr>"
                 f"{rows}</table>")
    else:  # a model without a classifier (an empty predictions table was shown)
        output = ("an image-text embedding (CLIP's or SigLIP's projection)" if getattr(cfg, "head_kind", "") ==
                  "projection" and cfg.num_classes else "the pooled features")
        table = f"<p>This model has no classifier: its output is {output}, so no predictions.</p>"
    images = max(result.images, len(result.predictions), sum(name.startswith("rollout_") for name in result.figures))
    sections = "".join(f"<section><h2>{html.escape(name.replace('_', ' '))}</h2>"
                       f"<img alt=\"{html.escape(name)}\" src=\"{_data_uri(path)}\">"
                       f"<p class=\"caption\">{_caption(name, images, bool(rows))}</p></section>"
                       for name, path in result.figures.items())
    tokens = model.patch_embed.patch_size  # pixels per token: a hybrid's CNN stride x its patch
    backbone = getattr(model.patch_embed, "backbone", None) is not None
    embedding = (f"tokens of {tokens[0]}x{tokens[1]} px from a CNN (patch {cfg.patch_size[0]}x{cfg.patch_size[1]} "
                 f"on its feature map)" if backbone else f"patch {tokens[0]}x{tokens[1]}")
    config_json = html.escape(json.dumps(cfg.to_dict(), indent=1, default=str))
    notes = "".join(f"<p class=\"caption\">{html.escape(note)}</p>\n" for note in result.notes)
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}: {REPORT_MARK}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}
img{{max-width:100%}}.caption{{color:#555;max-width:60em}}
table{{border-collapse:collapse}}td,th{{padding:2px 10px;border-bottom:1px solid #ddd}}
pre{{background:#f6f6f6;padding:1em;font-size:12px;max-height:24em;overflow:auto}}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>{cfg.depth} layers, width {cfg.embed_dim}, {cfg.num_heads} heads, {embedding},
input {cfg.img_size[0]}x{cfg.img_size[1]}x{cfg.in_chans}, {sum(p.numel() for p in model.parameters()):,} parameters.</p>
{notes}{table}
{sections}
<h2>configuration</h2><pre>{config_json}</pre>
</body></html>
"""
    path = result.out_dir / "report.html"
    write_text(path, page)
    return path


#: Why a model whose maps are no distributions gets no attention-map figures (report.html says it, with the reason).
SIGNED_NOTE = ("No attention rollout, attention per layer or attention distance: {why}, which those analyses, "
               "built on maps whose rows are distributions, would misread.")

#: Images per forward pass of the per-image analyses: bounds the attention maps held at once
#: (ViT-B/16 at 224: 12 layers x 12 heads x 197^2 floats, 22 MB an image) and paces the progress line.
CHUNK = 16
#: The attention maps one pass may hold: fewer images a pass where each one's take more (DINOv2-L/14 at 518 px,
#: 2.9 GB an image; SAM's ViT-B at 1,024 px, 9.7 GB: 16 of them were asked for at once)
MAP_BUDGET = 2 * 2 ** 30
#: Images one inspection takes: one rollout figure each, and the whole set in memory at once (token
#: norms over every image); a folder of thousands is vitkit predict's work, not a report's.
MAX_IMAGES = 64


def images_a_pass(config: Any, remedy: str = "inspect at a smaller --img-size") -> int:
    """How many images a pass of the per-image analyses takes (:data:`CHUNK`, fewer where their attention maps
    pass :data:`MAP_BUDGET`); a model whose maps of one image do not fit in the free memory (twice: the maps and
    the softmax's) is refused in one line, before anything runs (it was killed for memory); ``remedy``: what
    the line tells to do instead."""
    from ..machine import available_memory
    from ..models.complexity import complexity

    c = complexity(config)
    one = c.depth * c.attn_bytes_per_layer_fp32
    free = available_memory()
    if free is not None and 2 * one > free:
        (h, w), n = c.img_size, c.tokens
        raise ValueError(f"the attention maps of one image at {h}x{w} px take {one / 2 ** 30:,.1f} GiB ({c.depth} "
                         f"layers x {c.heads} heads x {n:,} x {n:,} tokens, fp32), twice that at once, and "
                         f"{free / 2 ** 30:,.1f} GiB are free: {remedy}")
    return max(1, min(CHUNK, MAP_BUDGET // max(one, 1)))


def _per_image(model: nn.Module, x: torch.Tensor, with_probs: bool, bar: Progress, maps: bool = True,
               chunk: int = CHUNK) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(class probabilities (B, classes) or None, rollout maps (B, gh, gw), mean attention distance
    (layers, heads) over all images) of ``x``, ``chunk`` images a pass; without ``maps`` (differential
    attention) no rollout and no distance (None)."""
    probs, rollouts, distance = [], [], torch.zeros(())
    for i in range(0, len(x), chunk):
        part = x[i:i + chunk]
        if with_probs:
            probs.append(model(part).float().softmax(-1).cpu())
        if maps:  # (one forward pass for both: the maps are most of the time at 4,096 tokens)
            held = attention_maps(model, part)
            rollouts.append(attention_rollout(model, part, maps=held).cpu())
            # every chunk's mean over its images, weighted by its images: the mean over all of them
            distance = distance + mean_attention_distance(model, part, maps=held).cpu() * len(part)
            del held
        bar.advance()
    if not maps:
        return (torch.cat(probs) if probs else None), None, None
    return (torch.cat(probs) if probs else None), torch.cat(rollouts), distance / len(x)


#: file stems that say nothing of the model, beside the weight files a folder is read by (the folder names it)
GENERIC_STEMS = ("model", "checkpoint", "weights")


def _generic(path: Path) -> bool:
    from ..weights.load import WEIGHT_FILES

    return path.name in WEIGHT_FILES or path.stem in GENERIC_STEMS


def default_folder(weights: Union[str, Path]) -> Path:
    """Where ``vitkit inspect`` writes without ``--out``: beside a run's model (``runs/NAME/inspect``; a run's
    checkpoint, ``runs/NAME/inspect-step_N``), else ``runs/inspect-NAME`` with NAME the file's or, for a file
    named as every model's is (model.safetensors), its folder's -- never the current directory itself. Two
    models whose names agree are kept apart by :func:`free_folder`."""
    from ..weights.pretrained import run_model_folder

    path = Path(weights)
    if run_model_folder(path) is not None:
        return path / "inspect"
    if path.name == "model" and (path.parent / "config.json").is_file():  # runs/NAME/model
        return path.parent / "inspect"
    run = path.parent.parent
    if path.suffix and run_model_folder(run) is not None:  # runs/NAME/model/model.safetensors, a checkpoint
        return run / "inspect" if path.parent.name == "model" else run / f"inspect-{_safe_name(path.stem)}"
    stem = path.stem if path.suffix else path.name
    if path.suffix and _generic(path) and path.parent.name not in ("", ".", ".."):
        stem = path.parent.name
    return Path("runs") / f"inspect-{_safe_name(stem)}"


def _safe_name(stem: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in (stem or "model")).strip(".-") or "model"


def free_folder(folder: Path, title: str) -> Path:
    """``folder``, or where its name is taken by another model's report (a report's title names its weights),
    the first of ``folder-2``, ``folder-3``, ... that is free or holds this model's: a default folder was
    replaced, without a word, by the next model whose file had the same name."""
    for candidate in (folder, *(folder.with_name(f"{folder.name}-{i}") for i in range(2, 1000))):
        made_by = report_title(candidate)
        if made_by is None or made_by == title or _same_path(made_by, title):
            return candidate
    return folder  # (a thousand other models' reports: this one replaces the first, as --out would)


def _same_path(a: str, b: str) -> bool:
    """Two spellings of one model: a relative and an absolute path, a run's folder, its model/ folder and the
    weight file in it (each was "other weights" to the other: a second report beside the run's)."""
    try:
        return Path(a).exists() and _model_of(Path(a)) == _model_of(Path(b))
    except OSError:
        return False


def _model_of(path: Path) -> Path:
    """The folder (or file) ``path`` loads its model from, resolved."""
    from ..weights.load import folder_weights
    from ..weights.pretrained import run_model_folder

    path = run_model_folder(path) or path
    if path.is_file() and folder_weights(path.parent) == path:  # the weight file its folder is read by
        path = path.parent
    return path.resolve()


def report_title(folder: Path) -> Optional[str]:
    """The title (the weights) of the vitkit inspect report in ``folder``, or None where there is none."""
    found = re.search(r"<title>(.*): " + re.escape(REPORT_MARK) + r"</title>", _report_text(folder))
    return html.unescape(found.group(1)) if found else None


def _report_text(folder: Path) -> str:
    """``folder``'s report.html as text ("" where there is none, or it cannot be read)."""
    page = Path(folder) / "report.html"
    try:
        return page.read_text(errors="replace") if page.is_file() else ""
    except OSError:
        return ""


@in_eval_mode
@torch.no_grad()
def inspect_model(model: nn.Module, out_dir: Union[str, Path], images: Optional[Sequence[Union[str, Path]]] = None,
                  title: Optional[str] = None, pca_components: int = 28, progress: bool = True) -> InspectResult:
    """Run every analysis on ``model`` and write the figures and report.html into ``out_dir``
    (``images``: files, or folders standing for the images under them; default: sample photos).

    A pre-training model (:mod:`vitkit.selfsup`) is inspected through its encoder, and a
    reconstruction figure shows its objective at work on the same images. ``progress``: an
    "inspecting" line on stderr counting the steps (an image loaded, a chunk analysed, a figure
    written) with the ETA, once the inspection has run 5 s: each image's figure takes ~0.25 s,
    and 16 images through a ViT-S/16 take ~20 s on a CPU."""
    images = _images_to_inspect(_checked(images, pca_components), Path(out_dir))
    pretrainer, model = (model, model.encoder) if is_pretrainer(model) else (None, model)
    cfg = model.config
    signed = maps_not_distributions(model)  # maps that are no distributions: no map figures, and why
    maps, chunk, out = signed is None, images_a_pass(cfg), Path(out_dir)
    with waiting_bar(None, "inspecting", progress, unit="steps") as bar:
        named = [] if images else default_images(model)
        n = len(images) if images else len(named)
        # every advance() below: images loaded, reconstruction, chunks, rollout figures, _model_figures'
        bar.total = (2 if maps else 1) * n + int(pretrainer is not None) + -(-n // chunk) + \
            len(family_of(cfg).analyses) + (6 if maps else 4)
        if not images:
            bar.advance(n)  # the default images: loaded already
        for path in images or ():
            named.append((str(path), load_image(path, cfg.in_chans)))
            bar.advance()
        with weights_folder(out, report_files) as into:  # after the images load; an old report replaced whole
            transform = EvalTransform.from_config(cfg)
            views, tensors = zip(*(_model_view(im, transform, cfg.in_chans) for _, im in named))
            x = torch.stack(tensors).to(next(model.parameters()).device)
            result = InspectResult(into, images=len(named))
            if not maps:
                result.notes.append(SIGNED_NOTE.format(why=signed))
            if pretrainer is not None:  # masks drawn from a fixed seed: the same figure every time
                shown = pretrainer.visualise(x, torch.Generator().manual_seed(0))
                result.figures["reconstruction"] = figures.reconstruction_grid(
                    shown, into / "reconstruction.png", pretrainer.objective, [Path(name).name for name, _ in named],
                    note="(norm_pix_loss: predictions shown with each patch's true mean and variance)"
                    if getattr(pretrainer.config, "norm_pix_loss", False) else "")
                bar.advance()
            probs, rollout, distance = _per_image(model, x, pretrainer is None and not no_classes(cfg), bar, maps,
                                                  chunk)
            _check_finite(probs)
            for (name, _), p in zip(named, probs if probs is not None else []):
                result.predictions.append((name, label_for(int(p.argmax()), cfg.label_names), float(p.max())))
            for i, ((name, _), view) in enumerate(zip(named, views) if maps else ()):
                label = f", predicted {result.predictions[i][1]}" if result.predictions else ""
                result.figures[f"rollout_{i + 1}"] = figures.rollout_overlay(
                    view, rollout[i], into / f"rollout_{i + 1}.png", title=f"{Path(name).name}{label}",
                    covered=figures.covered_pixels(cfg, rollout[i].shape))
                bar.advance()
            _model_figures(model, x, views[0], distance, into, result, pca_components, bar)
            result.report = write_report(result, model, title or cfg.name or "ViT",
                                         pretrainer.config.to_dict() if pretrainer is not None else None)
            _check_replaces_only_reports(into, out)
            bar.advance()
    return _moved(result, out)


def _checked(images: Any, pca_components: Any) -> Optional[List[Union[str, Path]]]:
    """``images`` as a list (one path: a string was read a character at a time, "image not found: a"), an empty one
    refused (it fell back to the sample photos), and ``pca_components`` checked before the analyses run."""
    if isinstance(images, (str, Path)):
        images = [images]
    images = None if images is None else list(images)  # (once: a generator is spent by its first reading)
    if images is not None and not images:
        raise ValueError("images is empty: give image files or folders, or leave it out for the sample photos")
    if not positive_whole(pca_components):
        raise ValueError(f"pca_components must be a positive integer, not {pca_components!r}")
    return images


def _images_to_inspect(images: Optional[Sequence[Union[str, Path]]], out: Path) -> Optional[List[Path]]:
    """The files given, and the images under the folders given, but an earlier report's own figures, in ``out``
    or in any folder the images are in (``--image DIR --out DIR`` inspected them the second time, and so did
    ``--image DIR --out DIR/new`` with a report in DIR); at most :data:`MAX_IMAGES`."""
    from ..data.folder import image_files

    if not images:
        return None
    given = [Path(p) for p in images]
    listed = image_files(images)
    folders = {out, *(Path(p).parent for p in listed if Path(p) not in given)}
    earlier = {p.resolve() for folder in folders for p in report_files(folder)}
    found = [p for p in listed if Path(p) in given or Path(p).resolve() not in earlier]
    if len(found) > MAX_IMAGES:
        raise ValueError(f"{len(found):,} images to inspect: at most {MAX_IMAGES} (one figure each, all held at "
                         f"once); pass a few of them, or classify many with vitkit predict")
    return found


def _check_finite(values: Optional[torch.Tensor]) -> None:
    """Said as predict says it, not as matplotlib's "supplied range of [inf, inf] is not finite" at a figure."""
    if values is not None and not torch.isfinite(values).all():
        raise ValueError(NOT_FINITE)


def _moved(result: InspectResult, out: Path) -> InspectResult:
    """``result`` with the paths the files have once moved into ``out`` (they were written beside it: an
    earlier report there was replaced whole, its old rollouts no longer beside the new one)."""
    result.out_dir, result.report = out, out / result.report.name
    result.figures = {name: out / path.name for name, path in result.figures.items()}
    return result


#: what marks a report.html as vitkit inspect's (its title's end)
REPORT_MARK = "vitkit inspect"


def report_files(folder: Path) -> List[Path]:
    """The files an earlier ``vitkit inspect`` wrote into ``folder`` (a new report replaces them all): its
    report.html and the figures it shows (their names are its images' ``alt``), never a file of the user's that
    only looks like one (``rollout_7.png`` beside no report was deleted, the image being inspected included)."""
    page = Path(folder) / "report.html"
    text = _report_text(folder)
    if REPORT_MARK not in text:
        return []
    known = {*CAPTIONS, *(stem for stem, _ in EXTRA_ANALYSES.values())}
    shown = [n for n in re.findall(r'<img alt="([A-Za-z0-9_]+)"', text)
             if n in known or re.fullmatch(r"rollout_\d+", n)]
    return [p for p in (*(page.parent / f"{n}.png" for n in dict.fromkeys(shown)), page) if p.is_file()]


def _check_replaces_only_reports(into: Path, out: Path) -> None:
    """A file in ``out`` of a name the new report writes, which no earlier report wrote, is the user's: refused,
    not replaced (a filter_pca.png of their own, an image named rollout_1.png)."""
    ours = {p.name for p in report_files(out)}
    theirs = sorted(p.name for p in into.iterdir() if (out / p.name).exists() and p.name not in ours)
    if theirs:
        which = "it" if len(theirs) == 1 else "them"
        raise ValueError(f"{out} holds {', '.join(theirs[:4])}{' ...' if len(theirs) > 4 else ''}, which no earlier "
                         f"vitkit inspect report there wrote: the report would replace {which}; give another --out")


def _model_figures(model: nn.Module, batch: torch.Tensor, view, distance: Optional[torch.Tensor], out: Path,
                   result: InspectResult, pca_components: int, bar: Progress) -> None:
    """The figures of the model itself: the class attention of the first image per layer, the mean
    attention ``distance`` (both left out when it is None: differential attention), the token norms (the
    first image's map, every image's histogram), the family's own analyses, position embeddings, filters."""
    cfg = model.config
    first = batch[:1]
    if distance is not None:
        maps = [m.cpu() for m in attention_maps(model, first)]
        grid = model.patch_embed.grid_for(first.shape[-2:])
        result.figures["attention_per_layer"] = figures.class_attention_per_layer(
            maps, grid, model.num_prefix_tokens, model.cls_token is not None, out / "attention_per_layer.png")
        bar.advance()
        uniform = float(patch_distances(grid, model.patch_embed.patch_size).mean())
        result.figures["attention_distance"] = figures.attention_distance_scatter(
            distance, out / "attention_distance.png", image_size=max(cfg.img_size), uniform=uniform)
        bar.advance()
    norms = token_norms(model, batch)
    _check_finite(norms.patches)
    labels = (["class"] if model.cls_token is not None else []) + \
        (["distillation"] if getattr(model, "dist_token", None) is not None else []) + \
        [f"register {i + 1}" for i in range(getattr(cfg, "reg_tokens", 0) or 0)]
    result.figures["token_norms"] = figures.token_norm_map(
        view, norms.patches[0], norms.outliers[0], norms.patches, norms.prefix[0].tolist(), labels, norms.fence,
        out / "token_norms.png", title=f"{norms.outliers.sum().item()} outliers among {norms.patches.numel():,} "
                                      f"patch tokens of {len(batch)} image{'s' if len(batch) != 1 else ''}",
        covered=figures.covered_pixels(cfg, norms.patches.shape[-2:]))
    bar.advance()
    for name in family_of(cfg).analyses:  # the family's own analyses (ConViT: its gates)
        stem, write = EXTRA_ANALYSES[name]
        written = write(model, out / f"{stem}.png")
        if written is not None:
            result.figures[stem] = written
        bar.advance()
    if model.patch_pos_embed(model.patch_embed.grid_size) is not None:
        result.figures["position_embedding_similarity"] = figures.pos_embed_similarity_grid(
            pos_embed_similarity(model).cpu(), out / "position_embedding_similarity.png")
    else:  # (the figure was left out without a word)
        result.notes.append(f"no position-embedding similarity: {no_table_why(model)}, so there is no table to "
                            f"compare")
    bar.advance()
    comps, explained = embedding_filters_pca(model, pca_components)
    hybrid = getattr(model.patch_embed, "backbone", None) is not None
    result.figures["filter_pca"] = figures.filter_pca_grid(
        comps.cpu(), explained.cpu(), out / "filter_pca.png",
        "the CNN's first filters (hybrid)" if hybrid else "the patch-embedding filters")
    bar.advance()
