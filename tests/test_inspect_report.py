"""`vitkit inspect` end to end: figures written, report.html self-contained with every figure."""

import json
import re

import numpy as np
import pytest
from PIL import Image

import vitkit
from conftest import randomize
from vitkit.cli import main as cli


@pytest.fixture
def saved_model(tmp_path):
    model = randomize(vitkit.create_model("vit_fmnist", in_chans=3, img_size=32, num_classes=3,
                                          label_names=["a", "b", "c"], mean=(0.5,) * 3, std=(0.5,) * 3))
    model.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def test_cli_inspect_writes_figures_and_a_self_contained_report(tmp_path, saved_model, capsys):
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 40, 3), dtype=np.uint8)).save(photo)
    out = tmp_path / "inspect"
    assert cli(["inspect", "--weights", str(saved_model), "--image", str(photo), "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    names = {"rollout_1", "attention_per_layer", "attention_distance", "position_embedding_similarity", "filter_pca"}
    assert set(result["figures"]) == names
    for path in result["figures"].values():
        assert Image.open(path).size[0] > 100
    assert result["predictions"][0]["label"] in ("a", "b", "c")
    page = (out / "report.html").read_text()
    assert len(re.findall(r'src="data:image/png;base64,', page)) == len(names)
    assert not re.search(r'(src|href)="(https?:|//|file:)', page)  # nothing to fetch: opens offline


def test_default_images_are_the_scikit_image_photos(tmp_path, saved_model):
    pytest.importorskip("skimage")
    from vitkit.inspect import inspect_model

    result = inspect_model(vitkit.from_pretrained(saved_model), tmp_path / "out")
    assert [p[0] for p in result.predictions] == ["astronaut", "chelsea", "coffee", "rocket"]
    assert (tmp_path / "out" / "rollout_4.png").is_file()
