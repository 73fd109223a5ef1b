"""Batch parts on a CPU (vitkit.parallel): the same numbers as accumulation, single-threaded
operations inside a run, and torch's own threads wherever parts would make a run unrepeatable."""

import threading
import time

import pytest
import torch
from safetensors.torch import load_file

import vitkit
from vitkit.data import fashion_mnist as fm
from vitkit.parallel import BatchParallel, PartedModel, choose, for_inference, parts, stochastic_modules
from vitkit.train import muon, resolve_config, train
from vitkit.train.optim import hidden_matrices
from vitkit.train.tasks import Classification
from vitkit.utils import usable_cores

real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")
two_cores = pytest.mark.skipif(usable_cores() < 2, reason="needs 2 usable cores for 2 threads")


def test_parts_cover_a_batch_in_order_without_empty_parts():
    for n in (1, 2, 5, 127, 128):
        for workers in (1, 2, 3, 8):
            got = parts(n, workers)
            assert [s.start for s in got][0] == 0 and got[-1].stop == n
            assert all(a.stop == b.start for a, b in zip(got, got[1:]))
            assert all(s.stop > s.start for s in got) and len(got) == min(n, workers)
            assert max(s.stop - s.start for s in got) - min(s.stop - s.start for s in got) <= 1


def _weights(run_dir):
    (path,) = (run_dir / "model").glob("*.safetensors")
    return load_file(path)


@real
@two_cores
def test_two_batch_parts_train_exactly_what_two_accumulation_steps_train(tmp_path):
    """The contract of parts: two threads with half a batch each = two micro-batches of the same
    images one after the other (both single-threaded inside), to the bit. (With augmentation the
    pixels differ: micro-batches draw theirs one after the other, parts share the whole batch's.)"""
    common = dict(max_steps=6, batch_size=32, runs_dir=str(tmp_path), progress=False, val_size=100,
                  eval_batch_size=500, warmup_steps=2, tensorboard=False, random_erasing=0.0, test_size=1000)
    parted = train(resolve_config("fmnist", name="parts", threads=2, cpu_parallel="batch", **common))
    accumulated = train(resolve_config("fmnist", name="accum", threads=1, accum_steps=2, **common))
    a, b = _weights(tmp_path / "parts"), _weights(tmp_path / "accum")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert parted["test_top1"] == accumulated["test_top1"]
    assert parted["test_loss"] == pytest.approx(accumulated["test_loss"], rel=1e-6)


@real
@two_cores
def test_a_run_computes_its_parts_on_two_threads_with_single_threaded_operations(tmp_path, monkeypatch):
    """The mechanism that keeps a run's speed beside a busy process: no operation waits for
    a second OpenMP thread (torch's threads are 1 inside), and the parts run on two threads."""
    seen = []
    real_loss = Classification.loss

    def spy(self, run, x, y, extra):
        seen.append((threading.current_thread().name, torch.get_num_threads(), len(y)))
        return real_loss(self, run, x, y, extra)

    monkeypatch.setattr(Classification, "loss", spy)
    real_orthogonalize, orthogonalized = muon.orthogonalize, []

    def spy_muon(update):  # Muon's matrices (the recipe's optimiser) share the parts' workers too
        orthogonalized.append((threading.current_thread().name, torch.get_num_threads()))
        return real_orthogonalize(update)

    monkeypatch.setattr(muon, "orthogonalize", spy_muon)
    lines = []
    train(resolve_config("fmnist", max_steps=3, batch_size=32, runs_dir=str(tmp_path), name="r", progress=False,
                         val_size=100, threads=2, tensorboard=False, test_size=100), log=lines.append)
    assert "(2 CPU threads, parallel over batch)" in lines[0]
    assert {threads for _, threads, _ in seen} == {1}
    assert {n for _, _, n in seen} == {16}
    assert len({name for name, _, _ in seen}) == 2 and all(name.startswith("vitkit-part") for name, _, _ in seen)
    # 3 steps, and the cost line's timing of one step's (on the same workers)
    assert len(orthogonalized) == (3 + 1) * len(hidden_matrices(vitkit.create_model("vit_fmnist_hybrid")))
    assert {name for name, _ in orthogonalized} == {name for name, _, _ in seen}
    assert {threads for _, threads in orthogonalized} == {1}
    assert torch.get_num_threads() == 2  # the run's --threads again once it ends, not the parts' 1


def test_spread_shares_pieces_out_by_cost_and_gives_their_results_in_order():
    """Each item's result where its item was; the costliest items on different workers, each worker's in turn."""
    where = {}

    def square(x):
        where[x] = threading.current_thread().name
        time.sleep(0.02)  # (a worker that finished at once could take the other share too: two threads kept)
        return x * x

    items, costs = [1, 2, 3, 4, 5], [1, 9, 1, 8, 1]
    assert BatchParallel(2).spread(square, items, costs) == [1, 4, 9, 16, 25]
    assert where[2] != where[4] and {where[2], where[4]} == set(where.values())  # 9 and 8 apart, then the 1s
    assert [where[x] for x in (1, 3, 5)].count(where[4]) == 2
    assert BatchParallel(1).spread(square, items, costs) == [1, 4, 9, 16, 25]
    assert BatchParallel(4).spread(square, [], []) == []


def test_random_layers_keep_torchs_threads_and_batch_refuses_them_by_name():
    plain = vitkit.create_model("vit_fmnist_hybrid")
    assert stochastic_modules(plain) == []
    dropped = vitkit.create_model("vit_fmnist_hybrid", depth=2, drop_path_rate=0.1)  # block 0's rate is 0
    assert stochastic_modules(dropped) == ["blocks.1"]
    assert stochastic_modules(vitkit.create_model("vit_fmnist", attn_drop_rate=0.1))[0] == "blocks.0.attn"
    assert stochastic_modules(vitkit.create_model("vit_fmnist", drop_rate=0.1))  # nn.Dropout
    cpu = torch.device("cpu")
    parallel, how = choose("auto", 2, cpu, 1, plain, compiled=False)
    assert isinstance(parallel, BatchParallel) and parallel.workers == 2 and how == "batch"
    parallel, how = choose("auto", 2, cpu, 1, dropped, compiled=False)
    assert parallel is None and "blocks.1" in how
    with pytest.raises(ValueError, match="blocks.1.*--cpu-parallel ops or auto"):
        choose("batch", 2, cpu, 1, dropped, compiled=False)
    assert choose("auto", 2, cpu, 2, plain, compiled=False)[0] is None  # torchrun: a part per process already
    assert choose("auto", 2, cpu, 1, plain, compiled=True)[0] is None
    assert choose("auto", 1, cpu, 1, plain, compiled=False)[0] is None  # one thread: nothing to split
    assert choose("ops", 2, cpu, 1, plain, compiled=False)[0] is None
    with pytest.raises(ValueError, match="auto, batch, ops"):
        choose("threads", 2, cpu, 1, plain, compiled=False)


def test_scoring_in_parts_counts_the_same_and_adds_the_same_loss():
    torch.manual_seed(0)
    model = vitkit.create_model("vit_fmnist_hybrid")
    batches = [(torch.randn(37, 1, 28, 28), torch.randint(0, 10, (37,)), ()) for _ in range(3)]
    task = Classification()
    whole = task.evaluate(model, batches, torch.bfloat16)
    pool = BatchParallel(3)
    try:
        with pool.single_threaded_ops():
            parted = task.evaluate(model, batches, torch.bfloat16, pool)
    finally:
        pool.close()
    assert parted[1] == whole[1] and parted[0] == pytest.approx(whole[0], rel=1e-5)


def test_inference_in_parts_gives_the_models_outputs_in_order():
    """What vitkit predict/eval run on a CPU: the wrapped model's logits, the batch's order kept."""
    torch.manual_seed(0)
    model = vitkit.create_model("vit_fmnist_hybrid").eval()
    x = torch.randn(9, 1, 28, 28)
    parted = for_inference(model, threads=2)
    assert isinstance(parted, PartedModel) and parted.config is model.config
    with torch.inference_mode():
        want, got = model(x), parted(x)
        singles = torch.cat([model(x[i:i + 1]) for i in range(len(x))])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, singles, rtol=1e-5, atol=1e-5)
    assert not got.requires_grad and torch.get_num_threads() >= 1
    assert for_inference(model, threads=1) is model


@real
@two_cores
def test_batch_parts_asked_for_a_model_with_random_layers_is_one_line_and_writes_nothing(tmp_path, capsys):
    from vitkit.cli import main

    code = main(["train", "--cpu-parallel", "batch", "--threads", "2",
                 "--model-args", '{"depth": 2, "drop_path_rate": 0.1}', "--max-steps", "2",
                 "--runs-dir", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0]
    assert "cpu_parallel batch cannot split" in err[0] and "blocks.1" in err[0] and "--cpu-parallel ops" in err[0]
    assert list(tmp_path.iterdir()) == []
