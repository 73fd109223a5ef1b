"""Fine-tuning from existing weights (--init): new grid, new channels, the paper's new head."""

import json

import pytest
import torch

import vitkit
from vitkit.data import fashion_mnist as fm
from vitkit.models.layers import resample_pos_embed
from vitkit.train import resolve_config, train
from vitkit.train.init import model_from_init
from vitkit.weights.io import WeightsError

real = pytest.mark.skipif(not fm._complete(fm.DEBIAN_DIR), reason="Debian dataset-fashion-mnist not installed")


def _rgb_model(tmp_path):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_fmnist", img_size=32, in_chans=3, patch_size=8, num_classes=5,
                                pos_embed="learned", class_token=True, global_pool="token",
                                representation_size=16, mean=(0.4, 0.5, 0.6), std=(0.2, 0.25, 0.3))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(tmp_path / "rgb")
    return model


def test_init_adapts_grid_channels_and_replaces_the_head(tmp_path):
    old = _rgb_model(tmp_path)
    data = dict(img_size=(48, 48), in_chans=1, num_classes=10, label_names=[str(i) for i in range(10)])
    logs = []
    new = model_from_init(str(tmp_path / "rgb"), data, {"drop_path_rate": 0.1}, "new", log=logs.append)
    assert new.config.img_size == (48, 48) and new.config.in_chans == 1
    assert new.config.num_classes == 10 and new.config.drop_path_rate == 0.1
    assert isinstance(new.pre_logits, torch.nn.Identity)  # the paper drops the pre-logits layer
    assert torch.count_nonzero(new.head.weight) == 0 and torch.count_nonzero(new.head.bias) == 0
    expected = resample_pos_embed(old.pos_embed.detach(), (6, 6), (4, 4), 1, "bicubic", True)
    torch.testing.assert_close(new.pos_embed.detach(), expected)
    torch.testing.assert_close(new.patch_embed.proj.weight, old.patch_embed.proj.weight.sum(1, keepdim=True))
    assert "pos_embed 4x4 -> 6x6" in logs[0] and "3 -> 1 input channels" in logs[0]
    assert len(new.config.mean) == 1 and new.config.mean[0] == pytest.approx(sum(old.config.mean) / 3)


def test_an_init_interpolation_that_resamples_nothing_is_refused_and_one_that_does_is_used(tmp_path):
    """--init-interpolation at the weights' own size did nothing and was taken without a word (grey data's
    summed filters are an adaptation, not a resampling); at another size it is the resampling used."""
    old = _rgb_model(tmp_path)
    same = dict(img_size=(32, 32), in_chans=1, num_classes=5, label_names=None)
    with pytest.raises(ValueError, match=r"init_interpolation='bilinear' resamples .* need none at 32x32 px"):
        model_from_init(str(tmp_path / "rgb"), same, {}, "new", log=lambda *a: None, interpolation="bilinear")
    logs = []
    new = model_from_init(str(tmp_path / "rgb"), {**same, "img_size": (48, 48)}, {}, "new", log=logs.append,
                          interpolation="bilinear")
    expected = resample_pos_embed(old.pos_embed.detach(), (6, 6), (4, 4), 1, "bilinear", True)
    torch.testing.assert_close(new.pos_embed.detach(), expected)
    assert "pos_embed 4x4 -> 6x6 (bilinear, antialiased)" in logs[0]


def test_grey_init_computes_what_the_rgb_model_computed_on_grey_images(tmp_path):
    old = _rgb_model(tmp_path).eval()
    data = dict(img_size=(32, 32), in_chans=1, num_classes=5, label_names=None)
    new = model_from_init(str(tmp_path / "rgb"), data, {}, "keep", log=lambda *a: None).eval()
    x = torch.rand(2, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(new(x), old(x.expand(-1, 3, -1, -1)), atol=1e-5, rtol=1e-5)


def test_init_from_a_transformers_folder_starts_where_transformers_computes_at_the_new_size(tmp_path):
    """--init resampled a Hugging Face folder's position table antialiased (timm's way) where transformers
    and from_pretrained do not: the run started 0.03 off transformers' own features at 48 px."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ref = transformers.ViTModel(transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                       intermediate_size=128, image_size=64, patch_size=16),
                                add_pooling_layer=False).eval()
    with torch.no_grad():
        ref.embeddings.position_embeddings.normal_(0, 1)  # a table with detail, where antialiasing shows
    ref.save_pretrained(tmp_path / "hf")
    data = dict(img_size=(48, 48), in_chans=3, num_classes=3, label_names=["a", "b", "c"])
    model = model_from_init(str(tmp_path / "hf"), data, {}, "new", log=lambda *a: None).eval()
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        want = ref(pixel_values=x, interpolate_pos_encoding=True).last_hidden_state
        got = model.forward_features(x)
    assert (got - want).abs().max() < 1e-4, (got - want).abs().max()


@pytest.mark.filterwarnings("ignore:.*holds tensors only")
def test_init_gives_a_distilled_deit_new_heads_for_its_classes(tmp_path):
    timm = pytest.importorskip("timm")
    ref = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, depth=2, img_size=32)
    torch.save(ref.state_dict(), tmp_path / "deit.pth")
    data = dict(img_size=(32, 32), in_chans=3, num_classes=3, label_names=["a", "b", "c"])
    model = model_from_init(str(tmp_path / "deit.pth"), data, {}, "new", log=lambda *a: None)
    assert model.head.out_features == 3 and model.head_dist.out_features == 3  # was: head_dist.bias mismatch
    torch.testing.assert_close(model.cls_token, ref.cls_token)
    assert vitkit.from_pretrained(tmp_path / "deit.pth", num_classes=3).head_dist.out_features == 3


def test_init_errors_are_clear(tmp_path):
    old = _rgb_model(tmp_path)
    data = dict(img_size=(32, 32), in_chans=3, num_classes=10, label_names=None)
    # --model-args that make the same tensors compute another function were taken without a word
    heads = old.config.num_heads
    with pytest.raises(ValueError, match=rf"--model-args num_heads={2 * heads} \(the weights': {heads}\), "
                                         rf"norm_eps=0.1 \(the weights': 1e-06\) contradict the --init weights"):
        model_from_init(str(tmp_path / "rgb"), data, {"num_heads": 2 * heads, "norm_eps": 0.1, "drop_rate": 0.2}, "new")
    with pytest.raises(ValueError, match=r"--model-args img_size: with --init the size is --img-size 42 \(the weights' "
                                         r"position tables are resampled"):  # (said to compute another function)
        model_from_init(str(tmp_path / "rgb"), data, {"img_size": 42}, "new")
    model = model_from_init(str(tmp_path / "rgb"), data, {"num_heads": heads, "global_pool": "avg", "drop_rate": 0.2},
                            "new", log=lambda *a: None)  # the weights' own value, the readout and a rate: free
    assert model.config.global_pool == "avg" and model.config.drop_rate == 0.2
    # a MAP readout asked of weights without one is new, as the head is (it was "missing from the checkpoint:
    # attn_pool.kv.bias, ..."): the encoder's weights are the checkpoint's
    model = model_from_init(str(tmp_path / "rgb"), data, {"global_pool": "map"}, "new", log=lambda *a: None)
    assert model.config.global_pool == "map" and model.attn_pool is not None
    torch.testing.assert_close(model.blocks[0].attn.qkv.weight, old.blocks[0].attn.qkv.weight, rtol=0, atol=0)
    with pytest.raises(WeightsError, match="same classes.*5.*10"):
        model_from_init(str(tmp_path / "rgb"), data, {}, "keep")
    with pytest.raises(FileNotFoundError, match="--init weights not found"):
        model_from_init(str(tmp_path / "nothing"), data, {}, "new")
    with pytest.raises(ValueError, match="init_head"):
        resolve_config("fmnist", init_head="old")


@pytest.mark.filterwarnings("ignore:.*holds tensors only")
def test_a_bare_files_unheld_fields_can_be_given_to_fine_tune_it(tmp_path):
    """A bare state dict's head count is a guess (width / 64: 1 for 64 wide); --model-args num_heads=2 was refused as
    contradicting "the weights' 1", and --model with --init was refused too: every way the note named to give the
    true count failed, and the run fine-tuned another function of the weights. What the tensors hold stays fixed."""
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    ref = timm.create_model("vit_small_patch14_dinov2", pretrained=False, embed_dim=64, num_heads=2, depth=2,
                            img_size=28, num_classes=0).eval()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, tmp_path / "bare.safetensors")
    data = dict(img_size=(28, 28), in_chans=3, num_classes=3, label_names=["a", "b", "c"])
    x = torch.randn(2, 3, 28, 28)
    model = model_from_init(str(tmp_path / "bare.safetensors"), data, {"num_heads": 2}, "new", log=lambda *a: None)
    with torch.no_grad():
        torch.testing.assert_close(model.eval().forward_features(x), ref.forward_features(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"--model-args depth=3 \(the weights': 2\) contradicts the --init weights"):
        model_from_init(str(tmp_path / "bare.safetensors"), data, {"num_heads": 2, "depth": 3}, "new")
    # a folder with its config holds the count: there it is the weights'
    vitkit.from_pretrained(tmp_path / "bare.safetensors", num_heads=2).save_pretrained(tmp_path / "folder")
    with pytest.raises(ValueError, match=r"num_heads=1 \(the weights': 2\) contradicts"):
        model_from_init(str(tmp_path / "folder"), data, {"num_heads": 1}, "new")


def test_keeping_the_head_compares_class_names_in_order(tmp_path):
    torch.manual_seed(0)
    names = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat"]
    model = vitkit.create_model("vit_fmnist", num_classes=5, label_names=names).eval()
    model.save_pretrained(tmp_path / "m")
    data = dict(img_size=(28, 28), in_chans=1, num_classes=5, label_names=names[::-1])
    with pytest.raises(WeightsError, match=r"same order: the same 5 classes in another order \(class 0 is "
                                           r"'T-shirt/top' in the weights, 'Coat' in the data\).*--init-head new"):
        model_from_init(str(tmp_path / "m"), data, {}, "keep", log=lambda *a: None)
    other = dict(data, label_names=["cat", "Trouser", "Pullover", "Dress", "Coat"])
    with pytest.raises(WeightsError, match="other classes .*only in the weights: 'T-shirt/top'; "
                                           "only in the data: 'cat'"):
        model_from_init(str(tmp_path / "m"), other, {}, "keep", log=lambda *a: None)
    for label_names in (names, None):  # the same names, or data that names none: the head is kept as it is
        kept = model_from_init(str(tmp_path / "m"), dict(data, label_names=label_names), {}, "keep",
                               log=lambda *a: None).eval()
        x = torch.rand(3, 1, 28, 28)
        with torch.no_grad():
            torch.testing.assert_close(kept(x), model(x))
    new = model_from_init(str(tmp_path / "m"), data, {}, "new", log=lambda *a: None)  # a new head needs no match
    assert new.config.label_names == names[::-1]


@real
@pytest.mark.slow
def test_model_trained_at_28px_fine_tunes_at_40px(tmp_path):
    # the plain ViT at two layers (patch 4: a 7x7 grid at 28 px, 10x10 at 40 px): what is tested is
    # the new grid, which the default hybrid's conv stem makes the same way at 3 times the cost; 100
    # steps of 64 at 28 px give it features that fine-tune at 40 px to 60-64% test top-1 (seeds 0-4;
    # 150 steps: 65-69%, seeds 0-2)
    base = dict(runs_dir=str(tmp_path), progress=False, val_size=500, warmup_steps=10, log_every=5,
                checkpoint_every=1000, test_size=500)
    train(resolve_config("fmnist", name="small", model="vit_fmnist", max_steps=100, batch_size=64, lr=4e-3,
                         model_args={"pos_embed": "learned", "depth": 2}, **base))
    logs = []
    summary = train(resolve_config("paper-finetune", name="big", max_steps=40, batch_size=64, lr=0.03,
                                   warmup_steps=5, init=str(tmp_path / "small" / "model"), img_size=40,
                                   **{k: v for k, v in base.items() if k != "warmup_steps"}),
                    log=logs.append)
    assert any("pos_embed 7x7 -> 10x10" in line for line in logs)
    run = tmp_path / "big"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in rows if "train_loss" in r]
    assert losses[-1] < 0.8 * losses[0]
    assert summary["test_top1"] > 0.5 and summary["init"].endswith("model")
    model = vitkit.from_pretrained(run / "model")
    assert model.config.img_size == (40, 40) and model.pos_embed.shape[1] == 100


def test_init_reads_a_bare_table_of_two_readings_at_the_runs_size(tmp_path, images, monkeypatch):
    """25 slots of a bare timm file: a 5x5 table, or a class slot before the 4x6 patches of 64x96 px. --init at
    --img-size 64 96 read it as 5x5 and resampled that to 4x6 (0.26 off timm in silence); it is read at the run's
    size now, as from_pretrained(img_size=) reads it: timm's logits. A size past the memory is refused before the
    build with --init too (it went straight to a 13 GB allocation)."""
    import timm
    from safetensors.torch import save_file

    from conftest import max_diff, randomize
    from vitkit.train import memory

    ref = randomize(timm.create_model("vit_tiny_patch16_224", img_size=(64, 96), num_classes=3)).eval()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "amb.safetensors"))
    data = dict(img_size=(64, 96), in_chans=3, num_classes=3, label_names=None)
    with pytest.warns(UserWarning) as said:
        model = model_from_init(str(tmp_path / "amb.safetensors"), data, {}, "keep", log=lambda *a: None).eval()
    assert not any("position table over the patches only" in str(w.message) for w in said)  # (the size settled it)
    x = images(2, 64, 96)
    with torch.no_grad():
        assert max_diff(ref(x), model(x)) <= 1e-5
    monkeypatch.setattr(memory, "available_memory", lambda: 2 ** 30)
    with pytest.raises(ValueError, match=r"position table for its 1024x1024 grid \(16384x16384 px\)"):
        model_from_init(str(tmp_path / "amb.safetensors"), {**data, "img_size": (16384, 16384)}, {}, "new")


@real
def test_a_three_channel_model_trains_on_grey_images_as_predict_feeds_it(tmp_path, monkeypatch):
    """--model-args '{"in_chans": 3}' on Fashion-MNIST was refused ("mean/std need 3 values": the data's one grey
    statistic); the grey images are fed as three equal channels, and a PNG of one reaches the model as in training."""
    from PIL import Image

    from conftest import max_diff
    from vitkit.cli import main
    from vitkit.data import datasets
    from vitkit.evaluate.metrics import prepare_batch

    monkeypatch.setenv("VITKIT_TINY", "1")
    assert main(["train", "--model-args", '{"in_chans": 3}', "--name", "rgb", "--threads", "1", "--runs-dir",
                 str(tmp_path), "--no-progress"]) == 0
    model = vitkit.from_pretrained(tmp_path / "rgb")
    assert model.config.in_chans == 3 and len(set(model.config.mean)) == 1 and len(model.config.std) == 3
    images = torch.from_numpy(datasets.load_split("fashion-mnist", "test", None).images[:4]).reshape(4, 1, 28, 28)
    trained = prepare_batch(images, model.config)
    predicted = torch.cat([vitkit.preprocess(model, Image.fromarray(i[0].numpy())) for i in images])
    assert trained.shape == predicted.shape == (4, 3, 28, 28) and max_diff(trained, predicted) <= 1e-6
    # 4 channels trained, and then predict and inspect could not feed it (an image has 1 or 3): refused first
    assert main(["train", "--model-args", '{"in_chans": 4}', "--name", "four", "--threads", "1", "--runs-dir",
                 str(tmp_path), "--no-progress"]) == 2
    assert not (tmp_path / "four").exists()


@real
def test_a_run_trains_and_fine_tunes_at_a_height_and_width(tmp_path, monkeypatch, capsys):
    """--img-size H W: a run at 28x40, then --init from it at 32x48 (its position grid resampled). The flag took one
    side only, while --model-args img_size with --init named `--img-size H W` as the way to ask for it."""
    from vitkit.cli import main

    monkeypatch.setenv("VITKIT_TINY", "1")  # a few steps: what is tested is the size, not the learning
    common = ["--threads", "1", "--runs-dir", str(tmp_path), "--no-progress"]
    assert main(["train", "--img-size", "28", "40", "--name", "a", *common]) == 0
    # predict and the exports see an image as training did: Fashion-MNIST's 28x28 stretched whole to 28x40 (they
    # resized it to 40x40 and cut 12 rows: 2.8 apart, half the top classes changed)
    from PIL import Image

    from vitkit.data import datasets
    from vitkit.evaluate.metrics import prepare_batch

    first = vitkit.from_pretrained(tmp_path / "a")
    images = torch.from_numpy(datasets.load_split("fashion-mnist", "test", None).images[:4]).reshape(4, 1, 28, 28)
    trained = prepare_batch(images, first.config)
    predicted = torch.cat([vitkit.preprocess(first, Image.fromarray(i[0].numpy())) for i in images])
    assert first.config.crop_mode == "squash" and (trained - predicted).abs().mean() < 0.005  # (PIL's bicubic both)
    assert main(["train", "--init", str(tmp_path / "a"), "--img-size", "32", "48", "--name", "b", *common]) == 0
    model = vitkit.from_pretrained(tmp_path / "b" / "model").eval()
    assert model.config.img_size == (32, 48) and model(torch.zeros(1, 1, 32, 48)).shape == (1, 10)
    assert json.loads((tmp_path / "b" / "config.json").read_text())["img_size"] == [32, 48]
    assert main(["train", "--resume", str(tmp_path / "b"), "--img-size", "32", "48", "--no-progress"]) == 0
    capsys.readouterr()  # a taken name is the one line, before the --init weights are read and said
    assert main(["train", "--init", str(tmp_path / "a"), "--finetune", "lora", "--name", "b", *common]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "run directory" in err and "already exists" in err, (out, err)
    assert main(["train", "--img-size", "28", "28", "--name", "square", *common]) == 0  # a square's sides: its one
    assert json.loads((tmp_path / "square" / "config.json").read_text())["img_size"] == 28
    assert vitkit.from_pretrained(tmp_path / "square").config.crop_mode == "center"  # (its shape is the data's)
    capsys.readouterr()
    for argv, words in ((["--img-size", "28", "40", "5"], "--img-size takes one value or two (H W), not 28 40 5"),
                        (["--img-size", "none", "40"], "--img-size takes one value or two (H W), not none 40"),
                        (["--img-size", "0", "40"], "img_size must be >= 1, not [0, 40]")):
        assert main(["train", *argv, "--name", "bad", *common]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err
    assert not (tmp_path / "bad").exists()


def test_init_on_in_memory_images_predicts_on_the_whole_image_as_training_saw_it(tmp_path):
    """In-memory images are trained and scored whole; an --init run kept the weights' crop (timm's 0.9), so
    predict and the exports cropped the images the model never saw cropped (SigLIP: 0.07 off)."""
    from vitkit.train.data import RunData
    from vitkit.train.tasks import Classification

    torch.manual_seed(0)
    vitkit.create_model("vit_fmnist", img_size=32, patch_size=8, num_classes=5, crop_pct=0.9).save_pretrained(
        tmp_path / "m")
    cfg = resolve_config("fmnist", init=str(tmp_path / "m"), runs_dir=str(tmp_path), progress=False)
    kw = dict(classes=[str(i) for i in range(10)], in_chans=1, mean=(0.5,), std=(0.5,), train=None, val=None,
              test=None, n_train=100)
    memory = Classification().build_model(cfg, RunData(kind="memory", img_size=(32, 32), **kw), log=lambda *a: None)
    folder = Classification().build_model(cfg, RunData(kind="folder", img_size=None, **kw), log=lambda *a: None)
    assert memory.config.crop_pct == 1.0 and memory.config.img_size == (32, 32)
    assert folder.config.crop_pct == 0.9  # files are cropped in training's eval as in predict's: the weights' crop
