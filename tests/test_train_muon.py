"""Muon: its matrices' step is torch.optim.Muon's (RMS matched to AdamW), the rest is torch's AdamW,
the input and output layers stay on AdamW, and a run with it learns and resumes bitwise."""

import json
import shutil
import warnings

import pytest
import torch
from safetensors.torch import load_file

import vitkit
from vitkit.data import fashion_mnist as fm
from vitkit.parallel import BatchParallel
from vitkit.selfsup import create_pretrainer
from vitkit.train import resolve_config, train
from vitkit.train.muon import Muon, in_turn, orthogonalize
from vitkit.train.optim import hidden_matrices, make_optimizer

real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")


def _steps(optimizer, params, grads):
    for g in grads:
        for p, gp in zip(params, g):
            p.grad = gp.clone()
        optimizer.step()


@pytest.mark.parametrize("shape", [(32, 48), (48, 32)])
def test_a_matrix_steps_as_torch_muon_steps_it(shape):
    torch.manual_seed(0)
    start = torch.randn(shape)
    grads = [[torch.randn(shape)] for _ in range(4)]
    theirs, ours = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    _steps(torch.optim.Muon([theirs], lr=0.01, weight_decay=0.1, momentum=0.95, nesterov=True,
                            adjust_lr_fn="match_rms_adamw"), [theirs], grads)
    _steps(Muon([{"params": [ours], "muon": True, "weight_decay": 0.1}], lr=0.01, momentum=0.95), [ours], grads)
    moved = (theirs - start).abs().max()
    # torch orthogonalises in bf16, vitkit in fp32: 1% of the distance moved; a step without Nesterov's
    # look-ahead, or without the RMS scale, lands tens of percent away
    assert (theirs - ours).abs().max() < 0.03 * moved


def test_matrices_spread_over_workers_step_to_the_bit_as_in_turn():
    """A run split over batch parts hands Muon's orthogonalisations to its workers: the same numbers as one
    thread doing them all, each matrix once; AdamW's parameters are not handed out."""
    torch.manual_seed(0)
    shapes = [(64, 48), (48, 96), (32, 8, 3, 3), (16,)]
    start = [torch.randn(s) for s in shapes]
    grads = [[torch.randn(s) for s in shapes] for _ in range(3)]
    handed = []

    def spread(fn, items, costs):
        handed.append(len(items))
        return BatchParallel(2).spread(fn, items, costs)

    runs = []
    for how in (in_turn, spread):
        params = [torch.nn.Parameter(s.clone()) for s in start]
        opt = Muon([{"params": params[:3], "muon": True, "weight_decay": 0.1}, {"params": params[3:]}], lr=0.01)
        opt.spread = how
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # (the workers' operations are single-threaded, as under a run's parts)
        try:
            _steps(opt, params, grads)
        finally:
            torch.set_num_threads(threads)
        runs.append(params)
    assert handed == [3, 3, 3]
    assert all(torch.equal(a, b) for a, b in zip(*runs)) and not torch.equal(runs[0][0], start[0])


def test_the_cost_line_counts_muons_orthogonalisations_and_the_optimizer_is_left_as_it_was(monkeypatch):
    """The run's estimate timed a forward and backward pass only, while Muon's orthogonalisations (ViT-S/16's 48 took
    3 s of a step on a family-23 EPYC) were none of it. They are timed now through the step's own spread, on
    stand-ins of the matrices' shapes, and counted once a step; the parameters and the state stay as they were."""
    from vitkit.models.complexity import complexity
    from vitkit.train import fit

    params = [torch.nn.Parameter(torch.randn(s)) for s in ((64, 48), (32, 8, 3, 3), (16,))]
    opt = Muon([{"params": params[:2], "muon": True}, {"params": params[2:]}], lr=0.01)
    handed, before = [], [p.detach().clone() for p in params]

    def spread(fn, items, costs):
        handed.append([tuple(m.shape) for m in items])
        return in_turn(fn, items, costs)

    opt.spread = spread
    assert opt.orthogonalisation_seconds() > 0 and handed == [[(64, 48), (32, 8, 3, 3)]]
    assert all(torch.equal(a, b) for a, b in zip(params, before)) and not opt.state
    model = vitkit.create_model("vit_fmnist", depth=1)
    monkeypatch.setattr(fit, "_time_step", lambda model, n, amp, device, parallel: 0.5 * n)  # 0.5 s an image
    monkeypatch.setattr(opt, "orthogonalisation_seconds", lambda: 0.25)
    macs, cpu = complexity(model.config).macs, torch.device("cpu")
    plain = fit.cost_line(model, macs, 1_000, 100, None, cpu, steps=10)
    assert plain.endswith("; about 8 min here (one timed step of 50 images)"), plain  # 500 s
    line = fit.cost_line(model, macs, 1_000, 100, None, cpu, optimizer=opt, steps=400, processes=2)
    assert line.endswith("; about 6 min here (one timed step of 50 images; Muon's orthogonalisations 0.25 s a "
                         "step)"), line  # 250 s for each of two processes' halves, and 400 x 0.25 s


def test_the_other_parameters_step_as_torch_adamw_steps_them():
    torch.manual_seed(0)
    starts = [torch.randn(7), torch.randn(5, 3)]
    grads = [[torch.randn_like(s) for s in starts] for _ in range(5)]
    theirs = [torch.nn.Parameter(s.clone()) for s in starts]
    ours = [torch.nn.Parameter(s.clone()) for s in starts]
    their_opt = torch.optim.AdamW(theirs, lr=0.01, betas=(0.9, 0.99), weight_decay=0.05)
    our_opt = Muon([{"params": ours, "weight_decay": 0.05}], lr=0.01, betas=(0.9, 0.99))
    _steps(their_opt, theirs, grads)
    _steps(our_opt, ours, grads)
    for a, b in zip(theirs, ours):  # torch's own update, so the same numbers, and its state's layout
        torch.testing.assert_close(b, a, rtol=0, atol=0)
        assert {k: (v.dtype, v.shape) for k, v in our_opt.state[b].items()} == \
            {k: (v.dtype, v.shape) for k, v in their_opt.state[a].items()}


@pytest.mark.parametrize("shape", [(32, 48), (48, 32), (64, 32, 3, 3)])
def test_orthogonalize_keeps_the_singular_vectors_and_flattens_the_values(shape):
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    o = orthogonalize(g)
    assert o.shape == g.shape
    u, _, vh = torch.linalg.svd(g.reshape(shape[0], -1), full_matrices=False)
    d = u.T @ o.reshape(shape[0], -1) @ vh.T  # diagonal where o = U S' V^T
    values = torch.diagonal(d)
    assert (d - torch.diag(values)).abs().max() < 1e-4
    assert 0.5 < values.min() and values.max() < 1.5  # the quintic's spread around 1 (Muon's authors)


def test_the_input_and_output_layers_and_non_matrices_stay_on_adamw():
    hybrid = vitkit.create_model("vit_fmnist_hybrid")
    assert hidden_matrices(hybrid) == {
        *(f"patch_embed.backbone.{i}.conv.weight" for i in range(1, 5)), "patch_embed.proj.weight",
        *(f"blocks.0.{m}.weight" for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"))}
    deit = vitkit.create_model("deit_tiny_distilled_patch16_224", depth=2)
    chosen = hidden_matrices(deit)
    assert not {"patch_embed.proj.weight", "head.weight", "head_dist.weight"} & chosen
    assert len(chosen) == 2 * 4
    mae = create_pretrainer("mae", "vit_fmnist")  # no classifier: the decoder's last layer is the output
    layers = {n for n, m in mae.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))}
    assert layers - {n.removesuffix(".weight") for n in hidden_matrices(mae)} == {"encoder.patch_embed.proj",
                                                                                   "decoder_pred"}
    optimizer = make_optimizer(hybrid, resolve_config("fmnist-fp32"))
    names = {id(p): n for n, p in hybrid.named_parameters()}
    on_muon = {names[id(p)] for g in optimizer.param_groups if g["muon"] for p in g["params"]}
    assert on_muon == hidden_matrices(hybrid)
    assert all(g["momentum"] == 0.95 for g in optimizer.param_groups)
    assert make_optimizer(hybrid, resolve_config("fmnist-adamw", optimizer="sgd")).param_groups[0]["momentum"] == 0.9
    assert {g["weight_decay"] for g in optimizer.param_groups if g["muon"]} == {0.05}


def test_muon_lr_scale_multiplies_the_matrices_lr_only():
    hybrid = vitkit.create_model("vit_fmnist_hybrid")
    optimizer = make_optimizer(hybrid, resolve_config("fmnist", optimizer="muon", muon_lr_scale=4.0, layer_decay=0.5))
    scales = {(g["muon"], g["lr_scale"]) for g in optimizer.param_groups}
    # one block: the embedding's layer (the stem's matrices, then its first convolution) at 0.25, the block's at 0.5
    assert scales == {(True, 1.0), (True, 2.0), (False, 0.25), (False, 0.5), (False, 1.0)}


def test_lora_factors_stay_on_adamw():
    from vitkit.train.finetune import prepare

    lora = prepare(vitkit.create_model("vit_fmnist"), "lora")
    assert any(".lora_A." in n for n, _ in lora.named_modules()) and hidden_matrices(lora) == set()


@pytest.mark.parametrize("precision, default, tuning, epochs", [("fp32", "fmnist-fp32", "fmnist-fp32-adamw", 3.0),
                                                                ("bf16", "fmnist", "fmnist-adamw", 9.0)])
def test_fine_tuning_keeps_adamw_unless_muon_is_named(precision, default, tuning, epochs):
    """Both default runs train from scratch with Muon; from --init weights, the recipe each had before (AdamW)."""
    from vitkit.train.recipes import recipe_in_effect

    assert recipe_in_effect(None, None, {"precision": precision}, {}) == default
    assert resolve_config(default).optimizer == "muon"
    assert recipe_in_effect(None, None, {"precision": precision, "init": "w"}, {}) == tuning
    assert recipe_in_effect(default, None, {"precision": precision, "init": "w"}, {}) == default  # named: kept
    tuned = resolve_config(tuning)
    assert (tuned.optimizer, tuned.momentum, tuned.epochs, tuned.label_smoothing) == ("adamw", 0.9, epochs, 0.1)


def test_muon_takes_momentum_betas_and_its_scale_and_nothing_else_does():
    assert resolve_config("fmnist", optimizer="muon", momentum=0.8, betas=(0.9, 0.95)).momentum == 0.8
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\), not 1.0"):  # at 1 Muon's buffer never moves
        resolve_config("fmnist", optimizer="muon", momentum=1.0)
    with pytest.raises(ValueError, match=r"--muon-lr-scale applies to --optimizer muon \(this run: --optimizer sgd\)"):
        resolve_config("fmnist", optimizer="sgd", muon_lr_scale=2.0)
    with pytest.raises(ValueError, match=r"muon_lr_scale must be > 0"):
        resolve_config("fmnist", optimizer="muon", muon_lr_scale=0.0)
    with pytest.raises(ValueError, match=r"optimizer must be adamw, adam, sgd or muon, not .muons."):
        resolve_config("fmnist", optimizer="muons")


def test_another_optimizer_leaves_the_recipes_muon_settings_behind_and_says_so():
    """--optimizer sgd over the default run's Muon recipe: its momentum 0.95 reached SGD in silence."""
    from vitkit.train.config_types import ConfigNote

    with pytest.warns(ConfigNote, match=r"optimizer sgd replaces recipe fmnist's muon: its momentum 0.95 goes back "
                                        r"to 0.9; its learning rate 0.002 is muon's, not sgd's: choose one with --lr"):
        sgd = resolve_config("fmnist", optimizer="sgd")
    assert (sgd.optimizer, sgd.momentum, sgd.muon_lr_scale) == ("sgd", 0.9, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # what the person chose stays, and nothing is left to say
        assert resolve_config("fmnist", optimizer="sgd", momentum=0.95, lr=0.1).momentum == 0.95
        assert resolve_config("fmnist", optimizer="muon").momentum == 0.95  # the recipe's own optimizer
        adamw = resolve_config("fmnist", optimizer="adamw")  # Adam reads neither field: reset without a word
    assert (adamw.momentum, adamw.muon_lr_scale) == (0.9, 1.0)
    with pytest.warns(ConfigNote, match=r"recipe paper-finetune's sgd: its learning rate 0.01 is sgd's, not adamw's"):
        resolve_config("paper-finetune", optimizer="adamw")


@real
@pytest.mark.slow
def test_a_muon_run_learns_and_resumes_bitwise(tmp_path):
    def config(name, steps):  # checkpoints at steps 70 and 80: the resume takes the last 10 (Muon's buffers restored)
        return resolve_config("fmnist-fp32", max_steps=steps, batch_size=32,
                              warmup_steps=10, checkpoint_every=70, val_size=500, test_size=500,
                              runs_dir=str(tmp_path), name=name, progress=False, log_every=20)

    summary = train(config("straight", 80))
    rows = [json.loads(r) for r in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in rows if "train_loss" in r]
    assert losses[-1] < 0.75 * losses[0] and summary["test_top1"] > 0.55  # chance is 0.1
    run = tmp_path / "resumed"  # the same run, as if it had stopped after step 70
    shutil.copytree(tmp_path / "straight", run)
    (run / "checkpoints" / "step_00000080.pt").unlink()  # as if it had stopped after step 70
    shutil.rmtree(run / "model")
    assert train(config("ignored", 80), resume=str(run), log=lambda line: None)["resumed_at_step"] == 70
    a = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    b = load_file(run / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
