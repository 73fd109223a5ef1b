"""DeiT's distillation: the losses, the teacher's input, torchvision teachers, a distilled run."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitkit
from conftest import randomize
from vitkit.data import fashion_mnist as fm
from vitkit.train import resolve_config, train
from vitkit.train.distill import InputSpec, Teacher, distillation_loss, load_teacher

real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")


def logits(seed, b=6, c=5):
    return torch.randn(b, c, generator=torch.Generator().manual_seed(seed))


def test_losses_follow_deit():
    cls, dist, teacher, y = logits(0), logits(1), logits(2), torch.tensor([0, 1, 2, 3, 4, 0])
    ce = F.cross_entropy(cls, y)
    assert torch.allclose(distillation_loss((cls, dist), y, None, "none"), ce)
    # hard: half the label loss, half the loss against the teacher's decisions
    hard = distillation_loss((cls, dist), y, teacher, "hard")
    assert torch.allclose(hard, 0.5 * ce + 0.5 * F.cross_entropy(dist, teacher.argmax(-1)))
    # soft: KL(teacher || student) at temperature tau, summed and divided by batch x classes
    tau, alpha = 2.0, 0.3
    p_t, logp_s = (teacher / tau).softmax(-1), (dist / tau).log_softmax(-1)
    kl = (p_t * (p_t.log() - logp_s)).sum() / dist.numel()
    soft = distillation_loss((cls, dist), y, teacher, "soft", alpha=alpha, tau=tau)
    assert torch.allclose(soft, (1 - alpha) * ce + alpha * tau ** 2 * kl, atol=1e-6)
    # a student that already agrees with its teacher pays only the label part
    assert torch.allclose(distillation_loss((cls, teacher), y, teacher, "soft", alpha=alpha), (1 - alpha) * ce,
                          atol=1e-6)
    # a student without a distillation token uses its one output for both terms
    assert torch.allclose(distillation_loss(cls, y, teacher, "hard"),
                          0.5 * ce + 0.5 * F.cross_entropy(cls, teacher.argmax(-1)))
    with pytest.raises(ValueError, match="teacher's logits"):
        distillation_loss(cls, y, None, "soft")


class Probe(nn.Module):
    """Returns what it was given, so the test can look at the teacher's input."""

    def forward(self, x):
        self.seen = x
        return x.flatten(1)[:, :3]


def test_the_teacher_sees_its_own_input_and_never_trains():
    student = InputSpec((28, 28), 1, (0.2860,), (0.3530,))
    teacher = Teacher(Probe(), InputSpec((32, 32), 3, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)), "probe")
    pixels = torch.rand(2, 1, 28, 28)
    teacher.train()  # stays in eval mode
    assert not teacher.training and not teacher.model.training
    teacher((pixels - 0.2860) / 0.3530, student)
    seen = teacher.model.seen
    assert seen.shape == (2, 3, 32, 32)
    expected = (F.interpolate(pixels, size=(32, 32), mode="bilinear", antialias=True) - 0.5) / 0.5
    assert torch.allclose(seen, expected.expand(-1, 3, -1, -1), atol=1e-5)


def test_torchvision_teacher_from_a_state_dict(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    path = tmp_path / "r18.pth"
    torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), path)
    teacher = load_teacher(f"torchvision:resnet18:{path}", 10)
    out = teacher(torch.randn(2, 1, 28, 28), InputSpec((28, 28), 1, (0.2860,), (0.3530,)))
    assert out.shape == (2, 10) and not any(p.requires_grad for p in teacher.parameters())
    with pytest.raises(ValueError, match="does not fit torchvision's resnet18 with 5 classes"):
        load_teacher(f"torchvision:resnet18:{path}", 5)
    with pytest.raises(ValueError, match="torchvision:NAME:FILE"):
        load_teacher("torchvision:resnet18", 10)
    with pytest.raises(ValueError, match="unknown torchvision classifier"):
        load_teacher(f"torchvision:resnet9000:{path}", 10)


def test_config_needs_a_teacher_and_sane_weights():
    with pytest.raises(ValueError, match="needs --teacher"):
        resolve_config("fmnist", distill="hard")
    with pytest.raises(ValueError, match="distill must be"):
        resolve_config("fmnist", distill="medium", teacher="t")
    with pytest.raises(ValueError, match="alpha must be"):
        resolve_config("fmnist", distill="soft", teacher="t", alpha=1.5)


@real
@pytest.mark.slow
def test_a_deit_student_distils_from_a_vitkit_teacher(tmp_path):
    teacher_dir = tmp_path / "teacher"
    randomize(vitkit.create_model("vit_fmnist_hybrid", img_size=32)).save_pretrained(teacher_dir)  # another size
    # a few steps of a few images: nothing here is a score (losses finite, the distillation head moved off its
    # zero start); 30 steps of 64 scored on 1,500 images were 20 s of the suite's slowest minute
    cfg = resolve_config("fmnist", model="vit_fmnist", max_steps=4, batch_size=16, warmup_steps=1,
                         val_size=50, test_size=100, runs_dir=str(tmp_path), name="student", checkpoint_every=4,
                         progress=False,
                         model_args={"class_token": True, "global_pool": "token", "distill_token": True},
                         distill="hard", teacher=str(teacher_dir))
    logs = []
    summary = train(cfg, log=logs.append)
    assert any(line.endswith(f"from {teacher_dir}, which sees each 28x28 batch resized to its 32x32") for line in logs)
    rows = [json.loads(r) for r in (tmp_path / "student" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in rows if "train_loss" in r]
    assert all(torch.isfinite(torch.tensor(losses))) and summary["steps"] == 4
    student = vitkit.from_pretrained(tmp_path / "student" / "model")
    assert student.config.distill_token and student.head_dist.weight.abs().sum() > 0  # its head learned
    with pytest.raises(ValueError, match="distillation needs the same classes"):
        randomize(vitkit.create_model("vit_fmnist_hybrid", num_classes=3)).save_pretrained(tmp_path / "t3")
        train(resolve_config("fmnist", max_steps=2, runs_dir=str(tmp_path), name="bad", progress=False,
                             distill="soft", teacher=str(tmp_path / "t3")))
    assert not (tmp_path / "bad").exists()  # refused before anything was written
