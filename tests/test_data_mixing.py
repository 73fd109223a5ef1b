"""DeiT's batch regularisers: Mixup/CutMix targets and boxes, random erasing (timm semantics)."""

import pytest
import torch
import torch.nn.functional as F

from vitkit.data.mixing import cutmix_box, mixup_cutmix, random_erasing, smooth_one_hot
from vitkit.train.distill import distillation_loss


def gen(seed):
    return torch.Generator().manual_seed(seed)


def batch(b=8, c=3, h=16, w=16):
    return torch.randn(b, c, h, w, generator=gen(123)), torch.arange(b) % 5


def test_smoothed_one_hot():
    t = smooth_one_hot(torch.tensor([0, 2]), 4, 0.1)
    assert torch.allclose(t, torch.tensor([[0.925, 0.025, 0.025, 0.025], [0.025, 0.025, 0.925, 0.025]]))


def test_mixup_targets_split_lam_and_one_minus_lam():
    x, y = batch()
    out, t, info = mixup_cutmix(x, y, 5, mixup_alpha=0.8, generator=gen(0))
    lam = info["lam"]
    assert not info["cutmix"] and 0 < lam < 1
    assert torch.allclose(t.sum(1), torch.ones(len(y)))
    assert torch.allclose(out, lam * x + (1 - lam) * x.flip(0))
    for i in range(len(y)):  # lam on the own label, 1 - lam on the mirrored sample's
        expected = torch.zeros(5)
        expected[y[i]] += lam
        expected[y.flip(0)[i]] += 1 - lam
        assert torch.allclose(t[i], expected)
    # label smoothing is folded in: lam * smooth(y) + (1 - lam) * smooth(y_flipped)
    _, ts, _ = mixup_cutmix(x, y, 5, mixup_alpha=0.8, smoothing=0.1, generator=gen(0))
    assert torch.allclose(ts, lam * smooth_one_hot(y, 5, 0.1) + (1 - lam) * smooth_one_hot(y.flip(0), 5, 0.1))
    assert torch.allclose(ts.sum(1), torch.ones(len(y)))
    # the same generator seed, the same draws
    again, t2, info2 = mixup_cutmix(x, y, 5, mixup_alpha=0.8, generator=gen(0))
    assert torch.equal(again, out) and torch.equal(t2, t) and info2["lam"] == lam


def test_cutmix_box_area_matches_the_corrected_lambda():
    x, y = batch()
    for seed in range(20):
        out, t, info = mixup_cutmix(x, y, 5, cutmix_alpha=1.0, generator=gen(seed))
        assert info["cutmix"]
        y0, y1, x0, x1 = info["box"]
        inside = torch.zeros(16, 16, dtype=torch.bool)
        inside[y0:y1, x0:x1] = True
        assert info["lam"] == pytest.approx(1 - inside.sum().item() / 256)
        assert torch.equal(out[..., inside], x.flip(0)[..., inside])  # pasted from the mirrored sample
        assert torch.equal(out[..., ~inside], x[..., ~inside])
        assert torch.allclose(t.sum(1), torch.ones(len(y)))
        assert torch.allclose(t[0, y[0]] if y[0] != y[-1] else t[0, y[0]] - (1 - info["lam"]),
                              torch.tensor(info["lam"]))
    (y0, y1, x0, x1), lam = cutmix_box((1, 1, 10, 20), 0.75, gen(0))  # side sqrt(1 - lam) = 0.5
    assert (y1 - y0) <= 5 and (x1 - x0) <= 10 and lam == pytest.approx(1 - (y1 - y0) * (x1 - x0) / 200)


def test_switching_between_mixup_and_cutmix():
    x, y = batch()
    kinds = [mixup_cutmix(x, y, 5, 0.8, 1.0, 0.5, generator=gen(s))[2]["cutmix"] for s in range(200)]
    assert 60 < sum(kinds) < 140
    assert not any(mixup_cutmix(x, y, 5, 0.8, 1.0, 0.0, generator=gen(s))[2]["cutmix"] for s in range(20))
    out, t, info = mixup_cutmix(x, y, 5, generator=gen(0))  # both off: untouched, one-hot
    assert out is x and info["lam"] == 1.0 and torch.equal(t, F.one_hot(y, 5).float())


def test_soft_targets_in_the_loss_and_with_distillation():
    logits = torch.randn(6, 5, generator=gen(1))
    teacher = torch.randn(6, 5, generator=gen(2))
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    t = smooth_one_hot(y, 5, 0.1) * 0.7 + smooth_one_hot(y.flip(0), 5, 0.1) * 0.3
    soft_ce = (-t * logits.log_softmax(-1)).sum(-1).mean()
    assert torch.allclose(distillation_loss(logits, t, None, "none", label_smoothing=0.1), soft_ce)
    # one-hot soft targets = class indices
    assert torch.allclose(distillation_loss(logits, F.one_hot(y, 5).float(), None, "none"),
                          F.cross_entropy(logits, y))
    hard = distillation_loss((logits, logits), t, teacher, "hard")
    assert torch.allclose(hard, 0.5 * soft_ce + 0.5 * F.cross_entropy(logits, teacher.argmax(-1)))


def test_random_erasing_changes_about_p_of_the_samples_inside_one_box():
    x = torch.randn(2000, 3, 20, 24, generator=gen(5))
    out = random_erasing(x, 0.25, gen(7))
    changed = (out != x).flatten(1).any(1)
    assert 0.2 < changed.float().mean() < 0.3
    areas = []
    for i in torch.nonzero(changed)[:, 0].tolist():
        diff = (out[i] != x[i]).any(0)
        rows, cols = torch.nonzero(diff.any(1))[:, 0], torch.nonzero(diff.any(0))[:, 0]
        r0, r1, c0, c1 = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
        box = torch.zeros_like(diff)
        box[r0:r1, c0:c1] = True
        assert not diff[~box].any()  # nothing outside one rectangle
        assert (out[i][:, box] != x[i][:, box]).float().mean() > 0.99  # filled with noise
        areas.append(((r1 - r0) * (c1 - c0)).item() / (20 * 24))
    assert min(areas) >= 0.015 and max(areas) <= 0.36  # 2%-1/3 (rounded sides)
    assert torch.equal(out, random_erasing(x, 0.25, gen(7)))
    assert random_erasing(x, 0.0, gen(7)) is x


def test_randaugment_parses_timm_specs_and_refuses_others():
    from vitkit.data.randaugment import parse_randaugment
    from vitkit.train import resolve_config

    assert parse_randaugment("m9-mstd0.5") == (2, 9.0, 0.5)
    assert parse_randaugment("rand-m9-mstd0.5-inc1") == (2, 9.0, 0.5)
    assert parse_randaugment("m7-n3") == (3, 7.0, 0.0)
    for bad in ("m9-foo", "mstd0.5", "m11", "m9-inc0", ""):
        with pytest.raises(ValueError, match="randaugment"):
            parse_randaugment(bad)
    with pytest.raises(ValueError, match="randaugment 'x9'"):
        resolve_config("fmnist", randaugment="x9")


def test_randaugment_is_deterministic_for_a_generator_and_changes_images():
    from vitkit.data.randaugment import OPS, RandAugment, apply_op

    x = torch.randint(0, 256, (64, 3, 20, 20), generator=gen(0), dtype=torch.uint8)
    ra = RandAugment.from_spec("m9-mstd0.5")
    a, b = ra(x, gen(1)), ra(x, gen(1))
    assert torch.equal(a, b) and a.dtype == torch.uint8 and a.shape == x.shape
    assert not torch.equal(a, ra(x, gen(2)))
    changed = (a != x).flatten(1).any(1).float().mean()
    assert 0.5 < changed < 0.95  # each of 2 ops applied with p 0.5
    plan = ra.draw(2000, gen(3))
    mags = torch.tensor([m for ops in plan for _, m, _ in ops])
    assert mags.mean() == pytest.approx(9.0, abs=0.05) and mags.std() == pytest.approx(0.5, abs=0.05)
    assert sum(len(ops) for ops in plan) / 2000 == pytest.approx(1.0, abs=0.06)
    for op in OPS:  # every op keeps shape and dtype, on grey and colour images
        for img in (x[0], x[0, :1]):
            out = apply_op(img, op, 9.0, negate=True)
            assert out.shape == img.shape and out.dtype == torch.uint8
    assert torch.equal(apply_op(x[0], "Invert", 0.0), 255 - x[0])
    assert torch.equal(apply_op(x[0], "PosterizeIncreasing", 10.0), torch.zeros_like(x[0]))  # 0 bits


def test_randaugment_in_the_file_pipeline():
    pytest.importorskip("torchvision")
    from PIL import Image

    from vitkit.data.pipelines import train_transform

    img = Image.fromarray(torch.randint(0, 256, (40, 40, 3), generator=gen(0), dtype=torch.uint8).numpy())
    t = train_transform(32, (0.5,) * 3, (0.5,) * 3, randaugment="m9-mstd0.5")
    assert "RandAugment" in repr(t)
    torch.manual_seed(0)
    a = t(img)
    torch.manual_seed(0)
    assert torch.equal(a, t(img)) and a.shape == (3, 32, 32) and a.dtype == torch.float32
