"""Reading tensors from weight files without ever running code from them.

- ``.safetensors``: safetensors (no code by construction);
- ``.pth`` / ``.pt`` / ``.bin`` / ``.ckpt``: ``torch.load(weights_only=True)`` — the restricted
  unpickler that only rebuilds tensors and plain containers, and ``argparse.Namespace`` (an
  attribute holder that runs nothing), which timm's training checkpoints carry as ``args``;
- ``.npz``: ``np.load(allow_pickle=False)``;
- a sharded checkpoint: its ``*.index.json`` and the shards it names, each read as above.
"""

from __future__ import annotations

import argparse
import json
import pickle
import re
import struct
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from ..extras import first_line
from ..files import PathLike, atomic_path

TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
#: A training checkpoint's averaged weights (timm's train.py, DeiT's main.py), taken first, as timm's
#: ``load_checkpoint`` (``use_ema=True``, its default) takes them.
EMA_KEYS = ("state_dict_ema", "model_ema")
#: Containers that training scripts wrap state dicts in, tried in this order (timm's, then others').
WRAPPER_KEYS = EMA_KEYS + ("state_dict", "model", "model_state_dict", "module")
#: Prefixes a whole state dict may carry, in either order: DistributedDataParallel's and torch.compile's.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")
#: what a state dict's values are (files hold tensors; a dict in memory may hold numpy arrays too)
ARRAYS = (torch.Tensor, np.ndarray)


class CheckpointNote(UserWarning):
    """Which of a training checkpoint's state dicts was loaded, where it holds more than one."""


class WeightsError(ValueError):
    """A weight file that cannot be used: unreadable, unsafe, or not matching the model."""


class UnsafeCheckpointError(WeightsError):
    """The file asks the unpickler to build objects other than tensors (possibly code)."""


def read_tensors(path: PathLike) -> Dict[str, object]:
    """Return the flat ``name -> tensor/array`` mapping stored in a weight file."""
    return read_weight_file(path)[0]


def read_weight_file(path: PathLike, select: Optional[Callable[[List[str]], List[str]]] = None
                     ) -> Tuple[Dict[str, object], Dict[str, Any]]:
    """A weight file's tensors, and what a training checkpoint says of its model beside them
    (:func:`_training_facts`: ``{"arch": ..., "args": {...}, "script": "timm" or "deit"}``; ``{}``
    for any other file). ``select``: the names to read of a ``.safetensors`` file's (a VLM's tower: the language
    model's tensors beside it, gigabytes, are not read)."""
    path = Path(path)
    if not path.exists():
        raise WeightsError(f"weights file not found: {path}")
    if path.is_dir():
        raise WeightsError(f"{path} is a folder; pass a file, or use from_pretrained() for folders")
    if not path.is_file():
        raise WeightsError(f"{path} is not a regular file (a FIFO or a device?): pass a weight file")
    suffix = ".pth" if path.name.lower().endswith(".pth.tar") else path.suffix.lower()  # timm's train.py's
    if suffix in (".safetensors", ".npz") + TORCH_SUFFIXES and path.stat().st_size == 0:
        raise WeightsError(f"{path} is empty (0 bytes): not a checkpoint (an interrupted download or copy?)")
    if suffix == ".safetensors":
        return _unwrapped_timm(_read_safetensors(path, select)), {}
    if suffix == ".npz":
        return _read_npz(path), {}
    if suffix in TORCH_SUFFIXES:
        obj = _load_torch(path)
        return _unwrapped_timm(unwrap_state_dict(obj, str(path))), _training_facts(obj)
    if suffix in (".onnx", ".xml"):
        graph = "an ONNX graph" if suffix == ".onnx" else "an OpenVINO IR"
        raise WeightsError(f"{path} is {graph}, not weights: vitkit predict, eval and serve run it; this needs "
                           f"the PyTorch weights it was exported from (.safetensors, a run folder, ...)")
    raise WeightsError(f"unknown weights file type {suffix!r} for {path}; expected .safetensors, "
                       f".npz, or a torch file ({', '.join(TORCH_SUFFIXES)}, .pth.tar)")


#: transformers' TimmWrapperModel / ...ForImageClassification keeps the timm model under this name
TIMM_WRAPPER_PREFIX = "timm_model."


#: the index of a checkpoint saved in shards (transformers' ``save_pretrained`` past ``max_shard_size``)
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def read_sharded(index: PathLike, select: Optional[Callable[[List[str]], List[str]]] = None) -> Dict[str, object]:
    """The tensors of a sharded checkpoint: its index's ``weight_map`` (tensor -> shard file beside it), every
    shard read as any weight file is (safely), each tensor from the shard the index names. An index naming a
    file outside its folder, a missing shard, or a tensor not where the index says is refused in one line.
    ``select``: the names to read of all the index's (a VLM's tower: only the shards that hold it are read)."""
    index = Path(index)
    try:
        data = json.loads(index.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(f"{index} is not a readable shard index ({e})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise WeightsError(f"{index}: a shard index needs a \"weight_map\" of tensor names to shard files")
    by_shard: Dict[str, list] = {}
    for name in (select(list(weight_map)) if select is not None else weight_map):
        by_shard.setdefault(weight_map[name], []).append(name)
    out: Dict[str, object] = {}
    for shard, wanted in sorted(by_shard.items()):
        if Path(shard).name != shard or shard in (".", ".."):
            raise WeightsError(f"{index} names the shard {shard!r}: shards are files beside their index")
        if not (index.parent / shard).is_file():
            raise WeightsError(f"{index} names the shard {shard}, which is missing (an interrupted download?)")
        tensors = read_tensors(index.parent / shard)
        missing = [k for k in wanted if k not in tensors]
        if missing:
            raise WeightsError(f"{index}: {missing[0]} is not in {shard}, where the index puts it "
                               f"({len(missing)} such): the index or the shard was changed")
        out.update({k: tensors[k] for k in wanted})
    return out


#: safetensors' names of the half precisions a file may store a model in
HALF_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16}


def stored_half_dtype(path: PathLike) -> Optional[torch.dtype]:
    """The half precision (float16, bfloat16) every float tensor of a ``.safetensors`` file (or of the shards
    its index names) is stored in, read from the headers alone; None for float32, mixed precisions or
    another kind of file (a writer keeps a model's precision where its source had one)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if path.name.endswith(".index.json"):
        try:
            shards = sorted(set(json.loads(path.read_text()).get("weight_map", {}).values()))
        except (OSError, ValueError, AttributeError):
            return None
        files = [f for f in (path.parent / Path(str(s)).name for s in shards) if f.is_file()]  # (a VLM's tower's
        # shards alone may have been downloaded: hub_download.shards_to_read)
    else:
        files = [path]
    if not files or not all(f.suffix == ".safetensors" and f.is_file() for f in files):
        return None
    found = set()
    try:
        for f in files:
            with safe_open(str(f), framework="pt") as opened:
                found |= {opened.get_slice(k).get_dtype() for k in opened.keys()}
    except (SafetensorError, OSError, ValueError):
        return None
    floats = {d for d in found if d.startswith(("F", "BF"))}
    return HALF_DTYPES.get(floats.pop()) if len(floats) == 1 else None


def _unwrapped_timm(sd: Dict[str, object]) -> Dict[str, object]:
    """A timm model saved through transformers (every name under ``timm_model.``) as timm saves it."""
    if sd and all(k.startswith(TIMM_WRAPPER_PREFIX) for k in sd):
        return {k[len(TIMM_WRAPPER_PREFIX):]: v for k, v in sd.items()}
    return sd


def _read_safetensors(path: Path, select: Optional[Callable[[List[str]], List[str]]] = None) -> Dict[str, object]:
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    try:
        if select is None:
            return dict(load_file(str(path), device="cpu"))
        with safe_open(str(path), framework="pt") as f:
            return {name: f.get_tensor(name) for name in select(list(f.keys()))}
    except (SafetensorError, OSError, ValueError) as e:
        raise WeightsError(f"{path} is not a readable safetensors file: {e}") from e


def _read_npz(path: Path) -> Dict[str, object]:
    try:
        with np.load(path, allow_pickle=False) as data:
            out = {}
            for k in data.files:
                arr = data[k]
                if arr.dtype.kind not in "fiub":
                    raise WeightsError(f"{path}: array {k!r} has dtype {arr.dtype}, expected numbers")
                out[k] = arr
            return out
    except ValueError as e:
        if isinstance(e, WeightsError):
            raise
        raise WeightsError(f"{path}: refused to load: it is not an .npz archive of arrays (it holds pickled "
                           f"objects, which vitkit never unpickles, or it is no .npz at all)") from None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise WeightsError(f"{path} is not a readable .npz archive: {e}") from e


#: what torch.load raises for a file that is no checkpoint it can read: the archive's and the stream's errors, and
#: the weights-only unpickler's own on a malformed stream (b"\x80\x02R." was an "unexpected IndexError")
UNREADABLE_TORCH_FILE = (RuntimeError, OSError, EOFError, zipfile.BadZipFile, ValueError, IndexError, KeyError,
                         TypeError, AttributeError, struct.error)


def _load_torch(path: Path) -> object:
    try:
        with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
            # torch's "Detected pickle protocol 4 ... please file an issue" is about torch, not the file: not said
            warnings.filterwarnings("ignore", message=r"Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise _unpickling_error(path, e) from None
    except UNREADABLE_TORCH_FILE as e:
        raise WeightsError(f"{path} is not a readable PyTorch checkpoint ({first_line(e) or type(e).__name__})") \
            from None


def _training_facts(obj: object) -> Dict[str, Any]:
    """The model's name (``arch``), its ``args`` (as a dict) and the ``script`` that saved them: timm's
    train.py saves ``arch`` as the name its arguments give (``args.model``; without ``args``, the
    model's class name, which names no variant), DeiT's main.py ``args`` alone (``args.model``, a
    name from DeiT's own registry, where timm's names come from)."""
    if not isinstance(obj, Mapping) or not isinstance(obj.get("args"), argparse.Namespace):
        return {}
    args = vars(obj["args"])
    arch, script = obj.get("arch"), "timm"
    if arch is None and "nb_classes" in args:  # DeiT's main.py (its class count is nb_classes)
        arch, script = args.get("model"), "deit"
    if not isinstance(arch, str) or arch != args.get("model"):
        return {}
    for hub in ("hf-hub:timm/", "hf_hub:timm/"):  # --model hf-hub:timm/NAME.TAG: timm's own repository of NAME
        arch = arch[len(hub):] if arch.startswith(hub) else arch
    if ":" in arch or "/" in arch:  # another Hub repository: its name is no architecture's
        return {}
    return {"arch": arch, "args": dict(args), "script": script}


def unsafe_object(error: Exception) -> Optional[str]:
    """The Python object a file asked torch's weights_only unpickler to build (the name of a
    global it refused), or None when the refusal was not about an object (not a checkpoint)."""
    named = re.search(r"GLOBAL ([\w.]+)", str(error))
    return named.group(1) if named else None


def _unpickling_error(path: Path, error: Exception) -> WeightsError:
    """torch's weights_only refusal in vitkit's words: a file that names a Python object to build
    is unsafe (and never loaded); anything else is not a checkpoint. torch's own hint to retry
    with ``weights_only=False`` is never passed on."""
    text = str(error)
    named = unsafe_object(error)
    if named:
        return UnsafeCheckpointError(
            f"refused to load {path}: it asks to build the Python object {named!r}, and objects "
            f"other than tensors could run code; vitkit only loads tensors. Re-save the weights as "
            f"safetensors (or a plain state dict) in an environment you trust")
    detail = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    said = detail.group(1).strip() if detail else "not a torch.save file"
    if said.startswith("Unsupported operand"):  # (a pickle's framing opcode, torch.save never writes it)
        said = f"a plain pickle, not a torch.save file ({said}); vitkit never unpickles those"
    return WeightsError(f"{path} is not a PyTorch checkpoint of tensors that vitkit can read ({said})")


def save_safetensors(sd: Mapping[str, torch.Tensor], path: Path, metadata: Optional[Dict[str, str]] = None) -> None:
    """Write a state dict as a ``.safetensors`` file, atomically (contiguous tensors, ``metadata``
    in its header): every writer of the format uses it."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp), metadata=metadata)


def safetensors_metadata(path: PathLike) -> Dict[str, str]:
    """The string metadata a ``.safetensors`` file carries in its header ({} when none)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise WeightsError(f"{path} is not a readable safetensors file: {e}") from e


def unwrap_state_dict(obj: object, where: str = "checkpoint") -> Dict[str, object]:
    """Find the state dict inside common training-checkpoint wrappers, as timm's ``load_checkpoint``
    finds it: the EMA weights where the checkpoint has them (said in a note when it has the raw
    ones too), and the names without DDP's and torch.compile's prefixes."""
    for _ in range(3):
        if isinstance(obj, Mapping) and not _is_state_dict(obj):
            held = [k for k in WRAPPER_KEYS if isinstance(obj.get(k), Mapping) and obj[k]
                    and (_is_state_dict(obj[k]) or any(w in obj[k] for w in WRAPPER_KEYS))]
            if not held:
                break
            if held[0] in EMA_KEYS and held[1:]:
                warnings.warn(f"{where} holds averaged weights ({held[0]}) and the raw ones ({held[1]}): loaded "
                              f"{held[0]}, as timm's load_checkpoint does; to load {held[1]}, save it on its own",
                              CheckpointNote, stacklevel=3)
            obj = obj[held[0]]
    if not isinstance(obj, Mapping) or not _is_state_dict(obj):
        held = f"top-level keys: {_preview(obj)}" if isinstance(obj, Mapping) else \
            f"it holds an object of type {type(obj).__name__}"
        raise WeightsError(f"{where}: no state dict of tensors found ({held})")
    sd = {k: v for k, v in obj.items() if isinstance(v, ARRAYS)}  # an in-memory dict may hold numpy arrays
    # saved from DistributedDataParallel, a compiled model, or both (in either order)
    while sd and (prefix := next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in sd)), None)):
        sd = {k[len(prefix):]: v for k, v in sd.items()}
    return sd


def _is_state_dict(obj: Mapping) -> bool:
    values = list(obj.values())
    return bool(values) and sum(isinstance(v, ARRAYS) for v in values) >= max(1, len(values) // 2)


def _preview(obj: object) -> str:
    if isinstance(obj, Mapping):
        keys = list(obj.keys())[:8]
        return ", ".join(map(str, keys)) + (" ..." if len(obj) > 8 else "")
    return type(obj).__name__
