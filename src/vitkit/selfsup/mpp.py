"""Masked patch prediction, the ViT paper's self-supervision (Dosovitskiy et al. 2021, 4.6 and B.1.2).

The facts that decide correctness (no released reference exists; the tests pin each one):

- ``mask_ratio`` (50%) of the patch embeddings are corrupted, chosen at random per image;
  each corrupted one independently becomes a learnable [mask] embedding (80%), the embedding
  of another patch (10%) or stays as it is (10%) -- BERT's recipe. "Another patch" is read as
  another patch of the same image (uniform over the other N - 1), which keeps each image's
  corruption independent of the rest of the batch (and of how DDP splits it);
- corruption acts on the patch embeddings, before the position embeddings are added (BERT
  corrupts tokens, then adds positions), and the full sequence runs through the encoder;
- every corrupted patch's final token predicts the patch's **mean colour in 3 bits per
  channel**: each channel's mean over the patch, of the pixel values in [0, 1] (the encoder's
  normalisation undone), quantised to 8 levels; the classes are the 8^C combinations (512 for
  RGB, 8 for grey), red the most significant digit; one linear layer makes the logits and the
  loss is their cross-entropy averaged over the corrupted patches.

The paper reports ViT-B/16 at 79.9% ImageNet top-1 after this pre-training on JFT: 2 points
over training from scratch and 4 behind supervised pre-training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .base import PretrainConfig, Pretrainer, PretrainOutput, count_for, masked_mean
from .masking import MASK_TOKEN, RANDOM_PATCH, corruption, random_mask


@dataclass
class MPPConfig(PretrainConfig):
    objective: str = "mpp"
    mask_ratio: float = 0.5
    #: bits per channel of the mean-colour target (3: 512 classes for RGB)
    bits: int = 3
    #: shares of the corrupted patches: [mask] embedding, another patch, unchanged
    split: Tuple[float, float, float] = (0.8, 0.1, 0.1)

    def problems(self) -> List[str]:
        out = []
        if not isinstance(self.bits, int) or isinstance(self.bits, bool) or not 1 <= self.bits <= 8:
            out.append(f"bits must be an integer in 1..8, got {self.bits!r}")
        try:
            self.split = tuple(float(s) for s in self.split)
        except (TypeError, ValueError):
            return out + [f"split must be three shares, got {self.split!r}"]
        if len(self.split) != 3 or min(self.split) < 0 or abs(sum(self.split) - 1.0) > 1e-6:
            out.append(f"split must be three shares >= 0 that sum to 1 ([mask], other patch, unchanged), "
                       f"got {self.split}")
        return out


def colour_class(means: torch.Tensor, bits: int = 3) -> torch.Tensor:
    """Per-channel means in [0, 1], (..., C) -> the class index of their ``bits``-bit quantisation."""
    levels = 2 ** bits
    q = (means.float() * levels).floor().clamp(0, levels - 1).long()
    weights = levels ** torch.arange(q.shape[-1] - 1, -1, -1, device=q.device)
    return (q * weights).sum(-1)


def class_colour(classes: torch.Tensor, channels: int, bits: int = 3) -> torch.Tensor:
    """The inverse for display: class (...,) -> the centre of its colour cell, (..., C) in [0, 1]."""
    levels = 2 ** bits
    digits = [(classes // levels ** (channels - 1 - c)) % levels for c in range(channels)]
    return (torch.stack(digits, -1).float() + 0.5) / levels


class MaskedPatchPrediction(Pretrainer):
    """The ViT paper's masked patch prediction: ``model(images, mask=BOOL_B_N)`` -> loss, colour logits."""

    objective: ClassVar[str] = "mpp"
    config_cls: ClassVar[type] = MPPConfig

    def __init__(self, encoder=None, config: Optional[MPPConfig] = None, **options):
        super().__init__(encoder, config, **options)
        D = self.encoder.embed_dim
        self.channels = self.encoder.config.in_chans
        self.num_colours = (2 ** self.config.bits) ** self.channels
        self.mask_token = nn.Parameter(torch.zeros(1, 1, D))
        self.mpp_head = nn.Linear(D, self.num_colours)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """[mask] embedding N(0, 0.02) (as BERT's embeddings); a zero head (uniform first guesses)."""
        nn.init.normal_(self.mask_token, std=0.02)
        nn.init.zeros_(self.mpp_head.weight)
        nn.init.zeros_(self.mpp_head.bias)

    def draw(self, batch: int, generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
        mask = random_mask(batch, self.num_patches, count_for(self.config.mask_ratio, self.num_patches), generator)
        kinds, sources = corruption(mask, self.config.split, generator)
        return {"mask": mask, "kinds": kinds, "sources": sources}

    def targets(self, images: torch.Tensor) -> torch.Tensor:
        """(B, N) mean-colour classes of the images' patches."""
        patches = self.patchify(self.pixels(images.float()))
        B, N, _ = patches.shape
        means = patches.reshape(B, N, -1, self.channels).mean(2)  # channel last within a patch
        return colour_class(means, self.config.bits)

    def forward(self, images: torch.Tensor, mask: Optional[torch.Tensor] = None,
                kinds: Optional[torch.Tensor] = None, sources: Optional[torch.Tensor] = None) -> PretrainOutput:
        """``mask`` (B, N) bool: the corrupted patches; ``kinds``/``sources`` (B, N) long: how each
        is corrupted (:func:`~vitkit.selfsup.masking.corruption`), drawn for ``mask`` when not given."""
        self.check_images(images)
        B = images.shape[0]
        if (kinds is None) != (sources is None) or (kinds is not None and mask is None):
            raise ValueError("give kinds and sources together, with the mask they corrupt")
        if mask is not None:
            self.check_draw("mask", mask, B, torch.bool)
            if kinds is None:  # the 80/10/10 split of the given mask (global random state)
                kinds, sources = corruption(mask.cpu(), self.config.split)
            self.check_draw("kinds", kinds, B, torch.long)
            self.check_draw("sources", sources, B, torch.long)
        draws = self._draws(images, {"mask": mask, "kinds": kinds, "sources": sources})
        mask, kinds, sources = draws["mask"], draws["kinds"], draws["sources"]
        enc = self.encoder
        tokens, grid = enc.patch_tokens(images)
        swapped = torch.gather(tokens, 1, sources[..., None].expand_as(tokens))
        tokens = torch.where((kinds == RANDOM_PATCH)[..., None], swapped, tokens)
        tokens = torch.where((kinds == MASK_TOKEN)[..., None], self.mask_token.to(tokens.dtype), tokens)
        x = enc.encode_tokens(enc.embed_tokens(tokens, grid), grid)[0][:, enc.num_prefix_tokens:]
        logits = self.mpp_head(x)
        target = self.targets(images)
        weight = mask.float()  # fp32 under autocast too: a bf16 sum of ones is exact only to 256
        ce = F.cross_entropy(logits.float().transpose(1, 2), target, reduction="none")  # (B, N)
        loss = masked_mean(ce, weight)
        correct = ((logits.argmax(-1) == target) & mask).sum()
        return PretrainOutput(loss=loss, pred=logits, mask=weight, target=target, kinds=kinds, correct=correct)

    def pixel_prediction(self, images: torch.Tensor, out: PretrainOutput) -> torch.Tensor:
        """Each patch flat in the centre of its predicted colour cell."""
        colours = class_colour(out.pred.argmax(-1), self.channels, self.config.bits)  # (B, N, C)
        P = self.patch_size[0] * self.patch_size[1]
        return self.unpatchify(colours[:, :, None, :].expand(-1, -1, P, -1).flatten(2))


__all__ = ["MaskedPatchPrediction", "MPPConfig", "colour_class", "class_colour"]
