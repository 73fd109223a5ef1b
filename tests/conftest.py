"""Shared test helpers: random weights that exercise every mapping; a run killed mid-way; a fake Hub."""

import fnmatch
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn


@torch.no_grad()
def randomize(model: nn.Module, seed: int = 0, scale: float = 0.1) -> nn.Module:
    """Fill every parameter with noise (LayerNorm weights around 1) so no mapping is trivial."""
    g = torch.Generator().manual_seed(seed)
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            noise = torch.randn(p.shape, generator=g) * scale
            if (isinstance(module, nn.LayerNorm) or "Norm" in type(module).__name__) and name == "weight":
                noise += 1.0
            p.copy_(noise)
    return model.eval()


def trained_briefly(name: str, steps: int = 100, **overrides) -> nn.Module:
    """Model ``name`` trained ``steps`` steps of 64 on 4,096 real Fashion-MNIST images (enough to make
    decisions, so that runtimes compare on them); skips the test without the Debian dataset."""
    from vitkit import create_model
    from vitkit.data import fashion_mnist as fm
    from vitkit.evaluate.metrics import prepare_batch

    if not fm._complete(fm.DEBIAN_DIR):
        pytest.skip("Debian dataset-fashion-mnist not installed")
    torch.manual_seed(0)
    train = fm.load_split("train")
    x = torch.from_numpy(train.images[:4096]).unsqueeze(1)
    y = torch.from_numpy(train.labels[:4096]).long()
    model = create_model(name, label_names=train.classes, **overrides)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    model.train()
    for _ in range(steps):
        i = torch.randint(0, len(y), (64,))
        loss = torch.nn.functional.cross_entropy(model(prepare_batch(x[i], model.config)), y[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def model_args_refusal(folder: Path, args: dict) -> str:
    """The one line ``vitkit.from_pretrained`` refuses a timm hub folder with once its config.json's ``model_args``
    take ``args`` (timm's arguments vitkit does not build)."""
    import json

    import vitkit
    from vitkit.weights.io import WeightsError

    config = json.loads((folder / "config.json").read_text())
    config["model_args"].update(args)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError) as e:
        vitkit.from_pretrained(folder)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.fixture
def images():
    def make(batch=2, h=224, w=224, c=3, seed=1):
        return torch.randn(batch, c, h, w, generator=torch.Generator().manual_seed(seed))
    return make


def vlm_repository(folder, tower, language_tensor, config):
    """A VLM's hub repository as the tests of reading its tower need it: ``tower`` (its tensors under the VLM's names)
    in one shard, the language model in another that is no weights file at all (opening it would fail), the index
    naming both (``language_tensor``: one name the second shard holds), and ``config`` as config.json."""
    import json

    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tower.items()}, folder / "model-00001-of-00002.safetensors")
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"not read")
    weight_map = {**dict.fromkeys(tower, "model-00001-of-00002.safetensors"),
                  language_tensor: "model-00002-of-00002.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(config))


def fake_snapshot_download(remote, calls):
    """huggingface_hub.snapshot_download serving the files of ``remote`` (a local folder) that match
    allow_patterns, copied to a cache folder as the real one does; records (repo, patterns, revision)."""

    def snapshot_download(repo_id, revision=None, allow_patterns=None, cache_dir=None, **kw):
        calls.append((repo_id, tuple(allow_patterns), revision))
        snapshot = remote.parent / "cache" / repo_id.replace("/", "--") / (revision or "main")
        snapshot.mkdir(parents=True, exist_ok=True)
        for path in remote.rglob("*"):
            name = path.relative_to(remote).as_posix()
            if path.is_file() and any(fnmatch.fnmatch(name, p) for p in allow_patterns):
                (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, snapshot / name)
        return str(snapshot)
    return snapshot_download


def vitkit_here(*argv) -> int:
    """``vitkit ARGV`` by its own ``main`` in this process, the thread count given back after. For the
    straight run a killed one is compared with: a second process would start Python, torch and the
    compiler torch's optimizers import (about 8 s of a short training process on an AMX Xeon)."""
    from vitkit.cli import main

    threads = torch.get_num_threads()
    try:
        return main([str(a) for a in argv])
    finally:
        torch.set_num_threads(threads)


def in_process(capsys, *argv) -> subprocess.CompletedProcess:
    """What ``python -m vitkit ARGV`` returns (exit code, stdout, stderr), from :func:`vitkit_here`: for
    commands whose process of their own would prove nothing more (the error boundary is main's)."""
    capsys.readouterr()
    code = vitkit_here(*argv)
    said = capsys.readouterr()
    return subprocess.CompletedProcess([str(a) for a in argv], code, said.out, said.err)


def kill_at_checkpoint(args, env, run, step: int, timeout: float = 180) -> None:
    """Start ``python -m vitkit ARGS`` and SIGKILL it once ``run`` holds the checkpoint of ``step``."""
    import forks  # here: a conftest copied alone (test_suite_groups copies it) imports without tests/forks.py
    from vitkit.train.checkpoint import checkpoint_paths

    proc = forks.popen(*args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while not any(p.name == f"step_{step:08d}.pt" for p in checkpoint_paths(run)):
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "model").exists(), "the run was meant to die before finishing"


#: Chromium as a root process on a machine without a display or a network (see env notes).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--mute-audio"]

#: Added to a copy of a page: after load, write each image's natural width (-1: not loaded) into the DOM.
IMAGE_PROBE = """<script>window.addEventListener('load', () => {
  const widths = [...document.images].map(i => i.complete ? i.naturalWidth : -1);
  document.documentElement.setAttribute('data-image-widths', widths.join(','));
});</script>"""


def chromium() -> str:
    """The headless browser's executable: a failure in CI (setup-system.sh installs it), else a skip."""
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; scripts/setup-system.sh (make test) installs it with apt")
        pytest.skip("chromium is not installed (scripts/setup-system.sh installs it with apt)")
    return exe


def run_chromium(tmp_path, *args) -> str:
    """Run headless Chromium with a fresh profile in ``tmp_path``; its stdout (``--dump-dom``'s page)."""
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
    cmd = [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout


class DevTools:
    """Headless Chromium driven over its DevTools protocol (a websocket), for what ``--dump-dom``
    cannot do: choose a file in an ``<input type=file>`` as a person does, click, wait for the page."""

    def __init__(self, tmp_path, url: str):
        import json
        import urllib.request

        from websockets.sync.client import connect

        profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
        self.proc = subprocess.Popen([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                      "--remote-debugging-port=0", url],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 60
            while not (port_file.is_file() and port_file.read_text().strip()):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("chromium did not open its DevTools port")
                time.sleep(0.05)
            port = port_file.read_text().split()[0]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as answer:
                page = next(t for t in json.loads(answer.read()) if t["type"] == "page")
            self.ws, self.json, self.calls = connect(page["webSocketDebuggerUrl"], max_size=None), json, 0
        except BaseException:
            self.close()
            raise

    def call(self, method: str, **params):
        """One protocol call's result (events that arrive meanwhile are skipped)."""
        self.calls += 1
        self.ws.send(self.json.dumps({"id": self.calls, "method": method, "params": params}))
        while True:
            message = self.json.loads(self.ws.recv(timeout=60))
            if message.get("id") == self.calls:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, seconds: float = 60):
        """The first truthy value of ``expression`` in the page, polled; an error after ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise AssertionError(f"the page never gave {expression!r} within {seconds:.0f} s")

    def choose_file(self, selector: str, path) -> None:
        """Put ``path`` in the file input at ``selector``: the page sees the change a person's choice fires."""
        root = self.call("DOM.getDocument")["root"]["nodeId"]
        node = self.call("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
        self.call("DOM.setFileInputFiles", files=[str(path)], nodeId=node)

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        self.proc.kill()
        self.proc.wait(timeout=30)


class Oracle(nn.Module):
    """A classifier of 4x4 grey images that reads the class off the brightness (images filled with
    10 * (class + 1)), with a ViT's config and feature API: evaluation code checked without training."""

    config = SimpleNamespace(num_classes=3, label_names=["a", "b", "c"], in_chans=1, img_size=(4, 4),
                             mean=(0.0,), std=(1.0,))

    def forward(self, x):
        m = x.mean((1, 2, 3)) * 255 / 10 - 1
        return -(m[:, None] - torch.arange(3.0)) ** 2

    def forward_features(self, x):
        return x.flatten(1)

    def forward_head(self, x, pre_logits=False):
        return x


def pytest_itemcollected(item):
    """A test that uses a module-scoped fixture joins its module's xdist group (read by xdist's
    own collection hook, which runs after this one)."""
    defs = getattr(item, "_fixtureinfo", None)
    if defs is not None and any(d[-1].scope == "module" for d in defs.name2fixturedefs.values() if d):
        item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def pytest_collection_modifyitems(session, config, items):
    """OpenVINO's tests run last. After OpenVINO models were compiled at bf16/int8 in this
    process (those tests, or bench_onnx's OpenVINO paths), the README's in-process commands
    crashed the process with a segfault, at a different command each time; never in a fresh
    process (each vitkit command is one), nor after fp32 OpenVINO models only. Until the cause
    is found (OpenVINO's and torch's CPU runtimes in one process), no test runs after them, and
    `make test` runs them in a process of their own (CI crashed at them after 1,400 other tests).

    Under pytest-xdist (`make test`: two workers, ``--dist loadgroup``) the tests of a module with
    a module-scoped fixture (a trained run, a pretraining run) stay on one worker, so the fixture
    is built once, and the modules with slow tests are handed out first, so the suite does not end
    with one worker in a minute-long test while the other idles. Modules stay whole (a stable
    sort by module), so a plain ``pytest`` builds each module's fixtures once too."""
    slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.fspath.basename == "test_deploy_openvino.py",
                                 item.module.__name__ not in slow_modules))


def pytest_configure(config):
    """An xdist worker computes on one thread: two workers with every core each would wait on each
    other at every OpenMP barrier. The commands tests start as processes keep their own threads.

    The controller imports vitkit's warning classes up front: xdist rebuilds a worker's warning there by
    importing its class's module, and its import of ``vitkit.weights.export`` first (an ExportWarning) met
    the package half-built ("cannot import name 'EXPORT_FORMATS' from partially initialized module": an
    internal error that ended the run; test_benchmarks_outputs.py and test_weights_parity.py together, three
    runs of three; none with the package imported first)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
    elif getattr(config.option, "numprocesses", None):
        import vitkit.weights  # noqa: F401  (every module whose warnings the workers send: models, data, weights)


@pytest.fixture(scope="session", autouse=True)
def scratch_in_pytest_tmp(tmp_path_factory):
    """What the tests and the processes they start put in the temporary folder (torchrun's
    ``torchelastic_*`` logs, the ``pymp-*`` folders of killed workers, Chromium's profiles) goes
    under pytest's own temporary folder, which pytest prunes, not loose in /tmp; so does the
    ``datasets`` package's cache (the hf: runs' Arrow files and lock files were left in the
    user's ~/.cache/huggingface/datasets: seven after one run of the suite)."""
    places = {"TMPDIR": "scratch", "HF_DATASETS_CACHE": "hf-datasets"}
    before = {name: os.environ.get(name) for name in places}
    for name, folder in places.items():
        os.environ[name] = str(tmp_path_factory.mktemp(folder))
    tempfile.tempdir = None  # read TMPDIR again
    hf = sys.modules.get("datasets")  # (imported while collecting test_data_hf.py: it read the variable then)
    if hf is not None:
        hf_before, hf.config.HF_DATASETS_CACHE = hf.config.HF_DATASETS_CACHE, Path(os.environ["HF_DATASETS_CACHE"])
    yield
    if hf is not None:
        hf.config.HF_DATASETS_CACHE = hf_before
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile.tempdir = None


_TORCHLIB_TABLES = {}  # (args, kwargs) of ONNXRegistry.from_torchlib -> the table it built


@pytest.fixture(autouse=True)
def onnx_table_built_once():
    """torch's dynamo ONNX exporter rebuilds its table of ATen-to-ONNX functions from torchlib for
    every export: 1.0-1.7 s of a 2-block ViT's 4 s on a family-23 EPYC, and the suite exports about
    a hundred. The table depends only on its arguments (the opset), and an export only reads it
    (vitkit passes no custom translation table, the one thing that adds to it), so once torch's
    exporter is loaded, a worker's later exports each get a copy of the first one built.
    Nothing changes where torch moves or renames the table's class."""
    registration = sys.modules.get("torch.onnx._internal.exporter._registration")
    table = getattr(registration, "ONNXRegistry", None)
    build = getattr(vars(table).get("from_torchlib"), "__func__", None) if table is not None else None
    if build is not None and not getattr(build, "shared", False):
        def from_torchlib(cls, *args, **kwargs):
            key = (args, tuple(sorted(kwargs.items())))
            if key not in _TORCHLIB_TABLES:
                _TORCHLIB_TABLES[key] = build(cls, *args, **kwargs)
            copy = cls.__new__(cls)
            copy.__dict__.update(_TORCHLIB_TABLES[key].__dict__)
            copy.functions = {op: list(decomps) for op, decomps in copy.functions.items()}
            return copy

        from_torchlib.shared = True
        table.from_torchlib = classmethod(from_torchlib)
    yield


# ------------------------------------------------------------------ serving (test_serve*.py)

#: the class names of the served test classifier
SERVED_LABELS = [f"kind {i}" for i in range(10)]


def save_served_classifier(folder):
    """A small RGB ViT with random weights (distinct classes per image), saved as vitkit writes it."""
    import vitkit

    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10,
                                label_names=SERVED_LABELS)
    randomize(model, scale=0.3).save_pretrained(folder)
    return folder


def image_bytes(seed: int, size=(40, 36), mode="RGB", fmt="PNG") -> bytes:
    """An encoded image of random pixels (``mode`` RGB, CMYK or L) as a client would upload it."""
    import io

    import numpy as np
    from PIL import Image

    channels = {"RGB": 3, "CMYK": 4, "L": 1}[mode]
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], channels), dtype=np.uint8)
    im = Image.fromarray(pixels[..., 0], "L") if channels == 1 else Image.fromarray(pixels, mode)
    out = io.BytesIO()
    im.save(out, format=fmt)
    return out.getvalue()

