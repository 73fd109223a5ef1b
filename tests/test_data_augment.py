"""Batched augmentation: each sample gets its own crop/flip, reproducibly from a generator."""

import pytest
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


def test_memory_batches_pad_crops_with_black_and_augment_before_normalising():
    """A crop's padding is pixel 0 (black, as torchvision's RandomCrop fills), so after
    normalisation it equals the background of a black image, never the mean-grey that padding
    the normalised tensor would paint; a flipped, cropped white square stays a square of 255s."""
    from types import SimpleNamespace

    from vitkit.train.batches import Layout, MemoryBatches

    config = SimpleNamespace(in_chans=1, img_size=(8, 8), mean=(0.3,), std=(0.5,))
    images = torch.zeros(16, 1, 8, 8, dtype=torch.uint8)
    images[:, :, 3:5, 3:5] = 255
    batches = MemoryBatches(images, torch.zeros(16, dtype=torch.long), crop_pad=2, hflip=True)
    layout = Layout.fitting(16, 1, 1, 0)
    x, _, _ = next(batches.train(config, 0, layout, 0, 1))
    black, white = (0 - 0.3) / 0.5, (1 - 0.3) / 0.5
    assert sorted(x.unique().tolist()) == [pytest.approx(black), pytest.approx(white)]
    assert all(int((img == white).sum()) == 4 for img in x)  # the square is cut, never padded
    moved = sum(not torch.equal(img, x[0]) for img in x)
    assert moved > 0  # the crops differ from sample to sample


@pytest.mark.parametrize("randaugment", [False, True])
def test_an_image_gets_the_same_augmentation_however_the_batch_splits(randaugment):
    """One process in 4 micro-batches and two processes in 2 each must see each image cropped, flipped (and
    RandAugment-ed) alike: micro-batches drawn one by one from the step's generator gave the same image other
    draws (torchrun with --micro-batch drifted 6e-3 from one process)."""
    from types import SimpleNamespace

    from vitkit.data.randaugment import RandAugment
    from vitkit.train.batches import Layout, MemoryBatches

    config = SimpleNamespace(in_chans=1, img_size=(8, 8), mean=(0.5,), std=(0.5,))
    images = torch.randint(0, 256, (64, 1, 8, 8), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    batches = MemoryBatches(images, torch.arange(64), crop_pad=2, hflip=True,
                            randaugment=RandAugment.from_spec("rand-m9-n2") if randaugment else None)

    def seen(batch, accum, world, rank):  # {label: image} over two steps
        out = {}
        for x, y, _ in batches.train(config, 3, Layout(batch, accum, world, rank), 0, 2):
            out.update({int(label): img for label, img in zip(y, x)})
        return out

    one = seen(32, 4, 1, 0)
    two = {**seen(32, 2, 2, 0), **seen(32, 2, 2, 1)}
    assert one.keys() == two.keys() and len(one) == 64
    assert all(torch.equal(one[i], two[i]) for i in one)
    assert all(torch.equal(one[i], img) for i, img in seen(32, 1, 1, 0).items())  # and as one micro-batch
