"""Optional packages: each user-facing path says in one line which extra installs what it lacks,
and every package ``require`` names is listed in that extra in ``pyproject.toml``.

A missing package is simulated in-process: ``sys.modules[name] = None`` makes ``import name``
raise ModuleNotFoundError, as an absent package does (monkeypatch puts the real one back).
"""

import ast
import json
import logging
import re
import sys
import types
from pathlib import Path

import pytest

import vitkit
from vitkit.utils import DISTRIBUTIONS, MissingExtra, distribution, require

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "vitkit"


def hide(monkeypatch, *names):
    """Make each package (and its loaded submodules) unimportable for this test."""
    for name in names:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            monkeypatch.setitem(sys.modules, key, None)
        monkeypatch.setitem(sys.modules, name, None)


def assert_names_extra(excinfo, extra, package):
    message = str(excinfo.value)
    assert isinstance(excinfo.value, ImportError) and excinfo.value.extra == extra
    assert "\n" not in message and message.startswith(f"{package} is needed for ")
    assert f"pip install -e '.[{extra}]'" in message and f"pip install 'vitkit[{extra}]'" in message


# ---------------------------------------------------------------------------------------------
# require itself
# ---------------------------------------------------------------------------------------------

def test_require_returns_the_module_and_names_pip_packages():
    assert require("json", "train", "nothing") is json
    assert distribution("yaml") == "pyyaml" and distribution("skimage.data") == "scikit-image"
    assert distribution("torch.utils.tensorboard") == "tensorboard" and distribution("torchvision.transforms") == \
        "torchvision"


def test_require_hidden_parent_is_missing(monkeypatch):
    """A loaded submodule under a missing parent is missing too (``from a.b import c`` would fail)."""
    pytest.importorskip("torchvision.transforms.v2")
    monkeypatch.setitem(sys.modules, "torchvision.transforms", None)
    with pytest.raises(MissingExtra) as e:
        require("torchvision.transforms.v2", "train", "a test")
    assert_names_extra(e, "train", "torchvision")


def test_require_broken_install_says_so_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "vitkit_broken_pkg.py").write_text("raise TypeError('Descriptors cannot be created directly.\\n"
                                                    "More detail on a second line')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingExtra) as e:
        require("vitkit_broken_pkg", "train", "a test")
    assert_names_extra(e, "train", "vitkit_broken_pkg")
    assert "installed but does not import (TypeError: Descriptors cannot be created directly.)" in str(e.value)


def test_missing_extra_survives_dataloader_reraise():
    """torch's worker ExceptionWrapper rebuilds the exception from its message alone."""
    err = MissingExtra("x is needed for y")
    assert isinstance(type(err)(str(err)), ImportError)


# ---------------------------------------------------------------------------------------------
# each user-facing path, its package missing
# ---------------------------------------------------------------------------------------------

def test_file_datasets_and_randaugment_without_torchvision(monkeypatch):
    from vitkit.data import pipelines
    from vitkit.data.randaugment import RandAugment
    from vitkit.models import get_model_config
    from vitkit.train.config import TrainConfig

    config = get_model_config("vit_fmnist")
    hide(monkeypatch, "torchvision")
    assert pipelines.from_model_config(config, train=False) is not None  # evaluation needs no torchvision
    for build in (lambda: pipelines.from_model_config(config, train=True),
                  lambda: RandAugment.from_spec("m9-mstd0.5"),
                  lambda: TrainConfig(dataset="folder", data_dir="x").validate(),
                  lambda: TrainConfig(dataset="webdataset", data_dir="x").validate(),
                  lambda: TrainConfig(randaugment="m9-mstd0.5").validate()):
        with pytest.raises(MissingExtra) as e:
            build()
        assert_names_extra(e, "train", "torchvision")
    assert "--dataset folder" in str(_raised(lambda: TrainConfig(dataset="ImageFolder").validate()))
    assert "--randaugment" in str(_raised(lambda: TrainConfig(randaugment="m9").validate()))
    TrainConfig().validate()  # in-memory data without RandAugment needs nothing


def test_torchvision_teacher_without_torchvision(tmp_path, monkeypatch):
    from vitkit.train.config import TrainConfig
    from vitkit.train.distill import load_teacher

    hide(monkeypatch, "torchvision")
    source = f"torchvision:resnet18:{tmp_path / 'r18.pth'}"
    for build in (lambda: load_teacher(source, 10), lambda: TrainConfig(distill="soft", teacher=source).validate()):
        with pytest.raises(MissingExtra) as e:
            build()
        assert_names_extra(e, "train", "torchvision")
        assert "--teacher torchvision:NAME:FILE" in str(e.value)


def test_yaml_config_without_pyyaml(tmp_path, monkeypatch):
    from vitkit.train.config import load_config_file, resolve_config

    path = tmp_path / "run.yaml"
    path.write_text("epochs: 1\n")
    (tmp_path / "run.json").write_text('{"epochs": 1}')
    hide(monkeypatch, "yaml")
    assert resolve_config(file=str(tmp_path / "run.json")).epochs == 1  # JSON needs nothing
    for build in (lambda: load_config_file(str(path)), lambda: resolve_config(file=str(path))):
        with pytest.raises(MissingExtra) as e:
            build()
        assert_names_extra(e, "train", "pyyaml")
        assert "run.yaml" in str(e.value)


def test_hub_source_without_huggingface_hub(monkeypatch):
    hide(monkeypatch, "huggingface_hub")
    with pytest.raises(MissingExtra) as e:
        vitkit.from_pretrained("hf-hub:org/name")
    assert_names_extra(e, "hub", "huggingface_hub")


@pytest.mark.parametrize("hidden", ["tensorboard", "torch.utils.tensorboard"])
def test_metrics_without_tensorboard_go_to_jsonl_only(tmp_path, monkeypatch, caplog, hidden):
    """TensorBoard is a view: without it the run logs one line and goes on (the realistic case
    is torch present, the tensorboard package absent, so torch's wrapper fails to import)."""
    from vitkit.train.tracking import MetricsLog

    for key in [k for k in sys.modules if k == "torch.utils.tensorboard" or k.startswith("torch.utils.tensorboard.")]:
        monkeypatch.delitem(sys.modules, key)
    hide(monkeypatch, hidden)
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        metrics = MetricsLog(tmp_path)
    assert metrics.writer is None
    metrics.write({"step": 1, "train_loss": 0.5})
    metrics.close({"test_top1": 0.9})
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 1, "train_loss": 0.5}
    said = [r.getMessage() for r in caplog.records if "tensorboard" in r.getMessage()]
    assert len(said) == 1 and "'vitkit[train]'" in said[0] and "metrics.jsonl only" in said[0]
    assert "does not import" not in said[0]


def test_inspect_default_photos_without_scikit_image(monkeypatch):
    from vitkit.inspect.report import default_images

    hide(monkeypatch, "skimage")
    model = types.SimpleNamespace(config=types.SimpleNamespace(in_chans=3, img_size=(32, 32)))
    with pytest.raises(MissingExtra) as e:
        default_images(model)
    assert_names_extra(e, "inspect", "scikit-image")
    assert "--image" in str(e.value)


def _raised(fn):
    with pytest.raises(MissingExtra) as e:
        fn()
    return e.value


# ---------------------------------------------------------------------------------------------
# pyproject.toml covers every optional import
# ---------------------------------------------------------------------------------------------

def _norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _pyproject():
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _extras():
    """extra -> normalised pip names, self-references (vitkit[a,b]) expanded."""
    raw = _pyproject()["optional-dependencies"]

    def names(extra):
        out = set()
        for req in raw[extra]:
            m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[([^\]]*)\])?", req)
            if _norm(m.group(1)) == "vitkit":
                for sub in m.group(2).split(","):
                    out |= names(sub.strip())
            else:
                out.add(_norm(m.group(1)))
        return out

    return {extra: names(extra) for extra in raw}


def _runtime():
    return {_norm(re.match(r"\s*([A-Za-z0-9_.-]+)", req).group(1)) for req in _pyproject()["dependencies"]}


def _trees():
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(ROOT), ast.parse(path.read_text(), str(path))


def _require_calls():
    """(file:line, module, extra) of every require(...) call in src/vitkit."""
    calls = []
    for where, tree in _trees():
        for node in ast.walk(tree):
            func = getattr(node, "func", None)
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            if isinstance(node, ast.Call) and name == "require" and where.name != "utils.py":
                args = node.args[:2]
                assert len(args) == 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args), \
                    f"{where}:{node.lineno}: require's module and extra must be string literals"
                calls.append((f"{where}:{node.lineno}", args[0].value, args[1].value))
    return calls


def _imported_modules():
    """(file:line, module) of every absolute import in src/vitkit outside the standard library."""
    found = []
    for where, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                modules = [node.module]
            else:
                continue
            found += [(f"{where}:{node.lineno}", m) for m in modules
                      if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "vitkit"]
    return found


def test_every_require_names_an_extra_that_lists_its_package():
    extras = _extras()
    calls = _require_calls()
    wrong = [f"{where}: {distribution(module)} is not in extra {extra!r}" for where, module, extra in calls
             if _norm(distribution(module)) not in extras.get(extra, set())]
    assert not wrong, "; ".join(wrong)
    required = {_norm(distribution(module)) for _, module, _ in calls}
    assert {"torchvision", "tensorboard", "pyyaml", "huggingface-hub"} <= required


def test_every_optional_import_is_in_an_extra_and_all_is_every_extra():
    extras, runtime = _extras(), _runtime()
    import_names = {"PIL": "pillow"}  # runtime packages whose import name is not their pip name
    modules = _imported_modules() + [(where, module) for where, module, _ in _require_calls()]
    optional = {(where, _norm(import_names.get(m.split(".")[0], distribution(m)))) for where, m in modules}
    optional = {(where, package) for where, package in optional if package not in runtime}
    uncovered = sorted(f"{where}: {package}" for where, package in optional if package not in extras["all"])
    assert not uncovered, "optional imports no extra installs: " + "; ".join(uncovered)
    assert extras["all"] == set().union(*(names for extra, names in extras.items() if extra != "all"))
    assert set(DISTRIBUTIONS.values()) <= extras["all"]
