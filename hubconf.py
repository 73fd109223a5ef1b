"""torch.hub entry points of a vitkit checkout::

    model = torch.hub.load("/path/to/vitkit", "vit_small_patch16_224", source="local", num_classes=10)
    model = torch.hub.load("/path/to/vitkit", "vitkit_model", "hf-hub:org/name", source="local")

One entry point per registered model name (``vitkit.list_models()``), each
``fn(pretrained_weights=None, **overrides)``: without weights the randomly initialised model
(``vitkit.create_model(name, **overrides)``); with a folder, a file, a run folder or
``"hf-hub:org/name"`` the model they hold (``vitkit.from_pretrained(weights, **overrides)``: the
weights' own config decides the architecture, as everywhere in vitkit). ``vitkit_model`` takes
either, by name or weights.

torch.hub lists every public callable of this file as an entry point: helpers and imports here
are private (``_``) for that reason.
"""

import sys as _sys
from pathlib import Path as _Path

dependencies = ["torch", "numpy", "safetensors"]

# the package lives in src/ (not importable from the checkout's root, which torch.hub puts on sys.path)
_SRC = str(_Path(__file__).resolve().parent / "src")
if _SRC not in _sys.path:
    _sys.path.insert(0, _SRC)

import vitkit as _vitkit  # noqa: E402  (after the path it is found on)


def vitkit_model(name_or_weights, **overrides):
    """A vitkit model by registered name or size string (``"vit_base_patch16_224"``, ``"B/16"``;
    randomly initialised) or from weights (a folder, a file, a run folder, ``"hf-hub:org/name"``).
    Keyword overrides change the configuration (``num_classes=10``, ``img_size=384``)."""
    text = str(name_or_weights)
    if text.startswith("hf-hub:") or _Path(text).exists():
        return _vitkit.from_pretrained(text, **overrides)
    try:
        return _vitkit.create_model(text, **overrides)
    except ValueError as e:  # a mistyped path was said to be an unknown model name, and only that
        if not str(e).startswith("unknown model"):
            raise
        raise ValueError(f"{e}; nor is there a file or folder {_Path(text).absolute()} to load weights from") \
            from None


def _entry(name):
    def entry(pretrained_weights=None, **overrides):
        if pretrained_weights is None:
            return _vitkit.create_model(name, **overrides)
        model = _vitkit.from_pretrained(pretrained_weights, **overrides)
        _check_architecture(name, model, pretrained_weights, overrides)
        return model

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = (f"``{name}``: randomly initialised (``vitkit.create_model({name!r}, **overrides)``), or "
                     f"the model ``pretrained_weights`` holds (a folder, a file, a run folder or "
                     f"``\"hf-hub:org/name\"``; ``vitkit.from_pretrained(pretrained_weights, **overrides)``).")
    entry.__module__ = __name__
    return entry


def _check_architecture(name, model, weights, overrides):
    """An entry point named for one architecture given another's weights says so, instead of
    returning the other model under this name (the keywords given count as part of the name:
    ``depth=1`` asks for that depth)."""
    from vitkit.models import get_model_config
    from vitkit.weights.timm_format import architecture_differences

    differences = architecture_differences(model.config, get_model_config(name).replace(**overrides))
    if differences:
        raise ValueError(f"{weights} holds another architecture than {name}: {'; '.join(differences[:4])}; load it "
                         f"with the entry point vitkit_model({str(weights)!r}) (its own config decides)")


for _name in _vitkit.list_models():
    if _name.isidentifier():
        globals()[_name] = _entry(_name)
del _name
