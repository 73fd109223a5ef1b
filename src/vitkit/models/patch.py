"""The patch embedding (image -> patch tokens) and the adapters of its weights: filters resampled to
another patch size (FlexiViT's way) or another number of input channels (timm's ``adapt_input_conv``)."""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from .norms import NormFactory
from .positions import INTERPOLATIONS
from .sizes import IntPair, to_2tuple


class PatchGrid:
    """What a patch embedding answers about its token grid (:class:`PatchEmbed`, the hybrid's
    ``HybridEmbed``); each defines ``grid_for(img_size)``, the grid of an input size."""

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    def set_img_size(self, img_size: Union[int, IntPair]) -> None:
        self.img_size = to_2tuple(img_size)
        self.grid_size = self.grid_for(self.img_size)

    def check_images(self, x: torch.Tensor, strict: bool = True) -> None:
        """Clear errors for a wrong layout, channel count or size (any size, when not ``strict``,
        that the grid can tile)."""
        check_pixel_tensor(x, self.in_chans)
        weight = next(self.parameters(), None)
        if weight is not None and x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
            raise ValueError(f"the images are {x.dtype} and the model's weights {weight.dtype}: cast one to the "
                             f"other (x.to({weight.dtype}), or model.to({x.dtype})), or run under torch.autocast")
        size = (x.shape[-2], x.shape[-1])
        if strict and size != self.img_size:
            raise ValueError(
                f"input size {size[0]}x{size[1]} does not match the model's "
                f"{self.img_size[0]}x{self.img_size[1]}; build the model with "
                f"dynamic_img_size=True or call model.set_input_size({size})")
        if not strict:
            self.grid_for(size)  # clear error when not divisible


def check_pixel_tensor(x: Any, in_chans: int) -> None:
    """A batch of images as a model takes them: a float tensor (B, ``in_chans``, H, W). A numpy array or a list was
    an AttributeError ('no attribute dim'), and an exported model ran uint8 pixels as if normalised."""
    if not isinstance(x, torch.Tensor):
        hint = " (torch.from_numpy(array))" if type(x).__module__ == "numpy" else ""
        raise TypeError(f"the model takes a torch.Tensor of images (B, {in_chans}, H, W), not a "
                        f"{type(x).__name__}{hint}: vitkit.preprocess(model, image) makes one")
    if x.dim() != 4 or x.shape[1] != in_chans:
        raise ValueError(f"expected images of shape (B, {in_chans}, H, W), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"expected float pixels, normalised as vitkit.preprocess gives them; got a {x.dtype} "
                         f"tensor (raw 0-255 values?)")


class PatchEmbed(PatchGrid, nn.Module):
    """Image (B, C, H, W) -> patch tokens (B, gh, gw, D) by a stride-P convolution.

    A convolution with kernel = stride = P is exactly "flatten each P x P patch and apply
    one shared linear map", the paper's Eq. 1, done in one kernel.
    """

    def __init__(self, img_size: IntPair, patch_size: IntPair, in_chans: int, embed_dim: int,
                 bias: bool = True, norm: Optional["NormFactory"] = None, crop_remainder: bool = False):
        super().__init__()
        #: pixels past the last whole patch are left out (timm's and Hugging Face's strided convolution
        #: does so: SigLIP so400m/14 at 384 px reads 378 px of them); otherwise they are an error
        self.crop_remainder = bool(crop_remainder)
        self.patch_size = to_2tuple(patch_size)
        self.in_chans = in_chans
        self.embed_dim = embed_dim
        self.set_img_size(img_size)
        self.proj = nn.Conv2d(in_chans, embed_dim, self.patch_size, stride=self.patch_size,
                              bias=bias)
        #: a norm of each token after the projection (AIMv2's RMSNorm; timm's ``embed_norm_layer``)
        self.norm = norm(embed_dim) if norm is not None else None

    def grid_for(self, img_size: IntPair) -> IntPair:
        h, w = img_size
        ph, pw = self.patch_size
        if self.crop_remainder and h >= ph and w >= pw:
            return (h // ph, w // pw)
        if h % ph or w % pw:
            raise ValueError(
                f"image size {h}x{w} is not divisible by the patch size {ph}x{pw}; "
                f"resize or crop the input to a multiple of the patch size")
        return (h // ph, w // pw)

    def forward(self, x: torch.Tensor, strict: bool = True) -> torch.Tensor:
        self.check_images(x, strict)
        x = self.proj(x).permute(0, 2, 3, 1)  # (B, gh, gw, D)
        return x if self.norm is None else self.norm(x)



# ----------------------------------------------------------------------------- weight adapters


def resample_patch_embed(weight: torch.Tensor, new_size: IntPair, interpolation: str = "bicubic",
                         antialias: bool = True) -> torch.Tensor:
    """Patch filters (O, C, h, w) for patches of another size (O, C, h', w'), FlexiViT's way.

    Resizing a patch is a linear map ``x' = R x``; the new filter ``w'`` is the least-squares
    solution of ``<x, w> = <R x, w'>`` for every patch ``x``: ``w' = pinv(R)^T w``. A token of an
    image resized with ``interpolation`` (timm's default: bicubic, antialiased) keeps its value
    where the resize loses nothing (upsampling), and loses least where it must (Beyer et al.
    2023). ``R``'s columns are the resized one-pixel patches; computed in float32 as timm does.
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"unknown interpolation {interpolation!r}; expected one of {INTERPOLATIONS}")
    old, new = tuple(weight.shape[-2:]), tuple(to_2tuple(new_size))
    if old == new:
        return weight
    antialias = antialias and interpolation != "nearest"
    basis = torch.eye(old[0] * old[1], dtype=torch.float32, device=weight.device).reshape(-1, 1, *old)
    resized = F.interpolate(basis, size=new, mode=interpolation, antialias=antialias,
                            align_corners=None if interpolation == "nearest" else False)
    resize = resized.reshape(old[0] * old[1], new[0] * new[1]).T  # (h'w', hw): R
    flat = weight.float().reshape(-1, old[0] * old[1])
    return (flat @ torch.linalg.pinv(resize)).reshape(*weight.shape[:2], *new).to(weight.dtype)


def adapt_input_channels(weight: torch.Tensor, in_chans: int) -> torch.Tensor:
    """First-layer filters (O, C, kh, kw) for ``in_chans`` input channels, as timm's
    ``adapt_input_conv`` does: one channel sums the C filters (a grey image gives the response
    its colour version had); more or fewer channels repeat the C filters cyclically, cut to
    ``in_chans`` and scale by C / in_chans (a multiple of C: an image whose channels repeat its
    C channels keeps its response; otherwise a start, not the same function)."""
    have = weight.shape[1]
    if in_chans < 1:
        raise ValueError(f"in_chans must be at least 1, got {in_chans}")
    if in_chans == have:
        return weight
    dtype, w = weight.dtype, weight.float()
    if in_chans == 1:
        w = w.sum(dim=1, keepdim=True)
    else:
        w = w.repeat(1, math.ceil(in_chans / have), 1, 1)[:, :in_chans] * (have / in_chans)
    return w.to(dtype)
