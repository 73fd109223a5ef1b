"""SimMIM (Xie et al., "A Simple Framework for Masked Image Modeling", arXiv 2111.09886).

The facts that decide correctness (Hugging Face's ``ViTForMaskedImageModeling`` is the
reference; tests compare loss and reconstruction to it on the same weights and masks):

- masks are square blocks of ``mask_block`` pixels (32 in the paper, a whole number of
  patches) chosen at random, ``ceil(mask_ratio x blocks)`` of them (ratio 0.6);
- a masked patch's embedding is replaced by one learnable mask token *before* the position
  embeddings are added; the whole sequence (class token included) runs through the encoder;
- the head is one linear layer: a 1x1 convolution from the final patch tokens to
  ph*pw*C channels, then a pixel shuffle back to the image;
- the loss is L1 between the reconstruction and the (normalised) input on the masked pixels
  only, summed and divided by (masked pixels + 1e-5) and by the channels.

The paper's 32 px block at 192 px is a sixth of the image side; at 28 px (Fashion-MNIST)
one 4 px patch (a seventh) is the like-for-like block, which is what ``vitkit pretrain``
uses there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .base import PretrainConfig, Pretrainer, PretrainOutput
from .masking import block_mask, block_tiling


@dataclass
class SimMIMConfig(PretrainConfig):
    objective: str = "simmim"
    mask_ratio: float = 0.6
    #: side of the square mask blocks in pixels: a whole number of patches that tiles the image
    mask_block: int = 32


class SimMIM(Pretrainer):
    """SimMIM on a ViT (plain or EVA-style): ``model(images, mask=BOOL_B_N)`` -> loss, reconstruction."""

    objective: ClassVar[str] = "simmim"
    config_cls: ClassVar[type] = SimMIMConfig

    def __init__(self, encoder=None, config: Optional[SimMIMConfig] = None, **options):
        super().__init__(encoder, config, **options)
        problems: List[str] = block_tiling(self.encoder.config.img_size, self.patch_size, self.config.mask_block)
        if problems:
            raise ValueError("invalid simmim config: " + "; ".join(problems))
        D, C = self.encoder.embed_dim, self.encoder.config.in_chans
        self.mask_token = nn.Parameter(torch.zeros(1, 1, D))
        # the one-layer head: a 1x1 convolution to ph*pw*C channels per patch (HF: decoder.0)
        self.decoder = nn.Conv2d(D, self.patch_size[0] * self.patch_size[1] * C, kernel_size=1)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """SimMIM's: mask token and head N(0, 0.02) truncated, head bias 0 (the encoder keeps its own)."""
        nn.init.trunc_normal_(self.mask_token, std=0.02, a=-0.04, b=0.04)
        nn.init.trunc_normal_(self.decoder.weight, std=0.02, a=-0.04, b=0.04)
        nn.init.zeros_(self.decoder.bias)

    def draw_problems(self) -> List[str]:
        """Why this model cannot draw its own masks as configured (a block so large that the
        mask ratio cannot be honoured); masks given to ``forward`` need none of this."""
        return block_tiling(self.encoder.config.img_size, self.patch_size, self.config.mask_block,
                            self.config.mask_ratio)

    def draw(self, batch: int, generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
        cfg = self.config
        problems = self.draw_problems()
        if problems:
            raise ValueError("invalid simmim config: " + "; ".join(problems))
        return {"mask": block_mask(batch, self.grid, self.patch_size, cfg.mask_block, cfg.mask_ratio, generator)}

    def reconstruct(self, images: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Images and (B, N) bool mask -> the reconstruction (B, C, H, W)."""
        enc = self.encoder
        tokens, grid = enc.patch_tokens(images)
        tokens = torch.where(mask[..., None], self.mask_token.to(tokens.dtype), tokens)
        x = enc.encode_tokens(enc.embed_tokens(tokens, grid), grid)[0]
        x = x[:, enc.num_prefix_tokens:]
        B, N, D = x.shape
        maps = self.decoder(x.transpose(1, 2).reshape(B, D, *grid))  # (B, C*ph*pw, gh, gw)
        return unpatchify_channels_first(maps, self.patch_size)

    def forward(self, images: torch.Tensor, mask: Optional[torch.Tensor] = None) -> PretrainOutput:
        self.check_images(images)
        if mask is not None:
            self.check_draw("mask", mask, images.shape[0], torch.bool)
        mask = self._draws(images, {"mask": mask})["mask"]
        recon = self.reconstruct(images, mask)
        pred, target = self.patchify(recon), self.patchify(images)
        weight = mask.float()  # fp32 under autocast too: a bf16 sum of ones is exact only to 256
        l1 = F.l1_loss(pred.float(), target.float(), reduction="none").sum(-1)  # (B, N): over ph*pw*C
        pixels = weight.sum() * self.patch_size[0] * self.patch_size[1]
        loss = (l1 * weight).sum() / (pixels + 1e-5) / images.shape[1]
        return PretrainOutput(loss=loss, pred=pred, mask=weight, target=target, reconstruction=recon)

    def pixel_prediction(self, images: torch.Tensor, out: PretrainOutput) -> torch.Tensor:
        return self.pixels(out.reconstruction.float())


def unpatchify_channels_first(maps: torch.Tensor, patch_size) -> torch.Tensor:
    """(B, C*ph*pw, gh, gw) -> (B, C, gh*ph, gw*pw): PyTorch's pixel shuffle, also for
    rectangular patches (channel c*ph*pw + i*pw + j is pixel (i, j) of colour c)."""
    B, K, gh, gw = maps.shape
    ph, pw = patch_size
    C = K // (ph * pw)
    x = maps.reshape(B, C, ph, pw, gh, gw).permute(0, 1, 4, 2, 5, 3)
    return x.reshape(B, C, gh * ph, gw * pw)


__all__ = ["SimMIM", "SimMIMConfig", "unpatchify_channels_first"]
