"""Sharing a model on the Hugging Face Hub: :func:`save_for_hub` writes what would be pushed,
:func:`push_to_hub` pushes it.

A pushed repository holds exactly what ``save_pretrained`` writes (``config.json``,
``model.safetensors``), so ``vitkit.from_pretrained("hf-hub:ORG/NAME")`` rebuilds the model
bit for bit, plus the model card ``README.md`` (YAML front matter the Hub indexes:
``library_name: vitkit``, tags, the pipeline) and, for a training run, its figures under
``figures/`` (the training curves, ``vitkit inspect``'s PNGs) embedded in the card with the
run's ``summary.json`` scores.

The upload itself is huggingface_hub's (the ``hub`` extra): its ``HfApi`` does the
authentication, the large-file storage and the retries; vitkit turns its typed errors into one
line saying what to do (:func:`~vitkit.weights.hub_download.hub_failure`).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from torch import nn

from .._version import __version__
from ..extras import require
from ..files import PathLike, check_output, copy_file, new_folder, write_text
from ..runlock import unfinished_run
from .export import source_half_dtype
from .hub_download import HUB_PREFIX, hub_failure
from .io import WeightsError
from .pretrained import from_pretrained, run_model_folder

CARD_NAME = "README.md"
FIGURES = "figures"
#: A name part of a Hub repository id: letters, digits, '-', '_', '.', not at either end
#: '-' or '.', no '--' or '..' (the Hub's own rule), at most 96 characters.
_REPO_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")


def check_repo_id(repo_id: Any) -> str:
    """``repo_id`` as the Hub wants it (``"org/name"``; a leading ``hf-hub:`` is dropped), or a
    :class:`WeightsError` saying the form. Checked before any work: a typo should not cost a save."""
    text = repo_id[len(HUB_PREFIX):] if isinstance(repo_id, str) and repo_id.startswith(HUB_PREFIX) else repo_id
    parts = text.split("/") if isinstance(text, str) else []
    if len(parts) != 2 or not all(_REPO_PART.fullmatch(p) for p in parts) or "--" in text or ".." in text:
        raise WeightsError(f"repo_id {repo_id!r} should look like 'org/name' (your user or organisation, then "
                           f"letters, digits, '-', '_', '.'), e.g. 'alice/vit-tiny-fmnist'")
    return text


# ------------------------------------------------------------------ what is pushed


def save_for_hub(model_or_run: Union[nn.Module, PathLike], folder: PathLike, repo_id: Optional[str] = None) -> Path:
    """Write into ``folder`` (new or empty) what :func:`push_to_hub` pushes: ``config.json`` and
    ``model.safetensors`` as ``save_pretrained`` writes them, the model card ``README.md`` (its
    loading snippet names ``repo_id``) and, for a run, ``figures/``. Offline: look before you push.

    ``model_or_run``: a vitkit model (a pre-training model included), a training run's folder
    (``runs/NAME``: its model, scores and figures; an unfinished run is refused), or anything
    :func:`~vitkit.from_pretrained` reads (a saved model folder, a weight file).
    """
    repo_id = check_repo_id(repo_id) if repo_id is not None else None
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise WeightsError(f"{folder} is not an empty folder: save_for_hub writes a new one (old figures "
                           f"or files left there would be pushed too)")
    check_output(folder, "folder", "the hub folder")
    model, run = _model_and_run(model_or_run)
    summary = _run_summary(run) if run is not None else None  # (before anything is written)
    with new_folder(folder):  # a failure (a full disk) removes what was written
        model.save_pretrained(folder)
        figures = _copy_figures(run, folder) if run is not None else []
        config = json.loads((folder / "config.json").read_text())
        params = sum(p.numel() for p in model.parameters())
        write_text(folder / CARD_NAME, model_card(config, params, repo_id, summary, figures))
    return folder


def _model_and_run(source: Union[nn.Module, PathLike]) -> Tuple[nn.Module, Optional[Path]]:
    """The model to push and the folder of the run that trained it (None when it is no run's)."""
    if isinstance(source, nn.Module):
        if not callable(getattr(source, "save_pretrained", None)):
            raise WeightsError(f"a {type(source).__name__} has no save_pretrained(): push_to_hub takes vitkit "
                               f"models (vitkit.create_model, from_pretrained, vitkit.selfsup)")
        return source, None
    path = Path(source)
    if not path.exists():
        raise WeightsError(f"{path}: no such run, model folder or weight file")
    if why := unfinished_run(str(path)):
        raise WeightsError(why)
    run = path if run_model_folder(path) is not None else None
    if run is None and path.name == "model" and run_model_folder(path.parent) is not None:
        run = path.parent  # runs/NAME/model: its run's scores and figures belong on the card too
    model = from_pretrained(path)
    half = source_half_dtype(run_model_folder(path) or path)
    return (model.to(half) if half is not None else model), run  # a half-precision source stays half its size


def _copy_figures(run: Path, folder: Path) -> List[Path]:
    """Copy the run's PNGs (the training curves; ``inspect/``'s figures) to ``folder/figures``;
    return their paths relative to ``folder``. A name met twice keeps the run's own figure."""
    copied: Dict[str, Path] = {}
    for png in sorted(run.glob("*.png")) + sorted((run / "inspect").glob("*.png")):
        if png.is_file() and png.name not in copied:
            copy_file(png, folder / FIGURES / png.name)
            copied[png.name] = Path(FIGURES) / png.name
    return list(copied.values())


def _run_summary(run: Path) -> Dict[str, Any]:
    """A finished run's ``summary.json``: its scores, and the note a test-scale run (VITKIT_TINY) carries. A run
    whose summary is gone or damaged is refused: it pushed a card without either, so a tiny run passed for a result."""
    path = run / "summary.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        why = "is missing"
    except (OSError, ValueError) as e:
        why = f"cannot be read ({' '.join(str(e).split())[:80]})"
    else:
        if isinstance(data, dict):
            return data
        why = f"is not the run's summary (a JSON {type(data).__name__}, not an object)"
    raise WeightsError(f"{path} {why}: the card's scores come from it, and a test-scale run's note; restore it (a "
                       f"run rewrites it as it finishes), or push a copy of {run / 'model'} apart from its run, "
                       f"without scores")


# ------------------------------------------------------------------ the model card


def model_card(config_json: Dict[str, Any], params: int, repo_id: Optional[str] = None,
               summary: Optional[Dict[str, Any]] = None, figures: Sequence[Path] = ()) -> str:
    """The Markdown of ``README.md``: front matter, the model, how to load it, the run's
    scores and figures. ``config_json``: the pushed ``config.json`` (the card describes what is
    in the repository, not what the caller believes)."""
    config, pretraining = config_json.get("config", {}), config_json.get("pretraining")
    classes = config.get("num_classes") or 0
    classifier = classes > 0 and not pretraining and config.get("head_kind", "classes") == "classes"
    tags = ["vitkit", "vision-transformer"] + (["image-classification"] if classifier else []) \
        + (["self-supervised", str(pretraining.get("objective"))] if pretraining else [])
    lines = ["---", "library_name: vitkit", "tags:", *(f"- {t}" for t in tags)]
    if classifier:
        lines.append("pipeline_tag: image-classification")
    name = repo_id or "ORG/NAME"
    kind = f"a {pretraining.get('objective')} pre-training model" if pretraining else \
        ("an image classifier" if classifier else "an image encoder (no classifier head)" if not classes else
         "an image-text tower's image encoder (its head is the projection into the joint space)")
    lines += ["---", "", f"# {name}", "",
              f"A Vision Transformer saved by vitkit {config_json.get('vitkit_version', __version__)}: {kind}.",
              "", "## Model", "", "| | |", "|---|---|", *_model_rows(config, params, pretraining), ""]
    labels = config.get("label_names")
    if labels:
        shown = ", ".join(f"`{' '.join(str(n).split())}`" for n in labels[:50])
        lines += [f"Labels (output index order): {shown}{' ...' if len(labels) > 50 else ''}", ""]
    lines += _usage(name, config, pretraining)
    if summary:
        lines += _training(summary)
    if figures:
        lines += ["## Figures", ""]
        for fig in figures:
            lines += [f"![{fig.stem.replace('_', ' ')}]({fig.as_posix()})", ""]
    return "\n".join(lines).rstrip() + "\n"


def _model_rows(config: Dict[str, Any], params: int, pretraining: Optional[Dict[str, Any]]) -> List[str]:
    shape = [f"{config[key]} {word}{'s' if config[key] != 1 else ''}" for key, word in (("depth", "block"),
                                                                                       ("num_heads", "head"))
             if config.get(key)]
    if config.get("embed_dim"):
        shape.insert(1 if config.get("depth") else 0, f"width {config['embed_dim']}")
    if config.get("patch_size") and not config.get("backbone"):  # a hybrid's tokens are its CNN's cells
        shape.append(f"patches {'x'.join(map(str, config['patch_size']))}")
    family = config.get("architecture", "?")
    arch = f"`{config.get('name') or family}` ({family} family{'; ' + ', '.join(shape) if shape else ''})"
    h, w = config.get("img_size", ("?", "?"))
    rows = [("architecture", arch), ("parameters", f"{params:,}"),
            ("input", f"{config.get('in_chans', 3)} x {h} x {w}, {config.get('interpolation', 'bicubic')} resize, "
                      f"crop fraction {config.get('crop_pct', 1.0)}"
                      + {"squash": " (squashed: aspect not kept)",
                         "border": " (whole image, padded with the mean)"}.get(config.get("crop_mode"), "")),
            ("normalisation", f"mean {_numbers(config.get('mean'))}, std {_numbers(config.get('std'))}"),
            ("classes", "none: an image-text projection, {} wide".format(config.get("num_classes"))
             if config.get("head_kind") == "projection" and config.get("num_classes")
             else str(config.get("num_classes") or "none (features)"))]
    if pretraining:
        options = ", ".join(f"{k} {v}" for k, v in pretraining.items() if k != "objective" and not isinstance(v, dict))
        rows.append(("pre-training", f"{pretraining.get('objective')}" + (f" ({options})" if options else "")))
    return [f"| {k} | {_cell(v)} |" for k, v in rows]


def _resize_words(crop_mode: Optional[str], h: Any, w: Any) -> str:
    """How the evaluation resize meets the model's size (data/transforms.eval_resize_size), in words."""
    if crop_mode == "squash":
        return f"the whole image resized to {h} x {w} / crop fraction"
    if crop_mode == "border":
        return f"the longer side resized to fit {h} x {w} / crop fraction, the rest padded with the mean's colour"
    if h == w:
        return f"the shorter side resized to {h} / crop fraction"
    return f"resized, keeping its aspect, to cover {h} x {w} / crop fraction"


def _usage(name: str, config: Dict[str, Any], pretraining: Optional[Dict[str, Any]]) -> List[str]:
    h, w = config.get("img_size", ("?", "?"))
    call = f'vitkit.from_pretrained("hf-hub:{name}"{", encoder_only=True" if pretraining else ""})'
    lines = ["## Use", "", "```python", "import vitkit  # pip install 'vitkit[hub]'", "",
             f"model = {call}",
             "x = vitkit.preprocess(model, \"photo.jpg\")  # (1, C, H, W), the model's own preprocessing", "```", "",
             "Inputs, as `vitkit.preprocess` makes them: " + _resize_words(config.get("crop_mode"), h, w)
             + f", a centre {h} x {w} crop, pixels scaled to [0, 1] and normalised with the mean and std above."
             + ("" if config.get("head_kind") == "projection" or not config.get("num_classes") else
                f" From the command line: `vitkit predict --weights hf-hub:{name} IMAGE`.")]
    if pretraining:
        lines[-1] = (f"Inputs: {h} x {w} images scaled to [0, 1] and normalised with the mean and std above. "
                     f"Without `encoder_only=True` the whole pre-training model (with its decoder) is built.")
    return lines + [""]


#: The summary.json entries the card shows, in order: (key, label, how: pct / loss / int / text).
_SUMMARY_ROWS = (("model", "model", "text"), ("dataset", "dataset", "text"), ("init", "initialised from", "text"),
                 ("objective", "objective", "text"), ("test_images", "test images scored", "int"),
                 ("test_top1", "test top-1", "pct"),
                 ("val_top1", "validation top-1", "pct"), ("test_top1_ema", "test top-1 (EMA)", "pct"),
                 ("val_top1_ema", "validation top-1 (EMA)", "pct"), ("test_colour_acc", "test colour accuracy", "pct"),
                 ("test_loss", "test loss", "loss"), ("val_loss", "validation loss", "loss"),
                 ("train_images", "training images", "int"), ("steps", "steps", "int"), ("epochs", "epochs", "text"),
                 ("seconds", "seconds", "int"), ("train_img_s", "training images / s", "int"),
                 ("precision", "precision", "text"), ("device", "device", "text"), ("processes", "processes", "int"))


def _training(summary: Dict[str, Any]) -> List[str]:
    """The run's scores and cost from its summary.json, as a table."""
    rows = []
    for key, label, how in _SUMMARY_ROWS:
        value = summary.get(key)
        if value is None or value == "" or (key.startswith("val_") and summary.get("val_is_test")):
            continue  # (validation that scored the test split is no second score)
        if how == "pct" and isinstance(value, (int, float)):
            text = f"{100 * value:.2f} %"
        elif how == "loss" and isinstance(value, (int, float)):
            text = f"{value:.4f}"
        elif how == "int" and isinstance(value, (int, float)):
            text = f"{round(value):,}"
        else:
            text = str(value)
        rows.append(f"| {label} | {_cell(text)} |")
    fewshot = summary.get("fewshot")
    if isinstance(fewshot, dict) and fewshot:
        shots = ", ".join(f"{k}-shot {100 * v:.2f} %" for k, v in fewshot.items() if isinstance(v, (int, float)))
        rows.append(f"| few-shot (frozen encoder) | {_cell(shots)} |")
    lines = ["## Training", "", "| | |", "|---|---|", *rows, ""]
    if summary.get("tiny"):
        lines += [f"**Note:** {summary['tiny']}", ""]
    return lines


def _numbers(values: Any) -> str:
    return "(" + ", ".join(f"{v:g}" for v in values) + ")" if isinstance(values, (list, tuple)) else str(values)


def _cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell (one line, no column break)."""
    return " ".join(str(text).split()).replace("|", "\\|")


# ------------------------------------------------------------------ pushing


def push_to_hub(model_or_run: Union[nn.Module, PathLike], repo_id: str, *, token: Optional[str] = None,
                private: bool = False, revision: Optional[str] = None, commit_message: Optional[str] = None,
                api: Any = None) -> str:
    """Push a model or a training run to the Hugging Face Hub repository ``repo_id``
    (``"org/name"``, created when missing); return the URL of the commit (of the repository when
    the client gives no commit). What is pushed is :func:`save_for_hub`'s folder.

    ``token``: a write token (default: huggingface_hub's, from ``HF_TOKEN`` or ``hf auth login``;
    unused when ``api`` is given, which carries its own);
    ``private``: of a repository this creates; ``revision``: an existing branch to commit to;
    ``api``: an ``huggingface_hub.HfApi`` (or an object with its ``create_repo`` and
    ``upload_folder``) to use instead of ``HfApi(token=token)``.
    """
    repo_id = check_repo_id(repo_id)
    hub = require("huggingface_hub", "hub", "pushing to the Hugging Face Hub") if api is None else None
    with tempfile.TemporaryDirectory(prefix="vitkit-hub-") as tmp:
        folder = save_for_hub(model_or_run, Path(tmp) / "repo", repo_id=repo_id)
        config = json.loads((folder / "config.json").read_text())["config"]
        message = commit_message or f"Upload {config.get('name') or config.get('architecture', 'model')} " \
                                    f"with vitkit {__version__}"
        api = api if api is not None else hub.HfApi(token=token)
        try:
            url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        except Exception as e:  # the client and its transports raise many types: hub_failure sorts them
            raise WeightsError(_push_problem(repo_id, revision, "creating", e)) from e
        try:
            info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model",
                                     revision=revision, commit_message=message)
        except Exception as e:
            raise WeightsError(_push_problem(repo_id, revision, "uploading to", e)) from e
    return str(getattr(info, "commit_url", None) or url)


def _push_problem(repo_id: str, revision: Optional[str], doing: str, e: BaseException) -> str:
    """One line for a failed push: which case it is and what to do."""
    kind, status, detail = hub_failure(e)
    login = ("pass token= (a write token: https://huggingface.co/settings/tokens), set HF_TOKEN or log in "
             "(hf auth login)")
    if kind == "auth" or (kind in ("no-repo", "gated") and status in (401, 403)):
        return f"the Hugging Face Hub refused {doing} {repo_id!r} (HTTP {status or 401}, {detail}): {login}"
    if kind in ("no-repo", "gated"):
        return (f"the Hugging Face Hub has no repository {repo_id!r} you may write to ({detail}): check its "
                f"organisation and that your token may write there; {login}")
    if kind == "no-revision":
        return (f"{repo_id!r} has no branch {revision!r} to commit to: create it first "
                f"(HfApi.create_branch) or push without revision")
    if kind in ("offline", "network"):
        return f"could not reach the Hugging Face Hub while {doing} {repo_id!r} ({detail}): nothing was committed"
    http = f"HTTP {status}, " if status else ""
    return f"pushing to {repo_id!r} failed while {doing} it ({http}{detail})"


__all__ = ["push_to_hub", "save_for_hub", "model_card", "check_repo_id"]
