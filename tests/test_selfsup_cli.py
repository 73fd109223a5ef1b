"""The command line around pre-training models without data: convert in and out of every
layout, the verbs that refuse them, and the options each verb accepts."""

import json

import pytest
import torch

import vitkit
from conftest import max_diff, randomize
from vitkit.cli import main
from vitkit.selfsup import MAE, SimMIM
from vitkit.train import resolve_config
from vitkit.train.loop import layer_of, make_optimizer


def encoder(**kw):
    return vitkit.ViTConfig(**{**dict(img_size=32, patch_size=8, embed_dim=192, depth=2, num_heads=3, mlp_dim=96),
                               **kw})


@pytest.mark.parametrize("to,suffix", [("vitkit", ""), ("hf", ""), ("mae", ".pth")])
def test_convert_a_pretraining_model_round_trips(tmp_path, capsys, to, suffix):
    model = randomize(MAE(encoder(), decoder_dim=32, decoder_depth=1, decoder_heads=16, decoder_mlp_dim=64))
    model.save_pretrained(tmp_path / "run" / "model")  # a run's folder stands for its model
    assert main(["convert", str(tmp_path / "run"), str(tmp_path / f"out{suffix}"), "--to", to, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["architecture"] == "mae pre-training (vit)" and info["params"] == sum(
        p.numel() for p in model.parameters())
    back = vitkit.from_pretrained(tmp_path / f"out{suffix}")
    x, noise = torch.randn(2, 3, 32, 32), torch.rand(2, 16)
    with torch.no_grad():
        assert max_diff(model(x, noise=noise).pred, back(x, noise=noise).pred) <= 1e-5


def test_convert_to_a_layout_without_a_decoder_writes_the_encoder(tmp_path, capsys):
    model = randomize(SimMIM(encoder(), mask_block=16))
    model.save_pretrained(tmp_path / "m")
    assert main(["convert", str(tmp_path / "m"), str(tmp_path / "enc.safetensors"), "--to", "timm"]) == 0
    assert "holds its encoder" in capsys.readouterr().err
    enc = vitkit.from_pretrained(tmp_path / "enc.safetensors")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert max_diff(enc.forward_features(x), model.encoder.forward_features(x)) == 0


def test_layouts_that_cannot_hold_a_pretraining_model_say_why(tmp_path, capsys):
    nocls = SimMIM(encoder(class_token=False, global_pool="avg"), mask_block=16)
    nocls.save_pretrained(tmp_path / "m")
    assert main(["convert", str(tmp_path / "m"), str(tmp_path / "hf"), "--to", "hf"]) == 2
    assert "always has a class token" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "m"), str(tmp_path / "x.pth"), "--to", "mae"]) == 2
    assert "MAE models only" in capsys.readouterr().err
    vitkit.create_model("vit_fmnist").save_pretrained(tmp_path / "clf")
    assert main(["convert", str(tmp_path / "clf"), str(tmp_path / "y.pth"), "--to", "mae"]) == 2
    assert "MAE pre-training models" in capsys.readouterr().err


def test_eval_refuses_a_pretraining_model(tmp_path, capsys):
    SimMIM("vit_fmnist", mask_block=4).save_pretrained(tmp_path / "m")
    assert main(["eval", "--weights", str(tmp_path / "m"), "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert "simmim pre-training model: it has no classifier" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "e").exists()


def test_train_refuses_a_pretraining_config_and_pretraining_refuses_labels(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"objective": "mae"}))
    assert main(["train", "--config", str(cfg), "--runs-dir", str(tmp_path / "runs")]) == 2
    assert "run it with vitkit pretrain" in capsys.readouterr().err
    with pytest.raises(ValueError, match="mask_ratio only applies to pre-training"):
        resolve_config("fmnist", mask_ratio=0.5)
    with pytest.raises(ValueError, match="mask_ratio, fewshot only apply to pre-training"):
        resolve_config("fmnist", mask_ratio=0.5, fewshot=False)
    with pytest.raises(ValueError, match="reads no labels, so mixup=0.8, label_smoothing=0.1 cannot apply"):
        resolve_config("mae-fmnist", objective="mae", mixup=0.8, label_smoothing=0.1)
    with pytest.raises(ValueError, match="reads no labels, so test_tta='flip' cannot apply"):
        resolve_config("mae-fmnist", objective="mae", test_tta="flip")
    # the default recipe's smoothing is dropped for pre-training; chosen by the user it is refused
    assert resolve_config("fmnist", objective="simmim").label_smoothing == 0.0
    assert resolve_config("fmnist").label_smoothing == 0.1
    with pytest.raises(ValueError, match="label_smoothing=0.1 cannot apply"):
        resolve_config("fmnist", objective="simmim", label_smoothing=0.1)
    with pytest.raises(ValueError, match="objective must be classify, simmim, mpp, mae"):
        resolve_config("fmnist", objective="byol")
    with pytest.raises(ValueError, match="norm_pix_loss does not apply to simmim"):
        resolve_config("simmim-fmnist", objective="simmim", norm_pix_loss=False)
    # another objective's recipe: said as the two disagreeing (it was a field only the recipe set, "mask_block")
    with pytest.raises(ValueError, match=r"the recipe simmim-fmnist pre-trains simmim, not mae"):
        resolve_config("simmim-fmnist", objective="mae")
    with pytest.raises(ValueError, match=r"mask_block does not apply to mae \(it is simmim's\)$"):
        resolve_config("fmnist", objective="mae", mask_block=4)  # given: the user's
    assert not (tmp_path / "runs").exists()


def test_pretrain_offers_no_fine_tuning_flags_and_its_resume_lines_are_its_own(tmp_path, capsys):
    """pretrain took --finetune, --lora-* and --freeze-blocks, each refused as needing --init, a flag pretrain has
    not; its --resume refusal listed --test-tta among what may change and advised `--init RUN` (train's)."""
    from vitkit.train.resume import check_resume

    for flags in (["--finetune", "lora"], ["--lora-rank", "4"], ["--freeze-blocks", "1"]):
        with pytest.raises(SystemExit):
            main(["pretrain", "--objective", "mae", *flags])
        assert "unrecognized arguments" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"objective": "mae", "recipe": "mae-fmnist", "lr": 1e-3}))
    with pytest.raises(ValueError) as e:
        check_resume(str(tmp_path / "run"), {"lr": 5.0}, "pretrain")
    assert "--test-tta" not in str(e.value) and f"vitkit train --init {tmp_path / 'run'} fine-tunes its encoder" in \
        str(e.value)


def test_pretraining_on_files_says_where_its_few_shot_score_comes_from(tmp_path, capsys):
    """The closing few-shot probe reads an in-memory dataset; on an image folder it was left out without a word."""
    import numpy as np
    from PIL import Image

    from vitkit.train import train

    for split in ("train", "test"):
        for name in ("a", "b"):
            (tmp_path / "d" / split / name).mkdir(parents=True)
            for i in range(4):
                Image.fromarray(np.full((28, 28), 50 * i, np.uint8)).save(tmp_path / "d" / split / name / f"{i}.png")
    said = []
    cfg = resolve_config("mae-fmnist", objective="mae", dataset="folder", data_dir=str(tmp_path / "d"), max_steps=1,
                         batch_size=4, val_size=0, warmup_steps=0, runs_dir=str(tmp_path / "runs"), name="r",
                         workers=0, progress=False, tensorboard=False,
                         model_args={"embed_dim": 32, "depth": 1, "num_heads": 2, "mlp_dim": 64})
    summary = train(cfg, log=said.append)
    assert "fewshot" not in summary
    assert any("no few-shot evaluation: the run's probe needs an in-memory dataset" in line and
               f"vitkit fewshot --weights {tmp_path / 'runs' / 'r'} --dataset folder --data-dir" in line
               for line in said), said
    # tar shards: the command it named (--dataset shards) was refused by vitkit fewshot (a stream has no pool)
    import dataclasses

    from vitkit.cli import main
    from vitkit.data.shard_writer import folder_to_shards

    for split in ("train", "test"):
        folder_to_shards(tmp_path / "d" / split, tmp_path / "s" / split)
    said.clear()
    train(dataclasses.replace(cfg, dataset="shards", data_dir=str(tmp_path / "s"), name="s"), log=said.append)
    note = next(line for line in said if "no few-shot evaluation" in line)
    assert note.endswith(f"vitkit fewshot --weights {tmp_path / 'runs' / 's'} --dataset folder --data-dir DIR scores "
                         f"the image folder the shards were written from"), note
    # the command it names reads the folder (8 images are too few for a probe: refused past the dataset's check)
    assert main(["fewshot", "--weights", str(tmp_path / "runs" / "s"), "--dataset", "folder", "--data-dir",
                 str(tmp_path / "d"), "--shots", "1", "--seeds", "1", "--no-progress", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert "need 51 training images per class; 2 of 2 classes have fewer (class 'a': 4)" in err, err


def test_layer_decay_scales_each_layer_and_leaves_the_head_at_lr():
    model = vitkit.create_model("vit_fmnist")  # 4 blocks
    assert [layer_of(n, 4) for n in ("patch_embed.proj.weight", "blocks.0.attn.qkv.weight",
                                     "blocks.3.norm1.bias", "norm.weight", "head.weight")] == [0, 1, 4, 5, 5]
    opt = make_optimizer(model, resolve_config("fmnist-adamw", lr=1e-3, layer_decay=0.5))
    scale = {id(p): g["lr_scale"] for g in opt.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert scale[id(named["head.weight"])] == 1.0 and scale[id(named["blocks.3.mlp.fc1.weight"])] == 0.5
    assert scale[id(named["blocks.0.mlp.fc1.weight"])] == 0.5 ** 4
    assert scale[id(named["patch_embed.proj.weight"])] == 0.5 ** 5
    wd = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert wd[id(named["blocks.0.mlp.fc1.weight"])] == 0.05 and wd[id(named["blocks.0.mlp.fc1.bias"])] == 0.0
    plain = make_optimizer(model, resolve_config("fmnist-adamw"))
    assert len(plain.param_groups) == 2 and all(g["lr_scale"] == 1.0 for g in plain.param_groups)
    with pytest.raises(ValueError, match="layer_decay must be in \\(0, 1\\]"):
        resolve_config("fmnist", layer_decay=1.5)
