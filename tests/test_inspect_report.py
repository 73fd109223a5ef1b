"""`vitkit inspect` end to end: figures written, report.html self-contained with every figure."""

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from conftest import IMAGE_PROBE, randomize, run_chromium
from vitkit.cli import main as cli


@pytest.fixture
def saved_model(tmp_path):
    """A narrow two-layer ViT: the report draws a subplot per layer and per filter component (as many as
    its width, at most 28), which at vit_fmnist's 4 layers and width 96 were most of each report's time."""
    model = randomize(vitkit.create_model("vit_fmnist", in_chans=3, img_size=32, num_classes=3, embed_dim=8,
                                          num_heads=2, mlp_dim=16, depth=2, label_names=["a", "b", "c"],
                                          mean=(0.5,) * 3, std=(0.5,) * 3))
    model.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def test_cli_inspect_writes_figures_and_a_self_contained_report(tmp_path, saved_model, capsys):
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 40, 3), dtype=np.uint8)).save(photo)
    out = tmp_path / "inspect"
    assert cli(["inspect", "--weights", str(saved_model), "--image", str(photo), "--out", str(out), "--json"]) == 0
    said = capsys.readouterr()
    result = json.loads(said.out)
    assert "requires_grad" not in said.err  # the analyses run without autograd (no graph kept, no torch warning)
    names = {"rollout_1", "attention_per_layer", "attention_distance", "position_embedding_similarity", "filter_pca",
             "token_norms"}
    assert set(result["figures"]) == names
    for path in result["figures"].values():
        assert Image.open(path).size[0] > 100
    assert result["predictions"][0]["label"] in ("a", "b", "c")
    page = (out / "report.html").read_text()
    assert len(re.findall(r'src="data:image/png;base64,', page)) == len(names)
    assert not re.search(r'(src|href)="(https?:|//|file:)', page)  # nothing to fetch: opens offline
    captions = re.findall(r'<p class="caption">([^<]+)</p>', page)
    assert len(captions) == len(names) and all(len(c) > 40 for c in captions)  # every figure says what it shows
    assert "averaged over the 1 image of this report" in page and "patch 4x4," in page


def test_a_second_report_into_the_same_folder_replaces_the_first_whole(tmp_path, saved_model, capsys):
    """Three images, then one into the same --out: rollout_2.png and rollout_3.png stayed beside the new report.
    The user's own files stay; a headless model's report has no empty predictions table."""
    photos = []
    for i in range(3):
        photos.append(tmp_path / f"p{i}.png")
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(photos[-1])
    out = tmp_path / "inspect"
    assert cli(["inspect", "--weights", str(saved_model), "--image", *map(str, photos), "--out", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    eight_filters = Image.open(out / "filter_pca.png").size[0]  # all 8 of width 8: two rows of up to 7
    capsys.readouterr()
    assert cli(["inspect", "--weights", str(saved_model), "--image", str(photos[0]), "--out", str(out),
                "--pca-components", "0"]) == 2  # said in one line before the model is read; the report stays
    assert capsys.readouterr().err.strip().endswith("--pca-components must be a positive integer, not 0")
    assert (out / "rollout_3.png").exists()
    assert cli(["inspect", "--weights", str(saved_model), "--image", str(photos[0]), "--out", str(out),
                "--pca-components", "3"]) == 0
    capsys.readouterr()
    assert Image.open(out / "filter_pca.png").size[0] < 0.7 * eight_filters  # one row of 3 (the title keeps some width)
    assert not (out / "rollout_2.png").exists() and not (out / "rollout_3.png").exists()
    assert (out / "rollout_1.png").is_file() and (out / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left
    headless = randomize(vitkit.create_model("vit_fmnist", in_chans=3, img_size=32, num_classes=0, mean=(0.5,) * 3,
                                             std=(0.5,) * 3))
    headless.save_pretrained(tmp_path / "headless")
    assert cli(["inspect", "--weights", str(tmp_path / "headless"), "--image", str(photos[0]), "--out",
                str(tmp_path / "h")]) == 0
    page = (tmp_path / "h" / "report.html").read_text()
    assert "<h2>predictions</h2>" not in page and "no classifier" in page and "the prediction draws on" not in page


def test_a_report_replaces_only_what_an_earlier_report_wrote_and_never_inspects_it(tmp_path, saved_model, capsys):
    """Every rollout_*.png in --out was taken for an old figure and deleted (the image being inspected too), a
    user's filter_pca.png was replaced, and `--image DIR --out DIR` inspected its own figures the second time (and
    `--out` elsewhere still took a report in DIR for photos)."""
    out = tmp_path / "photos"
    out.mkdir()
    for i, name in enumerate(("rollout_7.png", "cat.png")):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(out / name)
    mine = (out / "rollout_7.png").read_bytes()
    for _ in range(2):
        assert cli(["inspect", "--weights", str(saved_model), "--image", str(out), "--out", str(out), "--json"]) == 0
        said = json.loads(capsys.readouterr().out)
        assert len(said["predictions"]) == 2, said  # cat.png and rollout_7.png, never the report's own figures
    assert (out / "rollout_7.png").read_bytes() == mine and (out / "rollout_2.png").is_file()
    # a report in the images' folder, the new one written elsewhere: its figures are not photos either
    assert cli(["inspect", "--weights", str(saved_model), "--image", str(out), "--out", str(tmp_path / "new"),
                "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["predictions"]) == 2
    assert cli(["inspect", "--weights", str(saved_model), "--image", str(out / "cat.png"), "--out", str(out)]) == 0
    assert not (out / "rollout_2.png").exists() and (out / "rollout_7.png").read_bytes() == mine
    capsys.readouterr()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "filter_pca.png").write_bytes(b"my own figure")
    assert cli(["inspect", "--weights", str(saved_model), "--image", str(out / "cat.png"), "--out", str(theirs)]) == 2
    err = capsys.readouterr().err
    assert f"{theirs} holds filter_pca.png, which no earlier vitkit inspect report there wrote" in err, err
    assert [p.name for p in theirs.iterdir()] == ["filter_pca.png"] and \
        (theirs / "filter_pca.png").read_bytes() == b"my own figure"


def test_the_report_of_a_hybrid_names_its_tokens_in_pixels(tmp_path):
    from vitkit.inspect import inspect_model

    model = randomize(vitkit.create_model("vit_fmnist_hybrid", in_chans=3, num_classes=3, mean=(0.5,) * 3,
                                          std=(0.5,) * 3, label_names=["a", "b", "c"]))
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (28, 28, 3), dtype=np.uint8)).save(photo)
    result = inspect_model(model, tmp_path / "out", images=[photo], progress=False)
    page = result.report.read_text()
    assert "tokens of 4x4 px from a CNN (patch 1x1 on its feature map)" in page and "patch 1x1," not in page


def test_default_images_are_the_scikit_image_photos(tmp_path, saved_model):
    pytest.importorskip("skimage")
    from vitkit.inspect import inspect_model

    result = inspect_model(vitkit.from_pretrained(saved_model), tmp_path / "out")
    assert [p[0] for p in result.predictions] == ["astronaut", "chelsea", "coffee", "rocket"]
    assert (tmp_path / "out" / "rollout_4.png").is_file()


def test_a_model_that_names_a_datasets_classes_is_shown_its_test_images_at_any_size(tmp_path, monkeypatch):
    """A Fashion-MNIST run trained at 28x40 was inspected on scikit-image's astronaut, chelsea, coffee and rocket:
    only a 28x28 grey model was shown Fashion-MNIST. Its classes say what it should see, at whatever size (CIFAR's
    too, where they are on disk; nothing is downloaded for a figure)."""
    from vitkit.data import cifar
    from vitkit.data import fashion_mnist as fm
    from vitkit.data.fashion_mnist import ArrayDataset
    from vitkit.inspect import inspect_model
    from vitkit.inspect.report import default_images

    if not fm._complete(fm.DEBIAN_DIR):
        pytest.skip("Debian dataset-fashion-mnist not installed")
    test = fm.load_split("test")
    wide = randomize(vitkit.create_model("vit_fmnist", img_size=(28, 40), label_names=test.classes))
    result = inspect_model(wide, tmp_path / "out", progress=False)
    assert [p[0] for p in result.predictions] == \
        [f"fashion-mnist test #{i} (true: {test.classes[test.labels[i]].replace('/', ' or ')})" for i in range(4)]
    pixels = np.random.default_rng(0).integers(0, 255, (4, 32, 32, 3), dtype=np.uint8)
    asked = []

    def on_disk(split, variant, download):
        asked.append((split, variant, download))
        return ArrayDataset(pixels, np.array([3, 8, 8, 0]), list(cifar.CIFAR10_CLASSES))

    monkeypatch.setattr(cifar, "load_split", on_disk)
    rgb = vitkit.create_model("vit_fmnist", in_chans=3, img_size=32, label_names=list(cifar.CIFAR10_CLASSES))
    named = default_images(rgb)
    assert asked == [("test", "cifar10", False)] and named[0][0] == "cifar10 test #0 (true: cat)"
    assert np.array_equal(np.asarray(named[1][1]), pixels[1])
    pytest.importorskip("skimage")
    monkeypatch.setattr(cifar, "load_split", lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError("absent")))
    assert [n for n, _ in default_images(rgb)] == ["astronaut", "chelsea", "coffee", "rocket"]


# ------------------------------------------------------------------ in a real browser

@pytest.mark.slow
def test_report_opens_in_headless_chromium_with_every_image_loaded(tmp_path, saved_model):
    from vitkit.inspect import inspect_model

    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(photo)
    result = inspect_model(vitkit.from_pretrained(saved_model), tmp_path / "out", images=[photo])
    report = result.report

    probe = report.with_name("probe.html")
    probe.write_text(report.read_text().replace("</body>", IMAGE_PROBE + "</body>"))
    dom = run_chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    found = re.search(r'data-image-widths="([^"]*)"', dom)
    assert found, "the page never finished loading"
    widths = [int(w) for w in found.group(1).split(",")]
    assert len(widths) == len(result.figures)
    assert all(w > 0 for w in widths), f"images that did not load: natural widths {widths}"

    shot = tmp_path / "report.png"
    run_chromium(tmp_path, "--window-size=1100,1400", f"--screenshot={shot}", report.as_uri())
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float32)
    assert pixels.shape == (1400, 1100)
    assert pixels.std() > 20 and len(np.unique(pixels)) > 64, "the screenshot is blank"


def test_inspect_runs_on_cait(tmp_path):
    from vitkit.inspect import inspect_model
    from vitkit.models.cait import CaiT, CaiTConfig

    model = randomize(CaiT(CaiTConfig(img_size=32, patch_size=8, embed_dim=32, depth=2, cls_depth=1,
                                      num_heads=2, num_classes=3)))
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(photo)
    result = inspect_model(model, tmp_path / "out", images=[photo])
    # talking heads' maps are no distributions: no map figures, and the report says why
    assert set(result.figures) == {"position_embedding_similarity", "filter_pca", "token_norms"}
    assert any("talking-heads attention (CaiT's)" in note for note in result.notes)


def test_a_rope_models_report_says_why_it_has_no_position_figure_and_images_are_checked(tmp_path):
    """A RoPE model's report left the position-embedding figure out without a word; inspect_model(images='a.png')
    read the string a character at a time ("image not found: a"), images=[] fell back to the sample photos, and
    pca_components=0 was refused only after every analysis had run."""
    from vitkit.inspect import inspect_model

    model = randomize(vitkit.create_model("vit_small_patch16_rope_224", depth=1, img_size=32, num_classes=3))
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(photo)
    result = inspect_model(model, tmp_path / "out", images=str(photo), progress=False)
    assert inspect_model(model, tmp_path / "gen", images=(p for p in [photo]), progress=False).images == 1  # a
    # generator was spent by the emptiness check and the sample photos inspected instead
    assert result.images == 1 and "position_embedding_similarity" not in result.figures
    assert any(n.startswith("no position-embedding similarity: its positions are rotary") for n in result.notes)
    assert "no position-embedding similarity" in (tmp_path / "out" / "report.html").read_text()
    with pytest.raises(ValueError, match="images is empty"):
        inspect_model(model, tmp_path / "none", images=[], progress=False)
    with pytest.raises(ValueError, match="pca_components must be a positive integer, not 0"):
        inspect_model(model, tmp_path / "zero", images=[photo], pca_components=0, progress=False)
    assert not (tmp_path / "none").exists() and not (tmp_path / "zero").exists()


def test_an_out_folder_that_cannot_be_made_is_said_by_its_own_name(tmp_path, saved_model, capsys):
    """--out /proc/o9 said "No such file or directory: /proc/.o9.5z0tfzy9.work", the staging folder's name; then
    "No such file or directory: /proc/vitkit-o9" after the analyses: now --out, before them."""
    assert cli(["inspect", "--weights", str(saved_model), "--out", "/proc/vitkit-o9"]) == 2
    assert capsys.readouterr().err.strip() == ("vitkit inspect: error: --out /proc/vitkit-o9 cannot be written: /proc "
                                               "takes no new files (No such file or directory)")


def test_attention_maps_larger_than_the_memory_are_refused_and_large_ones_go_fewer_a_pass(tmp_path, saved_model,
                                                                                           capsys, monkeypatch):
    """Sixteen images a pass held every layer's maps of all sixteen at once: 46 GiB for DINOv2-L/14 at 518 px,
    155 GiB for SAM's ViT-B at 1,024 (killed for memory). Each pass now takes what fits in MAP_BUDGET, and a model
    whose maps of one image do not fit in the free memory is one line, exit 2, before any image is read."""
    import vitkit.machine
    from vitkit.inspect import report
    from vitkit.models import get_model_config

    monkeypatch.setattr(vitkit.machine, "available_memory", lambda: 64 * 2 ** 30)
    assert report.images_a_pass(get_model_config("vit_base_patch16_224")) == report.CHUNK  # 22 MB an image
    assert report.images_a_pass(get_model_config("vit_large_patch14_dinov2")) == 1  # 2.9 GiB an image
    assert report.images_a_pass(get_model_config("vit_base_patch16_384")) == 2 ** 31 // (12 * 12 * 577 ** 2 * 4) == 11
    monkeypatch.setattr(vitkit.machine, "available_memory", lambda: 1000)  # (bytes)
    out = tmp_path / "inspect"
    assert cli(["inspect", "--weights", str(saved_model), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(r"vitkit inspect: error: the attention maps of one image at 32x32 px take 0\.0 GiB \(2 layers "
                        r"x 2 heads x 64 x 64 tokens, fp32\), twice that at once, and 0\.0 GiB are free: inspect at a "
                        r"smaller --img-size", err), err
    assert not out.exists()


def test_the_rollout_and_the_distance_share_one_pass_of_attention_maps(tmp_path, saved_model):
    """Each asked the model for its maps: two forward passes with every layer's maps (31 s an image for SAM's
    ViT-B at 1,024 px); one pass now serves both, with the same figures' numbers as each function alone."""
    from vitkit.inspect import attention_rollout, mean_attention_distance
    from vitkit.inspect.report import inspect_model

    model = vitkit.from_pretrained(saved_model)
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(photo)
    forward, passes = model.forward, []
    model.forward = lambda x, return_attention=False: passes.append(return_attention) or forward(x, return_attention)
    inspect_model(model, tmp_path / "out", [photo], progress=False)
    assert passes.count(True) == 2  # the chunk's maps once, and the figure of the attention per layer
    model.forward = forward
    x = vitkit.preprocess(model, photo)
    maps = vitkit.inspect.attention_maps(model, x)
    assert torch.equal(attention_rollout(model, x, maps=maps), attention_rollout(model, x))
    assert torch.equal(mean_attention_distance(model, x, maps=maps), mean_attention_distance(model, x))
