"""The tensors a foreign file lacks said by the file's own names: a converter reads a Hugging Face or official
file into vitkit's names, so a missing tensor was named as vitkit names it (``attn_pool.latent`` for a SigLIP
file that lacks ``head.probe``), a name the user's file never held."""

from __future__ import annotations

from typing import Collection, Dict, List, Optional, Set

from . import hf_format, hf_towers, npz_format


def _exported(model, layout: str) -> Optional[Dict[str, object]]:
    """``model``'s tensors as its export to ``layout`` names them; None where vitkit writes no such layout."""
    if layout == "hf":
        return hf_towers.from_native(model)[0] if hf_towers.layout_of(model.config) else hf_format.from_native(model)
    if layout in ("npz", "big_vision"):
        return npz_format.from_native(model, "vit_jax" if layout == "npz" else "big_vision")
    return None


def missing_by_file_names(model, layout: str, held: Collection[str]) -> Optional[List[str]]:
    """The names a ``layout`` file holding ``held`` lacks for ``model``: its export's names the file does not
    hold (under a longer prefix too: a two-tower file's ``vision_model.``). None where that cannot be told: no
    export of the layout, or a file whose names mostly differ from the export's (another class's layout)."""
    try:
        names = list(_exported(model, layout) or ())
    except Exception:  # (a model the layout cannot express, or on the meta device): vitkit's names say it
        return None
    before: Dict[str, Set[str]] = {}  # each name the file holds, and each tail of one: what comes before it
    for key in held:
        for i in range(key.count(".") + 1):
            tail = key.split(".", i)[-1]
            before.setdefault(tail, set()).add(key[: len(key) - len(tail)])
    absent = sorted(name for name in names if name not in before)
    if not absent or len(absent) * 2 > len(names):
        return None
    # the one prefix the file puts before every name the export has (a two-tower file's vision_model.)
    prefixes = set.intersection(*(before[name] for name in names if name in before))
    prefix = prefixes.pop() if len(prefixes) == 1 else ""
    return [prefix + name for name in absent]
