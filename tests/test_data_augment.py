"""Batched augmentation: each sample gets its own crop/flip, reproducibly from a generator."""

import torch

from vitkit.data.augment import random_crop, random_hflip


def test_random_crop_is_a_shifted_window_per_sample():
    x = torch.arange(2 * 1 * 6 * 6, dtype=torch.float32).reshape(2, 1, 6, 6) + 1
    out = random_crop(x, 2, torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for b in range(2):  # every output is some 6x6 window of the padded input
        windows = [padded[b, :, i:i + 6, j:j + 6] for i in range(5) for j in range(5)]
        assert any(torch.equal(out[b], w) for w in windows)
    again = random_crop(x, 2, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    assert torch.equal(random_crop(x, 0), x)


def test_hflip_flips_some_samples():
    x = torch.randn(64, 1, 4, 4)
    out = random_hflip(x, torch.Generator().manual_seed(1))
    flipped = [torch.equal(o, s.flip(-1)) for o, s in zip(out, x)]
    kept = [torch.equal(o, s) for o, s in zip(out, x)]
    assert all(f or k for f, k in zip(flipped, kept)) and 10 < sum(flipped) < 54
