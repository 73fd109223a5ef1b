"""Fetching a model from the Hugging Face Hub into its cache (``hf-hub:org/name[@revision]``): the files taken
(the configs, then one weight file, or the shards its index names) and one line for each way it fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Tuple

from ..extras import require
from ..files import PathLike
from . import open_clip_format
from .io import WeightsError

HUB_PREFIX = "hf-hub:"
#: What ``hf-hub:`` fetches of a repository: the configs, then one weight file. safetensors is
#: asked for alone first because timm and transformers repositories carry it beside
#: ``pytorch_model.bin``: both would double the download.
_HUB_CONFIG_FILES = ("config.json", "preprocessor_config.json", "processor_config.json")
_HUB_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.npz")
#: a checkpoint saved in shards (transformers past ``max_shard_size``): the index and the files it names
_HUB_SHARDS = {"model.safetensors": ("model.safetensors.index.json", "model-*-of-*.safetensors"),
               "pytorch_model.bin": ("pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin")}

#: huggingface_hub's errors that say what went wrong, matched by class name along the
#: exception's hierarchy (most derived first, so GatedRepoError is not read as its parent
#: RepositoryNotFoundError): the classes moved from ``huggingface_hub.utils`` to
#: ``huggingface_hub.errors`` within the versions the ``hub`` extra allows; their names did not.
_HUB_ERRORS = {"GatedRepoError": "gated", "RepositoryNotFoundError": "no-repo",
               "RevisionNotFoundError": "no-revision", "LocalEntryNotFoundError": "offline",
               "OfflineModeIsEnabled": "offline", "EntryNotFoundError": "no-file",
               "LocalTokenNotFoundError": "auth"}


def hub_failure(e: BaseException) -> Tuple[str, Optional[int], str]:
    """What a huggingface_hub call's exception means: ``(kind, HTTP status or None, "Type: its
    first line")``; kind is one of gated, no-repo, no-revision, no-file, offline, auth (HTTP 401/403, no
    token), http (another HTTP status), network, other. ``snapshot_download`` raises
    LocalEntryNotFoundError for every failure it cannot serve from the cache, with the real one
    (a missing revision, a refused connection) as its cause: the cause decides when it says more."""
    kind, status = _hub_kind(e)
    cause = e.__cause__ or e.__context__
    if kind == "offline" and cause is not None:
        inner, inner_status = _hub_kind(cause)
        if inner not in ("network", "other", "offline"):
            kind, status, e = inner, inner_status, cause
    text = str(e).strip()
    return kind, status, f"{type(e).__name__}: {text.splitlines()[0] if text else 'no detail'}"


def _hub_kind(e: BaseException) -> Tuple[str, Optional[int]]:
    status = getattr(getattr(e, "response", None), "status_code", None)
    status = status if isinstance(status, int) else None
    names = [cls.__name__ for cls in type(e).__mro__]
    for name in names:
        if name in _HUB_ERRORS:
            return _HUB_ERRORS[name], status
    if status in (401, 403):
        return "auth", status
    # the transports raise OSError (requests) or their own RequestError tree (httpx), without a response; httpx's
    # tree is under its HTTPError, so this comes first (an offline push was "failed while creating it")
    if status is None and (isinstance(e, (OSError, TimeoutError)) or {"RequestError", "TransportError"} & set(names)):
        return "network", status
    if status is not None or "HTTPError" in names:
        return "http", status
    return "other", status


def download_from_hub(spec: str, cache_dir: Optional[PathLike] = None) -> Path:
    """Fetch ``config.json`` (and the image processor's config) and one weight file of
    ``org/name[@revision]`` into the Hugging Face cache (an open_clip repository: its
    ``open_clip_config.json`` and weights); return their folder."""
    repo, _, revision = spec.partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise WeightsError(f"hub id {spec!r} should look like 'org/name' or 'org/name@revision'")
    hub = require("huggingface_hub", "hub", "'hf-hub:' sources (or pass a folder downloaded elsewhere)")

    def fetch(patterns: Tuple[str, ...]) -> Path:
        try:
            return Path(hub.snapshot_download(repo, revision=revision or None, allow_patterns=list(patterns),
                                              cache_dir=None if cache_dir is None else str(cache_dir)))
        except Exception as e:  # the client and its transports raise many types: hub_failure sorts them
            raise WeightsError(_download_problem(repo, revision, e)) from e

    folder = fetch(_HUB_CONFIG_FILES + _HUB_WEIGHT_FILES[:1])
    if not (folder / _HUB_WEIGHT_FILES[0]).is_file():  # the same revision's snapshot folder, another layout
        index = _HUB_SHARDS["model.safetensors"][0]
        folder = fetch((index,))
        if (folder / index).is_file():  # the shards that hold what is read: a VLM's tower alone, not its LM's
            folder = fetch(shards_to_read(folder / index) or _HUB_SHARDS["model.safetensors"][1:])
        else:
            folder = fetch(_HUB_WEIGHT_FILES[1:] + _HUB_SHARDS["pytorch_model.bin"])
    at = f"{repo}@{revision}" if revision else repo
    indexes = tuple(files[0] for files in _HUB_SHARDS.values())
    if not (folder / "config.json").is_file() and not any((folder / n).is_file() for n in _HUB_WEIGHT_FILES + indexes):
        # an open_clip repository (timm/ViT-B-16-SigLIP, ...): its config and one of its weight files
        folder = fetch((open_clip_format.CONFIG_FILE, open_clip_format.WEIGHT_FILES[0]))
        if not (folder / open_clip_format.WEIGHT_FILES[0]).is_file():
            folder = fetch(open_clip_format.WEIGHT_FILES[1:])
        if (folder / open_clip_format.CONFIG_FILE).is_file() and any(
                (folder / n).is_file() for n in open_clip_format.WEIGHT_FILES):
            return folder
    if not (folder / "config.json").is_file():
        raise WeightsError(f"{at!r} has no config.json (nor open_clip's {open_clip_format.CONFIG_FILE} and weights): "
                           f"not a model repository from_pretrained() can read (download its weights and pass the "
                           f"file)")
    if not any((folder / name).is_file() for name in _HUB_WEIGHT_FILES + indexes):
        raise WeightsError(f"{at!r} has none of {', '.join(_HUB_WEIGHT_FILES)} (nor a shard index)")
    return folder


def shards_to_read(index: Path) -> Tuple[str, ...]:
    """The shard files of a downloaded index that hold what the loader reads (every one, but for a VLM's checkpoint
    only those holding its tower: :func:`~vitkit.weights.load.vlm_tower_names`; its language model fills most of
    them); () where the index cannot say (the loader then says why)."""
    from .load import vlm_tower_names

    try:
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
        return tuple(sorted({weight_map[n] for n in vlm_tower_names(list(weight_map))}))
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return ()


def _download_problem(repo: str, revision: str, e: BaseException) -> str:
    """One line for a failed download: which case it is and what to do."""
    kind, status, detail = hub_failure(e)
    login = "set HF_TOKEN or log in (hf auth login)"
    if kind == "gated":
        return f"{repo!r} is gated: accept its terms on https://huggingface.co/{repo}, then {login}"
    if kind == "no-repo":
        return f"no model repository {repo!r} on the Hugging Face Hub (if it is private: {login})"
    if kind == "no-revision":
        return f"{repo!r} has no revision {revision!r}: give an existing branch, tag or commit after '@'"
    if kind == "auth":
        return f"the Hugging Face Hub refused access to {repo!r} (HTTP {status or '401'}): {login}"
    if kind in ("offline", "network"):
        return (f"could not reach the Hugging Face Hub for {repo!r} and it is not in the cache (offline? {detail}); "
                f"download the repository elsewhere and pass its local folder in place of hf-hub:NAME")
    if kind == "no-file":
        return f"{repo!r} lacks a file from_pretrained() needs ({detail})"
    http = f"HTTP {status}, " if status else ""
    return f"could not fetch {repo!r} from the Hugging Face Hub ({http}{detail})"
