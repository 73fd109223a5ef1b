"""Fine-tuning with few trainable parameters: LoRA (through ``peft``), BitFit, the head alone,
and frozen first blocks.

``--finetune lora`` puts peft's LoRA adapters (Hu et al. 2021: ``W + (alpha / r) B A``, B zero at
the start) on the linear layers of every block; their names are the block's own, timm's:
``attn.qkv`` (the fused q, k, v rows: one adapter of rank r over all three), ``attn.proj``,
``mlp.fc1``, ``mlp.fc2`` (CaiT's class attention: ``attn.q``, ``attn.k``, ``attn.v``; ConViT's
gated attention: ``attn.qk``, ``attn.v``, ``attn.pos_proj``). ``--lora-targets`` picks among them by
the last part of the name; peft's own ``LoraConfig(target_modules=...)`` takes the same names.
``bitfit`` (Ben Zaken et al. 2022) trains the biases, ``head`` the classifier alone; every mode
trains the (new) head. ``--freeze-blocks N`` freezes the embedding and the first N blocks.

When the run ends the adapters are saved as peft saves them, with the trained heads as peft's
``modules_to_save`` (``run_dir/adapter``: peft's ``PeftModel.from_pretrained`` loads them onto the
model the run started from and gives ``run_dir/model``'s logits), then merged into the weights
they adapt and the wrappers removed (:func:`merge`): the saved model is a plain model, so every
exporter works on it unchanged.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

from torch import nn

from ..extras import require
from .optim import layer_groups

MODES = ("full", "lora", "bitfit", "head")
#: ``--lora-targets``' default: every linear layer of a block (QLoRA's finding: all of them beat
#: attention alone at the same rank)
DEFAULT_TARGETS = ("qkv", "proj", "fc1", "fc2")

#: what bitfit trains: every bias, BEiT's and EVA's separate query and value biases (``q_bias``, ``v_bias``)
#: and a parallel block's MLP bias too (none of them ends in ".bias")
BIASES = (".bias", "_bias")

def _block_lists(model: nn.Module) -> List[Tuple[str, nn.ModuleList]]:
    return [(name, m) for name, m in model.named_children() if name.startswith("blocks") and
            isinstance(m, nn.ModuleList)]


def _heads(model: nn.Module) -> Tuple[str, ...]:
    return tuple(model.head_names()) if hasattr(model, "head_names") else ("head",)


#: a target's parts in the later ViTs' layouts: separate q/k/v projections (EVA-02, DINOv3 from Hugging
#: Face, Sapiens) for ``qkv``, SwiGLU's two input projections for ``fc1``; the parallel block's input
#: projection (q, k, v and the MLP's hidden layer in one) for both, its output projections for ``proj`` and
#: ``fc2`` (one ``out_proj`` over both with differential attention)
TARGET_ALIASES = {"qkv": ("q_proj", "k_proj", "v_proj", "in_proj"), "fc1": ("fc1_g", "fc1_x", "in_proj"),
                  "proj": ("attn_out_proj", "out_proj"), "fc2": ("mlp_out_proj", "out_proj")}


#: the modules of a block that compute positions, not the block's attention or MLP: a relative-position
#: MLP's fc1 and fc2 (timm's relpos ViTs: 2 -> 128 -> heads) were LoRA targets beside the block's own MLP
POSITION_PARTS = frozenset({"rel_pos", "rope", "pos_embed"})


def lora_target_names(model: nn.Module, targets: Sequence[str]) -> List[str]:
    """The full names of the blocks' linear layers (not those that compute positions: :data:`POSITION_PARTS`)
    whose last name part is in ``targets`` (``qkv`` and
    ``fc1`` stand for their parts where a model splits them: :data:`TARGET_ALIASES`); an unknown part is
    an error naming the parts the blocks have."""
    linears = [(f"{prefix}.{name}", name.rsplit(".", 1)[-1]) for prefix, blocks in _block_lists(model)
               for name, module in blocks.named_modules()
               if isinstance(module, nn.Linear) and not POSITION_PARTS & set(name.split("."))]
    have = {part for _, part in linears}
    wanted = set(targets)
    for target, parts in TARGET_ALIASES.items():
        if target in wanted and target not in have and set(parts) & have:
            wanted |= set(parts) & have
            wanted.discard(target)
    found = [full for full, part in linears if part in wanted]
    unknown = sorted(wanted - have)
    if unknown:
        raise ValueError(f"--lora-targets {', '.join(unknown)}: not a linear layer of this model's blocks "
                         f"(they have {', '.join(sorted(have))})")
    return found


def prepare(model: nn.Module, mode: str = "full", lora_rank: int = 8, lora_alpha: float = 16.0,
            lora_targets: Sequence[str] = DEFAULT_TARGETS, freeze_blocks: int = 0) -> nn.Module:
    """Make only what ``mode`` trains trainable (in place; LoRA wraps the target layers) and return
    the model. The heads always train: fine-tuning starts them from zero; so do the parts ``--init`` started
    afresh beside them (``model.fresh_parts``: a new pre-logits layer, a new MAP pool or fc_norm)."""
    if mode not in MODES:
        raise ValueError(f"finetune must be one of {', '.join(MODES)}, got {mode!r}")
    blocks = getattr(model, "blocks", nn.ModuleList())
    if not 0 <= freeze_blocks <= len(blocks):
        raise ValueError(f"--freeze-blocks {freeze_blocks}: the model has {len(blocks)} blocks")
    heads = _heads(model)
    if mode == "lora":
        if lora_rank < 1:
            raise ValueError(f"--lora-rank must be at least 1, got {lora_rank}")
        peft = require("peft", "peft", "--finetune lora")
        names = lora_target_names(model, lora_targets)
        widths = {n: min(model.get_submodule(n).in_features, model.get_submodule(n).out_features) for n in names}
        narrowest = min(widths, key=widths.get, default=None)
        if narrowest is not None and lora_rank > widths[narrowest]:
            layer = model.get_submodule(narrowest)
            raise ValueError(f"--lora-rank {lora_rank} is past the rank of {narrowest} ({layer.in_features} -> "
                             f"{layer.out_features}: at most {widths[narrowest]}); a low-rank adapter has a "
                             f"rank below its layer's width (8-64 is usual)")
        config = peft.LoraConfig(r=lora_rank, lora_alpha=lora_alpha, target_modules=names, lora_dropout=0.0,
                                 bias="none")
        peft.inject_adapter_in_model(config, model)  # freezes every other parameter
    elif mode == "bitfit":
        for name, p in model.named_parameters():
            p.requires_grad_(name.endswith(BIASES))
    elif mode == "head":
        model.requires_grad_(False)
    for name in (*heads, *getattr(model, "fresh_parts", ())):  # (the parts --init started afresh: model_from_init)
        getattr(model, name).requires_grad_(True)
    if freeze_blocks:  # the embedding too: the parameters the family puts in layer 0
        embedding = layer_groups(model).embed
        for name, p in model.named_parameters():
            if name.startswith(embedding):
                p.requires_grad_(False)
        blocks[:freeze_blocks].requires_grad_(False)
        if mode == "lora" and not any(p.requires_grad for n, p in model.named_parameters() if "lora_" in n):
            raise ValueError(f"--freeze-blocks {freeze_blocks} freezes every block that holds a LoRA adapter: only "
                             f"the head would train (--finetune head says so), or freeze fewer blocks")
    return model


#: where peft's ``PeftModel`` keeps the model it wraps: its adapter files name tensors under it
PEFT_PREFIX = "base_model.model."


def save_adapters(model: nn.Module, folder: Union[str, Path]) -> Optional[Path]:
    """Write the LoRA adapters as peft writes them (``adapter_config.json`` and
    ``adapter_model.safetensors``): ``peft.PeftModel.from_pretrained(model, folder)`` puts them on
    a plain copy of the model. None (nothing written) without adapters."""
    config = getattr(model, "peft_config", {}).get("default")
    if config is None:
        return None
    peft = require("peft", "peft", "--finetune lora")
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {PEFT_PREFIX + k: v.detach().contiguous() for k, v in peft.get_peft_model_state_dict(model).items()}
    # the heads (and the parts --init started afresh) train beside the adapters: peft's modules_to_save carries
    # them, or the adapters would reload onto a model with the head it started with (a zero one, for a new head)
    heads = [h for h in (*_heads(model), *getattr(model, "fresh_parts", ()))
             if isinstance(getattr(model, h, None), nn.Module)]
    for head in heads:
        for name, value in getattr(model, head).state_dict().items():
            tensors[f"{PEFT_PREFIX}{head}.{name}"] = value.detach().contiguous()
    config = copy.copy(config)
    config.modules_to_save = heads or None
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(folder))
    return folder


def merge(model: nn.Module) -> nn.Module:
    """Fold every LoRA adapter into the weight it adapts and put the plain layer back (in place);
    a model without adapters is returned as it is."""
    wrapped = [(name, m) for name, m in model.named_modules() if hasattr(m, "merge") and hasattr(m, "get_base_layer")]
    for name, module in wrapped:
        module.merge()
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, module.get_base_layer())
    return model


def trainable(model: nn.Module) -> Tuple[int, int]:
    """(trainable, all) parameter counts."""
    counts = [(p.numel(), p.requires_grad) for p in model.parameters()]
    return sum(n for n, t in counts if t), sum(n for n, _ in counts)


__all__ = ["MODES", "DEFAULT_TARGETS", "prepare", "merge", "save_adapters", "trainable", "lora_target_names"]
