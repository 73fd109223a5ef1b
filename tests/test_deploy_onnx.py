"""ONNX export and ONNX Runtime inference, checked against PyTorch and onnxruntime themselves:
every family's logits through ORT match the PyTorch model's, the file's metadata is enough for
`vitkit predict`, int8 models run and agree, and every bad input is one line."""

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from PIL import Image
from torch import nn

import forks
import vitkit
from conftest import max_diff, randomize, trained_briefly
from vitkit.cli import main
from vitkit.data import fashion_mnist as fm
from vitkit.deploy import OnnxExportError, OnnxMetadataError, OnnxModel, export_onnx, read_metadata

SMALL = dict(depth=2, num_classes=5)
FAMILIES = {  # (registered name, overrides): each family at a small size
    "vit": ("vit_tiny_patch16_224", dict(img_size=32, patch_size=8, **SMALL)),
    "vit_avg_pool_non_square": ("vit_tiny_patch16_224", dict(img_size=(32, 48), patch_size=8, global_pool="avg",
                                                              class_token=False, **SMALL)),
    "deit_distilled": ("deit_tiny_distilled_patch16_224", dict(img_size=32, patch_size=8, **SMALL)),
    "convit": ("convit_tiny", dict(img_size=32, patch_size=8, local_up_to_layer=1, **SMALL)),
    "cait": ("cait_xxs24_224", dict(img_size=32, patch_size=8, **SMALL)),
    "hybrid": ("vit_tiny_r_s16_p8_224", dict(img_size=64, **SMALL)),
    "bit_cnn": ("resnetv2_50_nopreact", dict(img_size=64, layers=[1], num_classes=5)),
}


def ort_logits(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_onnx_runtime_matches_pytorch_for_every_family_at_two_batch_sizes(family, tmp_path):
    name, overrides = FAMILIES[family]
    model = randomize(vitkit.create_model(name, **overrides))
    path = export_onnx(model, tmp_path / f"{family}.onnx")
    h, w = model.config.img_size
    for batch in (1, 3):  # the batch dimension is dynamic: neither is the exporter's example batch (2)
        x = torch.randn(batch, model.config.in_chans, h, w, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            expected = model(x)
        got = ort_logits(path, x)  # onnxruntime itself, not vitkit's wrapper
        assert got.shape == expected.shape == (batch, 5)
        assert max_diff(got, expected) <= 1e-4, family
    shape = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim
    assert shape[0].dim_param and [d.dim_value for d in shape[1:]] == [model.config.in_chans, h, w]


def test_a_batch_runs_in_parts_on_one_thread_sessions_and_one_image_on_all_threads(tmp_path):
    """vitkit's wrapper cuts a batch into one part per thread, each on the one-thread session, and
    joins them in order: the same logits as onnxruntime's own session on the whole batch; a lone
    image runs on the session with every thread; a bad batch is one line, and the next one runs."""
    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, **SMALL))
    path = export_onnx(model, tmp_path / "m.onnx")
    x = torch.randn(7, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    wrapped = OnnxModel(path, threads=2)
    ran = []
    for name in ("session", "_part_session"):
        session = getattr(wrapped, name)
        run = session.run
        setattr(wrapped, name, type("Counted", (), {"run": lambda self, *a, n=name, r=run: ran.append(n) or r(*a)})())
    got = wrapped(x)
    assert ran == ["_part_session"] * 2 and wrapped.parallel.workers == 2
    torch.testing.assert_close(got, ort_logits(path, x), rtol=1e-5, atol=1e-5)
    ran.clear()
    torch.testing.assert_close(wrapped(x[:1]), got[:1], rtol=1e-5, atol=1e-5)
    assert ran == ["session"]
    with pytest.raises(ValueError, match="could not run"):
        wrapped(torch.randn(4, 3, 48, 48))
    # raw pixels and a numpy array are refused as the torch model refuses them (uint8 ran as if normalised)
    with pytest.raises(ValueError, match=r"expected float pixels, .* got a torch.uint8 tensor \(raw 0-255 values\?\)"):
        wrapped(torch.full((1, 3, 32, 32), 200, dtype=torch.uint8))
    with pytest.raises(TypeError, match=r"takes a torch.Tensor of images \(B, 3, H, W\), not a ndarray "
                                        r"\(torch.from_numpy\(array\)\)"):
        wrapped(x.numpy())
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 3, H, W\), got \(3, 32, 32\)"):
        wrapped(x[0])
    torch.testing.assert_close(wrapped(x), got, rtol=0, atol=0)
    single = OnnxModel(path, threads=1)  # one thread: one session, every batch whole
    assert single._part_session is single.session
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="threads must be a whole number of at least 1"):
            OnnxModel(path, threads=bad)
    torch.testing.assert_close(single(x), got, rtol=1e-5, atol=1e-5)
    from vitkit.evaluate import extract_features  # features need the pre-logits: it failed in an AttributeError

    with pytest.raises(ValueError, match="features are a vitkit model's pre-logits .its forward_head.; OnnxModel "
                                         "has none: load the "):
        extract_features(single, torch.zeros(2, 3, 32, 32, dtype=torch.uint8), progress=False)


#: the later ViTs: each layer kind the export form (SeparateQKV) must carry
LATER = {
    "siglip_map": ("vit_base_patch16_siglip_224", dict(img_size=32, **SMALL)),
    "eva02_axial_rope_split_swiglu": ("eva02_base_patch14_224", dict(img_size=28, **SMALL)),
    "rope_mixed": ("vit_small_patch16_rope_mixed_224", dict(img_size=32, **SMALL)),
    "dinov3_registers": ("vit_small_plus_patch16_dinov3", dict(img_size=32, **SMALL)),
    # (at a quarter of ViT-L's width, its head size kept: 4 heads of 64, half the middle blocks' key/value heads)
    "sapiens_grouped_query_qk_norm": ("vit_large_patch16_sapiens2", dict(img_size=(32, 48), embed_dim=256, num_heads=4,
                                                                         mlp_dim=512, kv_heads=[4, 2], **SMALL)),
    "beit_relative": ("beitv2_base_patch16_224", dict(img_size=32, **SMALL)),
    "relpos_mlp_shared": ("vit_srelpos_small_patch16_224", dict(img_size=32, **SMALL)),
    # (and the VLM projector: 3 x 4 patches zero-padded to 3 x 6, two 3 x 3 blocks)
    "deepseek_bias_free_swiglu_pooled_rmsnorm_projector": ("deepseek_vit_412m_align", dict(
        img_size=(42, 56), embed_dim=64, num_heads=4, mlp_dim=176, projector_dim=32, **SMALL)),
    # (a learned table resampled with its corners aligned beside rotary positions, and Qwen's merger)
    "qwen3_table_rope_merger": ("qwen3_vit_88m_merge", dict(img_size=(64, 96), embed_dim=64, num_heads=4,
                                                            projector_dim=32, pos_embed_size=96, **SMALL)),
    # (clamped projections, q/k/v norms, rotary halves, sandwich norms, grouped-query attention, a gated MLP)
    "gemma4_clamps_sandwich_gqa": ("gemma4_vit_167m", dict(img_size=(32, 48), embed_dim=64, num_heads=4, kv_heads=2,
                                                           mlp_dim=96, **SMALL)),
    # (windows over a grid padded to whole ones, the decomposed relative positions, the neck; a head)
    "sam_windows_offsets_neck": ("samvit_base_patch16", dict(img_size=(48, 80), window_size=2, global_attn_indexes=(1,),
                                                             embed_dim=64, num_heads=4, neck_chans=16, **SMALL)),
}

def test_dynamic_int8_answers_each_image_as_it_would_alone(tmp_path):
    """ONNX Runtime's dynamic int8 scales activations by the largest value of its whole input: run as a
    batch, a bright image changed a dark one's logits (a server's answer depended on its traffic). Each
    image's logits are onnxruntime's own on that image alone (one thread, two); a static graph runs whole."""
    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, **SMALL))
    path = export_onnx(model, tmp_path / "q.onnx", quantize="int8")
    x = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    x[0] *= 8  # an image far brighter than the others sets the batch's scale
    alone = torch.cat([ort_logits(path, x[i:i + 1]) for i in range(len(x))])
    assert max_diff(ort_logits(path, x), alone) > 1e-3  # onnxruntime itself: the batch moves the answers
    assert not OnnxModel(export_onnx(model, tmp_path / "f.onnx")).per_image
    for threads in (1, 2):
        wrapped = OnnxModel(path, threads=threads)
        assert wrapped.per_image
        torch.testing.assert_close(wrapped(x), alone, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(wrapped(x[1:]), alone[1:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", sorted(LATER))
def test_onnx_runtime_matches_pytorch_for_the_later_vits(case, tmp_path):
    name, overrides = LATER[case]
    model = randomize(vitkit.create_model(name, **overrides))
    path = export_onnx(model, tmp_path / f"{case}.onnx")
    x = torch.randn(3, 3, *model.config.img_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(x)
    got = ort_logits(path, x)
    assert got.shape == expected.shape and max_diff(got, expected) <= 1e-4 * max(1.0, expected.abs().max().item())


def test_the_torchscript_exporter_matches_too_and_headless_models_export_features(tmp_path):
    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=0))
    path = export_onnx(model, tmp_path / "f.onnx", exporter="torchscript")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert max_diff(ort_logits(path, x), model(x)) <= 1e-4
    assert onnx.load(str(path)).graph.output[0].name == "features"
    assert read_metadata(path)["vitkit.exporter"] == "torchscript"


def test_a_torchscript_failure_writes_no_graph_to_stdout_and_a_graph_that_computes_otherwise_is_refused(tmp_path,
                                                                                                         capfd):
    """The tracer wrote the whole graph to stdout when its ONNX pass failed (torch turns its log on for every export:
    280 lines before --json's one object); RoPE-Mixed failed so ("All tensors must have the same rank"), and a graph
    made to pass did not run: refused before any work, naming the exporter that works."""
    from vitkit.deploy.onnx_export import OnnxExportError

    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1))
    model.forward = lambda x: torch.fft.fft2(x).real.mean(dim=(2, 3))  # no ONNX form in the tracer's opsets
    capfd.readouterr()
    with pytest.raises(OnnxExportError, match=r"torch.onnx.export \(torchscript\) failed"):
        export_onnx(model, tmp_path / "f.onnx", exporter="torchscript", progress=False)
    out, err = capfd.readouterr()
    assert "graph(" not in out + err and not list(tmp_path.iterdir()), out[:300]
    # a graph that does not compute the model is refused, not written: here the tracer keeps the batch it saw
    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1))
    forward = model.forward
    model.forward = lambda x: forward(x)[: int(x.shape[0])]  # traced at batch 2: "[:2]" at every batch
    with pytest.raises(OnnxExportError, match=r"the torchscript exporter's graph of VisionTransformer \(vit\) does "
                                              r"not compute the model: at batch 3 it gave shape \(2, 1000\)"):
        export_onnx(model, tmp_path / "b.onnx", exporter="torchscript", progress=False)
    assert not list(tmp_path.iterdir())
    for dtype in (torch.float16, torch.bfloat16):  # a model cast by hand: the exporters' own words (escape codes)
        with pytest.raises(OnnxExportError, match=f"export_onnx writes float32 graphs; this model holds "
                                                  f"{str(dtype)[6:]} weights: export model.float()"):
            export_onnx(model.to(dtype), tmp_path / "h.onnx", progress=False)
    mixed = vitkit.create_model("vit_small_patch16_rope_mixed_224", img_size=32, depth=1)
    with pytest.raises(OnnxExportError, match="RoPE-Mixed's learned rotations export with the dynamo exporter"):
        export_onnx(mixed, tmp_path / "m.onnx", exporter="torchscript", progress=False)


def test_attention_is_exported_as_separate_q_k_v_that_ort_fuses_and_the_model_is_left_as_it_was(tmp_path):
    """q, k and v are three MatMuls on their own weights (views of the fused qkv rows), in the
    graph ONNX Runtime's transformer optimizer turns into its Attention op; the fused graph still
    matches PyTorch, and the exported model keeps its own fused projection."""
    from onnxruntime.transformers.optimizer import optimize_model

    from vitkit.models.layers import Attention

    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=3,
                                          num_classes=5))
    qkv = model.blocks[1].attn.qkv.weight.detach().clone()
    path = export_onnx(model, tmp_path / "m.onnx")
    assert all(type(b.attn) is Attention for b in model.blocks)
    assert torch.equal(model.blocks[1].attn.qkv.weight, qkv) and model.blocks[1].attn.qkv.weight.requires_grad
    graph = onnx.load(str(path)).graph
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    matmul_weights = [weights[n.input[1]] for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]
    rows = qkv.shape[0] // 3
    for i in range(3):  # MatMul's weight is the transposed Linear weight
        assert any(w.shape == (192, rows) and np.array_equal(w, qkv[i * rows:(i + 1) * rows].T.numpy())
                   for w in matmul_weights), "qkv part %d not a projection of its own" % i
    fused = optimize_model(str(path), model_type="vit", num_heads=3, hidden_size=192, opt_level=0)
    ops = [n.op_type for n in fused.model.graph.node]
    assert ops.count("Attention") >= 2  # ORT's fusion applies (the first block's residual is the embedding's Add)
    fused.save_model_to_file(str(tmp_path / "fused.onnx"))
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert max_diff(ort_logits(tmp_path / "fused.onnx", x), model(x)) <= 1e-4


def test_an_export_that_fails_puts_the_attention_layers_back(tmp_path, monkeypatch):
    from vitkit.deploy.onnx_export import separate_qkv
    from vitkit.models.layers import Attention

    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=3)
    with pytest.raises(RuntimeError):
        with separate_qkv(model):
            assert not any(type(b.attn) is Attention for b in model.blocks)
            raise RuntimeError("the exporter failed")
    assert all(type(b.attn) is Attention for b in model.blocks)


def test_metadata_describes_the_preprocessing_for_any_reader(tmp_path):
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=(32, 48), patch_size=8, depth=1, num_classes=3,
                                in_chans=1, mean=(0.25,), std=(0.5,), label_names=["cat", "dog", "fox"])
    meta = read_metadata(export_onnx(model, tmp_path / "m.onnx"))
    assert json.loads(meta["input_size"]) == [1, 32, 48]
    assert json.loads(meta["mean"]) == [0.25] and json.loads(meta["std"]) == [0.5]
    assert json.loads(meta["labels"]) == ["cat", "dog", "fox"] and meta["vitkit.quantization"] == "none"
    assert json.loads(meta["vitkit.config"])["config"]["img_size"] == [32, 48]
    assert meta["vitkit.version"] == vitkit.__version__


def test_predict_on_the_onnx_file_alone_matches_predict_on_the_weights(tmp_path, capsys):
    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=(32, 40), patch_size=8, depth=2,
                                          num_classes=3, mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.25),
                                          label_names=["cat", "dog", "fox"]), scale=0.3)
    model.save_pretrained(tmp_path / "weights")
    assert main(["convert", str(tmp_path / "weights"), str(tmp_path / "m.onnx"), "--to", "onnx", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "onnx" and info["quantization"] == "none" and info["bytes"] > 0
    photos = []
    for i in range(3):  # photos of another size: the metadata's resize and crop must be applied
        pixels = np.random.default_rng(i).integers(0, 256, (50 + 7 * i, 61, 3), dtype=np.uint8)
        photos.append(str(tmp_path / f"p{i}.png"))
        Image.fromarray(pixels).save(photos[-1])
    assert main(["predict", *photos, "--weights", str(tmp_path / "weights"), "--json", "--top-k", "3"]) == 0
    torch_preds = json.loads(capsys.readouterr().out)
    assert main(["predict", *photos, "--weights", str(tmp_path / "m.onnx"), "--json", "--top-k", "3"]) == 0
    onnx_preds = json.loads(capsys.readouterr().out)
    for a, b in zip(torch_preds, onnx_preds):
        assert [t["label"] for t in a["top"]] == [t["label"] for t in b["top"]]
        assert np.allclose([t["probability"] for t in a["top"]], [t["probability"] for t in b["top"]], atol=1e-5)
    assert {t["label"] for t in onnx_preds[0]["top"]} == {"cat", "dog", "fox"}


class _Probabilities(torch.nn.Module):
    """A classifier exported with its softmax, as many foreign "prob" outputs are (then reshaped: looked through),
    or with a multi-label model's sigmoid."""

    def __init__(self, model, sigmoid: bool = False):
        super().__init__()
        self.model, self.sigmoid = model, sigmoid

    def forward(self, x):
        out = self.model(x)
        return (out.sigmoid() if self.sigmoid else out.softmax(-1)).reshape(x.shape[0], -1)


def softmax_ended_graphs(folder):
    """A seeded timm classifier exported by plain torch.onnx as ``logits.onnx``, ending in its softmax as
    ``prob.onnx``, that softmax quantized and dequantized after it as ``prob_qdq.onnx`` and ending in a sigmoid as
    ``sigmoid.onnx`` into ``folder``; (images, the model's probabilities for them)."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=5).eval()
    with torch.no_grad():
        model.head.weight.mul_(20)
        for name, net in (("logits", model), ("prob", _Probabilities(model)), ("sigmoid", _Probabilities(model, True))):
            torch.onnx.export(net, (torch.zeros(2, 3, 32, 32),), str(folder / f"{name}.onnx"), dynamo=False,
                              dynamic_axes={"x": {0: "b"}}, input_names=["x"])
        graph = onnx.load(str(folder / "prob.onnx"))  # a quantized export's output: its probabilities as 8 bits
        out = graph.graph.output[0].name
        for node in graph.graph.node:
            node.output[:] = [f"{o}_f" if o == out else o for o in node.output]
        graph.graph.initializer.extend([onnx.numpy_helper.from_array(np.float32(1 / 255), "s"),
                                        onnx.numpy_helper.from_array(np.uint8(0), "z")])
        graph.graph.node.extend([onnx.helper.make_node("QuantizeLinear", [f"{out}_f", "s", "z"], ["q"]),
                                 onnx.helper.make_node("DequantizeLinear", ["q", "s", "z"], [out])])
        onnx.save(graph, str(folder / "prob_qdq.onnx"))
        x = torch.randn(3, 3, 32, 32)
        return x, model(x).softmax(-1)


@pytest.mark.filterwarnings("ignore")  # the tracer's notes, from plain torch.onnx.export
def test_a_graph_that_ends_in_softmax_is_not_softmaxed_again(tmp_path):
    """Its probabilities were softmaxed a second time: 40% where the model said 100%, the others evened out; so were
    those quantized after the softmax, and a sigmoid's (a multi-label model's) were softmaxed as one class each."""
    x, want = softmax_ended_graphs(tmp_path)
    stand_ins = dict(img_size=[32], mean=[0.5] * 3, std=[0.5] * 3)
    logits, prob = OnnxModel(tmp_path / "logits.onnx", **stand_ins), OnnxModel(tmp_path / "prob.onnx", **stand_ins)
    assert (logits.probabilities, prob.probabilities) == (False, True)
    assert max_diff(prob(x).softmax(-1), want) <= 1e-5 and max_diff(logits(x).softmax(-1), want) <= 1e-5
    assert want.max() > 0.8  # (a second softmax would have evened it out; seeded: not left to chance)
    qdq = OnnxModel(tmp_path / "prob_qdq.onnx", **stand_ins)  # quantized after its softmax: still probabilities
    assert qdq.probabilities and max_diff(qdq(x).softmax(-1), want) <= 2 / 255  # (8-bit steps, renormalised)
    with pytest.raises(OnnxMetadataError, match=r"sigmoid.onnx ends in Sigmoid: a multi-label model's independent "
                                                r"probabilities"):
        OnnxModel(tmp_path / "sigmoid.onnx", **stand_ins)  # (each was softmaxed as if one class each)
    graph = onnx.load(str(tmp_path / "prob.onnx"))  # a softmax over the batch: rows of 1.0 were read as 10% each
    for node in graph.graph.node:
        if node.op_type == "Softmax":
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute("axis", 0))
    onnx.save(graph, str(tmp_path / "batch.onnx"))
    with pytest.raises(OnnxMetadataError, match=r"batch.onnx ends in a Softmax over another axis than its classes'"):
        OnnxModel(tmp_path / "batch.onnx", **stand_ins)


class _TwoOutputs(torch.nn.Module):
    """A foreign export with its features before its logits (or a binary model's one logit)."""

    def __init__(self, model, one_logit: bool = False):
        super().__init__()
        self.model, self.one_logit = model, one_logit

    def forward(self, x):
        features = self.model.forward_head(self.model.forward_features(x), pre_logits=True)
        return features.sum(-1, keepdim=True) if self.one_logit else (features, self.model.head(features))


def foreign_graphs(folder):
    """A seeded timm classifier exported by plain torch.onnx at a fixed batch of 1 (its default) as ``batch1.onnx``,
    with its features as a first output as ``two.onnx`` and as one logit as ``one.onnx``; (images, its logits)."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=5).eval()
    with torch.no_grad():
        torch.onnx.export(model, (torch.zeros(1, 3, 32, 32),), str(folder / "batch1.onnx"), dynamo=False)
        for name, net in (("two", _TwoOutputs(model)), ("one", _TwoOutputs(model, True))):
            torch.onnx.export(net, (torch.zeros(2, 3, 32, 32),), str(folder / f"{name}.onnx"), dynamo=False,
                              dynamic_axes={"x": {0: "b"}}, input_names=["x"])
        x = torch.randn(3, 3, 32, 32)
        return x, model(x)


@pytest.mark.filterwarnings("ignore")  # the tracer's notes, from plain torch.onnx.export
def test_foreign_graphs_vitkit_cannot_rank_are_refused_and_one_of_batch_1_runs_image_by_image(tmp_path):
    """A graph with its features as first output had them ranked as classes; one with one logit answered "class 0,
    100%" for every image; one exported at batch 1 (torch.onnx.export's default) failed on two images or more."""
    x, want = foreign_graphs(tmp_path)
    stand_ins = dict(img_size=[32], mean=[0.5] * 3, std=[0.5] * 3)
    with pytest.raises(OnnxMetadataError, match=r"two.onnx is no image model vitkit can run: it has 2 outputs \(.* "
                                                r"192\], .* 5\]\), where vitkit reads a classifier's one"):
        OnnxModel(tmp_path / "two.onnx", **stand_ins)
    with pytest.raises(OnnxMetadataError, match=r"one.onnx is no image model vitkit can run: its output '.*' holds one "
                                                r"value an image \(a binary logit or a score\)"):
        OnnxModel(tmp_path / "one.onnx", **stand_ins)
    fixed = OnnxModel(tmp_path / "batch1.onnx", **stand_ins)
    assert fixed.per_image and max_diff(fixed(x), want) <= 1e-5
    # another fixed batch is said with the numbers ONNX Runtime gives on its second line (its first was cut there)
    import timm

    torch.onnx.export(timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=5),
                      (torch.zeros(4, 3, 32, 32),), str(tmp_path / "batch4.onnx"), dynamo=False)
    with pytest.raises(OnnxMetadataError, match=r"for the following indices index: 0 Got: 3 Expected: 4"):
        OnnxModel(tmp_path / "batch4.onnx", threads=1, **stand_ins)(x)


class _ChannelsLast(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):  # (batch, height, width, channels), as TensorFlow's exports take images
        return self.model(x.permute(0, 3, 1, 2))


@pytest.mark.filterwarnings("ignore")  # the tracer's notes, from plain torch.onnx.export
def test_a_channels_last_graph_is_refused_as_one(tmp_path):
    """An NHWC graph was refused as "--mean has 3 values for 32 channels", with no word of its layout."""
    import timm

    model = _ChannelsLast(timm.create_model("vit_tiny_patch16_224", depth=1, img_size=32, num_classes=4).eval())
    with torch.no_grad():
        torch.onnx.export(model, (torch.zeros(2, 32, 32, 3),), str(tmp_path / "nhwc.onnx"), dynamo=False,
                          input_names=["x"], dynamic_axes={"x": {0: "b"}})
    with pytest.raises(OnnxMetadataError, match=r"its input 'x' is \['b', 32, 32, 3\]: channels last \(batch, "
                                                r"height, width, channels\), where vitkit feeds \(batch, channels"):
        OnnxModel(tmp_path / "nhwc.onnx", img_size=[32], mean=[0.5] * 3, std=[0.5] * 3)
    rgba = _ChannelsLast(timm.create_model("vit_tiny_patch16_224", depth=1, img_size=32, num_classes=4,
                                           in_chans=4).eval())
    for name, net, example, axes in (("any.onnx", model, torch.zeros(2, 32, 32, 3), {0: "b", 1: "h", 2: "w"}),
                                     ("rgba.onnx", rgba, torch.zeros(2, 32, 32, 4), {0: "b"})):
        with torch.no_grad():
            torch.onnx.export(net, (example,), str(tmp_path / name), dynamo=False, input_names=["x"],
                              dynamic_axes={"x": axes})
        with pytest.raises(OnnxMetadataError, match=r"channels last"):
            OnnxModel(tmp_path / name, img_size=[32], mean=[0.5] * 3, std=[0.5] * 3)
    # vitkit's own export of 12 channels and 1 px wide images says its channels: not taken for channels last
    ours = randomize(vitkit.create_model("vit_tiny_patch16_224", depth=1, num_classes=4, in_chans=12,
                                         img_size=(64, 1), patch_size=(8, 1)))
    x = torch.randn(2, 12, 64, 1)
    with torch.no_grad():
        assert max_diff(OnnxModel(export_onnx(ours, tmp_path / "c12.onnx"))(x), ours(x)) <= 1e-4


@pytest.mark.filterwarnings("ignore")  # the tracer's notes, from plain torch.onnx.export
def test_an_error_onnx_runtime_raises_is_one_line_without_its_own_log_above_it(tmp_path, capfd):
    """A graph of any channel count fed three: ONNX Runtime's C++ log printed the error in colour on stderr (a
    time stamp, a node name) before vitkit's line said it again."""
    import timm

    model = timm.create_model("vit_tiny_patch16_224", depth=1, img_size=32, num_classes=4, in_chans=1).eval()
    with torch.no_grad():
        torch.onnx.export(model, (torch.zeros(2, 1, 32, 32),), str(tmp_path / "g.onnx"), dynamo=False,
                          input_names=["x"], dynamic_axes={"x": {0: "b", 1: "c"}})
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "a.png")
    capfd.readouterr()
    assert main(["predict", str(tmp_path / "a.png"), "--weights", str(tmp_path / "g.onnx"), "--img-size", "32",
                 "--mean", "0.5", "0.5", "0.5", "--std", "0.5", "0.5", "0.5"]) == 2
    err = [line for line in capfd.readouterr().err.splitlines() if "note:" not in line]
    assert len(err) == 1 and err[0].startswith("vitkit predict: error: ONNX Runtime could not run") and \
        "Input channels C is not equal to kernel channels" in err[0], err


@pytest.mark.filterwarnings("ignore")  # the tracer's notes, from plain torch.onnx.export
def test_an_onnx_file_without_vitkit_metadata_asks_for_its_preprocessing(tmp_path, capsys):
    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=3))
    path = tmp_path / "foreign.onnx"
    with torch.no_grad():  # exported by plain torch.onnx, as another project would
        torch.onnx.export(model, (torch.zeros(2, 3, 32, 32),), str(path), dynamo=False,
                          dynamic_axes={"x": {0: "b"}}, input_names=["x"])
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "a.png")
    assert main(["predict", str(tmp_path / "a.png"), "--weights", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no vitkit metadata" in err and "--img-size, --mean, --std" in err
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # (said once per place in a process: another test may have said it)
        assert main(["predict", str(tmp_path / "a.png"), "--weights", str(path), "--img-size", "32", "--mean", "0.5",
                     "0.5", "0.5", "--std", "0.5", "0.5", "0.5", "--labels", "a", "b", "c", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)[0]["top"][0]["label"] in "abc"
    # how it is preprocessed where the stand-ins say nothing (the crop) is said, not assumed in silence
    assert "no vitkit metadata: each image is resized whole to 32x32 (bicubic, no centre crop)" in err, err
    assert main(["predict", str(tmp_path / "a.png"), "--weights", str(path), "--img-size", "32", "--mean", "0.5",
                 "--std", "0.5", "0.5", "0.5"]) == 2  # one mean for three channels
    assert "--mean has 1 values for 3 channels" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "a.png"), "--weights", str(path), "--img-size", "32", "--mean", "124",
                 "116", "104", "--std", "58", "57", "57"]) == 2  # ImageNet's on the 0-255 scale: another answer
    assert "--mean (124, 116, 104) and --std (58, 57, 57) are not of pixels scaled to [0, 1]" in \
        capsys.readouterr().err
    vitkit_file = export_onnx(model, tmp_path / "v.onnx")
    assert main(["predict", str(tmp_path / "a.png"), "--weights", str(vitkit_file), "--img-size", "64"]) == 2
    assert "carries its own preprocessing" in capsys.readouterr().err
    # vitkit serve takes the same stand-ins (its message named them, its parser refused them)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 30, 3), dtype=np.uint8)).save(tmp_path / "b.png")
    stand_ins = ["--img-size", "32", "--mean", "0.4", "0.5", "0.6", "--std", "0.2", "0.3", "0.4", "--labels", "a", "b",
                 "c"]
    assert main(["predict", str(tmp_path / "b.png"), "--weights", str(path), "--top-k", "3", "--json", *stand_ins]) == 0
    want = json.loads(capsys.readouterr().out)[0]["top"]
    server = forks.popen("serve", path, "--port", "0", "--json", *stand_ins, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        ready = json.loads(server.stdout.readline())
        url = ready["url"]
        assert ready["precision"] == "onnxruntime, precision not recorded: no vitkit metadata"  # (was "unknown")
        request = urllib.request.Request(url + "/predict?top_k=3", data=(tmp_path / "b.png").read_bytes())
        got = json.load(urllib.request.urlopen(request, timeout=60))["top"]
        assert [t["label"] for t in got] == [t["label"] for t in want]
        assert np.allclose([t["probability"] for t in got], [t["probability"] for t in want], atol=1e-6)
    finally:
        server.terminate()
        assert server.wait(30) == 0


def test_bad_inputs_are_one_line_each(tmp_path, capsys):
    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=3))
    model.save_pretrained(tmp_path / "w")
    w = str(tmp_path / "w")
    (tmp_path / "junk.onnx").write_bytes(b"not a protobuf at all" * 10)
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "a.png")
    image = str(tmp_path / "a.png")
    cases = {
        ("convert", w, str(tmp_path / "x.pth"), "--to", "timm", "--quantize", "int8"): "applies to --to onnx and",
        ("convert", w, str(tmp_path / "x.onnx"), "--to", "onnx", "--scan"): "--scan applies to --to big_vision",
        ("convert", w, str(tmp_path / "x.bin"), "--to", "onnx"): "must end in .onnx",
        # said before the source is read (it was, after the model was loaded): a missing SRC is not the error
        ("convert", str(tmp_path / "absent"), str(tmp_path / "x"), "--to", "timm"): "must end in .safetensors or",
        ("convert", str(tmp_path / "absent"), str(tmp_path / "x.pth"), "--to", "npz"): "must end in .npz, not",
        ("convert", w, str(tmp_path / "x.onnx"), "--to", "onnx", "--opset", "9"): "opset must be",
        ("convert", w, str(tmp_path / "x.onnx"), "--to", "onnx", "--quantize", "int8-static"):
            "name no built-in dataset",
        ("predict", image, "--weights", str(tmp_path / "junk.onnx")): "not a readable ONNX model",
        ("predict", image, "--weights", str(tmp_path / "missing.onnx")): "not found",
        ("predict", image, "--weights", w, "--quantize", "int8"): "--quantize needs --runtime onnxruntime",
        ("predict", image, "--weights", w, "--mean", "0.5"): "--mean stands in for the metadata",
        ("eval", "--weights", str(tmp_path / "junk.onnx"), "--runtime", "torch"): "runs on --runtime onnxruntime",
        ("fewshot", "--weights", str(tmp_path / "junk.onnx")): "junk.onnx is an ONNX graph, not weights: vitkit "
                                                              "predict, eval and serve run it",
        ("convert", str(tmp_path / "junk.onnx"), str(tmp_path / "x.safetensors"), "--to", "timm"): "an ONNX graph",
    }
    for argv, words in cases.items():
        assert main(list(argv)) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, (argv, err)
    assert not list(tmp_path.glob("x.*")) and not list(tmp_path.glob(".x.onnx*"))  # nothing half-written


def test_a_torch_older_than_the_onnx_extra_asks_is_one_line_before_any_work(tmp_path, monkeypatch):
    """torch 2.4.1 failed with "export() got an unexpected keyword argument 'external_data'", 2.6.0 and 2.7.1
    inside torch.export, 2.8.0 exported with parity (2026-11-29, by hand: torch stays pinned here)."""
    import tomllib

    from vitkit.deploy import onnx_export

    extra = tomllib.loads(open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml")).read())
    assert f"torch>={onnx_export.MIN_TORCH}" in extra["project"]["optional-dependencies"]["onnx"]
    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=3))
    monkeypatch.setattr(torch, "__version__", "2.7.1+cu126")
    with pytest.raises(OnnxExportError, match=r"ONNX export needs torch 2\.8 or newer, not 2\.7\.1\+cu126 .*"
                                              r"pip install -U 'torch>=2\.8'"):
        export_onnx(model, tmp_path / "m.onnx")
    assert not list(tmp_path.iterdir())
    monkeypatch.setattr(torch, "__version__", "2.8.0")
    assert export_onnx(model, tmp_path / "m.onnx", progress=False).is_file()


def test_pre_training_models_and_huge_models_are_refused_before_any_work(tmp_path):
    from vitkit.selfsup import pretrainer_from_configs

    encoder = vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1).config
    mae = pretrainer_from_configs(encoder, {"objective": "mae"})
    with pytest.raises(OnnxExportError, match="pre-training model has no ONNX form"):
        export_onnx(mae, tmp_path / "m.onnx")
    with torch.device("meta"):  # a 2.3 GB head, counted, not filled (10 s)
        huge = vitkit.create_model("vit_huge_patch14_224", depth=1, embed_dim=576, num_heads=1, mlp_dim=32,
                                   num_classes=1_000_000)
    with pytest.raises(OnnxExportError, match="past the single-file ONNX limit"):
        export_onnx(huge, tmp_path / "h.onnx")
    with pytest.raises(OnnxExportError, match=r"takes a model \(a torch.nn.Module\), not the str 'runs/x': load it "
                                              r"first \(vitkit.from_pretrained\(path\)\)"):  # an AttributeError
        export_onnx("runs/x", tmp_path / "s.onnx")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(vitkit.weights.WeightsError, match="weights are a file, a folder or hf-hub:NAME, not None"):
        vitkit.from_pretrained(None)  # (pathlib's TypeError)


def test_a_failed_export_leaves_nothing_behind(tmp_path, monkeypatch):
    import vitkit.deploy.onnx_export as ox

    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=3)
    (tmp_path / "m.onnx").write_bytes(b"the previous export")

    def broken(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(ox.onnx_modules("test")[0], "save_model", broken)
    with pytest.raises(OSError):
        export_onnx(model, tmp_path / "m.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    assert (tmp_path / "m.onnx").read_bytes() == b"the previous export"


def test_onnxruntime_missing_names_the_extra(tmp_path, monkeypatch, capsys):
    from test_extras import assert_names_extra, hide

    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=3)
    hide(monkeypatch, "onnxruntime")
    with pytest.raises(ImportError) as e:
        export_onnx(model, tmp_path / "m.onnx")
    assert_names_extra(e, "onnx", "onnxruntime")
    model.save_pretrained(tmp_path / "w")
    assert main(["eval", "--weights", str(tmp_path / "w"), "--runtime", "onnxruntime"]) == 2
    assert "pip install -e '.[onnx]'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def trained():
    """A small model trained for a few seconds on real Fashion-MNIST (enough to make decisions)."""
    return trained_briefly("vit_fmnist", depth=2)


@pytest.fixture(scope="module")
def fp32(trained, tmp_path_factory):
    """1,000 test images as the model takes them, fp32 ONNX Runtime's decisions on them, the fp32 file's size and
    PyTorch's top-1: one export for both int8 kinds."""
    from vitkit.evaluate import classification_report
    from vitkit.evaluate.metrics import prepare_batch

    test = fm.load_split("test")
    images, labels = torch.from_numpy(test.images[:1000]).unsqueeze(1), torch.from_numpy(test.labels[:1000]).long()
    path, x = export_onnx(trained, tmp_path_factory.mktemp("fp32") / "f.onnx"), prepare_batch(images, trained.config)
    return dict(x=x, decisions=OnnxModel(path)(x).argmax(-1), bytes=os.path.getsize(path),
                top1=classification_report(trained, images, labels, progress=False).top1)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["int8", "int8-static"])
def test_int8_models_run_and_agree_with_fp32_on_most_predictions(trained, fp32, method, tmp_path):
    # int8-static without calibration= takes 256 training images of the dataset the labels name
    q = OnnxModel(export_onnx(trained, tmp_path / "q.onnx", quantize=method))
    assert q.quantization == {"int8": "int8-dynamic"}.get(method, method)
    assert os.path.getsize(tmp_path / "q.onnx") < 0.6 * fp32["bytes"]  # int8 weights
    agree = (q(fp32["x"]).argmax(-1) == fp32["decisions"]).float().mean().item()
    assert fp32["top1"] > 0.55  # it learned (chance is 0.1), so agreement is about decisions, not noise
    assert agree > 0.9, agree


def test_eval_on_onnxruntime_matches_eval_on_torch(trained, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VITKIT_TINY", "1")  # the first 100 test images (vitkit/tiny.py)
    trained.save_pretrained(tmp_path / "w")
    results = {}
    for runtime in ("torch", "onnxruntime"):
        assert main(["eval", "--weights", str(tmp_path / "w"), "--runtime", runtime, "--json", "--no-progress"]) == 0
        results[runtime] = json.loads(capsys.readouterr().out)
    assert results["onnxruntime"]["precision"] == "onnxruntime fp32" and results["torch"]["precision"] == "fp32"
    assert results["onnxruntime"]["confusion"] == results["torch"]["confusion"]


def test_calibration_images_from_a_folder_are_what_the_model_sees(tmp_path):
    """A folder of photos (any layout; hidden files, other files and broken images skipped) gives
    the images as `vitkit.preprocess` feeds them, before normalising: the same pixels."""
    from vitkit.deploy.quantize import NoCalibrationImages, calibration_images
    from vitkit.evaluate.metrics import prepare_batch

    model = vitkit.create_model("vit_tiny_patch16_224", img_size=40, patch_size=8, depth=1, num_classes=3)
    rng = np.random.default_rng(0)
    paths = []
    for i, (folder, size) in enumerate([("a", (50, 70)), ("a/deeper", (64, 48)), ("b", (40, 40))]):
        (tmp_path / "photos" / folder).mkdir(parents=True, exist_ok=True)
        paths.append(tmp_path / "photos" / folder / f"p{i}.png")
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(paths[-1])
    (tmp_path / "photos" / ".cache").mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "photos" / ".cache" / "hidden.png")
    (tmp_path / "photos" / "b" / "broken.jpg").write_bytes(b"not a jpeg")
    (tmp_path / "photos" / "notes.txt").write_text("not an image")
    images = calibration_images(model, source=tmp_path / "photos")
    assert images.dtype == torch.uint8 and images.shape == (3, 3, 40, 40)
    want = vitkit.preprocess(model, [str(p) for p in paths])
    got = prepare_batch(images, model.config)
    # the draw's order is its own: match each image to the photo it came from
    order = [int(torch.argmin(((want - g) ** 2).flatten(1).sum(1))) for g in got]
    assert sorted(order) == [0, 1, 2]
    assert torch.allclose(got, want[order], atol=1e-6)
    assert calibration_images(model, count=2, source=tmp_path / "photos").shape[0] == 2
    assert calibration_images(model, source=images) is images  # images as they are
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "broken.png").write_bytes(b"x")
    with pytest.raises(NoCalibrationImages, match="no readable image files"):
        calibration_images(model, source=empty)
    with pytest.raises(NoCalibrationImages, match="neither a folder of images nor a built-in dataset"):
        calibration_images(model, source=tmp_path / "nope")
    with pytest.raises(NoCalibrationImages, match="ONNX int8-static calibrates on images.*--calibration FOLDER"):
        export_onnx(model, tmp_path / "q.onnx", quantize="int8-static")
    assert not (tmp_path / "q.onnx").exists()
    q = export_onnx(model, tmp_path / "q.onnx", quantize="int8-static", calibration=tmp_path / "photos",
                    progress=False)
    assert OnnxModel(q).quantization == "int8-static"


def test_a_signal_inside_the_exporter_stops_the_export_as_a_signal(tmp_path, monkeypatch):
    """torch.export wraps a SIGTERM that lands inside it in its own error (seen: `vitkit convert`
    killed mid-export said "torch.onnx.export (dynamo) failed" and exited 2): it stays a stop."""
    from vitkit.signals import Terminated

    def export_interrupted(*args, **kwargs):
        try:
            raise Terminated()
        except Terminated as stop:
            raise RuntimeError("Failed to export the model with torch.export.") from stop

    monkeypatch.setattr(torch.onnx, "export", export_interrupted)
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=3)
    with pytest.raises(Terminated):
        export_onnx(model, tmp_path / "m.onnx", progress=False)
    assert list(tmp_path.iterdir()) == []  # the work folder went with it
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("unsupported op")))
    with pytest.raises(OnnxExportError, match="failed on VisionTransformer.*unsupported op"):
        export_onnx(model, tmp_path / "m.onnx", progress=False)  # a real failure is still one line


def test_the_server_exports_apart_and_never_imports_the_exporter(tmp_path):
    """`vitkit serve` exports weights on the fly in a child process (the exporter's modules and arenas would stay
    in the server: 1,586 against 1,065 MiB for ViT-S/16 on OpenVINO int8): the file the child wrote answers as the
    PyTorch model does, through onnxruntime, and the server's own process never imported the exporter."""
    import subprocess

    from conftest import save_served_classifier

    weights = save_served_classifier(tmp_path / "model")
    script = f"""
import sys, torch, vitkit
from vitkit.serve.model import load_served
served = load_served({str(weights)!r}, "onnxruntime", None, None, print, None, max_batch=4, progress=False)
x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    expected = vitkit.from_pretrained({str(weights)!r}).eval()(x).softmax(-1)
got = torch.stack(served.probabilities(list(x)))
print("RESULT", served.runtime, float((got - expected).abs().max()), "onnxscript" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    runtime, diff, imported = done.stdout.split("RESULT ")[1].split()
    assert runtime == "onnxruntime" and float(diff) <= 1e-5 and imported == "False"


def test_an_export_apart_that_fails_is_the_child_s_one_line(tmp_path):
    from vitkit.deploy.apart import export_apart

    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=3)
    with pytest.raises(OnnxExportError, match="quantize must be one of int8, int8-static, not 'int4'"):
        export_apart(model, tmp_path / "m.onnx", "onnxruntime", quantize="int4")
    assert list(tmp_path.iterdir()) == []  # neither the file nor the work folder handed to the child
    with pytest.raises(OnnxExportError, match="calibration images are used by int8-static quantization only"):
        export_apart(model, tmp_path / "m.onnx", "onnxruntime", calibration=tmp_path)
    with pytest.raises(ValueError, match="onnxruntime or openvino, not 'torch'"):
        export_apart(model, tmp_path / "m.onnx", "torch")
    from vitkit.signals import how_it_ended

    assert how_it_ended(-9, "the export process") == "the export process was killed by SIGKILL before it said why " \
                                                     "(out of memory?)"
    assert how_it_ended(-11, "it") == "it was killed by SIGSEGV before it said why"
    assert how_it_ended(3, "it") == "it ended with exit code 3 before it said why"


@pytest.mark.filterwarnings("ignore")  # the tracer's notes, from plain torch.onnx.export
def test_vitkit_info_says_what_an_onnx_file_is(tmp_path, capsys):
    """`vitkit info model.onnx` said "unknown weights file type '.onnx'". Now: what made it, its
    input and output as ONNX Runtime reads them, the model its metadata describes (checked as
    predict checks it: a lying file exit 2), and for a foreign graph what running it needs."""
    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=3))
    path = export_onnx(model, tmp_path / "m.onnx", progress=False)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert main(["info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    (name, dims, kind), = info["source"]["graph"]["inputs"]
    assert [name, dims] == [session.get_inputs()[0].name, ["?" if isinstance(d, str) else d
                                                           for d in session.get_inputs()[0].shape]]
    assert info["source"]["graph"]["outputs"][0][1][1] == session.get_outputs()[0].shape[1] == 3
    assert info["source"]["config"] == model.config.to_dict()
    assert info["params"] == sum(p.numel() for p in model.parameters())
    proto = onnx.load(str(path))
    assert info["source"]["tensors"] == len(proto.graph.initializer) + sum(n.op_type == "Constant"
                                                                           for n in proto.graph.node)
    said = info["source"]["source_name"]
    assert "exported by vitkit" in said and "with dynamo, quantization none" in said, said
    assert main(["info", str(path), "--img-size", "64"]) == 2  # a graph's size is the one it was exported at
    assert "is an exported graph, fixed at the size it was exported at: --img-size applies" in capsys.readouterr().err
    # a lying file: refused as predict refuses it
    next(p for p in proto.metadata_props if p.key == "labels").value = json.dumps(["a", "b"])
    onnx.save(proto, str(tmp_path / "lie.onnx"))
    assert main(["info", str(tmp_path / "lie.onnx")]) == 2
    assert "cannot load it:" in capsys.readouterr().out
    # a depth or patch size edited in the metadata was printed as the file's (predict runs by neither)
    for key, value, words in (("depth", 3, "it holds 1 of blocks.N where that model has 3"),
                              ("patch_size", [4, 4], "its patch_embed.proj.weight is [192, 3, 8, 8] where that "
                                                     "model's is [192, 3, 4, 4]")):
        proto = onnx.load(str(path))
        meta = next(p for p in proto.metadata_props if p.key == "vitkit.config")
        edited = json.loads(meta.value)
        edited["config"][key] = value
        meta.value = json.dumps(edited)
        onnx.save(proto, str(tmp_path / "lie.onnx"))
        assert main(["info", str(tmp_path / "lie.onnx")]) == 2
        out = capsys.readouterr().out
        assert "cannot load it: its vitkit metadata does not describe its graph: " + words in " ".join(out.split()), out
    # a foreign graph: what it takes and gives, and what predict needs to run it
    with torch.no_grad():
        torch.onnx.export(model, (torch.zeros(2, 3, 32, 32),), str(tmp_path / "foreign.onnx"), dynamo=False,
                          dynamic_axes={"x": {0: "b"}}, input_names=["x"])
    assert main(["info", str(tmp_path / "foreign.onnx")]) == 0
    out = capsys.readouterr().out
    assert "not exported by vitkit" in out and "x (b, 3, 32, 32) float ->" not in out  # a named dynamic axis is "?"
    assert "x (?, 3, 32, 32) float" in out and "--img-size, --mean, --std" in out
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "junk.onnx").write_bytes(b"not a protobuf at all" * 10)
    for bad, words in (("empty.onnx", "is empty (0 bytes)"), ("junk.onnx", "not a readable ONNX model")):
        assert main(["info", str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err


def test_an_export_apart_ends_when_its_parent_is_killed_outright(tmp_path):
    """The child runs in a session of its own (a stop in the parent ends its group), so a parent killed by SIGKILL
    or the OOM killer left it exporting, owned by nobody (a minute of CPU under NNCF): it watches its parent's end
    of a pipe and ends its group when that closes."""
    import signal
    import subprocess

    script = f"""
import torch, vitkit
from vitkit.deploy.apart import export_apart
model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=3)
export_apart(model, {str(tmp_path / "m.onnx")!r}, "onnxruntime")
"""
    parent = subprocess.Popen([sys.executable, "-c", script])
    child = []

    def alive(pid):
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def children():
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == parent.pid and "vitkit.deploy.apart" in \
                        (stat.parent / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(stat.parent.name))
        return found

    try:
        deadline = time.time() + 60
        while not (child := children()) and time.time() < deadline and parent.poll() is None:
            time.sleep(0.05)
        assert child, "the export's child process was not seen"
        parent.kill()
        parent.wait()
        deadline = time.time() + 120
        while alive(child[0]) and time.time() < deadline:
            time.sleep(0.1)
        assert not alive(child[0]), "the export's child went on after its parent was killed"
        assert not (tmp_path / "m.onnx").exists(), "the orphaned child finished the export"
    finally:
        parent.kill()
        for pid in child:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_backbone_exports_its_maps_by_name_and_is_said_to_be_one(tmp_path):
    """export_onnx of a features_only model wrote its second map as "313", and vitkit's runtimes then called the
    file "no image model vitkit can run"; its maps are features_0, features_1, ..., each ONNX Runtime's equal to
    the model's, and the runtimes say what the file is and what runs it."""
    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=3,
                                          features_only=True, out_indices=(0, 2))).eval()
    path = export_onnx(model, tmp_path / "b.onnx", progress=False)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["features_0", "features_1"]
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for got, want in zip(session.run(None, {session.get_inputs()[0].name: x.numpy()}), model(x)):
            scale = want.abs().max().item()  # (unnormalised block outputs: tens, not a logit's units)
            torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-5, atol=1e-5 * scale)
    with pytest.raises(OnnxMetadataError, match=r"is a backbone's graph \(2 feature maps: features_0, features_1\), "
                                                r"not a classifier's: .* run it with ONNX Runtime"):
        OnnxModel(path)
