"""On a CUDA GPU: the paths a CPU never takes. Skipped where there is no GPU.

bf16 autocast, the fused AdamW, torch.compile, channels-last inputs, a one-process NCCL DDP
step, a short real training run whose loss falls, and GPU-vs-CPU inference parity.
Run them where a GPU is: ``python -m pytest -q tests/gpu`` (PYTHONPATH=src without an install).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

import vitkit
from vitkit.data import fashion_mnist as fm
from vitkit.train import resolve_config, train
from vitkit.train.loop import make_optimizer
from vitkit.train.precision import pick_precision

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR) and not os.environ.get("VITKIT_DATA"),
                          reason="Fashion-MNIST not installed")

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def exact_fp32():
    """fp32 comparisons without TF32's 10-bit mantissa."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _step(model, optimizer, x, y, amp):
    with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def test_auto_precision_is_bf16_on_a_gpu_that_has_it_and_a_step_is_finite():
    cfg = resolve_config("fmnist")
    amp = pick_precision(cfg.precision, CUDA)
    assert amp is (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    model = vitkit.create_model("vit_small_patch16_224", num_classes=10).to(CUDA)
    x, y = torch.randn(8, 3, 224, 224, device=CUDA), torch.randint(0, 10, (8,), device=CUDA)
    loss = _step(model, make_optimizer(model, cfg), x, y, amp)
    assert torch.isfinite(loss)


def test_adamw_is_fused_on_a_gpu_and_steps_as_the_foreach_one_does():
    """The same gradients into both optimizers: cuDNN's convolution backward is not bitwise
    reproducible between two models, and Adam turns a 1e-9 gradient difference on a near-zero
    element into a visible update difference (the first GPU run failed on exactly that)."""
    torch.manual_seed(0)
    cfg = resolve_config("fmnist-adamw")  # (the default run trains with Muon)
    a = vitkit.create_model("vit_fmnist_hybrid").to(CUDA)
    b = vitkit.create_model("vit_fmnist_hybrid").to(CUDA)
    b.load_state_dict(a.state_dict())
    fused = make_optimizer(a, cfg)
    assert fused.defaults.get("fused") is True
    plain = torch.optim.AdamW(b.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=0.0, foreach=True)
    for group in fused.param_groups:  # the same decay everywhere, for the comparison
        group["weight_decay"] = 0.0
    x, y = torch.randn(64, 1, 28, 28, device=CUDA), torch.randint(0, 10, (64,), device=CUDA)
    for _ in range(3):
        torch.nn.functional.cross_entropy(a(x), y).backward()
        for p, q in zip(a.parameters(), b.parameters()):
            q.grad = p.grad.clone()
        fused.step()
        plain.step()
        fused.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_compiled_model_matches_eager():
    torch.manual_seed(0)
    model = vitkit.create_model("vit_small_patch16_224").to(CUDA).eval()
    x = torch.randn(4, 3, 224, 224, device=CUDA)
    with torch.inference_mode():
        eager = model(x)
        compiled = torch.compile(model)(x)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)


def test_channels_last_input_gives_the_same_logits():
    torch.manual_seed(0)
    model = vitkit.create_model("vit_base_r50_s16_224").to(CUDA).eval()
    x = torch.randn(2, 3, 224, 224, device=CUDA)
    with torch.inference_mode():
        want = model(x)
        got = model.to(memory_format=torch.channels_last)(x.to(memory_format=torch.channels_last))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_one_process_nccl_ddp_step_equals_the_plain_step(tmp_path):
    import torch.distributed as dist

    torch.manual_seed(0)
    plain = vitkit.create_model("vit_fmnist_hybrid").to(CUDA)
    wrapped = vitkit.create_model("vit_fmnist_hybrid").to(CUDA)
    wrapped.load_state_dict(plain.state_dict())
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(wrapped, device_ids=[0])
        cfg = resolve_config("fmnist")
        x, y = torch.randn(32, 1, 28, 28, device=CUDA), torch.randint(0, 10, (32,), device=CUDA)
        _step(plain, make_optimizer(plain, cfg), x, y, None)
        _step(ddp, make_optimizer(wrapped, cfg), x, y, None)
    finally:
        dist.destroy_process_group()
    for p, q in zip(plain.parameters(), wrapped.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@real
def test_a_short_real_training_run_learns_on_the_gpu(tmp_path):
    summary = train(resolve_config("fmnist", max_steps=200, runs_dir=str(tmp_path), name="gpu", progress=False,
                                   val_size=2000, warmup_steps=20, tensorboard=False))
    rows = [json.loads(line) for line in (tmp_path / "gpu" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in rows if "train_loss" in r]
    assert summary["device"].startswith("cuda") and losses[-1] < 0.6 * losses[0]
    assert summary["test_top1"] > 0.7


@real
def test_torchrun_one_process_trains_on_the_gpu(tmp_path):
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "vitkit",
                           "train", "--max-steps", "20", "--runs-dir", str(tmp_path), "--name", "tr",
                           "--no-progress", "--no-tensorboard", "--val-size", "500"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "tr" / "summary.json").read_text())
    assert summary["device"].startswith("cuda") and summary["processes"] == 1


def test_gpu_inference_matches_the_cpu():
    torch.manual_seed(0)
    model = vitkit.create_model("vit_small_patch16_224").eval()
    x = torch.randn(4, 3, 224, 224)
    with torch.inference_mode():
        cpu = model(x)
        gpu = model.to(CUDA)(x.to(CUDA)).cpu()
    torch.testing.assert_close(gpu, cpu, rtol=1e-4, atol=1e-4)
