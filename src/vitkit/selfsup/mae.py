"""MAE (He et al., "Masked Autoencoders Are Scalable Vision Learners", arXiv 2111.06377).

The facts that decide correctness (Hugging Face's ``ViTMAEForPreTraining`` and the official
``models_mae.py`` are the references; tests compare mask, ids, loss and predictions to the
former on the same weights and noise):

- masking by per-sample noise (B, N): patches sorted by their noise, the first
  ``int(N x (1 - mask_ratio))`` kept (75% masked); ``ids_restore`` undoes the sort;
- positions are added to all patches, then the masked ones are dropped; the class token
  (with its position slot) goes in front and the encoder sees only the visible tokens;
- the decoder: a linear map to its own width, one shared mask token for every masked patch,
  the sequence unshuffled to grid order, fixed 2D sine-cosine positions (MAE's frequency
  spacing: :func:`~vitkit.models.layers.sincos_2d_pos_embed` with ``spacing="mae"``, a zero
  slot for the class token), its own pre-LN blocks (width, depth, heads), a LayerNorm and a
  linear prediction of each patch's ph*pw*C pixels (channel last);
- the loss is the MSE over a patch's pixels, averaged over the masked patches only; with
  ``norm_pix_loss`` (the released models' setting, the default here) each target patch is
  first normalised by its own mean and (unbiased) variance + 1e-6.

A learned encoder table is held at MAE's sine-cosine values and frozen, as MAE does
(``fixed_pos_embed``); the other position kinds of vitkit train as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple

import torch
from torch import nn

from ..models.layers import Block, init_block_, sincos_2d_pos_embed, xavier_uniform_fan
from .base import PretrainConfig, Pretrainer, PretrainOutput, masked_mean
from .masking import noise as draw_noise
from .masking import shuffle_ids


@dataclass
class MAEConfig(PretrainConfig):
    objective: str = "mae"
    mask_ratio: float = 0.75
    #: normalise each target patch by its mean and variance (the released MAE models)
    norm_pix_loss: bool = True
    #: the decoder's width, depth, heads and MLP width (MAE's ViT-B default: 512, 8, 16, 2048)
    decoder_dim: int = 512
    decoder_depth: int = 8
    decoder_heads: int = 16
    decoder_mlp_dim: int = 2048
    #: a learned encoder position table is held at MAE's sine-cosine values, frozen
    fixed_pos_embed: bool = True

    def problems(self) -> List[str]:
        out = [f"{name} must be a positive integer, got {getattr(self, name)!r}"
               for name in ("decoder_dim", "decoder_depth", "decoder_heads", "decoder_mlp_dim")
               if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool)
               or getattr(self, name) <= 0]
        if not isinstance(self.norm_pix_loss, bool):  # ("no" was kept, and read as true)
            out.append(f"norm_pix_loss must be true or false, got {self.norm_pix_loss!r}")
        if not out and self.decoder_dim % self.decoder_heads:
            out.append(f"decoder_dim {self.decoder_dim} is not divisible by decoder_heads {self.decoder_heads}")
        if not out and self.decoder_dim % 4:
            out.append(f"decoder_dim must be divisible by 4 (its sine-cosine positions), got {self.decoder_dim}")
        return out


def mae_pos_table(grid: Tuple[int, int], dim: int, prefix: int) -> torch.Tensor:
    """(1, prefix + gh*gw, dim): MAE's fixed sine-cosine positions with zero prefix slots."""
    table = torch.empty(1, prefix + grid[0] * grid[1], dim)
    fill_mae_pos_table(table, grid, prefix)
    return table


@torch.no_grad()
def fill_mae_pos_table(table: torch.Tensor, grid: Tuple[int, int], prefix: int) -> None:
    """:func:`mae_pos_table`'s values written into ``table`` (1, prefix + gh*gw, dim): a large grid's table is held
    once and its values computed once beside it (built, then built again by init_weights and copied, it peaked at
    three tables: at 16,384 px 19.5 GB of the machine's 22)."""
    table[:, :prefix] = 0
    table[:, prefix:] = sincos_2d_pos_embed(grid, table.shape[-1], spacing="mae").to(table.device)


class MAE(Pretrainer):
    """MAE on a ViT (plain or EVA-style): ``model(images, noise=FLOAT_B_N)`` -> loss, per-patch pixel predictions."""

    objective: ClassVar[str] = "mae"
    config_cls: ClassVar[type] = MAEConfig

    def __init__(self, encoder=None, config: Optional[MAEConfig] = None, **options):
        super().__init__(encoder, config, **options)
        cfg, enc_cfg = self.config, self.encoder.config
        self.keep = int(self.num_patches * (1 - cfg.mask_ratio))
        if self.keep < 1:
            raise ValueError(f"invalid mae config: mask_ratio {cfg.mask_ratio} leaves no visible patch of the "
                             f"{self.num_patches}; lower it")
        Dd, P = cfg.decoder_dim, self.encoder.num_prefix_tokens
        self.decoder_embed = nn.Linear(self.encoder.embed_dim, Dd)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, Dd))
        self.decoder_pos_embed = nn.Parameter(torch.empty(1, P + self.num_patches, Dd), requires_grad=False)
        self.decoder_blocks = nn.ModuleList([
            Block(Dd, cfg.decoder_heads, cfg.decoder_mlp_dim, enc_cfg.qkv_bias, enc_cfg.norm_eps, enc_cfg.gelu,
                  attn_impl=enc_cfg.attn_impl) for _ in range(cfg.decoder_depth)])
        self.decoder_norm = nn.LayerNorm(Dd, eps=enc_cfg.norm_eps)
        self.decoder_pred = nn.Linear(Dd, self.patch_size[0] * self.patch_size[1] * enc_cfg.in_chans)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """MAE's choices where they are its own: Xavier-uniform linear layers with zero biases (the
        decoder blocks as vitkit initialises a ViT's), mask token N(0, 0.02), and fixed sine-cosine
        positions -- the decoder's, and the encoder's when its table is learned (then frozen)."""
        enc = self.encoder
        for fc in (self.decoder_embed, self.decoder_pred):
            xavier_uniform_fan(fc.weight, fc.in_features, fc.out_features)
            nn.init.zeros_(fc.bias)
        for blk in self.decoder_blocks:
            init_block_(blk)
        nn.init.normal_(self.mask_token, std=0.02)
        fill_mae_pos_table(self.decoder_pos_embed, self.grid, enc.num_prefix_tokens)
        if enc.pos_embed_kind == "learned" and self.config.fixed_pos_embed:
            fill_mae_pos_table(enc.pos_embed, enc.pos_embed_grid, enc.pos_embed_prefix_tokens)  # (its held grid)
            enc.pos_embed.requires_grad_(False)

    def draw(self, batch: int, generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
        return {"noise": draw_noise(batch, self.num_patches, generator)}

    def forward_encoder(self, images: torch.Tensor, noise: torch.Tensor):
        """-> (latent (B, prefix + keep, D), mask (B, N), ids_restore (B, N))."""
        enc = self.encoder
        tokens, grid = enc.patch_tokens(images)
        ids_keep, mask, ids_restore = shuffle_ids(noise, self.keep)
        # the encoder's own embedding of the visible patches (positions, prefix, its norm_pre: a CLIP-style encoder
        # skipped it here) and their rotations, where it has rotary positions
        x = enc.embed_tokens(tokens, grid, keep=ids_keep)
        return enc.encode_tokens(x, grid, keep=ids_keep)[0], mask, ids_restore

    def forward_decoder(self, latent: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        """-> per-patch pixel predictions (B, N, ph*pw*C) in grid order."""
        P = self.encoder.num_prefix_tokens
        x = self.decoder_embed(latent)
        B, L, Dd = x.shape
        filled = torch.cat([x[:, P:], self.mask_token.to(x.dtype).expand(B, self.num_patches + P - L, Dd)], dim=1)
        filled = torch.gather(filled, 1, ids_restore[..., None].expand(-1, -1, Dd))
        x = torch.cat([x[:, :P], filled], dim=1) + self.decoder_pos_embed
        for blk in self.decoder_blocks:
            x = blk(x)[0]
        return self.decoder_pred(self.decoder_norm(x))[:, P:]

    def targets(self, images: torch.Tensor) -> torch.Tensor:
        """The pixels each patch is scored against (normalised per patch with ``norm_pix_loss``)."""
        target = self.patchify(images.float())
        if self.config.norm_pix_loss:
            mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
            target = (target - mean) / (var + 1.0e-6) ** 0.5
        return target

    def forward(self, images: torch.Tensor, noise: Optional[torch.Tensor] = None) -> PretrainOutput:
        self.check_images(images)
        if noise is not None:
            self.check_draw("noise", noise, images.shape[0])
        noise = self._draws(images, {"noise": noise})["noise"]
        latent, mask, ids_restore = self.forward_encoder(images, noise)
        pred = self.forward_decoder(latent, ids_restore)
        target = self.targets(images)
        per_patch = ((pred.float() - target) ** 2).mean(-1)
        loss = masked_mean(per_patch, mask)  # keep < N: at least one patch is masked
        return PretrainOutput(loss=loss, pred=pred, mask=mask, target=target, ids_restore=ids_restore)

    def pixel_prediction(self, images: torch.Tensor, out: PretrainOutput) -> torch.Tensor:
        """Predictions as pixels; with ``norm_pix_loss`` the model predicts normalised patches, shown
        with the true patch's mean and variance put back (the only way to look at them)."""
        pred = out.pred.float()
        if self.config.norm_pix_loss:
            patches = self.patchify(images.float())
            pred = pred * (patches.var(-1, keepdim=True) + 1.0e-6) ** 0.5 + patches.mean(-1, keepdim=True)
        return self.pixels(self.unpatchify(pred))


__all__ = ["MAE", "MAEConfig", "mae_pos_table"]
