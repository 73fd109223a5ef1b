"""Training configuration: layers merge deeply, optional features switch off, every flag explains itself."""

import argparse
import json
import re
import warnings

import pytest

from vitkit.cli import build_parser, train_config
from vitkit.train.config import OFF, ConfigNote, deep_merge, resolve_config
from vitkit.train.resume import resume_conflicts
from vitkit.utils import seed_for


def parse_train(*argv):
    return build_parser().parse_args(["train", *argv])


def test_model_args_merge_recipe_file_and_flags_deeply(tmp_path):
    cfg = resolve_config("deit", model_args={"depth": 4})
    assert cfg.model_args == {"drop_path_rate": 0.1, "depth": 4}  # the recipe's drop-path survives
    (tmp_path / "run.json").write_text(json.dumps({"model_args": {"embed_dim": 64, "drop_path_rate": 0.2}}))
    cfg = resolve_config("deit", str(tmp_path / "run.json"), model_args={"depth": 4})
    assert cfg.model_args == {"drop_path_rate": 0.2, "embed_dim": 64, "depth": 4}
    cfg = train_config(parse_train("--recipe", "deit", "--model-args", '{"drop_path_rate": null}'))
    assert cfg.model_args == {}  # null removes a recipe's key
    nested = deep_merge({"backbone": {"type": "conv", "channels": [8]}}, {"backbone": {"channels": [16]}})
    assert nested == {"backbone": {"type": "conv", "channels": [16]}}
    with pytest.raises(ValueError, match="model_args must be a JSON object"):
        resolve_config("fmnist", model_args=[1, 2])
    with pytest.raises(ValueError, match="--model-args is not valid JSON"):
        train_config(parse_train("--model-args", "{depth: 4}"))


def test_none_switches_an_optional_feature_off_and_zero_is_refused():
    assert resolve_config("deit").ema_decay == 0.99996
    assert resolve_config("deit", ema_decay=OFF).ema_decay is None
    cfg = train_config(parse_train("--recipe", "deit", "--ema-decay", "none", "--clip-grad", "off"))
    assert cfg.ema_decay is None and cfg.clip_grad is None and cfg.mixup == 0.8
    with pytest.raises(ValueError, match=r"ema_decay must be in \(0, 1\).*none switches the EMA off"):
        train_config(parse_train("--ema-decay", "0"))
    with pytest.raises(SystemExit):  # argparse: not a number and not 'none'
        parse_train("--ema-decay", "often")
    for flag in ("--log-every", "--checkpoint-every", "--eval-batch-size"):
        with pytest.raises(ValueError, match="must be >= 1"):
            train_config(parse_train(flag, "0"))


def test_every_train_flag_has_help_from_its_field_comment():
    train = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "train")[1]
    flags = [a for a in train._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    assert len(flags) > 55
    bare = [a.option_strings[0] for a in flags if not a.help or a.help.startswith("[default")]
    assert bare == [], f"flags without help text: {bare}"
    ema = next(a for a in flags if a.option_strings[0] == "--ema-decay")
    assert "exponential moving average" in ema.help and "'none' unsets it" in ema.help


def test_resume_conflicts_only_where_model_args_change_something(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(resolve_config("deit", model_args={"depth": 4}).to_dict()))
    assert resume_conflicts(str(tmp_path), {"model_args": {"depth": 4}}) == []
    assert resume_conflicts(str(tmp_path), {"model_args": {"depth": 5}}) != []
    assert resume_conflicts(str(tmp_path), {"ema_decay": OFF}) != []


def test_resume_reads_a_pretraining_option_saved_as_none_as_the_objectives_own_value(tmp_path):
    """An MAE run saved with mask_ratio none trained at 0.75: --mask-ratio 0.75 given again continues it, and
    0.6 is refused saying 0.75, not null (the run never trained with 'no ratio')."""
    from vitkit.train.config import TrainConfig

    (tmp_path / "config.json").write_text(json.dumps(TrainConfig(objective="mae").to_dict()))
    assert resume_conflicts(str(tmp_path), {"mask_ratio": 0.75, "norm_pix_loss": True}) == []
    (refused,) = resume_conflicts(str(tmp_path), {"mask_ratio": 0.6})
    assert refused == "--mask-ratio (saved: 0.75, mae's default, given: 0.6)"
    (refused,) = resume_conflicts(str(tmp_path), {"mask_block": 8})  # not MAE's: still none
    assert refused == "--mask-block (saved: null, given: 8)"


def test_one_seeding_helper_gives_independent_reproducible_streams():
    assert seed_for(0, "mix", 3, 0, 1) == seed_for(0, "mix", 3, 0, 1)
    keys = [(s, stream, i) for s in (0, 1) for stream in ("order", "augment", "mix") for i in range(50)]
    seeds = {seed_for(s, stream, i) for s, stream, i in keys}
    assert len(seeds) == len(keys) and all(0 <= x < 2 ** 63 for x in seeds)
    # the old formula's collision: seed 0 step 1_000_003 was seed 1 step 0
    assert seed_for(0, "augment", 1_000_003) != seed_for(1, "augment", 0)
    with pytest.raises(ValueError, match="unknown random stream"):
        seed_for(0, "no-such-stream")
    with pytest.raises(ValueError, match=">= 0"):
        seed_for(-1, "mix")


def test_tiny_scale_caps_test_images_of_indexable_data_only(monkeypatch):
    """VITKIT_TINY=1 (the docs' commands at test scale) scores a sample of 100 test images of an image
    folder or a Hugging Face dataset, keeps a smaller --test-size, and leaves streams (no positions to draw)."""
    from vitkit import tiny

    monkeypatch.setenv("VITKIT_TINY", "1")
    assert resolve_config(dataset="folder").test_size == tiny.SPLIT_IMAGES["test"] == 100
    assert resolve_config(dataset="folder", test_size=50).test_size == 50
    assert resolve_config(dataset="hf:some/set").test_size == 100
    assert resolve_config(dataset="shards").test_size is None
    assert resolve_config(dataset="hf:some/set", hf_streaming=True).test_size is None
    monkeypatch.delenv("VITKIT_TINY")
    assert resolve_config(dataset="folder").test_size is None


@pytest.mark.parametrize("native_bf16", [True, False])
def test_a_run_that_names_no_recipe_gets_the_one_for_the_precision_it_trains_in(monkeypatch, native_bf16):
    from vitkit.train import precision
    from vitkit.train.recipes import default_recipe

    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: native_bf16)
    monkeypatch.setattr(precision.torch.cuda, "is_available", lambda: False)
    auto = "fmnist" if native_bf16 else "fmnist-fp32"
    assert default_recipe() == (auto, "bf16: this CPU runs bf16 natively" if native_bf16
                                else "fp32: this CPU has no native bf16")
    assert default_recipe("fp32") == ("fmnist-fp32", "fp32: --precision fp32")  # asked for, either CPU
    assert default_recipe("bf16")[0] == default_recipe("fp16")[0] == "fmnist"
    from vitkit.train.config import RECIPES

    for argv, recipe in [((), auto), (("--precision", "fp32"), "fmnist-fp32"), (("--precision", "bf16"), "fmnist"),
                         (("--recipe", "fmnist", "--precision", "fp32"), "fmnist")]:  # a named recipe is kept
        cfg = train_config(parse_train(*argv))
        assert cfg.recipe == recipe and cfg.epochs == RECIPES[recipe]["epochs"], (argv, cfg.recipe)
    assert resolve_config().recipe == auto  # the library's default is the command line's
    with pytest.raises(ValueError, match="precision must be one of auto, bf16, fp16, fp32, not \"fp8\""):
        resolve_config(precision="fp8")  # checked before it chooses a recipe


def test_the_first_line_of_a_run_says_its_precision_why_and_its_recipe(monkeypatch, tmp_path, capsys):
    from vitkit.cli import main
    from vitkit.train import precision

    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: False)
    args = ["train", "--max-steps", "1", "--val-size", "100", "--test-size", "100", "--runs-dir", str(tmp_path),
            "--no-progress", "--threads", "1", "--no-tensorboard"]
    assert main([*args, "--name", "auto"]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert "(279,786 parameters, fp32: this CPU has no native bf16; recipe fmnist-fp32)" in first, first
    assert json.loads((tmp_path / "auto" / "config.json").read_text())["recipe"] == "fmnist-fp32"
    assert main([*args, "--name", "named", "--recipe", "fmnist", "--precision", "fp32"]) == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert "fp32: --precision fp32; recipe fmnist)" in first, first


def test_lengths_no_machine_could_train_are_refused_by_name():
    """--max-steps past int64 and --epochs 1e12 started a run whose ETA read 119614500009548.6 h."""
    for kw, words in ((dict(max_steps=10 ** 20), "max_steps must be in [1, 1,000,000,000], not 100000000000000000000"),
                      (dict(epochs=1e12), "epochs must be <= 1,000,000, not 1000000000000.0")):
        with pytest.raises(ValueError, match=re.escape(words)):
            resolve_config("fmnist", **kw)


def test_a_runs_own_config_json_is_a_config_file_again(tmp_path, monkeypatch):
    """A run's config.json lists every field, its defaults too: given back as --config, LoRA's rank without LoRA
    and SGD's momentum beside AdamW were refused as choices no one made. A field at the value of the layer below
    is no choice; one that changes it still is, and a model beside init must name the weights' architecture."""
    import vitkit
    from vitkit.train import train
    from vitkit.train.loop import _located

    monkeypatch.setenv("VITKIT_TINY", "0")
    saved = _located(resolve_config("fmnist").to_dict())
    (tmp_path / "run.json").write_text(json.dumps(saved))
    again = resolve_config(None, str(tmp_path / "run.json"))
    assert again.to_dict() == resolve_config("fmnist").to_dict()
    from vitkit.train.fit import fit_to_data

    # every field a file writes is still chosen: kept from fitting (a study's arm wrote batch 128 and trained at 32)
    assert "batch_size" in again.chosen and fit_to_data(again, 550)[0].batch_size == again.batch_size == 128
    (tmp_path / "warm.json").write_text(json.dumps({"warmup_steps": 200}))
    assert resolve_config("deit", str(tmp_path / "warm.json")).warmup_epochs is None  # as --warmup-steps 200
    (tmp_path / "lora.json").write_text(json.dumps({**saved, "lora_rank": 4}))  # a rank that changes something
    with pytest.raises(ValueError, match=r"--lora-rank applies with --finetune lora"):
        resolve_config(None, str(tmp_path / "lora.json"))
    # a file written by hand: 16 is LoRA's alpha 16.0, and [0.9, 0.999] the betas' tuple (one rule with resume's)
    (tmp_path / "hand.yaml").write_text("lora_alpha: 16\nbetas: [0.9, 0.999]\nmomentum: 0.9\noptimizer: sgd\n")
    assert resolve_config(None, str(tmp_path / "hand.yaml")).lora_alpha == 16
    # a run's config.json from before its recipe changed (fmnist was AdamW for 9 epochs until 2026-12-06, now Muon
    # with momentum 0.95): trains as it says, and AdamW's unread momentum 0.9, the field's default, is no choice
    old = {**_located(resolve_config("fmnist-adamw", precision="bf16").to_dict()), "recipe": "fmnist"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    before = resolve_config(None, str(tmp_path / "old.json"))
    assert (before.recipe, before.optimizer, before.momentum, before.epochs) == ("fmnist", "adamw", 0.9, 9.0)
    (tmp_path / "old.json").write_text(json.dumps({**old, "momentum": 0.8}))  # one the run chose is still refused
    with pytest.raises(ValueError, match=r"--momentum applies to --optimizer sgd and muon, not adamw"):
        resolve_config(None, str(tmp_path / "old.json"))
    # a file's floor at the field's default, over a recipe's 0, is still a change: above the peak, refused
    (tmp_path / "floor.yaml").write_text("min_lr: 1.0e-5\nlr: 5.0e-6\n")
    with pytest.raises(ValueError, match=r"--min-lr 1e-05 is above the peak learning rate 5e-06"):
        resolve_config("paper-finetune", str(tmp_path / "floor.yaml"))
    # a fine-tuning run's config.json holds init and the architecture it trained
    vitkit.create_model("vit_fmnist", depth=1, num_classes=10).save_pretrained(tmp_path / "w")
    (tmp_path / "init.json").write_text(json.dumps({**saved, "init": str(tmp_path / "w"), "model": "vit_fmnist"}))
    assert resolve_config(None, str(tmp_path / "init.json")).model == "vit_fmnist"
    (tmp_path / "other.json").write_text(json.dumps({**saved, "init": str(tmp_path / "w"),
                                                     "model": "vit_tiny_patch16_224"}))
    with pytest.raises(ValueError, match=r"the config file's model vit_tiny_patch16_224 is not the --init weights' "
                                         r"architecture, vit_fmnist"):
        train(resolve_config(None, str(tmp_path / "other.json"), runs_dir=str(tmp_path / "runs"), max_steps=1,
                             val_size=10, test_size=10, progress=False, tensorboard=False))
    with pytest.raises(ValueError, match=r"--model vit_fmnist does not apply with --init"):  # typed: refused
        resolve_config(None, str(tmp_path / "init.json"), model="vit_fmnist")


def test_a_finished_runs_config_json_trains_again_in_a_folder_of_its_own(tmp_path, capsys):
    """vitkit train --config runs/r/config.json was refused as "run directory runs/r already exists" (the file names
    its run) and, from a machine with bf16 on one without, as a recipe the file could not choose: it trains again
    with the run's settings in a new folder, and notes say why (the recipe sized for another precision too)."""
    from conftest import in_process

    runs = tmp_path / "runs"
    first = ["train", "--runs-dir", runs, "--max-steps", "2", "--val-size", "10", "--test-size", "10", "--no-progress"]
    assert in_process(capsys, *first, "--name", "r", "--recipe", "fmnist").returncode == 0
    again = in_process(capsys, "train", "--config", runs / "r" / "config.json", "--precision", "fp32", "--no-progress")
    assert again.returncode == 0, again.stderr
    assert f"note: {runs / 'r' / 'config.json'} is run r's own: this run gets a folder of its own (--name)" \
        in again.stderr, again.stderr
    assert "recipe fmnist is the default run for bf16 or fp16; this run trains in fp32 (--precision fp32), whose " \
           "default run is --recipe fmnist-fp32" in again.stderr, again.stderr
    (new,) = [p for p in runs.iterdir() if p.name != "r"]
    old, now = (json.loads((runs / n / "config.json").read_text()) for n in ("r", new.name))
    assert now["name"] is None and now["recipe"] == "fmnist" and now["precision"] == "fp32"
    assert {k: v for k, v in now.items() if k not in ("name", "precision")} == \
        {k: v for k, v in old.items() if k not in ("name", "precision")}
    (tmp_path / "copy").mkdir()  # the same file elsewhere names a folder someone chose: still refused when taken
    (tmp_path / "copy" / "config.json").write_text((runs / "r" / "config.json").read_text())
    line = in_process(capsys, "train", "--config", tmp_path / "copy" / "config.json").stderr
    assert f"run directory {runs / 'r'} already exists" in line, line


def test_a_pretraining_recipe_implies_its_objective_and_a_file_without_precision_is_noted(tmp_path, monkeypatch):
    """A config file's recipe: mae-fmnist without an objective ran classification over MAE's fields ("decoder_dim
    ... only apply to pre-training"); a hand-written recipe: fmnist without precision: got no note of the precision
    the default run of this machine is; a run's own config.json given from inside its folder was not known."""
    import warnings

    from vitkit.train import precision
    from vitkit.train.config_files import own_run_name

    (tmp_path / "mae.yaml").write_text("recipe: mae-fmnist\n")
    assert resolve_config(None, str(tmp_path / "mae.yaml")).objective == "mae"
    assert resolve_config("simmim-fmnist").objective == "simmim" and resolve_config("fmnist").objective == "classify"
    # another objective beside a pre-training recipe: refused as the two disagreeing (it was "mask_block does not
    # apply to mae", a field of the recipe's)
    (tmp_path / "simmim.yaml").write_text("recipe: simmim-fmnist\n")
    for recipe, file, given in (("simmim-fmnist", None, "mae"), (None, str(tmp_path / "simmim.yaml"), "mae"),
                                ("mpp-fmnist", None, "classify")):
        with pytest.raises(ValueError, match=rf"the recipe \S+ pre-trains \w+, not {given}: give the objective's own "
                                             r"recipe \((--recipe mae-fmnist|no pre-training recipe)\)"):
            resolve_config(recipe, file, objective=given)
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: False)  # a machine without bf16
    monkeypatch.setattr(precision.torch.cuda, "is_available", lambda: False)
    (tmp_path / "f.yaml").write_text("recipe: fmnist\n")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert resolve_config(None, str(tmp_path / "f.yaml")).recipe == "fmnist"
    assert any("recipe fmnist is the default run for bf16 or fp16; this run trains in fp32" in str(w.message)
               for w in said), [str(w.message) for w in said]
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / ".lock").write_text("")
    (run / "config.json").write_text(json.dumps({"name": "r"}))
    monkeypatch.chdir(run)
    assert own_run_name("config.json", {"name": "r"}) and not own_run_name("config.json", {"name": "other"})


def test_a_config_files_objective_picks_the_pretraining_recipe(tmp_path):
    """vitkit pretrain --config with objective: in the file ran on the classification recipe (a 25.6M-parameter
    MAE decoder, random erasing, 5,000 validation images) where --objective picks its pre-training recipe."""
    (tmp_path / "pt.yaml").write_text("objective: mae\nmodel: vit_fmnist\n")
    cfg = resolve_config(None, str(tmp_path / "pt.yaml"))
    assert (cfg.recipe, cfg.decoder_dim) == ("mae-fmnist", 64)
    assert cfg.to_dict() == resolve_config("mae-fmnist", objective="mae", model="vit_fmnist").to_dict()
    assert train_config(parse_train("--config", str(tmp_path / "pt.yaml"))).recipe == "mae-fmnist"


def test_what_the_data_or_the_flags_decide_is_not_overridden_in_silence(tmp_path):
    """--img-size 40 beside model_args img_size 32 trained at 32 while config.json said 40; model_args num_classes
    fought the data's classes; a --warmup-steps given lost to a recipe's warmup_epochs (DeiT's 5 epochs: a
    37k-step warm-up for a 3-step run); a warm-up as long as the run was never said."""
    from vitkit.train import train

    with pytest.raises(ValueError, match=r"--img-size 40 and model_args img_size 32 differ .* give the size once"):
        resolve_config("fmnist", img_size=40, model_args={"img_size": 32})
    assert resolve_config("fmnist", img_size=32, model_args={"img_size": [32, 32]}).img_size == 32
    with pytest.raises(ValueError, match=r"model_args label_names, num_classes: the data decides the classes"):
        resolve_config("fmnist", model_args={"num_classes": 5, "label_names": list("abcde")})
    assert resolve_config("deit", warmup_steps=1).warmup_epochs is None
    assert resolve_config("deit").warmup_epochs == 5.0  # the recipe's, where no steps are given
    assert resolve_config("deit", warmup_steps=1, warmup_epochs=2).warmup_epochs == 2  # both given: the epochs
    lines = []
    cfg = resolve_config("fmnist", max_steps=3, batch_size=8, val_size=20, test_size=20, model_args={"depth": 1},
                         runs_dir=str(tmp_path), progress=False, tensorboard=False, precision="fp32")
    train(cfg, log=lines.append)
    assert any("the warm-up of 200 steps is longer than the run's 3: the learning rate never reaches its peak" in line
               for line in lines), lines


@pytest.mark.parametrize("given, words", [
    (dict(teacher="t"), "--teacher applies with --distill soft or hard"),
    (dict(alpha=0.9), "--alpha applies to --distill soft"),
    (dict(distill="hard", teacher="t", tau=5.0, alpha=0.1), "--alpha and --tau apply to --distill soft .*this run: "
                                                            "--distill hard"),
    (dict(init_head="keep"), "--init-head applies with --init"),
    (dict(mixup=0.8, mixup_switch_prob=0.9), "--mixup-switch-prob chooses between Mixup and CutMix"),
])
def test_an_option_another_leaves_unread_is_refused_by_name(given, words):
    """Each was taken, changed nothing and exited 0 (--teacher /nonexistent without --distill too)."""
    with pytest.raises(ValueError, match=words):
        resolve_config("fmnist", **given)


def test_the_options_they_need_let_them_be_read():
    assert resolve_config("fmnist", distill="soft", teacher="t", tau=2.0, alpha=0.3).tau == 2.0
    assert resolve_config("fmnist", mixup=0.8, cutmix=1.0, mixup_switch_prob=0.9).mixup_switch_prob == 0.9


def test_a_switchs_help_offers_only_what_it_takes(capsys):
    """--norm-pix-loss's help said "'none' unsets it", which the switch refused as an unrecognized argument."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["pretrain", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    said = text[text.index("--norm-pix-loss, --no-norm-pix-loss"):][:300]
    head = said.split("]")[0]  # the flag's help, to its default
    assert head.endswith("[default: none") and "unsets" not in head
    with pytest.raises(SystemExit):
        build_parser().parse_args(["pretrain", "--norm-pix-loss", "none"])


def test_a_saved_runs_defaults_are_not_taken_as_its_choices_on_resume(tmp_path):
    """A run's config.json holds every field: an SGD run's betas (saved as a list, the default is a tuple) were
    taken as chosen and refused as Adam's, so no SGD run resumed through the command line."""
    from vitkit.train.resume import with_saved

    with pytest.warns(ConfigNote):  # (the note of a new run that names another optimizer than its recipe's)
        runs = {"sgd": resolve_config("fmnist", optimizer="sgd"), "adamw": resolve_config("fmnist-adamw"),
                "muon": resolve_config("fmnist-fp32"),
                "sgd95": resolve_config("fmnist", optimizer="sgd", momentum=0.95)}
    for name, cfg in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg.to_dict()))
        recipe, merged = with_saved(str(tmp_path / name), {})
        assert "betas" not in merged and ("momentum" in merged) == name.startswith("sgd"), name
        with warnings.catch_warnings():  # the saved run decides: SGD's momentum 0.95 (the Muon recipe's value) was
            warnings.simplefilter("error")  # said to go back to 0.9, with advice (--lr) a resume refuses
            again = resolve_config(recipe, **merged)
        assert (again.optimizer, again.momentum) == (cfg.optimizer, cfg.momentum), name
    # a bf16 default run from before its recipe took Muon (fmnist: AdamW, 9 epochs): its flags' checks pass, and
    # the run goes on as its config.json says
    from vitkit.train.resume import resumed_config

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps({**resolve_config("fmnist-adamw").to_dict(),
                                                              "recipe": "fmnist"}))
    recipe, merged = with_saved(str(tmp_path / "old"), {})
    resolve_config(recipe, **merged)
    again = resumed_config(str(tmp_path / "old"), resolve_config(recipe, **merged))
    assert (again.recipe, again.optimizer, again.momentum, again.epochs) == ("fmnist", "adamw", 0.9, 9.0)
