"""The Hugging Face Hub, offline: push_to_hub with a fake HfApi, from_pretrained("hf-hub:") served
from what was pushed, huggingface_hub's typed errors in one line each; hubconf.py for torch.hub."""

import importlib.util
import json
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch

import vitkit
from conftest import fake_snapshot_download, randomize
from vitkit.weights import WeightsError, download_from_hub, save_for_hub
from vitkit.weights.hub import push_to_hub

ROOT = Path(__file__).resolve().parents[1]
LABELS = ["cat", "dog", "a|b"]


def tiny(**kw):
    return randomize(vitkit.create_model("vit_tiny_patch16_224", **{
        **dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_dim=64, num_classes=3,
               label_names=LABELS), **kw}))


class FakeApi:
    """huggingface_hub.HfApi's create_repo / upload_folder: records the calls, "uploads" to
    ``remote/ORG/NAME``; ``fail`` maps a method name to the exception it raises."""

    instances = []

    def __init__(self, remote=None, token=None, fail=None):
        self.remote, self.token, self.fail, self.calls = remote, token, fail or {}, []
        FakeApi.instances.append(self)

    def create_repo(self, repo_id, private=None, exist_ok=False, repo_type=None):
        self.calls.append(("create_repo", repo_id, dict(private=private, exist_ok=exist_ok, repo_type=repo_type)))
        if "create_repo" in self.fail:
            raise self.fail["create_repo"]
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, folder_path, repo_id, repo_type=None, revision=None, commit_message=None):
        self.calls.append(("upload_folder", repo_id, dict(repo_type=repo_type, revision=revision,
                                                          commit_message=commit_message)))
        if "upload_folder" in self.fail:
            raise self.fail["upload_folder"]
        shutil.copytree(folder_path, self.remote / repo_id, dirs_exist_ok=True)
        return types.SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0123abc")


def files(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def front_matter(card):
    head, sep, _ = card[4:].partition("\n---\n")
    assert card.startswith("---\n") and sep, "the card opens with YAML front matter"
    return head.splitlines()


# ------------------------------------------------------------------ push, then load back


def test_push_then_load_back_gives_the_same_logits(tmp_path, monkeypatch, images):
    hub = pytest.importorskip("huggingface_hub")
    model = tiny()
    api = FakeApi(tmp_path / "remote")
    url = push_to_hub(model, "org/name", private=True, revision="main", api=api)
    assert url == "https://huggingface.co/org/name/commit/0123abc"
    assert [c[0] for c in api.calls] == ["create_repo", "upload_folder"]
    assert api.calls[0][2] == dict(private=True, exist_ok=True, repo_type="model")
    assert api.calls[1][2]["revision"] == "main" and api.calls[1][2]["repo_type"] == "model"
    assert "vit_tiny_patch16_224" in api.calls[1][2]["commit_message"]
    remote = tmp_path / "remote" / "org" / "name"
    assert files(remote) == ["README.md", "config.json", "model.safetensors"]

    card = (remote / "README.md").read_text()
    assert front_matter(card) == ["library_name: vitkit", "tags:", "- vitkit", "- vision-transformer",
                                  "- image-classification", "pipeline_tag: image-classification"]
    params = sum(p.numel() for p in model.parameters())
    for text in ['vitkit.from_pretrained("hf-hub:org/name")', f"| parameters | {params:,} |",
                 "3 x 32 x 32", "mean (0.5, 0.5, 0.5), std (0.5, 0.5, 0.5)", "`cat`, `dog`, `a|b`",
                 "2 blocks, width 32, 2 heads, patches 8x8"]:
        assert text in card

    calls = []
    monkeypatch.setattr(hub, "snapshot_download", fake_snapshot_download(remote, calls))
    loaded = vitkit.from_pretrained("hf-hub:org/name")
    assert calls[0][0] == "org/name" and "README.md" not in calls[0][1]
    x = images(2, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert loaded.config.label_names == LABELS


def test_real_hfapi_is_used_without_api(tmp_path, monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    FakeApi.instances.clear()
    monkeypatch.setattr(hub, "HfApi", lambda token=None: FakeApi(tmp_path / "remote", token=token))
    url = push_to_hub(tiny(), "hf-hub:org/name", token="hf_secret", commit_message="first")
    assert url.endswith("/commit/0123abc") and len(FakeApi.instances) == 1
    api = FakeApi.instances[0]
    assert api.token == "hf_secret" and api.calls[1][2]["commit_message"] == "first"
    assert (tmp_path / "remote" / "org" / "name" / "model.safetensors").is_file()


def test_pretrainer_pushes_whole_with_its_own_card(tmp_path):
    from vitkit.selfsup import create_pretrainer

    encoder = vitkit.ViTConfig(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_dim=64,
                               num_classes=0)
    model = randomize(create_pretrainer("mae", encoder, decoder_dim=16, decoder_depth=1, decoder_heads=2,
                                        decoder_mlp_dim=32))
    folder = save_for_hub(model, tmp_path / "out", repo_id="org/mae")
    card = (folder / "README.md").read_text()
    assert front_matter(card) == ["library_name: vitkit", "tags:", "- vitkit", "- vision-transformer",
                                  "- self-supervised", "- mae"]
    assert 'vitkit.from_pretrained("hf-hub:org/mae", encoder_only=True)' in card and "| pre-training | mae" in card
    back = vitkit.from_pretrained(folder)
    assert type(back) is type(model)
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))


# ------------------------------------------------------------------ a training run


def fake_run(root, finished=True):
    """A run folder as vitkit train leaves it (what push reads of it: config, model, summary, PNGs)."""
    run = root / "runs" / "demo"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"recipe": "vit_fmnist", "objective": "classify"}))
    if not finished:
        return run
    tiny().save_pretrained(run / "model")
    (run / "summary.json").write_text(json.dumps({
        "model": "vit_tiny_patch16_224", "dataset": "fashion-mnist", "init": None, "test_top1": 0.87654,
        "val_top1": 0.9, "test_loss": 0.41234, "test_images": 100, "steps": 1200, "epochs": 2.0, "seconds": 123.4,
        "train_img_s": 2345.6, "precision": "bf16", "tiny": "VITKIT_TINY was set: a test-scale run, not a result"}))
    (run / "training_curves.png").write_bytes(b"\x89PNG curves")
    (run / "inspect").mkdir()
    (run / "inspect" / "attention_distance.png").write_bytes(b"\x89PNG distance")
    (run / "inspect" / "report.html").write_text("<html></html>")
    return run


def test_run_push_carries_scores_and_figures(tmp_path):
    run = fake_run(tmp_path)
    api = FakeApi(tmp_path / "remote")
    push_to_hub(run, "me/fmnist-vit", api=api)
    remote = tmp_path / "remote" / "me" / "fmnist-vit"
    assert files(remote) == ["README.md", "config.json", "figures/attention_distance.png",
                             "figures/training_curves.png", "model.safetensors"]
    assert (remote / "figures" / "training_curves.png").read_bytes() == b"\x89PNG curves"
    card = (remote / "README.md").read_text()
    for text in ["## Training", "| test top-1 | 87.65 % |", "| validation top-1 | 90.00 % |",
                 "| test images scored | 100 |",  # a subset's score is said as one (--test-size)
                 "| test loss | 0.4123 |", "| steps | 1,200 |", "| precision | bf16 |", "| dataset | fashion-mnist |",
                 "**Note:** VITKIT_TINY was set", "![training curves](figures/training_curves.png)",
                 "![attention distance](figures/attention_distance.png)"]:
        assert text in card
    assert "initialised from" not in card  # None entries are left out
    # runs/NAME/model is the same run: its card has the scores too
    out = save_for_hub(run / "model", tmp_path / "again")
    assert "| test top-1 | 87.65 % |" in (out / "README.md").read_text() and (out / "figures").is_dir()


def test_unfinished_run_and_bad_inputs_are_refused_before_any_call(tmp_path):
    api = FakeApi(tmp_path / "remote")
    run = fake_run(tmp_path, finished=False)
    with pytest.raises(WeightsError, match="stopped before its first checkpoint"):
        push_to_hub(run, "org/name", api=api)
    with pytest.raises(WeightsError, match="no such run, model folder or weight file"):
        push_to_hub(tmp_path / "missing", "org/name", api=api)
    with pytest.raises(WeightsError, match="has no save_pretrained"):
        push_to_hub(torch.nn.Linear(2, 2), "org/name", api=api)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.png").write_bytes(b"")
    with pytest.raises(WeightsError, match="not an empty folder"):
        save_for_hub(tiny(), tmp_path / "full")
    assert api.calls == []


class NeverSaved(torch.nn.Module):
    def save_pretrained(self, folder):
        raise AssertionError("the repo id is checked before any work")


@pytest.mark.parametrize("repo_id", ["name-only", "a/b/c", "org/", "/name", "org/-name", "org/na--me", "org/na..me",
                                     "org/na me", "org/" + "x" * 97, "", None, 42])
def test_bad_repo_id_fails_before_any_work(tmp_path, repo_id):
    api = FakeApi(tmp_path / "remote")
    with pytest.raises(WeightsError, match="should look like 'org/name'") as e:
        push_to_hub(NeverSaved(), repo_id, api=api)
    assert "\n" not in str(e.value) and api.calls == []


# ------------------------------------------------------------------ huggingface_hub's typed errors


def hub_errors():
    pytest.importorskip("huggingface_hub")
    import huggingface_hub.errors as errors

    return errors


def http_error(cls, status, message):
    """One of huggingface_hub's HTTP errors as the client raises it (a response with a status)."""
    response = types.SimpleNamespace(status_code=status, headers={}, request=None, url="https://huggingface.co",
                                     text="", json=lambda: {})
    return cls(message, response=response)


@pytest.mark.parametrize("where, error, status, expected", [
    ("create_repo", "HfHubHTTPError", 401,
     r"refused creating 'org/name' \(HTTP 401, HfHubHTTPError: 401 Client Error.*token=.*HF_TOKEN"),
    ("create_repo", "HfHubHTTPError", 403, r"refused creating 'org/name' \(HTTP 403"),
    ("upload_folder", "RepositoryNotFoundError", 404, r"no repository 'org/name' you may write to"),
    ("upload_folder", "RevisionNotFoundError", 404, r"'org/name' has no branch 'dev' to commit to"),
    ("upload_folder", "HfHubHTTPError", 500, r"failed while uploading to it \(HTTP 500, HfHubHTTPError"),
])
def test_push_errors_become_one_line(tmp_path, where, error, status, expected):
    err = http_error(getattr(hub_errors(), error), status, f"{status} Client Error: for url\nsecond line")
    api = FakeApi(tmp_path / "remote", fail={where: err})
    with pytest.raises(WeightsError, match=expected) as e:
        push_to_hub(tiny(), "org/name", revision="dev", api=api)
    assert "\n" not in str(e.value) and e.value.__cause__ is err


def test_push_without_network_says_nothing_was_committed(tmp_path):
    api = FakeApi(tmp_path / "remote", fail={"upload_folder": ConnectionError("Connection refused")})
    with pytest.raises(WeightsError, match=r"could not reach .* \(ConnectionError: Connection refused\): nothing"):
        push_to_hub(tiny(), "org/name", api=api)
    # huggingface_hub 1.x's transport: httpx, whose ConnectError is under httpx.HTTPError (it was "failed while
    # creating it", as if the Hub had answered)
    httpx = pytest.importorskip("httpx")
    offline = httpx.ConnectError("[Errno -2] Name or service not known")
    api = FakeApi(tmp_path / "remote2", fail={"create_repo": offline})
    with pytest.raises(WeightsError, match=r"could not reach the Hugging Face Hub while .* \(ConnectError: .*\): "
                                           r"nothing was committed"):
        push_to_hub(tiny(), "org/name", api=api)


def test_push_without_huggingface_hub_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match=r"huggingface_hub is needed for pushing.*vitkit\[hub\]"):
        push_to_hub(NeverSaved(), "org/name")


def _raise(error, cause=None):
    def snapshot_download(*a, **k):
        raise error from cause
    return snapshot_download


@pytest.mark.parametrize("make, expected", [
    (lambda e: http_error(e.RepositoryNotFoundError, 404, "404 Repository Not Found"),
     r"no model repository 'org/name' on the Hugging Face Hub \(if it is private: set HF_TOKEN"),
    (lambda e: http_error(e.GatedRepoError, 403, "403 Cannot access gated repo"),
     r"'org/name' is gated: accept its terms on https://huggingface.co/org/name, then set HF_TOKEN"),
    (lambda e: http_error(e.HfHubHTTPError, 401, "401 Unauthorized"), r"refused access to 'org/name' \(HTTP 401\)"),
    (lambda e: http_error(e.HfHubHTTPError, 500, "500 Server Error"),
     r"could not fetch 'org/name' .*\(HTTP 500, HfHubHTTPError: 500 Server Error\)"),
    (lambda e: e.LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder\nmore"),
     r"could not reach the Hugging Face Hub for 'org/name' and it is not in the cache .*pass its local folder"),
    (lambda e: e.EntryNotFoundError("404 Entry not found"), r"'org/name' lacks a file"),
])
def test_download_errors_say_which_case(monkeypatch, make, expected):
    errors = hub_errors()
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", _raise(make(errors)))
    with pytest.raises(WeightsError, match=expected) as e:
        download_from_hub("org/name@v9")
    assert "\n" not in str(e.value)


def test_download_reads_the_cause_snapshot_download_wraps(monkeypatch):
    """snapshot_download wraps a missing revision (and a connection failure) in LocalEntryNotFoundError."""
    errors = hub_errors()
    import huggingface_hub

    wrapped = errors.LocalEntryNotFoundError("Got: RevisionNotFoundError: 404\nAn error happened")
    missing = http_error(errors.RevisionNotFoundError, 404, "404 Revision Not Found for url")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _raise(wrapped, missing))
    with pytest.raises(WeightsError, match=r"^'org/name' has no revision 'v9': give an existing branch"):
        vitkit.from_pretrained("hf-hub:org/name@v9")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _raise(wrapped, ConnectionError("no route")))
    with pytest.raises(WeightsError, match=r"could not reach .*offline\? LocalEntryNotFoundError: Got"):
        vitkit.from_pretrained("hf-hub:org/name@v9")


# ------------------------------------------------------------------ torch.hub


def test_torch_hub_load_from_a_checkout(tmp_path, images):
    model = torch.hub.load(str(ROOT), "vit_tiny_patch16_224", source="local", num_classes=3, depth=1)
    assert isinstance(model, vitkit.VisionTransformer)
    assert model.config.num_classes == 3 and model.config.depth == 1 and model.config.embed_dim == 192
    saved = tiny().save_pretrained(tmp_path / "tiny")
    shape = dict(patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_dim=64)  # the entry's name, as changed
    for loaded in (torch.hub.load(str(ROOT), "vit_tiny_patch16_224", str(saved), source="local", **shape),
                   torch.hub.load(str(ROOT), "vitkit_model", str(saved), source="local")):
        x = images(1, 32, 32)
        with torch.no_grad():
            assert torch.equal(loaded(x), vitkit.from_pretrained(saved)(x))
    by_name = torch.hub.load(str(ROOT), "vitkit_model", "vit_tiny_patch16_224", source="local", depth=1)
    assert by_name.config.depth == 1
    with pytest.raises(ValueError, match=rf"unknown model '{tmp_path}/tiyn'.*; nor is there a file or folder "
                                         rf"{tmp_path}/tiyn to load weights from"):  # a mistyped folder
        torch.hub.load(str(ROOT), "vitkit_model", str(tmp_path / "tiyn"), source="local")


def test_a_hub_entry_refuses_another_architectures_weights(tmp_path):
    """vit_small_patch16_224 given a Ti-shaped model's weights says so instead of returning that model."""
    saved = tiny().save_pretrained(tmp_path / "tiny")
    with pytest.raises(ValueError, match=r"holds another architecture than vit_small_patch16_224: .*depth 2 \(not 12\)"
                                         r".*vitkit_model"):
        torch.hub.load(str(ROOT), "vit_small_patch16_224", str(saved), source="local")
    with pytest.raises(ValueError, match="embed_dim 32 \\(not 192\\)"):  # the depth given, the width not
        torch.hub.load(str(ROOT), "vit_tiny_patch16_224", str(saved), source="local", depth=2)


@pytest.mark.parametrize("kind", ["none", "relative"])
def test_a_hub_entry_refuses_weights_of_another_position_kind_and_takes_another_form_of_its_table(tmp_path, kind):
    """vit_fmnist (a sine-cosine table) given a run's model without positions, or with a bias in every attention
    layer, returned that model under its name: the form of a table was skipped, and these are no table."""
    saved = vitkit.create_model("vit_fmnist", pos_embed=kind).save_pretrained(tmp_path / kind)
    with pytest.raises(ValueError, match=rf'holds another architecture than vit_fmnist: .*pos_embed "{kind}" '
                                         r'\(not "sincos2d"\)'):
        torch.hub.load(str(ROOT), "vit_fmnist", str(saved), source="local")
    learned = vitkit.create_model("vit_fmnist", pos_embed="learned").save_pretrained(tmp_path / "learned")
    assert torch.hub.load(str(ROOT), "vit_fmnist", str(learned), source="local").config.pos_embed == "learned"


def test_hubconf_lists_every_registered_model():
    """torch.hub.list reads GitHub only; its rule (every public callable of hubconf.py) applied here."""
    spec = importlib.util.spec_from_file_location("vitkit_hubconf", ROOT / "hubconf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    entries = {n for n in dir(module) if callable(getattr(module, n)) and not n.startswith("_")}
    assert entries == set(vitkit.list_models()) | {"vitkit_model"}
    assert module.dependencies == ["torch", "numpy", "safetensors"]
    entry = module.vit_small_patch16_224
    assert entry.__name__ == "vit_small_patch16_224" and "vit_small_patch16_224" in entry.__doc__


# ------------------------------------------------------------------ vitkit push


def test_vitkit_push_uploads_a_run_and_dry_run_only_writes(tmp_path, monkeypatch, capsys):
    from vitkit.cli import main

    hub = pytest.importorskip("huggingface_hub")
    FakeApi.instances.clear()
    monkeypatch.setattr(hub, "HfApi", lambda token=None: FakeApi(tmp_path / "remote", token=token))
    run = fake_run(tmp_path)
    assert main(["push", str(run), "me/vit", "--dry-run", str(tmp_path / "look"), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["files"] == files(tmp_path / "look") and "README.md" in shown["files"]
    assert FakeApi.instances == []  # nothing was pushed
    assert main(["push", str(run), "me/vit", "--private", "--token", "hf_x", "--message", "v1"]) == 0
    out = capsys.readouterr().out
    assert "pushed" in out and 'from_pretrained("hf-hub:me/vit")' in out
    api = FakeApi.instances[0]
    assert api.token == "hf_x" and api.calls[0][2]["private"] is True and api.calls[1][2]["commit_message"] == "v1"
    assert files(tmp_path / "remote" / "me" / "vit") == files(tmp_path / "look")
    for argv, words in [(["push", str(run), "not a repo"], "should look like 'org/name'"),
                        (["push", str(tmp_path / "nothing"), "me/vit"], "not found"),
                        (["push", str(fake_run(tmp_path / "b", finished=False)), "me/vit"], "stopped")]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert len(FakeApi.instances) == 1


@pytest.mark.parametrize("damage, words", [(None, "is missing"), ("{x", "cannot be read (Expecting property name"),
                                           ("[1]", "is not the run's summary (a JSON list, not an object)")])
def test_a_run_whose_summary_is_gone_or_damaged_is_refused_not_pushed_without_its_scores(tmp_path, capsys, damage,
                                                                                         words):
    """The card lost the scores and the note a test-scale run (VITKIT_TINY) carries, with exit 0 and no word: a
    tiny run could pass for a result."""
    from vitkit.cli import main

    run = fake_run(tmp_path)
    if damage is None:
        (run / "summary.json").unlink()
    else:
        (run / "summary.json").write_text(damage)
    for source in (run, run / "model"):
        assert main(["push", str(source), "me/vit", "--dry-run", str(tmp_path / "look")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"summary.json {words}" in err and "the card's scores come from it" in err
        assert not (tmp_path / "look").exists()


def test_a_half_precision_source_is_pushed_in_its_own_precision(tmp_path):
    """A bfloat16 folder was pushed as float32, twice its size, without a word (convert keeps it as stored)."""
    from safetensors import safe_open

    from vitkit.weights.hub import save_for_hub

    model = tiny().to(torch.bfloat16)
    model.save_pretrained(tmp_path / "half")
    out = save_for_hub(tmp_path / "half", tmp_path / "card")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    assert (out / "model.safetensors").stat().st_size <= (tmp_path / "half" / "model.safetensors").stat().st_size + 4096


def test_the_cards_preprocessing_says_what_a_non_square_model_does(tmp_path):
    """A 32 x 48 model's card said "the shorter side resized to 32 / crop fraction, a centre 32 x 48 crop", which no
    square photo can give: vitkit resizes to cover the size keeping the aspect (data/transforms.eval_resize_size)."""
    from vitkit.data.transforms import eval_resize_size
    from vitkit.weights.hub import save_for_hub

    card = (save_for_hub(tiny(img_size=(32, 48)), tmp_path / "wide") / "README.md").read_text()
    assert "resized, keeping its aspect, to cover 32 x 48 / crop fraction, a centre 32 x 48 crop" in card
    assert "shorter side" not in card
    assert eval_resize_size((100, 100), (32, 48), 0.9) == (53, 53)  # a square photo: covers 35 x 53, not 35 x 35
    square = (save_for_hub(tiny(), tmp_path / "square") / "README.md").read_text()
    assert "the shorter side resized to 32 / crop fraction, a centre 32 x 32 crop" in square


def test_the_cards_shape_words_are_counted_and_a_hybrid_has_no_patch_size(tmp_path):
    """"1 blocks" and a hybrid's "patches 1x1" (its tokens are its CNN's cells) were written as they were."""
    from vitkit.weights.hub import save_for_hub

    card = (save_for_hub(tiny(depth=1, num_heads=1), tmp_path / "one") / "README.md").read_text()
    assert "1 block, width 32, 1 head, patches 8x8" in card
    hybrid = (save_for_hub(vitkit.create_model("vit_fmnist_hybrid"), tmp_path / "hybrid") / "README.md").read_text()
    assert "patches" not in hybrid and "heads" in hybrid
