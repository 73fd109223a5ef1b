"""Every CLI verb on a tiny model, human and --json output."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from conftest import randomize
from vitkit.cli import main
from vitkit.evaluate.predict import NOT_FINITE


def run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as e:  # the parser's own errors end as argparse ends them
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def tiny_weights(tmp_path):
    model = randomize(vitkit.create_model("Ti/16", img_size=32, patch_size=8, depth=2, num_classes=3,
                                          label_names=["ant", "bee", "cow"], crop_pct=1.0))
    model.save_pretrained(tmp_path / "tiny")
    return model, tmp_path / "tiny"


@pytest.fixture
def photo(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "photo.png"
    Image.fromarray(rng.integers(0, 255, (40, 56, 4), dtype=np.uint8), "RGBA").save(path)
    return path


def test_models_table_and_json(capsys):
    code, out, _ = run(capsys, "models", "--filter", "vit_base_patch16_224")
    assert code == 0 and "86.57M" in out and "17.56" in out and "197" in out
    code, out, _ = run(capsys, "models", "--json", "--filter", "vit_tiny_patch16_[0-9]*")
    rows = json.loads(out)
    assert {r["name"] for r in rows} == {"vit_tiny_patch16_224", "vit_tiny_patch16_384"}
    assert next(r for r in rows if r["name"] == "vit_tiny_patch16_224")["params"] == 5_717_416


def test_models_says_its_count_on_stderr_once_it_takes_a_while(capsys, monkeypatch):
    """Counting all 256 models' parameters took 12 s of silence on a slow CPU: a bar after DELAY_S, on stderr."""
    from vitkit import progress

    code, quick, err = run(capsys, "models", "--json", "--filter", "vit_tiny_patch16_[0-9]*")
    assert code == 0 and err == ""  # a short count says nothing
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    code, out, err = run(capsys, "models", "--json", "--filter", "vit_tiny_patch16_[0-9]*")
    assert code == 0 and out == quick  # stdout stays the table alone
    assert "counting parameters" in err and "2/2 models" in err, err


def test_info_human_and_json(capsys):
    code, out, _ = run(capsys, "info", "B/16")
    assert code == 0 and "86,567,656" in out and "197 x 197" in out
    code, out, _ = run(capsys, "info", "vit_base_patch16_224", "--img-size", "300", "300", "--patch-size", "1",
                       "--json")
    d = json.loads(out)
    # the seeds' example: a 300x300x3 image with every value a token -> 270,000 tokens, 72.9e9 weights
    assert d["value_tokens"] == 270_000 and d["value_attn_entries"] == 72_900_000_000
    assert d["tokens"] == 90_001 and d["attn_bytes_per_layer_fp32"] == 4 * 12 * 90_001 ** 2
    code, _, err = run(capsys, "info", "B/16", "--img-size", "300")
    assert code == 2 and "288 or 304" in err
    code, _, err = run(capsys, "info", "resnetv2_50_nopreact")
    assert code == 2 and "CNN, not a ViT" in err
    for missing in ("nonexist.safetensors", "./nodir", "nodir/x.pth"):  # a path, said as predict says it
        code, _, err = run(capsys, "info", missing)
        assert code == 2 and f"weights not found: {missing} (no such file or folder" in err, err
    code, _, err = run(capsys, "info", "vit_nonexist")
    assert code == 2 and "unknown model 'vit_nonexist'" in err


def test_info_on_a_dangling_link_names_the_link(capsys, tmp_path, monkeypatch):
    """It was "unknown model 'dangling'" (predict says the weights are not found; convert names the link)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    code, _, err = run(capsys, "info", "dangling")
    assert code == 2 and f"weights not found: dangling is a symbolic link to {tmp_path / 'gone'}" in err, err


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_convert_keeps_a_half_precision_source_half(capsys, tmp_path, dtype):
    """A float16 or bfloat16 file was written as float32 (twice its size, unsaid); timm and transformers read
    the written files back to the source's own function."""
    timm = pytest.importorskip("timm")
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    ref = timm.create_model("vit_tiny_patch16_224", img_size=32, depth=2, num_classes=5).eval()
    randomize(ref)
    save_file({k: v.to(dtype) for k, v in ref.state_dict().items()}, tmp_path / "half.safetensors")
    ref.load_state_dict({k: v.float() for k, v in load_file(tmp_path / "half.safetensors").items()})
    x = torch.randn(2, 3, 32, 32)
    name = str(dtype).replace("torch.", "")
    for to, dst in (("timm", "w.safetensors"), ("hf", "hf"), ("vitkit", "v")):
        code, out, _ = run(capsys, "convert", str(tmp_path / "half.safetensors"), str(tmp_path / dst), "--to", to,
                           "--json")
        assert code == 0 and json.loads(out)["dtype"] == name, out
        weights = tmp_path / dst if to == "timm" else tmp_path / dst / "model.safetensors"
        assert {v.dtype for v in load_file(weights).values()} == {dtype}
    back = timm.create_model("vit_tiny_patch16_224", img_size=32, depth=2, num_classes=5).eval()
    back.load_state_dict(load_file(tmp_path / "w.safetensors"))
    hf = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref(x)
        assert torch.allclose(back(x), want, atol=1e-5)
        assert torch.allclose(hf(pixel_values=x).logits, want, atol=1e-5)
        assert torch.allclose(vitkit.from_pretrained(tmp_path / "v")(x), want, atol=1e-5)
    code, out, _ = run(capsys, "convert", str(tmp_path / "w.safetensors"), str(tmp_path / "w.npz"), "--to", "npz",
                       "--json")
    assert code == 0 and json.loads(out)["dtype"] == "float32"  # vit_jax's files are float32


def test_convert_each_format(capsys, tmp_path, tiny_weights):
    model, path = tiny_weights
    for fmt, dst in (("npz", "w.npz"), ("timm", "w.safetensors"), ("hf", "hf"), ("vitkit", "again")):
        code, out, _ = run(capsys, "convert", str(path), str(tmp_path / dst), "--to", fmt, "--json")
        assert code == 0 and json.loads(out)["format"] == fmt
    code, out, _ = run(capsys, "info", str(tmp_path / "w.safetensors"), "--json")  # it was said to be "vitkit"
    assert code == 0 and json.loads(out)["source"]["format"] == "timm", out
    back = vitkit.from_pretrained(tmp_path / "hf")
    x = torch.randn(1, 3, 32, 32)
    assert torch.allclose(back(x), model(x), atol=1e-6)
    code, _, err = run(capsys, "convert", str(path / "nothing"), str(tmp_path / "x.npz"), "--to", "npz")
    assert code == 2 and "not found" in err
    (tmp_path / "notes.pth").write_text("my notes")  # replaced as cp replaces, but said (it was replaced in silence)
    code, _, err = run(capsys, "convert", str(path), str(tmp_path / "notes.pth"), "--to", "timm")
    assert code == 0 and f"note: {tmp_path / 'notes.pth'} was there before and is replaced" in err
    code, _, err = run(capsys, "convert", str(path), str(tmp_path / "fresh.pth"), "--to", "timm")
    assert code == 0 and "replaced" not in err
    (tmp_path / "link.pth").symlink_to(tmp_path / "notes.pth")  # the link goes, its target stays: said so
    before = (tmp_path / "notes.pth").read_bytes()
    code, _, err = run(capsys, "convert", str(path), str(tmp_path / "link.pth"), "--to", "timm")
    assert code == 0 and f"note: {tmp_path / 'link.pth'} was a link to {tmp_path / 'notes.pth'}: the link is " \
        f"replaced by the file, its target left as it was" in err, err
    assert not (tmp_path / "link.pth").is_symlink() and (tmp_path / "notes.pth").read_bytes() == before
    # a suffix in capitals is the layout's as the readers take it (.XML was written, .ONNX and .PTH refused)
    code, _, err = run(capsys, "convert", str(path), str(tmp_path / "upper.PTH"), "--to", "timm")
    assert code == 0 and torch.allclose(vitkit.from_pretrained(tmp_path / "upper.PTH")(x), model(x), atol=1e-6), err
    for fmt in ("hf", "vitkit"):  # a folder under a file's name: refused in Python as on the command line
        with pytest.raises(vitkit.WeightsError, match=r"layout is a folder .*py\.safetensors is a file name"):
            vitkit.export_weights(model, tmp_path / "py.safetensors", format=fmt)
    assert not (tmp_path / "py.safetensors").exists()
    # a folder that held a model: its files replaced, said as a file's are (an HF folder's processor config too)
    code, _, err = run(capsys, "convert", str(path), str(tmp_path / "hf"), "--to", "vitkit")
    assert code == 0 and f"note: {tmp_path / 'hf'} held a model before: its config.json, model.safetensors, " \
        f"preprocessor_config.json are replaced" in err, err


def test_predict_top_k_with_class_names(capsys, tiny_weights, photo):
    model, path = tiny_weights
    code, out, _ = run(capsys, "predict", "--weights", str(path), str(photo), "--top-k", "2", "--json")
    assert code == 0
    pred = json.loads(out)[0]
    assert [t["label"] for t in pred["top"]][0] in {"ant", "bee", "cow"} and len(pred["top"]) == 2
    # the same numbers by hand: RGBA on white, the shorter side to 32 (crop_pct 1) and the longer
    # truncated, the centre offset rounded (timm's / torchvision's evaluation), normalise with 0.5/0.5
    im = Image.open(photo).convert("RGBA")
    bg = Image.new("RGBA", im.size, (255, 255, 255, 255))
    im = Image.alpha_composite(bg, im).convert("RGB")
    w, h = im.size
    im = im.resize((int(w * 32 / h), 32), Image.Resampling.BICUBIC)
    left = int(round((im.size[0] - 32) / 2))
    arr = np.asarray(im.crop((left, 0, left + 32, 32)), np.float32) / 255
    x = torch.from_numpy((arr.transpose(2, 0, 1) - 0.5) / 0.5)[None]
    probs = model(x).softmax(-1)[0]
    assert abs(pred["top"][0]["probability"] - probs.max().item()) < 1e-5
    code, out, _ = run(capsys, "predict", "--weights", str(path), str(photo))
    assert code == 0 and "%" in out
    code, _, err = run(capsys, "predict", "--weights", str(path), "missing.jpg")
    assert code == 2 and "image not found" in err


def test_the_model_verbs_take_threads(capsys, tiny_weights, photo, monkeypatch):
    """predict, eval, fewshot, inspect and convert ran on every core whatever else ran beside them (only train,
    study and serve had --threads), so a process sharing the CPU could not take its share. The count is torch's
    during the verb's work, which ONNX Runtime and OpenVINO models take too."""
    import vitkit.evaluate
    from vitkit.deploy.runtime import thread_count

    _, path = tiny_weights
    seen = []
    real = vitkit.evaluate.predict_images

    def watched(*args, **kwargs):
        seen.append((torch.get_num_threads(), thread_count(None)))
        return real(*args, **kwargs)

    monkeypatch.setattr(vitkit.evaluate, "predict_images", watched)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        code, out, _ = run(capsys, "predict", "--weights", str(path), str(photo), "--threads", "1")
    finally:
        torch.set_num_threads(before)
    assert code == 0 and "%" in out and seen == [(1, 1)]
    for verb in ("eval", "fewshot", "inspect", "convert"):
        with pytest.raises(SystemExit):
            main([verb, "--help"])
        assert "--threads N" in capsys.readouterr().out, verb


def test_a_sigterm_while_an_error_is_said_ends_with_its_code_not_a_traceback(monkeypatch, capsys):
    """SIGTERM arriving while the error line was printed (a script that read the --json error and stopped the
    process) raised Terminated out of the error handler: a traceback and exit 1."""
    import vitkit.cli.entry as entry
    from vitkit.signals import Terminated

    said = []

    def print_then_signalled(*args, **kwargs):
        said.append(args)
        raise Terminated()

    monkeypatch.setattr(entry, "describe_error", lambda e: "missing.jpg: image not found")
    monkeypatch.setattr(entry, "print", print_then_signalled, raising=False)
    assert entry.main(["predict", "missing.jpg", "--weights", "nowhere"]) == 143
    assert said and "Traceback" not in capsys.readouterr().err


def test_predict_on_a_folder_predicts_the_images_under_it(capsys, tiny_weights, photo, tmp_path, caplog):
    """`vitkit predict photos/` was refused ("a folder, not an image file"); timm's inference script
    reads a folder. Now its images, subfolders included, sorted, hidden files and non-images left out;
    a folder without images is one line, before the weights are read."""
    import shutil

    model, path = tiny_weights
    for name in ("b.png", "a.png", "sub/c.png", ".hidden/d.png", ".e.png"):
        (tmp_path / "photos" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(photo, tmp_path / "photos" / name)
    (tmp_path / "photos" / "notes.txt").write_text("not an image")
    shutil.copy(photo, tmp_path / "photos" / "f.jfif")  # (JPEG's other name, and .pnm/.pbm: read, not dropped)
    code, out, err = run(capsys, "predict", "--weights", str(path), str(tmp_path / "photos"), str(photo), "--json")
    assert code == 0 and "vitkit predict: note: left out 1 file(s) of " in err, err  # (it was bare: no verb, no note)
    got = json.loads(out)
    assert [g["image"] for g in got] == [str(tmp_path / "photos" / n) for n in ("a.png", "b.png", "f.jfif",
                                                                                  "sub/c.png")] + [str(photo)]
    said = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]  # not in silence, and once
    assert len(said) == 1 and "left out 1 file(s) of " in said[0] and "(.txt x1)" in said[0], said
    (tmp_path / "photos" / "f.jfif").unlink()
    assert len({json.dumps(g["top"]) for g in got}) == 1  # the same picture gives the same answer
    # a broken file among them: said where it stands, every other image still answered, exit 2
    (tmp_path / "photos" / "b2.png").write_bytes(b"half a png")
    code, out, err = run(capsys, "predict", "--weights", str(path), str(tmp_path / "photos"), "--json")
    got = {os.path.basename(g["image"]): g for g in json.loads(out)}
    assert code == 2 and list(got) == ["a.png", "b.png", "b2.png", "c.png"]
    for name in ("b.png", "c.png"):  # (another batch: the same to float rounding)
        assert [t["label"] for t in got[name]["top"]] == [t["label"] for t in got["a.png"]["top"]]
        assert np.allclose([t["probability"] for t in got[name]["top"]],
                           [t["probability"] for t in got["a.png"]["top"]], atol=1e-6)
    assert got["b2.png"] == {"image": str(tmp_path / "photos" / "b2.png"), "top": [],
                             "error": "not an image Pillow can identify"}
    assert err.strip().splitlines()[-1] == (f"vitkit predict: error: 1 of 4 images have no answer "
                                            f"({tmp_path / 'photos' / 'b2.png'}; each said above)"), err
    # a dangling link and a FIFO in the folder stopped the whole run ("image not found"): said in their place
    (tmp_path / "photos" / "b2.png").unlink()
    (tmp_path / "photos" / "dangling.png").symlink_to(tmp_path / "nowhere.png")
    os.mkfifo(tmp_path / "photos" / "fifo.png")
    code, out, err = run(capsys, "predict", "--weights", str(path), str(tmp_path / "photos"), "--json")
    got = {os.path.basename(g["image"]): g for g in json.loads(out)}
    assert code == 2 and list(got) == ["a.png", "b.png", "dangling.png", "fifo.png", "c.png"], err
    assert got["dangling.png"]["error"].startswith("not a regular file") and got["fifo.png"]["top"] == []
    assert got["c.png"]["top"] == got["a.png"]["top"] or got["c.png"]["top"]
    (tmp_path / "photos" / "dangling.png").unlink()
    (tmp_path / "photos" / "fifo.png").unlink()
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "predict", "--weights", str(tmp_path / "missing"), str(tmp_path / "empty"))
    assert code == 2 and ("no image files (.jpg, .jpeg, .jfif, .png, .bmp, .gif, .webp, .tif, .tiff, .ppm, .pgm, .pbm, "
                          f".pnm) in the folder {tmp_path / 'empty'}") in err, err


def test_predict_says_where_the_model_overflows_and_keeps_json_valid(capsys, tiny_weights, photo, tmp_path):
    """Weights whose logits overflow gave `"probability": NaN` (not JSON) and exit 0. Each such image now
    says the model gave NaN or inf, and the command exits 2 (its output parses as strict JSON)."""
    model, _ = tiny_weights
    with torch.no_grad():
        model.head.weight[:2] = 1e38  # inf for two classes: the softmax is NaN
    model.save_pretrained(tmp_path / "overflows")
    code, out, err = run(capsys, "predict", "--weights", str(tmp_path / "overflows"), str(photo), "--json")

    def refuse(constant):
        raise AssertionError(f"{constant} in the JSON")

    got = json.loads(out, parse_constant=refuse)
    assert code == 2 and got == [{"image": str(photo), "top": [], "error": NOT_FINITE}], got
    assert err.strip().splitlines()[-1].startswith("vitkit predict: error: 1 of 1 images have no answer"), err
    code, out, _ = run(capsys, "predict", "--weights", str(tmp_path / "overflows"), str(photo))
    assert code == 2 and f"no answer: {NOT_FINITE}" in out
    # inspect says it as predict does (it said matplotlib's "supplied range of [inf, inf] is not finite"), and so
    # does it for a model whose tokens overflow before any head
    with torch.no_grad():
        model.blocks[1].mlp.fc2.weight.mul_(1e37)
    model.save_pretrained(tmp_path / "tokens")
    for weights in ("overflows", "tokens"):
        code, _, err = run(capsys, "inspect", "--weights", str(tmp_path / weights), "--image", str(photo), "--out",
                           str(tmp_path / f"inspect-{weights}"), "--no-progress")
        assert code == 2 and err.strip() == f"vitkit inspect: error: {NOT_FINITE}", err
        assert not (tmp_path / f"inspect-{weights}").exists()


@pytest.mark.parametrize("argv, said", [
    (["predict", "--weights", "{tmp}/missing", "{tmp}/a.png"], "image not found: {tmp}/a.png"),
    (["info", "{tmp}/nothing-here"], "weights not found: {tmp}/nothing-here"),
    (["convert", "{tmp}/missing", "{tmp}/out.onnx", "--to", "onnx"], "weights not found: {tmp}/missing"),
    (["eval", "--weights", "{tmp}/missing", "--dataset", "fashion-mnist"], "weights not found"),
    # the parser's own (it printed nothing on stdout): a bad choice, a bad number, an empty value, a flag missing
    (["convert", "{tmp}/missing", "{tmp}/out.onnx", "--to", "onx"], "argument --to: invalid choice: 'onx'"),
    (["convert", "{tmp}/missing", "{tmp}/out.onnx", "--to", "onnx", "--opset", "abc"],
     "argument --opset: invalid int value: 'abc'"),
    (["convert", "{tmp}/missing", "", "--to", "timm"], "argument DST: an empty value"),
    (["convert", "{tmp}/missing", "{tmp}/out.onnx"], "the following arguments are required: --to"),
])
def test_with_json_an_error_is_also_a_json_object_on_stdout(argv, said, capsys, tmp_path):
    """With --json an error was plain text on stderr only: a script reading stdout had nothing to parse."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, out, err = run(capsys, *argv, "--json")
    got = json.loads(out)
    assert code == 2 and got["verb"] == argv[0] and got["exit"] == 2 and said.replace("{tmp}", str(tmp_path)) in \
        got["error"] and err.strip().startswith(f"vitkit {argv[0]}: error: {got['error']}")
    code, out, _ = run(capsys, *argv)  # without --json: stdout stays empty
    assert code == 2 and out == ""


def test_console_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "vitkit", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"vitkit {vitkit.__version__}"


def test_a_reader_that_goes_away_ends_the_verb_quietly():
    """`vitkit models | head -1`: stdout's reader closes first; the verb ends with 141 (as `cat` does)
    and says nothing, where it said 'error: [Errno 32] Broken pipe' and exited 2."""
    # stdout buffered, as in a new user's shell (this sandbox sets PYTHONUNBUFFERED, which hid a failure)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    # (the pipe's error is main's, any verb's: `study list` prints without torch, 0.5 s where info took 3.4 s)
    proc = subprocess.Popen([sys.executable, "-m", "vitkit", "study", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    proc.stdout.close()  # before the first line is written: every write finds no reader
    err = proc.stderr.read()
    assert proc.wait(60) == 141 and err == "", err


def test_a_closed_stdout_is_no_error_and_no_verb_is_one(capsys, monkeypatch):
    """`vitkit info Ti/16 >&-`: Python has no stdout object, and the flush after the work was done ended in
    "unexpected AttributeError" (exit 2, after a training run had saved everything); `vitkit` alone printed the
    help and exited 0, as if something had run; a thread count that is none was OpenMP's line alone."""
    # processes of their own, for what the interpreter's start makes (no stdout object; no verb); the closed
    # stdout's verb is `study list`, which prints without torch (0.5 s; info's 3.4 s): the flush is main's, any verb's
    closed = subprocess.run([sys.executable, "-m", "vitkit", "study", "list"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1))
    assert closed.returncode == 0 and closed.stderr == "", closed.stderr
    bare = subprocess.run([sys.executable, "-m", "vitkit"], capture_output=True, text=True)
    assert bare.returncode == 2 and bare.stdout == "" and bare.stderr.startswith("usage: vitkit")
    # OpenMP's own "Invalid value for environment variable OMP_NUM_THREADS" said nothing of what came next. main
    # reads the variable: each value here; a process of its own (OpenMP and torch loaded with it) for one each side
    def note(value: str) -> str:
        return f"vitkit info: note: OMP_NUM_THREADS={value!r} is no thread count (a whole number >= 1): OpenMP " \
               f"ignores it"

    with monkeypatch.context() as env:
        for value, said in (("garbage", True), ("\u00b2", True), ("0", True), ("1,2", False), (" 4 ", False)):
            env.setenv("OMP_NUM_THREADS", value)  # ("1,2": OpenMP's list per nesting level)
            code, _, err = run(capsys, "info", "Ti/16")
            assert code == 0 and "Traceback" not in err and (note(value) in err) == said, (value, err)
    for value, said in (("garbage", True), ("1,2", False)):
        odd = subprocess.run([sys.executable, "-m", "vitkit", "info", "Ti/16"], capture_output=True, text=True,
                             env=dict(os.environ, OMP_NUM_THREADS=value))
        assert odd.returncode == 0 and "Traceback" not in odd.stderr, odd.stderr
        assert (note(value) in odd.stderr) == said, (value, odd.stderr)


@pytest.mark.parametrize("argv,words", [
    (["fewshot", "--weights", "w", "--shots", "0"], "--shots must be >= 1"),
    (["fewshot", "--weights", "w", "--seeds", "0"], "--seeds >= 1"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["eval", "--weights", "w", "--splt", "test"], "unrecognized arguments: --splt test (did you mean --split?)"),
    (["train", "--out", "runs"], "--out runs (vitkit train writes into --runs-dir DIR, its run's folder named by "
                                 "--name)"),  # (it said "did you mean --cutmix?")
    (["info", "B/16", "--img-size", "x"], "argument --img-size: invalid int value: 'x'"),
    (["info", "B/16", "--img-size", "224", "224", "224"], "--img-size takes one value or two (H W), not 224 224 224"),
    (["info", "B/16", "--patch-size", "0"], "patch_size must be positive"),
    (["train", "--threads", "0"], "threads must be >= 1"),
    (["eval", "--weights", "w", "--threads", "0"], "--threads must be >= 1, not 0"),
    (["convert", "a", "b", "--to", "timm", "--threads", "100000"], "--threads must be at most the"),
    (["--json", "models"], "unrecognized arguments: --json (--json goes after the verb: vitkit models --json"),
])
def test_command_line_mistakes_are_one_line_without_the_usage_block(argv, words, capsys):
    try:  # argparse's own errors exit; the verbs' return 2
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1 and "usage:" not in err, err


def test_help_shows_the_defaults_a_run_takes(capsys):
    """--help showed TrainConfig's own defaults, which no run without --recipe takes: train's epochs 6 (the default
    runs train 5 in bf16, 3 in fp32, and 9 in bf16 from --init), pretrain's model vit_fmnist_hybrid (refused by every
    objective), its lr, betas, epochs, validation images of classification. Each shown default is the one the run
    resolves."""
    import re

    from vitkit.train.config import resolve_config

    def help_of(verb: str, flag: str) -> str:
        with pytest.raises(SystemExit):
            main([verb, "--help"])
        text = " ".join(capsys.readouterr().out.split("options:", 1)[1].split())  # (not the usage block)
        return re.search(rf"{flag} \S+ .*?\[default: (.*?)\]( --|$)", text).group(1)

    bf16, fp32 = resolve_config("fmnist"), resolve_config("fmnist-fp32")
    tuning = resolve_config("fmnist-adamw")  # fine-tuning's, from --init, where the run trains in bf16
    assert help_of("train", "--epochs") == f"{bf16.epochs} where the run trains in bf16, {fp32.epochs} in fp32 " \
        f"({tuning.epochs} where the run trains in bf16, {fp32.epochs} in fp32 with --init) (the default recipes; " \
        f"6.0 under a recipe that sets none)"
    assert help_of("train", "--optimizer").startswith("muon (adamw with --init) (the default recipes;")
    assert help_of("train", "--label-smoothing").startswith(f"{bf16.label_smoothing} (the default recipes;")
    assert help_of("train", "--model") == bf16.model == fp32.model
    runs = {o: resolve_config(f"{o}-fmnist", objective=o) for o in ("simmim", "mpp", "mae")}
    assert help_of("pretrain", "--model") == runs["mae"].model == runs["simmim"].model == "vit_fmnist"
    assert help_of("pretrain", "--epochs") == "by --objective: " + ", ".join(f"{o} {r.epochs}" for o, r in runs.items())
    assert help_of("pretrain", "--lr") == str(runs["mae"].lr) and help_of("pretrain", "--val-size") == "0"
    assert help_of("pretrain", "--betas") == str(list(runs["mpp"].betas))


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["pretrain", "--help"], ["train", "--epocs", "3"],
                                  ["--version"]])
def test_help_and_a_mistyped_flag_answer_without_importing_torch(argv):
    """torch's import is most of a second: help and flag errors must not wait for it."""
    code = ("import sys, vitkit.cli\n"
            "try:\n    vitkit.cli.main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert done.stderr.strip().splitlines()[-1] == "False", done.stderr[-500:]
    if argv[-1] == "3":
        assert "did you mean --epochs?" in done.stderr
