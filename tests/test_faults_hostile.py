"""Faults, second pass (issue 26): files that lie, config files as people write them, every error
one line, full disks, signals, absurd sizes and the round trips the notes promise.

Each class has several cases of its own; each case asserts the exit code, that no traceback is
printed, the words of the message and what is left on disk. Full disks are real (a small tmpfs,
mounted where the test may; skipped with the reason where not) and signals go to real processes.
"""

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

import forks
import vitkit
from conftest import in_process, randomize
from vitkit.data import fashion_mnist as fm
from vitkit.train import resolve_config
from vitkit.train.checkpoint import checkpoint_paths, save_checkpoint
from vitkit.train.config import ConfigNote, TrainConfig
from vitkit.utils import DiskFull, atomic_path, remove_stale_temporaries, sweep_work_folders, work_folder
from vitkit.weights import WeightsError

real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")
ENV = dict(os.environ, PYTHONHASHSEED="0")


def cli(*argv, **kw):
    kw.setdefault("env", ENV)
    return forks.run(*argv, **kw)


def one_line(done, code=2):
    """The process ended with ``code`` and said one line (after any notes), without a traceback."""
    said = ("reading ", ": note: ", "the CPU is already busy")  # what a verb says on its way, before the error
    working = re.compile(r" \| \d\d:\d\d")  # a slow step's "exporting m.xml to OpenVINO | 00:05" (a busy machine)
    lines = [line for line in done.stderr.strip().splitlines()
             if not any(s in line for s in said) and not working.search(line)]
    assert done.returncode == code, (done.returncode, done.stderr[-800:])
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr[-800:]
    return lines[0]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A Fashion-MNIST-shaped classifier (random weights, the data's class names), saved."""
    folder = tmp_path_factory.mktemp("model") / "fmnist"
    randomize(vitkit.create_model("vit_fmnist", label_names=list(fm.CLASSES))).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "a.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8)).save(path)
    return path


# ---------------------------------------------------------------- 1. a file whose metadata lies is refused


@pytest.fixture(scope="module")
def onnx_file(model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "m.onnx"
    vitkit.export_onnx(vitkit.from_pretrained(model_dir), path, exporter="torchscript")
    return path


def with_metadata(src, dst, **changes):
    proto = onnx.load(str(src))
    for entry in proto.metadata_props:
        if entry.key in changes:
            entry.value = changes[entry.key]
    onnx.save(proto, str(dst))
    return dst


def foreign_graph(path, in_type=TensorProto.FLOAT, in_shape=("N", 1, 28, 28), out_shape=("N", 10), extra=()):
    """A small graph not made by vitkit: Cast + Flatten + MatMul (784 -> 10), then ``extra`` nodes."""
    w = numpy_helper.from_array(np.zeros((784, 10), np.float32), "W")
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT), helper.make_node("Flatten", ["xf"], ["f"]),
             helper.make_node("MatMul", ["f", "W"], ["y0" if extra else "y"]), *extra]
    inits = [w] + ([numpy_helper.from_array(np.array([2], np.int64), "axes")] if extra else [])
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", in_type, list(in_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def config_meta(onnx_file, **fields):
    meta = {p.key: p.value for p in onnx.load(str(onnx_file)).metadata_props}
    stored = json.loads(meta["vitkit.config"])
    stored["config"].update(fields)
    return json.dumps(stored)


@pytest.mark.parametrize("case,words", [
    ("three_classes", "it says 3 classes, the graph outputs 10"),
    ("twenty_classes", "it says 20 classes, the graph outputs 10"),
    ("rgb", "it says 3 input channels, the graph takes 1"),
    ("size", "56x56 images, the graph takes 28x28"),
    ("labels_entry", "labels [\"a\", \"b\", \"c\", ... (10 in all)] in its metadata"),
    ("std_entry", "std [0.0] in its metadata, [0.353] in its vitkit config"),
    ("garbage", "its vitkit.config metadata is not a valid vitkit config"),
])
def test_an_onnx_file_whose_metadata_lies_is_refused(capsys, onnx_file, image, tmp_path, case, words):
    lie = {"three_classes": {"vitkit.config": config_meta(onnx_file, num_classes=3, label_names=["a", "b", "c"])},
           "twenty_classes": {"vitkit.config": config_meta(onnx_file, num_classes=20,
                                                           label_names=[f"c{i}" for i in range(20)])},
           "rgb": {"vitkit.config": config_meta(onnx_file, in_chans=3, mean=[0.5] * 3, std=[0.5] * 3)},
           "size": {"vitkit.config": config_meta(onnx_file, img_size=[56, 56])},
           "labels_entry": {"labels": json.dumps(list("abcdefghij"))},
           "std_entry": {"std": json.dumps([0.0])},
           "garbage": {"vitkit.config": "{not json"}}[case]
    path = with_metadata(onnx_file, tmp_path / f"{case}.onnx", **lie)
    line = one_line(in_process(capsys, "predict", "--weights", path, image))
    assert words in line and str(path) in line, line


@pytest.mark.parametrize("graph,words", [
    (dict(in_type=TensorProto.UINT8), "its input 'x' is tensor(uint8), not tensor(float)"),
    (dict(in_shape=("N", 28, 28)), "not one (batch, channels, height, width)"),
    (dict(out_shape=("N", 10, 1), extra=[helper.make_node("Unsqueeze", ["y0", "axes"], ["y"])]),
     "its output has shape ['N', 10, 1], not (batch, classes)"),
])
def test_an_onnx_graph_vitkit_cannot_feed_is_one_line(capsys, image, tmp_path, graph, words):
    path = foreign_graph(tmp_path / "g.onnx", **graph)
    line = one_line(in_process(capsys, "predict", "--weights", path, image, "--img-size", 28, "--mean", 0.5,
                               "--std", 0.5))
    assert "no image model vitkit can run" in line and words in line, line


def test_an_output_that_contradicts_the_metadata_at_run_time_is_refused(capsys, onnx_file, image, tmp_path):
    """A graph whose class dimension is symbolic (it follows the input's size) can only be caught
    on its first batch."""
    graph = helper.make_graph([helper.make_node("Flatten", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "K"])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for entry in onnx.load(str(onnx_file)).metadata_props:  # vitkit's metadata: 10 classes
        proto.metadata_props.add(key=entry.key, value=entry.value)
    onnx.save(proto, str(tmp_path / "k.onnx"))
    line = one_line(in_process(capsys, "predict", "--weights", tmp_path / "k.onnx", image))
    assert "gave an output of shape (1, 784)" in line and "(batch, 10)" in line, line


def _older_save(model_dir, folder):
    """A copy of the saved model as vitkit saved it before its weights file carried its config: config.json is
    checked against the tensors (with the config in the file, against that first: test_weights_formats)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, folder)
    save_file(load_file(str(folder / "model.safetensors")), str(folder / "model.safetensors"), {"format": "vitkit"})
    return folder


@pytest.mark.parametrize("field,value,words", [
    ("num_classes", 3, "num_classes 3 where its weights hold 10 classes in its head"),
    ("in_chans", 3, "in_chans 3 where its weights hold 1 input channels"),
])
def test_a_config_json_that_contradicts_its_weights_is_refused(capsys, model_dir, image, tmp_path, field, value, words):
    folder = _older_save(model_dir, tmp_path / "edited")
    stored = json.loads((folder / "config.json").read_text())
    stored["config"].update({field: value, "label_names": None, "mean": [0.5] * 3, "std": [0.5] * 3}
                            if field == "in_chans" else {field: value, "label_names": None})
    (folder / "config.json").write_text(json.dumps(stored))
    with pytest.raises(WeightsError, match=words):
        vitkit.from_pretrained(folder)
    line = one_line(in_process(capsys, "predict", "--weights", folder, image))
    assert "its config does not match its weights" in line and words in line


@pytest.mark.parametrize("change,words", [
    ({"id2label": {"0": "a", "1": "b", "2": "c"}}, "id2label names 3 classes where its classifier holds 5"),
    ({"image_size": 64}, "img_size 64x64 (a 8x8 grid) where its weights hold 17 position slots"),
    ({"num_channels": 1}, "in_chans 1 where its weights hold 3 input channels"),
])
def test_a_hugging_face_config_that_contradicts_its_weights_is_refused(tmp_path, change, words):
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=5)
    folder = vitkit.export_weights(randomize(model), tmp_path / "hf", "hf")
    stored = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**stored, **change}))
    with pytest.raises(WeightsError, match=words.replace("(", r"\(").replace(")", r"\)")) as info:
        vitkit.from_pretrained(folder)
    assert str(folder) in str(info.value)


def test_a_timm_export_whose_stored_config_lies_is_refused(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = vitkit.export_weights(randomize(vitkit.create_model("vit_fmnist")), tmp_path / "w.safetensors", "timm")
    with safe_open(str(path), "pt") as f:
        stored = json.loads(f.metadata()["vitkit_config"])
    stored.update(num_classes=7, label_names=None)
    save_file(load_file(str(path)), str(tmp_path / "lie.safetensors"), metadata={"vitkit_config": json.dumps(stored)})
    with pytest.raises(WeightsError, match="num_classes 7 where its weights hold 10 classes"):
        vitkit.from_pretrained(tmp_path / "lie.safetensors")
    assert vitkit.from_pretrained(path, num_classes=7).config.num_classes == 7  # asked for: a new head, as ever


@pytest.mark.parametrize("field,value,words", [
    ("embed_dim", 48, "blocks.0.attn.proj.bias of shape (48,) where its weights hold (96,)"),
    ("depth", 6, "blocks.4.attn.proj.bias, blocks.4.attn.proj.weight, blocks.4.attn.qkv.bias where its weights hold "
                 "none"),
    ("label_names", ["a", "b"], "config.json: invalid ViT config: 2 label names for 10 classes"),
    ("format_version", 99, "format_version 99 is newer than the 1 this vitkit reads"),
])
def test_every_field_of_a_vitkit_config_is_checked_against_its_weights(model_dir, tmp_path, field, value, words):
    folder = _older_save(model_dir, tmp_path / "edited")
    stored = json.loads((folder / "config.json").read_text())
    (stored if field == "format_version" else stored["config"])[field] = value
    (folder / "config.json").write_text(json.dumps(stored))
    with pytest.raises(WeightsError, match=re.escape(words)):
        vitkit.from_pretrained(folder)
    with pytest.raises(WeightsError, match=re.escape(words)):  # fine-tuning reads it through the same check
        from vitkit.train.init import model_from_init

        model_from_init(str(folder), {"num_classes": 10}, {})


def test_a_bare_state_dict_says_which_field_it_guessed(tmp_path):
    from vitkit.weights.pretrained import GuessWarning

    with pytest.warns(UserWarning):
        path = vitkit.export_weights(randomize(vitkit.create_model("vit_fmnist")), tmp_path / "w.pth", "timm")
    with pytest.warns(GuessWarning, match=r"w.pth holds tensors only: its number of heads is not stored and was read "
                                          r"as 1 \(width 96 / 64\)"):
        assert vitkit.from_pretrained(path, pos_embed="learned").config.num_heads == 1
    with pytest.warns(GuessWarning) as said:  # mean pooling without a class token: a later ViT's layout
        assert vitkit.from_pretrained(path, num_heads=3, pos_embed="learned").config.num_heads == 3
    assert not any("number of heads" in str(w.message) for w in said)  # said: no guess, no note
    assert any("the GELU" in str(w.message) for w in said)
    with pytest.warns(GuessWarning) as said:
        vitkit.from_pretrained(path, num_heads=3, pos_embed="learned", gelu="exact", norm_eps=1e-6, block="pre",
                               mean=(0.5,), std=(0.5,))
    assert [str(w.message).split(": ", 1)[1] for w in said] == [
        "what no tensor holds was assumed: no rotary positions (Perception Encoder's, EVA-02's and DINOv3's have "
        "no tensors). Load it with its architecture (--model NAME, model_name=) or from its hub folder to be sure"]


@pytest.mark.parametrize("name", ["zero.pth", "zero.safetensors", "zero.npz", "zero.onnx"])
def test_a_zero_byte_weight_file_is_not_a_checkpoint(capsys, image, tmp_path, name):
    (tmp_path / name).write_bytes(b"")
    model = [] if name.endswith(".onnx") else ["--model", "vit_fmnist"]
    line = one_line(in_process(capsys, "predict", "--weights", tmp_path / name, *model, image))
    assert "is empty (0 bytes): not a" in line, line


# ---------------------------------------------------------------- 2. config files as people write them


def config_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("name,text,words", [
    ("c.json", '{"hflip": "no"}', 'hflip "no" is not true or false'),
    ("c.json", '{"batch_size": true}', "batch_size true is not an integer"),
    ("c.json", '{"weight_decay": NaN}', "weight_decay NaN is not finite"),
    ("c.yaml", "clip_grad: .nan\n", "clip_grad NaN is not finite"),
    ("c.yaml", "tau: .inf\n", "tau Infinity is not finite"),
    ("c.json", '{"min_lr": NaN}', "min_lr NaN is not finite"),
    ("c.json", '{"betas": [0.9, 0.99, 0.999]}', "betas [0.9, 0.99, 0.999] is not two numbers"),
    ("c.yaml", "warmup_steps: -1\n", "warmup_steps must be >= 0, not -1"),
    ("c.yaml", "crop_pad: -2\n", "crop_pad must be >= 0, not -2"),
    ("c.yaml", "lr: fast\n", 'lr "fast" is not a finite number'),
    ("c.yaml", "max_steps: 12.5\n", "max_steps 12.5 is not an integer"),
    ("c.yaml", "img_size: [32, 48, 3]\n", "img_size [32, 48, 3] is not an integer or two (height, width)"),
    ("c.yaml", "name: 123\n", "name 123 is not text (quote it)"),
    ("c.yaml", "x: [\n", "is not valid YAML at line 2, column 1"),
    ("c.yml", "a:\n\tb: 1\n", "(YAML indents with spaces, not tabs)"),
    ("c.YAML", "a: !!python/object/apply:os.system [echo]\n", "vitkit reads plain YAML, without tags"),
    ("c.yaml", "lr: 1\nlr: 2\n", "lr given twice"),
    ("c.json", '{"lr": 1, "lr": 2}', "lr given twice"),
    ("c.json", "", "is not valid JSON (the file is empty)"),
    ("c.json", "[1, 2]", "expected a mapping of config fields"),
    ("c.json", '{"lr": 1e-3', "is not valid JSON: Expecting ',' delimiter at line 1, column 12"),
    ("c.toml", "lr = 1\n", "name it .yaml, .yml or .json"),
    ("c.yaml", "model_args: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("c.json", '{"model_args": ' + "[" * 50 + "]" * 50 + "}", "nested too deeply (at most 32 levels)"),
    ("c.yaml", "1: 2\n", "field names are text, not 1"),
    ("c.json", '{"model_args": {"drop_rate": Infinity}}', "model_args: drop_rate inf is not finite"),
    ("c.json", '{"max_steps": ' + "9" * 5000 + "}", "holds a number of more than 4,300 digits"),
    ("c.yaml", "name: " + "x" * 300 + "\n", "name must be a folder name (printable, no '/', not '.' or '.."),
])
def test_a_config_file_that_is_wrong_is_one_line_naming_file_field_and_value(tmp_path, capsys, name, text, words):
    path = config_file(tmp_path, name, text)
    line = one_line(in_process(capsys, "train", "--config", path, "--runs-dir", tmp_path / "runs", "--no-progress"))
    assert words in line and name in line, line
    assert not (tmp_path / "runs").exists()  # refused before a run folder was made


def test_a_config_files_recipe_is_taken_as_the_recipes_and_its_typos_get_a_hint(tmp_path, capsys):
    path = config_file(tmp_path, "c.yaml", "recipe: deit\n")
    assert resolve_config(None, str(path)).mixup == 0.8  # the file's recipe, as --recipe deit (it was refused)
    assert resolve_config("deit", str(path)).mixup == 0.8  # the same recipe named twice
    line = one_line(in_process(capsys, "train", "--config", path, "--recipe", "fmnist", "--runs-dir", tmp_path / "r"))
    assert f'{path}: recipe "deit" differs from --recipe fmnist: name one recipe' in line, line
    line = one_line(in_process(capsys, "train", "--config", config_file(tmp_path, "u.yaml", "recipe: deit3\n"),
                               "--runs-dir", tmp_path / "runs"))
    assert f"{tmp_path / 'u.yaml'}: unknown recipe 'deit3'; known: fmnist" in line, line
    path = config_file(tmp_path, "t.yaml", "max-steps: 5\nLR: 0.1\n")
    line = one_line(in_process(capsys, "train", "--config", path, "--runs-dir", tmp_path / "runs"))
    assert f"{path}: unknown training option(s): \"LR\" (did you mean lr?), \"max-steps\" (did you mean max_steps?)" \
        in line, line
    path = config_file(tmp_path, "o.yaml", "lr: 0.1\n")  # no objective in the file, none on the command line
    line = one_line(in_process(capsys, "pretrain", "--config", path, "--runs-dir", tmp_path / "runs"))
    assert "--objective is required" in line
    assert not (tmp_path / "runs").exists()


def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdefgh", "bcdefghi"):  # 10^9 values by reference in 350 bytes
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    path = config_file(tmp_path, "bomb.yaml", "\n".join(lines + ["model_args: {x: *i}"]) + "\n")
    started = time.time()
    with pytest.raises(ValueError, match="holds more than 10,000 values once its references"):
        resolve_config("fmnist", str(path))
    assert time.time() - started < 5


def test_a_huge_or_special_config_file_is_refused_unread(tmp_path):
    big = config_file(tmp_path, "big.json", '{"name": "' + "x" * (1 << 21) + '"}')
    with pytest.raises(ValueError, match="2,097,16.? bytes: a training config is a few hundred"):
        resolve_config("fmnist", str(big))
    os.mkfifo(tmp_path / "fifo.yaml")
    with pytest.raises(ValueError, match="is not a regular file"):  # reading a FIFO would wait forever
        resolve_config("fmnist", str(tmp_path / "fifo.yaml"))
    (tmp_path / "latin.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        resolve_config("fmnist", str(tmp_path / "latin.yaml"))


def test_unambiguous_numbers_are_coerced_and_said_dates_stay_text(tmp_path):
    path = config_file(tmp_path, "c.YML", 'lr: "1e-3"\nmax_steps: 1e4\nname: 2024-01-01\nmin_lr: 0\n')
    with pytest.warns(ConfigNote) as notes:
        cfg = resolve_config("fmnist", str(path))
    assert cfg.lr == 0.001 and cfg.max_steps == 10000 and isinstance(cfg.max_steps, int)
    assert cfg.name == "2024-01-01" and cfg.min_lr == 0
    said = sorted(str(n.message) for n in notes)
    assert said == [f'{path}: lr "1e-3" read as 0.001', f'{path}: max_steps 10000.0 read as 10000']
    # a flag over one of the file's values wins, and is said (pretrain --objective mae over objective: simmim ran MAE
    # without a word); the same value given twice is no news
    with pytest.warns(ConfigNote) as notes:
        cfg = resolve_config("fmnist", str(path), lr=0.002, max_steps=10000)
    assert cfg.lr == 0.002 and [str(n.message) for n in notes if "taken over" in str(n.message)] == [
        f"--lr 0.002 is taken over {path}'s lr: 0.001"]
    from vitkit.train.config import OFF

    same = config_file(tmp_path, "s.json", '{"betas": [0.9, 0.95], "init": null, "dataset": "fmnist"}')
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigNote)  # a tuple for a list, none for null, a dataset's other name
        resolve_config("fmnist", str(same), betas=(0.9, 0.95), init=OFF, dataset="fashion-mnist")
    path = config_file(tmp_path, "c.json", '{"max_steps": 1e4, "epochs": 2}')  # JSON's 1e4 is a float
    with pytest.warns(ConfigNote, match="max_steps 10000.0 read as 10000"):
        assert resolve_config("fmnist", str(path)).max_steps == 10000
    done = cli("train", "--config", config_file(tmp_path, "n.yaml", 'lr: "1e-3"\nmax_steps: 0\n'),
               "--runs-dir", tmp_path / "r")
    assert 'vitkit train: note: ' in done.stderr and 'lr "1e-3" read as 0.001' in done.stderr  # one line per note
    assert "max_steps must be in [1, 1,000,000,000]" in one_line(done)
    # YAML 1.2's numbers: 1e-3 unquoted is one (YAML 1.1's text, which model_args refused: "got '1e-1'")
    assert resolve_config("fmnist", str(config_file(tmp_path, "e.yaml", "lr: 1e-3\nmodel_args: {drop_path_rate: 1e-1}\n"
                                                    ))).model_args["drop_path_rate"] == 0.1
    # YAML 1.1's other number forms were read in silence: 0042 octal (34), 0b1000 (8), 1:30 sexagesimal (90)
    path = config_file(tmp_path, "o.yaml", "seed: 0042\nmax_steps: 12\n")
    with pytest.warns(ConfigNote, match='seed "0042" read as 42'):
        assert resolve_config("fmnist", str(path)).seed == 42
    for text, words in (("batch_size: 0b1000", 'batch_size "0b1000" is not an integer'),
                        ("epochs: 1:30", 'epochs "1:30" is not a finite number'),
                        ("batch_size: 0x10", 'batch_size "0x10" is not an integer')):
        with pytest.raises(ValueError, match=words):
            resolve_config("fmnist", str(config_file(tmp_path, "b.yaml", text + "\n")))


@pytest.mark.parametrize("field,value,words", [
    ("lr", "1e-3", 'lr "1e-3" is not a finite number'), ("max_steps", 1e4, "max_steps 10000.0 is not an integer "
                                                                          "(write 10000)"),
    ("hflip", "no", 'hflip "no" is not true or false'), ("batch_size", True, "batch_size true is not an integer"),
    ("weight_decay", float("nan"), "weight_decay NaN is not finite"), ("betas", (0.9,), "is not two numbers"),
    ("ema_decay", float("inf"), "ema_decay Infinity is not finite"), ("epochs", None, "epochs cannot be none"),
])
def test_the_api_takes_no_wrong_type_either(field, value, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**{field: value}).validate()


@pytest.mark.parametrize("flag,value,words", [
    ("--lr", "nan", "lr NaN is not finite"), ("--clip-grad", "inf", "clip_grad Infinity is not finite"),
    ("--clip-grad", "0", "clip_grad must be > 0"), ("--betas", "0.9 1.5", "betas must be two numbers in [0, 1)"),
    ("--momentum", "2", "momentum must be in [0, 1), not 2.0"), ("--weight-decay", "-0.1", "weight_decay must be >= 0"),
    ("--label-smoothing", "1", "label_smoothing must be in [0, 1), not 1.0"),
    ("--seed", "-1", "seed must be in [0, 2^63)"),
    ("--name", "..", "name must be a folder name"), ("--name", "a/b", "name must be a folder name"),
])
def test_bad_flag_values_are_refused_before_a_run_folder(tmp_path, capsys, flag, value, words):
    line = one_line(in_process(capsys, "train", "--runs-dir", tmp_path, flag, *value.split(), "--no-progress"))
    assert words in line, line
    assert list(tmp_path.iterdir()) == []


def test_init_takes_its_architecture_from_the_weights_and_says_so_when_told_another(model_dir, tmp_path, capsys):
    line = one_line(in_process(capsys, "train", "--init", model_dir, "--model", "vit_base_patch16_224",
                               "--runs-dir", tmp_path))
    assert "--model vit_base_patch16_224 does not apply with --init: the architecture comes from the weights" in line
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_run_config_is_one_line_on_resume(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"recipe": "fmnist", "lr": ')
    line = one_line(cli("train", "--resume", run))
    assert "config.json is not valid JSON" in line and "damaged" in line, line
    (run / "config.json").write_text(json.dumps({**TrainConfig().to_dict(), "wings": 2}))
    (run / "checkpoints").mkdir()
    save_checkpoint(run, 1, {"model": {}, "step": 1}, keep=1)
    line = one_line(cli("train", "--resume", run))
    assert "has fields no training run has: wings" in line, line


# ---------------------------------------------------------------- 3. every error is one line


def test_errors_of_every_kind_are_named_in_one_line():
    from vitkit.cli import describe_error

    assert describe_error(MemoryError()).startswith("out of memory (MemoryError): use a smaller --img-size or model "
                                                    "(or --batch-size, where the command takes one)")
    # numpy's, from a data worker (re-raised as a RuntimeError): was "unexpected RuntimeError ... please report it"
    worker = RuntimeError("Caught MemoryError in DataLoader worker process 0.\nOriginal Traceback (most recent call "
                          "last):\nnumpy._core._exceptions._ArrayMemoryError: Unable to allocate 22.4 MiB for an array")
    assert describe_error(worker).startswith("out of memory (Unable to allocate 22.4 MiB for an array): use a")
    alloc = RuntimeError("[enforce fail at alloc_cpu.cpp:124] DefaultCPUAllocator: can't allocate memory: you tried "
                         "to allocate 1099511627776 bytes.\nError code 12")
    assert describe_error(alloc).startswith("out of memory ([enforce fail") and "\n" not in describe_error(alloc)
    assert describe_error(KeyError("pos_embed")) == ("unexpected KeyError: 'pos_embed' (VITKIT_DEBUG=1 shows where; "
                                                     "please report it if the input was sound)")
    assert describe_error(RecursionError()).startswith("the input is nested too deeply")
    assert describe_error(PermissionError(13, "Permission denied", "/root/x")) == "Permission denied: /root/x"
    assert describe_error(OSError(28, "No space left on device")).startswith("no space left on device: free some")
    assert describe_error(DiskFull("/d/f.pt")).startswith("no space left on device while writing /d/f.pt; nothing")
    assert describe_error(OSError(errno.EFBIG, "File too large", "/d/f")) == (
        "a file grew past the largest this process may write (its file-size limit: ulimit -f) while writing /d/f")


def test_an_unexpected_error_is_one_line_and_debug_shows_where(monkeypatch, capsys):
    import vitkit.cli as cli_module

    def broken(args):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    parser = cli_module.build_parser
    monkeypatch.setattr(cli_module.entry, "build_parser", lambda: _with_verb(parser(), "models", broken))
    assert cli_module.main(["models"]) == 2
    err = capsys.readouterr().err
    assert err == ("vitkit models: error: unexpected TypeError: unsupported operand type(s) for +: 'int' and 'str' "
                   "(VITKIT_DEBUG=1 shows where; please report it if the input was sound)\n")
    monkeypatch.setenv("VITKIT_DEBUG", "1")
    with pytest.raises(TypeError):
        cli_module.main(["models"])


def _with_verb(parser, verb, func):
    import argparse

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub.choices[verb].set_defaults(func=func)
    return parser


def test_outputs_are_checked_before_the_work_starts(capsys, model_dir, image, tmp_path):
    (tmp_path / "o").write_text("a file")
    started = time.time()
    line = one_line(in_process(capsys, "eval", "--weights", tmp_path / "absent", "--out", tmp_path / "o"))
    assert "--out" in line and "is a file, not a folder" in line, line  # said before the weights were looked at
    line = one_line(in_process(capsys, "convert", model_dir, tmp_path / "o" / "w.npz", "--to", "npz"))
    assert "DST" in line and "is a file, not a folder" in line, line
    (tmp_path / "dir.pth").mkdir()
    line = one_line(in_process(capsys, "convert", model_dir, tmp_path / "dir.pth", "--to", "timm"))
    assert "is a folder, not a file name" in line, line
    (tmp_path / "link.pth").symlink_to(tmp_path / "nowhere" / "w.pth")  # was "not a regular file (a FIFO ...)"
    line = one_line(in_process(capsys, "convert", model_dir, tmp_path / "link.pth", "--to", "timm"))
    assert f"is a symbolic link to {tmp_path / 'nowhere' / 'w.pth'}, which does not exist" in line, line
    line = one_line(in_process(capsys, "inspect", "--weights", model_dir, "--out", tmp_path / "o", "--image", image))
    assert "--out" in line and "is a file" in line, line
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")  # was "a symbolic link to loop2, which does not exist"
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    line = one_line(in_process(capsys, "info", tmp_path / "loop1"))
    assert f"is a symbolic link to {tmp_path / 'loop2'}, which leads back to it (a loop of links)" in line, line
    import pickle

    (tmp_path / "plain.pth").write_bytes(pickle.dumps({"w": [1.0, 2.0]}, protocol=4))  # was "Unsupported operand 149"
    line = one_line(in_process(capsys, "info", tmp_path / "plain.pth"))
    assert "(a plain pickle, not a torch.save file (Unsupported operand 149); vitkit never unpickles those)" in line
    line = one_line(in_process(capsys, "push", model_dir, "org/name", "--dry-run", tmp_path / "o"))
    assert "--dry-run" in line and "is a file" in line, line
    line = one_line(in_process(capsys, "train", "--runs-dir", tmp_path / "o"))
    assert "--runs-dir" in line and "is a file" in line, line
    assert time.time() - started < 60
    line = one_line(in_process(capsys, "eval", "--weights", model_dir, "--batch-size", "0"))
    assert "--batch-size must be a positive integer, not 0" in line, line
    os.mkfifo(tmp_path / "fifo.png")
    line = one_line(in_process(capsys, "predict", "--weights", model_dir, tmp_path / "fifo.png"), 2)
    assert "is not a regular file (a FIFO" in line, line


@pytest.mark.parametrize("argv,words", [
    (["push", "MODEL", "org/name", "--dry-run", ""], "argument --dry-run: an empty value"),  # would push for real
    (["train", "--runs-dir", ""], "argument --runs-dir: an empty value"),
    (["convert", "MODEL", "", "--to", "vitkit"], "argument DST: an empty value"),
    (["eval", "--weights", "MODEL", "--out", ""], "argument --out: an empty value"),
    (["predict", "--weights", "MODEL", ""], "argument IMAGES: an empty value"),
])
def test_an_empty_path_is_refused_not_read_as_here_or_unset(model_dir, tmp_path, monkeypatch, argv, words):
    monkeypatch.chdir(tmp_path)
    done = cli(*[model_dir if a == "MODEL" else a for a in argv])
    assert words in one_line(done)
    assert list(tmp_path.iterdir()) == []  # nothing written here


def test_convert_never_overwrites_what_it_reads(model_dir, tmp_path, capsys):
    source = tmp_path / "m"
    shutil.copytree(model_dir, source)
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    for dst, to, words in ((source / "model.safetensors", "timm", f"would overwrite {source / 'model.safetensors'}"),
                           (source, "vitkit", f"DST {source} is the folder SRC {source} is read from"),
                           (tmp_path / "x" / "model.safetensors", "vitkit", "writes a folder")):
        line = one_line(in_process(capsys, "convert", source, dst, "--to", to))
        assert words in line, line
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before
    # an open_clip folder's own files (they were deleted by --to vitkit/hf into it, overwritten by --to timm)
    clip = tmp_path / "clip"
    clip.mkdir()
    (clip / "open_clip_model.safetensors").write_bytes((source / "model.safetensors").read_bytes())
    (clip / "open_clip_config.json").write_text("{}")
    for dst, to, words in ((clip, "hf", f"DST {clip} is the folder SRC {clip} is read from"),
                           (clip / "open_clip_model.safetensors", "timm", "would overwrite")):
        line = one_line(in_process(capsys, "convert", clip, dst, "--to", to))
        assert words in line, line
    assert sorted(p.name for p in clip.iterdir()) == ["open_clip_config.json", "open_clip_model.safetensors"]
    # a training run's folder as DST: its config.json (the run's settings) was replaced by a model's
    run = tmp_path / "run"
    run.mkdir()
    settings = json.dumps({"recipe": "fmnist", "objective": "classify", "lr": 0.002})
    (run / "config.json").write_text(settings)
    for to in ("vitkit", "hf"):
        line = one_line(in_process(capsys, "convert", source, run, "--to", to))
        assert f"DST {run} is a training run's folder (its config.json holds the run's settings)" in line, line
    assert (run / "config.json").read_text() == settings and sorted(p.name for p in run.iterdir()) == ["config.json"]


def test_warnings_are_one_line_notes(capsys, model_dir, tmp_path):
    """An export warning (a bare .pth loses what its shapes cannot give back) is one line, not two."""
    done = in_process(capsys, "convert", model_dir, tmp_path / "w.pth", "--to", "timm")
    notes = [line for line in done.stderr.splitlines() if "note:" in line]
    assert done.returncode == 0 and len(notes) == 1 and notes[0].startswith("vitkit convert: note: ")
    assert "class names are not kept either" in notes[0]


def test_a_note_is_said_once(capsys):
    """A model built twice in one command (checked, then trained) says its note once."""
    from vitkit.cli import _one_line_warnings

    previous = _one_line_warnings("train")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            for _ in range(2):
                vitkit.create_model("vit_fmnist_hybrid", drop_path_rate=0.1)
    finally:
        warnings.showwarning = previous
    notes = capsys.readouterr().err.splitlines()
    assert notes == ["vitkit train: note: drop_path_rate 0.1 has no effect on a model of depth 1: stochastic depth "
                     "rises linearly from 0 at the first block (use drop_rate, or depth >= 2)"]


# ---------------------------------------------------------------- 4. a full disk is one line everywhere


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs (mounting needs root and CAP_SYS_ADMIN: skipped, with the reason, where not)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'mount failed'}): full disks untested")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def fill(disk, leave=48 * 1024):
    """Fill the disk to ``leave`` bytes."""
    free = shutil.disk_usage(disk).free
    (disk / "filler").write_bytes(b"\0" * max(free - leave, 0))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_stdout_is_said_as_stdouts_not_as_the_disk_the_work_was_on(small_disk):
    """`vitkit models > /dev/full` said "no space left on device: free some space and run it again", as if a file
    the verb wrote had failed; stdout on a full disk, the same. The verb's files are whole: the line says stdout."""
    for where in ("/dev/full", small_disk / "out.txt"):  # (a process of its own: Python's flush at exit is part of it)
        if where != "/dev/full":
            fill(small_disk, leave=0)
        with open(where, "w") as out:  # (stdout's error is main's, any verb's: `study list` needs no torch, 0.5 s)
            done = subprocess.run([sys.executable, "-m", "vitkit", "study", "list"], stdout=out,
                                  stderr=subprocess.PIPE, text=True, env=ENV)
        assert "no space left on the device stdout writes to" in one_line(done), where
    from vitkit.cli.entry import _stdout_full

    with open(small_disk / "out.txt", "a") as full, contextlib.redirect_stdout(full):
        assert not _stdout_full(DiskFull("run/x.pt"))  # the disk under the verb's own file full: its line,
        assert _stdout_full(OSError(errno.ENOSPC, "No space left on device"))  # not stdout's


def test_a_full_disk_under_torch_s_zip_writer_keeps_the_previous_checkpoint(small_disk):
    run = small_disk / "run"
    first = save_checkpoint(run, 4, {"model": {"w": torch.ones(8)}, "step": 4}, keep=1)
    fill(small_disk, leave=16 * 1024)
    with pytest.raises(DiskFull, match=r"no space left on device while writing .*step_00000008.pt.*intact"):
        save_checkpoint(run, 8, {"model": {"w": torch.ones(200_000)}, "step": 8}, keep=1)
    assert checkpoint_paths(run) == [first] and not list(run.rglob("*.tmp"))


def test_a_full_disk_removes_the_folders_it_started(small_disk):
    model = randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2))  # 3.5 MB
    fill(small_disk, leave=200 * 1024)
    for call, target in ((lambda t: model.save_pretrained(t), small_disk / "a" / "model"),
                         (lambda t: vitkit.export_weights(model, t, "hf"), small_disk / "hf"),
                         (lambda t: vitkit.export_weights(model, t, "timm"), small_disk / "w.pth"),
                         (lambda t: vitkit.export_weights(model, t, "npz"), small_disk / "w.npz")):
        with pytest.raises(DiskFull, match="no space left on device while writing"):
            call(target)
        assert sorted(p.name for p in small_disk.iterdir()) == ["filler"], target  # nothing half-made
    empty = small_disk / "empty"
    empty.mkdir()
    with pytest.raises(DiskFull):
        model.save_pretrained(empty)
    assert list(empty.iterdir()) == []  # a folder that was there stays, without what was half written


def test_convert_and_push_on_a_full_disk_are_one_line_and_leave_nothing(small_disk, tmp_path):
    src = tmp_path / "big"
    randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2)).save_pretrained(src)
    fill(small_disk, leave=200 * 1024)
    line = one_line(cli("convert", src, small_disk / "out", "--to", "vitkit"))
    assert "no space left on device while writing" in line and "model.safetensors" in line, line
    line = one_line(cli("push", src, "org/name", "--dry-run", small_disk / "card"))
    assert "no space left on device while writing" in line, line
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_a_write_past_the_file_size_limit_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    """Under a file-size limit (``ulimit -f``: EFBIG) convert ended in "unexpected SafetensorError: ... File too large
    (os error 27) ... please report it"; the ONNX exporter's OSError was said as its own failure."""
    import resource

    src = tmp_path / "src"
    randomize(vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2)).save_pretrained(src)
    limit = 200_000  # bytes: under the model's 2.2 MB
    # the limit is this process's while the verb runs (a process of its own per case started Python, torch and
    # the exporter again): a write past it is EFBIG here as there (every Python process ignores SIGXFSZ)
    assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN
    monkeypatch.chdir(tmp_path)  # (a file left in the working folder is seen)
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    for dst, to in (("out.safetensors", "timm"), ("out.onnx", "onnx")):  # (safetensors' error; the exporter's)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, before[1]))
        try:
            done = in_process(capsys, "convert", src, tmp_path / dst, "--to", to)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, before)
        line = one_line(done)
        assert line.startswith("vitkit convert: error: the file grew past the largest this process may write (its "
                               "file-size limit: ulimit -f) while writing ") and "nothing was replaced" in line, line
        assert sorted(p.name for p in tmp_path.iterdir()) == ["src"], to


def test_openvino_and_onnx_int8_exports_on_a_full_disk_are_one_line(small_disk, tmp_path, capsys):
    """Room for the ONNX graph and not for what follows it: OpenVINO's writer said "unexpected RuntimeError:
    basic_ios::clear: iostream error" and ONNX Runtime's quantizer, whose shape-inferred copy was cut short without a
    word, "unexpected DecodeError: Error parsing message" (the free space was read once their folders were gone)."""
    pytest.importorskip("openvino")
    from vitkit.deploy import export_onnx

    model = randomize(vitkit.create_model("vit_fmnist", depth=1, num_classes=10, embed_dim=48, num_heads=2))
    model.save_pretrained(tmp_path / "m")
    graph = export_onnx(model, tmp_path / "m.onnx", progress=False).stat().st_size
    fill(small_disk, leave=int(1.5 * graph))
    # OpenVINO in a process of its own (see conftest: never in this one); ONNX Runtime's here, where the exporter is
    # loaded (a forked process loads it again: 10 s)
    for dst, extra in (("o.xml", ("--to", "openvino")), ("o.onnx", ("--to", "onnx", "--quantize", "int8"))):
        argv = ("convert", tmp_path / "m", small_disk / dst, *extra)
        line = one_line(cli(*argv) if dst == "o.xml" else in_process(capsys, *argv))
        assert f"no space left on device while writing {small_disk / dst}; nothing was replaced" in line, line
        assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_a_full_disk_at_the_final_model_says_the_resume_that_writes_it(tmp_path, capsys, monkeypatch):
    """A disk full when the trained model was saved said "no space ... model.safetensors; nothing was replaced":
    nothing of the steps the checkpoints hold, nor of the resume that writes the model from them."""
    if not fm._complete(fm.DEBIAN_DIR):
        pytest.skip("Debian dataset-fashion-mnist not installed")
    import errno

    from vitkit.models.serialize import SaveMixin

    def full(self, directory):
        raise OSError(errno.ENOSPC, "No space left on device", str(directory))

    monkeypatch.setattr(SaveMixin, "save_pretrained", full)
    args = ("train", "--model", "vit_fmnist", "--model-args", '{"depth": 1, "embed_dim": 16, "num_heads": 1}',
            "--max-steps", "2", "--batch-size", "8", "--val-size", "10", "--test-size", "10", "--no-progress",
            "--runs-dir", tmp_path / "r", "--name", "k", "--no-tensorboard")
    done = in_process(capsys, *args)
    line = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "Traceback" not in done.stderr and line == (
        f"vitkit train: error: no space left on device while writing {tmp_path / 'r' / 'k'}; "
                    f"the run's checkpoints hold its steps: free some space, then vitkit train --resume "
                    f"{tmp_path / 'r' / 'k'} writes the model"), line
    monkeypatch.undo()
    assert in_process(capsys, "train", "--resume", tmp_path / "r" / "k", "--no-progress").returncode == 0
    assert (tmp_path / "r" / "k" / "model" / "model.safetensors").is_file()


def test_a_full_disk_under_tensorboard_and_a_kept_checkpoint_are_one_line(small_disk, tmp_path):
    """TensorBoard's writer thread printed its traceback after the run's line (which named no file); a disk with
    room for the checkpoints kept but not the next beside them said nothing of why."""
    if not fm._complete(fm.DEBIAN_DIR):
        pytest.skip("Debian dataset-fashion-mnist not installed")
    pytest.importorskip("torch.utils.tensorboard")
    args = ("train", "--model", "vit_fmnist", "--model-args", '{"depth": 1, "embed_dim": 16, "num_heads": 1}',
            "--max-steps", "4", "--batch-size", "8", "--val-size", "10", "--test-size", "10", "--no-progress")
    fill(small_disk, leave=8 * 1024)
    done = cli(*args, "--runs-dir", small_disk / "r", "--name", "t", "--tensorboard")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"vitkit train: error: no space left on device while writing {small_disk / 'r' / 't' / 'tensorboard'}; free "
        f"some space (or run with --no-tensorboard: metrics.jsonl is the record)"), done.stderr
    (small_disk / "filler").unlink()
    run = cli(*args, "--runs-dir", tmp_path / "r", "--name", "k", "--checkpoint-every", "2", "--no-tensorboard")
    size = (tmp_path / "r" / "k" / "checkpoints" / "step_00000002.pt").stat().st_size
    assert run.returncode == 0, run.stderr
    fill(small_disk, leave=int(2.5 * size) + 48 * 1024)  # two checkpoints fit (and the run's other files), a third not
    done = cli(*args, "--runs-dir", small_disk / "r", "--name", "k", "--checkpoint-every", "1", "--keep-checkpoints",
               "2", "--no-tensorboard")
    line = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "the checkpoints before are intact (the newest of step 2); a checkpoint is written beside the ones kept " \
           "before the oldest goes, so --keep-checkpoints 2 needs room for 3 of" in line, line
    # its resume on the disk made read-only names the run, not a --runs-dir the user never gave
    assert subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True).returncode == 0
    line = one_line(cli("train", "--resume", small_disk / "r" / "k", "--no-progress"))
    assert f"--resume {small_disk / 'r' / 'k'} cannot be written: no permission to write in" in line, line


def test_a_stop_whose_error_chain_loops_still_ends():
    """SIGTERM while torch.onnx imported torch._dynamo made a chain that loops (the stop's context an error whose
    cause's context is the stop): the command line's walk over it, to free what the verb held, never ended (3 of 30
    stopped exports ran at 100% CPU until killed)."""
    import threading

    from vitkit.cli.entry import _release_interrupted_work
    from vitkit.signals import Terminated

    stop, export, inner = Terminated(), RuntimeError("export failed"), AttributeError("torch._dynamo.exc")
    stop.__context__, export.__cause__, inner.__context__ = export, inner, stop
    walk = threading.Thread(target=_release_interrupted_work, args=(stop,), daemon=True)
    walk.start()
    walk.join(10)
    assert not walk.is_alive() and stop.__traceback__ is None


def test_inspect_and_eval_remove_the_out_folder_they_started_on_a_full_disk(small_disk, model_dir, image):
    fill(small_disk, leave=24 * 1024)
    line = one_line(cli("inspect", "--weights", model_dir, "--image", image, "--out", small_disk / "insp",
                        "--no-progress"))
    assert "no space left on device while writing" in line and str(small_disk / "insp") in line, line
    if fm._complete(fm.DEBIAN_DIR):
        line = one_line(cli("eval", "--weights", model_dir, "--out", small_disk / "ev", "--no-progress",
                            env=dict(ENV, VITKIT_TINY="1")))
        assert "no space left on device while writing" in line, line
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_a_metrics_row_is_never_half_written(small_disk):
    from vitkit.train.tracking import MetricsLog

    log = MetricsLog(small_disk, tensorboard=False)
    log.write({"step": 1, "train_loss": 1.0})
    fill(small_disk, leave=0)
    with pytest.raises(DiskFull, match="metrics.jsonl; the rows before are intact"):
        log.write({"step": 2, "train_loss": 0.5, "pad": "x" * 65536})
    assert (small_disk / "metrics.jsonl").read_text() == '{"step": 1, "train_loss": 1.0}\n'


# ---------------------------------------------------------------- 5. signals


def wait_for(predicate, proc, timeout=120, what="the file"):
    deadline = time.time() + timeout
    while not predicate():
        assert proc.poll() is None, f"the process ended before {what} appeared: {proc.stderr.read()[-500:]}"
        assert time.time() < deadline, f"{what} never appeared"
        time.sleep(0.02)


def test_a_stop_after_the_file_was_installed_says_it_is_whole(model_dir, tmp_path, capsys, monkeypatch):
    """Ctrl-C in the moment between installing the ONNX file and the verb's end said "partial files were removed"
    with the whole, working file left in place: the user could not tell whether to trust it. With --json a stop
    left stdout empty, where an error gives its JSON object."""
    import vitkit.cli.weights as verb

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(verb, "_faster_here", interrupted)
    fast = ("--exporter", "torchscript")  # (the stop comes after either exporter's file is installed: 1 s, not 9)
    done = in_process(capsys, "convert", model_dir, tmp_path / "m.onnx", "--to", "onnx", *fast)
    assert done.returncode == 130 and done.stderr.strip().splitlines()[-1] == \
        f"vitkit convert: stopped by Ctrl-C after {tmp_path / 'm.onnx'} was written whole", done.stderr
    assert vitkit.deploy.OnnxModel(tmp_path / "m.onnx").config.num_classes == 10
    done = in_process(capsys, "convert", model_dir, tmp_path / "m.onnx", "--to", "onnx", *fast, "--json")
    assert json.loads(done.stdout) == {"verb": "convert", "error": f"stopped by Ctrl-C after {tmp_path / 'm.onnx'} "
                                                                   f"was written whole", "exit": 130}  # (it was none)


def test_sigterm_during_an_onnx_export_exits_cleanly_and_leaves_nothing(model_dir, tmp_path):
    proc = forks.popen("convert", model_dir, tmp_path / "m.onnx", "--to", "onnx", "--quantize", "int8", env=ENV,
                       stderr=subprocess.PIPE)
    wait_for(lambda: list(tmp_path.glob(".m.onnx.*.work")), proc, what="the export's work folder")
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 143 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == "vitkit convert: stopped by SIGTERM; partial files were removed"
    assert list(tmp_path.iterdir()) == []


def test_sigterm_during_predict_s_export_on_the_fly_leaves_no_temporary_folder(model_dir, image, tmp_path):
    env = dict(ENV, TMPDIR=str(tmp_path))
    proc = forks.popen("predict", "--weights", model_dir, image, "--runtime", "onnxruntime", env=env,
                       stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    wait_for(lambda: list(tmp_path.glob(".vitkit-onnx.*.work")), proc, what="the export's work folder")
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 143 and "Traceback" not in err, err
    assert not list(tmp_path.glob(".vitkit-onnx*")), list(tmp_path.iterdir())


def test_a_signal_during_a_native_import_waits_for_the_import_to_end():
    """Raised inside a native extension's import (nanobind, onnxruntime) an interrupt aborts the
    process with nothing cleaned; vitkit holds it until the import is done, then raises it."""
    import vitkit.cli as cli_module
    from vitkit.utils import interrupts_deferred, require

    previous = signal.signal(signal.SIGTERM, cli_module._on_sigterm)
    reached = []
    try:
        with pytest.raises(cli_module.Terminated):
            with interrupts_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler has run by now: held, not raised
                reached.append("end of the import")
        assert reached == ["end of the import"]
        assert require("json", "train", "a test") is json  # nothing left pending
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_signal_just_after_a_temporary_or_a_folder_is_made_leaves_neither(tmp_path, monkeypatch):
    """SIGTERM between mkstemp and the cleanup's arming (or right after new_folder's mkdir) left the
    temporary (the folder) behind; the handler fires inside the call, as it does between bytecodes."""
    import tempfile
    from pathlib import Path

    import vitkit.cli as cli_module
    from vitkit.files import new_folder
    from vitkit.signals import interrupt

    def then_sigterm(original):
        def call(*args, **kwargs):
            out = original(*args, **kwargs)
            interrupt(cli_module.Terminated())  # what the SIGTERM handler does
            return out
        return call

    with monkeypatch.context() as m:
        m.setattr(tempfile, "mkstemp", then_sigterm(tempfile.mkstemp))
        with pytest.raises(cli_module.Terminated):
            with atomic_path(tmp_path / "model.safetensors"):
                pass
    assert list(tmp_path.iterdir()) == []
    with monkeypatch.context() as m:
        m.setattr(Path, "mkdir", then_sigterm(Path.mkdir))
        with pytest.raises(cli_module.Terminated):
            with new_folder(tmp_path / "a" / "b"):
                pass
    assert list(tmp_path.iterdir()) == []


SAVE_SLOWLY = """
import sys, time
from pathlib import Path
from vitkit.files import weights_folder
folder, me, start, pause = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
time.sleep(max(0.0, start - time.time()))
with weights_folder(folder, lambda f: [f / "config.json", f / "model.safetensors"]) as into:
    (into / "model.safetensors").write_text(me)
    time.sleep(pause)
    (into / "config.json").write_text(me)
"""


def test_two_processes_saving_into_one_folder_leave_one_model_not_some_of_each(tmp_path):
    """Two saves into one new folder at once wrote straight into it, each file the later writer's: the first
    writer's weights beside the second's config (and into a folder that held a model, the moves of two
    installs interleaved). Each writes apart now, and the installs take turns: one writer's files, whole."""
    for round_ in range(2):  # into a new folder, then into the folder the first round left
        start = time.time() + 3  # both begin together, past Python's start-up
        procs = [subprocess.Popen([sys.executable, "-c", SAVE_SLOWLY, str(tmp_path / "m"), me, str(start + delay),
                                   str(pause)]) for me, delay, pause in (("first", 0, 0.6), ("second", 0.1, 0.2))]
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
        weights, config = ((tmp_path / "m" / n).read_text() for n in ("model.safetensors", "config.json"))
        assert weights == config == "first", round_  # the later install, whole
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no staging folder left


SAVE_AND_HOLD = """
import sys, time
from pathlib import Path
from vitkit.files import weights_folder
with weights_folder(Path(sys.argv[1]), lambda f: [f / "model.safetensors"]) as into:
    (into / "model.safetensors").write_text("half")
    print("holding", flush=True)
    time.sleep(120)
"""


def test_a_save_killed_mid_way_leaves_a_staging_folder_the_next_save_removes(tmp_path):
    """SIGKILL runs no finally: the staging folder of a killed save stayed beside the model for good.
    It holds a lock while its writer lives, so the next save of the same name removes a dead one
    and leaves a live one alone."""
    from vitkit.files import weights_folder

    def save(text):
        with weights_folder(tmp_path / "m", lambda f: [f / "model.safetensors"]) as into:
            (into / "model.safetensors").write_text(text)

    proc = subprocess.Popen([sys.executable, "-c", SAVE_AND_HOLD, str(tmp_path / "m")], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "holding"
        [staging] = [p.name for p in tmp_path.iterdir()]
        save("while it lives")  # a live writer's staging folder is kept
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m", staging])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (tmp_path / staging).is_dir()  # the kill left it
    save("after")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["model.safetensors"]
    assert (tmp_path / "m" / "model.safetensors").read_text() == "after"


HOLD = """
import sys, time
from pathlib import Path
from vitkit.utils import atomic_path, work_folder
with work_folder(sys.argv[1], "job") as folder, atomic_path(Path(sys.argv[1]) / "f.bin") as tmp:
    (folder / "part").write_bytes(b"x" * 1000)
    tmp.write_bytes(b"half")
    print("holding", flush=True)
    time.sleep(120)
"""


def test_a_killed_writer_s_leftovers_are_swept_and_a_live_writer_s_are_not(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "holding"
        live = sorted(p.name for p in tmp_path.iterdir())
        assert sweep_work_folders(tmp_path, "job") == 0 and remove_stale_temporaries(tmp_path) == 0
        assert sorted(p.name for p in tmp_path.iterdir()) == live  # a live writer's work is kept
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(live) == 2  # the kill left its work folder and its temporary
    (tmp_path / ".editor.x.work").mkdir()  # another program's folder of the same form, without vitkit's lock file
    with work_folder(tmp_path, "other") as mine:  # the next job in the folder sweeps the dead one's folder
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted([".editor.x.work", mine.name])
    (tmp_path / ".editor.x.work").rmdir()
    with atomic_path(tmp_path / "f.bin") as tmp:  # the next writer of f.bin removes its dead temporary
        tmp.write_bytes(b"whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]


@real
@pytest.mark.slow
def test_sigterm_during_training_says_how_to_resume_and_releases_the_run(tmp_path):
    from vitkit.runlock import holder

    run = tmp_path / "run"
    proc = forks.popen("train", "--runs-dir", tmp_path, "--name", "run", "--max-steps", "400", "--checkpoint-every",
                       "5", "--val-size", "500", "--threads", "1", "--no-progress", "--no-tensorboard", env=ENV,
                       stderr=subprocess.PIPE)
    wait_for(lambda: checkpoint_paths(run), proc, what="a checkpoint")
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 143 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert f"vitkit train --resume {run} goes on from there" in lines[-2], lines
    assert lines[-1] == "vitkit train: stopped by SIGTERM; partial files were removed"
    assert holder(run) is None and not list(run.rglob("*.tmp"))


@real
def test_a_stop_right_after_a_checkpoint_lands_names_it_and_resume_goes_on(tmp_path, capsys, monkeypatch):
    """SIGTERM between a checkpoint's rename into place and the loop's note of it (the window the test
    above once hit): the file on disk is whole, so the message names it and --resume goes on from it."""
    from vitkit.signals import Terminated
    from vitkit.train import loop

    def save_then_stop(*args, **kw):
        save_checkpoint(*args, **kw)
        raise Terminated()

    monkeypatch.setattr(loop, "save_checkpoint", save_then_stop)
    run = tmp_path / "run"
    argv = ["--max-steps", "4", "--checkpoint-every", "2", "--batch-size", "16", "--val-size", "50", "--test-size",
            "50", "--threads", "1", "--no-progress", "--no-tensorboard", "--model-args", '{"depth": 1}']
    stopped = in_process(capsys, "train", "--runs-dir", tmp_path, "--name", "run", *argv)
    lines = stopped.stderr.strip().splitlines()
    assert stopped.returncode == 143 and "Traceback" not in stopped.stderr, stopped.stderr
    assert lines[-2] == f"interrupted; {run} keeps its checkpoint of step 2: vitkit train --resume {run} goes on " \
                        "from there", lines
    monkeypatch.undo()
    resumed = in_process(capsys, "train", "--resume", run, "--no-progress")
    assert resumed.returncode == 0 and f"resuming {run} at step 2/4" in resumed.stdout + resumed.stderr


# ---------------------------------------------------------------- 6. absurd sizes are refused up front


@pytest.mark.parametrize("argv,words", [
    (["train", "--threads", "10000"], "threads must be at most the"),
    (["train", "--threads", "100000"], "threads must be at most the"),
    (["train", "--workers", "10000"], "workers must be at most"),
    (["train", "--img-size", "100000"], "img_size 100000 is past the 16,384 px"),
    pytest.param(["train", "--model-args", '{"img_size": 100000}'], "img_size (100000, 100000) is past 16,384 px",
                 marks=real),
    (["info", "B/16", "--img-size", "16", "16", "16"], "--img-size takes one value or two (H W), not 16 16 16"),
])
def test_absurd_sizes_are_one_line(tmp_path, capsys, argv, words):
    line = one_line(in_process(capsys, *argv, *(["--runs-dir", tmp_path / "runs"] if argv[0] == "train" else [])))
    assert words in line, line
    assert not (tmp_path / "runs").exists()


def test_a_model_past_the_memory_is_refused_before_it_is_built(monkeypatch):
    from vitkit.train import memory

    with pytest.raises(ValueError, match="depth 1,000,000 is past 1,024"):
        vitkit.ViTConfig(depth=1_000_000)
    config = vitkit.ViTConfig(depth=1000, embed_dim=8192, num_heads=64, mlp_dim=32768)
    started = time.time()
    monkeypatch.setattr(memory, "available_memory", lambda: 64 * 2 ** 30)
    with pytest.raises(ValueError, match=r"1000 blocks of width 8192\) has at least 805,314,560,000 parameters: "
                                         r"training them needs at least 12,000.1 GiB and 64.0 GiB are free"):
        memory.check_model_fits(config)
    assert time.time() - started < 1  # from the config: nothing was built
    memory.check_model_fits(vitkit.ViTConfig())  # ViT-B/16 fits in 64 GiB


def test_a_position_table_past_the_memory_is_refused_before_it_is_built(monkeypatch):
    """`--img-size 16384` on the default model: its sine-cosine table (4096 x 4096 tokens, 6 GiB) was built twice
    (once more to count the parameters on the meta device) in five float64 pieces, and the kernel killed the run
    without a word. The table is now built alone, never on the meta device, and one too large is refused first."""
    from vitkit.models.positions.absolute import sincos_2d_pos_embed
    from vitkit.train import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 16 * 2 ** 30)
    big = vitkit.create_model("vit_fmnist", img_size=28).config.replace(img_size=16384, pos_embed="learned")
    with pytest.raises(ValueError, match=r"^the model's position table for its 4096x4096 grid \(16384x16384 px\) holds "
                                         r"16,777,216 x 96 values: the model needs at least 24.0 GiB and 16.0 GiB "
                                         r"are free: lower --img-size$"):
        memory.check_model_fits(big)
    memory.check_model_fits(big.replace(pos_embed="sincos2d"))  # 6 GiB: built, then the batches are refused
    started = time.time()
    with torch.device("meta"):  # counting parameters: nothing computed, nothing held
        table = sincos_2d_pos_embed((4096, 4096), 96)
    assert table.device.type == "meta" and table.shape == (1, 4096 * 4096, 96) and table.dtype == torch.float32
    assert time.time() - started < 1


def test_maes_decoder_table_counts_and_its_frozen_encoder_table_counts_once(monkeypatch):
    """MAE's decoder holds a second fixed table over the whole grid at its own width, which the bound left out (at
    4096 px the tables took 1.4x what was counted); a learned encoder table MAE holds fixed has no gradient and no
    Adam moments, which the bound counted."""
    from vitkit.selfsup import MAE, MAEConfig
    from vitkit.train import memory

    monkeypatch.setattr(memory, "available_memory", lambda: 16 * 2 ** 30)
    big = vitkit.create_model("vit_fmnist", img_size=28).config.replace(img_size=16384, num_classes=0)
    memory.check_model_fits(big)  # the encoder's sine-cosine table alone: 6 GiB
    with pytest.raises(ValueError, match=r"^the model's position tables for its 4096x4096 grid \(16384x16384 px\) "
                                         r"hold 16,777,216 x \(96 \+ the decoder's 512\) values: the model needs at "
                                         r"least 70.\d GiB and 16.0 GiB are free: lower --img-size$"):
        memory.check_model_fits(big, MAEConfig())
    small = MAEConfig(decoder_dim=32, decoder_heads=4, decoder_mlp_dim=64, decoder_depth=1)
    memory.check_model_fits(big.replace(pos_embed="learned"), small)  # 6 + 2 x 2 GiB, frozen: it fits
    with pytest.raises(ValueError, match="position table for its 4096x4096 grid"):
        memory.check_model_fits(big.replace(pos_embed="learned"))  # trained: 24 GiB
    # what MAE builds: its decoder's table is the encoder's grid at the decoder's width, in float32, and a learned
    # encoder table is not trained
    mae = MAE(vitkit.create_model("vit_fmnist", img_size=28).config.replace(num_classes=0, pos_embed="learned"), small)
    decoder_table = mae.decoder_pos_embed[0, mae.encoder.num_prefix_tokens:]
    assert memory._decoder_table_bytes(mae.encoder.config, small) == 2 * decoder_table.numel() * 4  # (and its values)
    assert decoder_table.dtype == torch.float32 and not mae.encoder.pos_embed.requires_grad


@real
def test_a_batch_past_the_memory_is_refused_before_the_run_folder(tmp_path):
    line = one_line(cli("train", "--runs-dir", tmp_path, "--batch-size", "100000000", "--model", "vit_fmnist",
                        "--no-progress"))
    assert "training 100000000 images of 28x28 at once needs at least" in line and "GiB are free" in line, line
    assert list(tmp_path.iterdir()) == []


def test_foreign_onnx_sizes_are_bounded(capsys, image, tmp_path):
    path = foreign_graph(tmp_path / "g.onnx", in_shape=("N", 1, "H", "W"))  # any size: only the bound says no
    for size, words in ((["16", "16", "16"], "--img-size takes one value or two (H W), not 16 16 16"),
                        (["60000"], "--img-size must be between 1 and 16,384 px, not 60000 60000")):
        line = one_line(in_process(capsys, "predict", "--weights", path, image, "--img-size", *size, "--mean", 0.5,
                                   "--std", 0.5))
        assert words in line, line
    line = one_line(in_process(capsys, "predict", "--weights", path, image, "--img-size", 28, "--mean", 0.5,
                               "--std", "nan"))
    assert "--std values must be positive" in line


def test_image_sizes_are_whole_numbers():
    with pytest.raises(ValueError, match=r"img_size must be an int or a pair \(H, W\) of ints, got 28.5"):
        vitkit.create_model("vit_fmnist", img_size=28.5)
    with pytest.raises(ValueError, match="got True"):
        vitkit.create_model("vit_fmnist", img_size=True)
    assert vitkit.create_model("vit_fmnist", img_size=np.int64(32)).config.img_size == (32, 32)


# ---------------------------------------------------------------- 7. round trips the notes promise


def test_a_bare_pth_reads_back_with_the_architecture_its_note_names(capsys, tmp_path, image):
    model = randomize(vitkit.create_model("vit_fmnist_hybrid", label_names=list(fm.CLASSES)))  # sine-cosine positions
    model.save_pretrained(tmp_path / "run_model")
    done = in_process(capsys, "convert", tmp_path / "run_model", tmp_path / "q.pth", "--to", "timm")
    assert done.returncode == 0 and "Load it with the architecture given" in done.stderr
    back = json.loads(in_process(capsys, "predict", "--weights", tmp_path / "q.pth", "--model", "vit_fmnist_hybrid",
                                 image, "--json").stdout)[0]["top"]
    want = json.loads(in_process(capsys, "predict", "--weights", tmp_path / "run_model", image,
                                 "--json").stdout)[0]["top"]
    assert [t["index"] for t in back] == [t["index"] for t in want]
    assert np.allclose([t["probability"] for t in back], [t["probability"] for t in want], atol=1e-6)


@real
@pytest.mark.slow
def test_int8_static_from_python_finds_its_calibration_images_from_the_labels(model_dir, tmp_path):
    from vitkit.deploy import OnnxModel

    model = vitkit.from_pretrained(model_dir)
    path = vitkit.export_onnx(model, tmp_path / "q.onnx", exporter="torchscript", quantize="int8-static")
    assert OnnxModel(path).quantization == "int8-static"
    nameless = randomize(vitkit.create_model("vit_fmnist"))
    with pytest.raises(ValueError, match="the model's classes name no built-in dataset"):
        vitkit.export_onnx(nameless, tmp_path / "n.onnx", exporter="torchscript", quantize="int8-static")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.onnx"]


def test_a_mask_block_that_cannot_honour_the_ratio_is_refused(tmp_path):
    from vitkit.selfsup import SimMIM

    encoder = vitkit.ViTConfig(img_size=28, patch_size=4, in_chans=1, embed_dim=32, depth=1, num_heads=2, mlp_dim=64)
    with pytest.raises(ValueError, match="mask_block 28 px is the whole image.*smaller blocks .*: 4 px"):
        SimMIM(encoder, mask_block=28).draw(2)
    model = SimMIM(encoder, mask_block=4, mask_ratio=0.6)
    assert model.draw(2)["mask"].float().mean().item() == pytest.approx(30 / 49)
    line = one_line(cli("pretrain", "--objective", "simmim", "--mask-block", "28", "--runs-dir", tmp_path,
                        "--no-progress"))
    assert "mask_block 28 px is the whole image" in line, line
    assert list(tmp_path.iterdir()) == []


def test_a_write_error_names_the_file_meant_not_its_temporary(tmp_path):
    """An I/O error while writing (a failing disk, a network file system gone) named
    '.model.safetensors.k3j9x.tmp', a file the user never asked for and that is gone by then; it names
    model.safetensors, and no temporary is left."""
    import errno

    with pytest.raises(OSError, match=r"Input/output error: '.*model\.safetensors'$") as e:
        with atomic_path(tmp_path / "model.safetensors") as tmp:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(tmp))
    assert e.value.errno == errno.EIO and e.value.filename == str(tmp_path / "model.safetensors")
    assert list(tmp_path.iterdir()) == []
