"""What a run's sizes ask of the memory, refused before the work when it cannot be had.

Both checks use lower bounds computed from the model's config
(:mod:`vitkit.models.complexity`), so a size they refuse cannot run on this machine; what they
let through may still run out (the bound leaves out attention's weights, the optimiser's
temporaries and the data), but no typo -- depth 1,000,000, batch 10^8 -- gets as far as an
allocation traceback, or the kernel's out-of-memory kill mid-run.
"""

from __future__ import annotations

from typing import Any

from ..machine import available_memory
from ..models.complexity import complexity, head_params, memory_floor, params_floor

#: Bytes a trained parameter holds: fp32 weight, gradient and Adam's two moments.
TRAINED_PARAM_BYTES = 16


#: the position kinds built as a table of tokens x width with the model (learned_2d's rows and columns are small)
TABLE_KINDS = ("learned", "sincos2d")


def check_model_fits(config: Any, objective: Any = None) -> None:
    """Refuse a model whose weights and optimiser state alone exceed the free memory, from its
    config, before it is built; its position table too, which grows with the image (a fixed one at
    16,384 px is gigabytes: the build was killed by the kernel, without a word). ``objective``: a
    pre-training objective's config, whose decoder (MAE's) counts too: its fixed table is the
    encoder's grid at the decoder's width."""
    params, available = params_floor(config), available_memory()
    if params is None or available is None:
        return
    params += _decoder_params(objective)
    frozen = bool(getattr(objective, "fixed_pos_embed", False))  # MAE holds a learned encoder table fixed
    table = _table_bytes(config, frozen) + _decoder_table_bytes(config, objective)
    weights = params * TRAINED_PARAM_BYTES
    if table + weights <= available:
        return
    if table > weights:
        (h, w), (ih, iw) = config.grid_size, config.img_size
        decoder = getattr(objective, "decoder_dim", 0)
        width = f"({config.embed_dim} + the decoder's {decoder})" if decoder else f"{config.embed_dim}"
        raise ValueError(f"the model's position table{'s' if decoder else ''} for its {h}x{w} grid ({ih}x{iw} px) "
                         f"hold{'' if decoder else 's'} {h * w:,} x {width} values: the model needs at least "
                         f"{(table + weights) / 2 ** 30:,.1f} GiB and {available / 2 ** 30:,.1f} GiB are free: lower "
                         f"--img-size")
    head = head_params(config)
    what = (f"its head for {config.num_classes:,} classes" if 2 * head > params else
            f"{getattr(config, 'depth', '?')} blocks of width {getattr(config, 'embed_dim', '?')}")
    raise ValueError(f"the model ({what}) has at least {params:,} parameters: training them needs at least "
                     f"{params * TRAINED_PARAM_BYTES / 2 ** 30:,.1f} GiB and {available / 2 ** 30:,.1f} GiB are free")


def _table_bytes(config: Any, frozen: bool = False) -> int:
    """The bytes of the position table the model builds (a learned one with its gradient and Adam's moments,
    unless ``frozen``)."""
    if getattr(config, "pos_embed", None) not in TABLE_KINDS or not hasattr(config, "grid_size"):
        return 0
    h, w = getattr(config, "table_grid", config.grid_size)  # (a learned table may be held at another size)
    return h * w * config.embed_dim * (TRAINED_PARAM_BYTES if config.pos_embed == "learned" and not frozen else 4)


def _decoder_table_bytes(config: Any, objective: Any) -> int:
    """MAE's decoder's fixed sine-cosine table: the encoder's grid at the decoder's width, float32, held and its
    values computed once beside it (``selfsup.mae.fill_mae_pos_table``)."""
    if not getattr(objective, "decoder_dim", None) or not hasattr(config, "grid_size"):
        return 0
    h, w = config.grid_size
    return 2 * h * w * objective.decoder_dim * 4


def _decoder_params(objective: Any) -> int:
    """A lower bound of MAE's decoder's parameters: each block's qkv, projection and MLP matrices."""
    if not getattr(objective, "decoder_dim", None):
        return 0
    width, mlp = objective.decoder_dim, objective.decoder_mlp_dim
    return objective.decoder_depth * (4 * width * width + 2 * width * mlp)


def check_batches_fit(config: Any, micro_batch: int, eval_batch: int) -> None:
    """Refuse a micro-batch (or evaluation batch) that cannot fit in the memory left, by
    :func:`vitkit.models.complexity.memory_floor`."""
    available = available_memory()
    if available is None or not hasattr(config, "embed_dim"):
        return
    cost = complexity(config)  # once for both batches: it builds the model on the meta device
    for batch, training, flag in ((micro_batch, True, "--batch-size (or --micro-batch)"),
                                  (eval_batch, False, "--eval-batch-size")):
        need = memory_floor(config, batch, training, cost)
        if need > available:
            h, w = config.img_size
            raise ValueError(f"{'training' if training else 'evaluating'} {batch} images of {h}x{w} at once needs "
                             f"at least {need / 2 ** 30:,.1f} GiB and {available / 2 ** 30:,.1f} GiB are free: "
                             f"lower {flag} or --img-size")


__all__ = ["check_model_fits", "check_batches_fit"]
