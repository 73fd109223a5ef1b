"""Every command and Python block of README.md and docs/*.md runs as written.

Each document runs top to bottom in its own empty folder, with ``VITKIT_TINY=1`` (vitkit/tiny.py:
at most 2 steps of 16 images, the first 3,000/100 images of a split) so hours become seconds
without changing a word. ``vitkit`` lines run in this process through ``vitkit.cli.main`` (one
torch import for all of them); other commands (``torchrun``, ``python``) run as processes. Shell
variables set in a block (``RUN=runs/mae``) carry to later lines. Python blocks share one
namespace per document. `make test` (CI) runs the README this way and, for every page, only what
costs nothing: each vitkit command parsed (a training command's settings resolved) and each Python
block compiled; `make test-full` runs every page.

A block is marked on the line before its fence:
    <!-- docs-test: skip: REASON -->   not run, and the reason is said in the document
    <!-- docs-test: file NAME -->      the block is a file the next commands read (my.yaml)
The inputs a reader downloads (ViT-B_16.npz, S24_224.pth, convit_small.pth, CIFAR-10, a
torchvision teacher, an ImageNet folder) are stood in by small files of the same layout made
here, since CI is offline; the README says where the real ones come from.
"""

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
RUN_LANGS = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python"}
MARK = re.compile(r"^<!--\s*docs-test:\s*(skip|file)\s*:?\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclass
class Block:
    doc: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    mark: Optional[str] = None  # "skip" or "file"
    arg: str = ""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(text: str, doc: str = "doc") -> List[Block]:
    """The fenced blocks of a Markdown text, with the docs-test mark of the line before each."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{doc}:{i + 1}: a code fence is never closed")
        mark = MARK.match(lines[i - 1]) if i else None
        out.append(Block(doc, i + 1, m.group(1).lower(), "\n".join(lines[i + 1:end]) + "\n",
                         mark.group(1) if mark else None, mark.group(2) if mark else ""))
        i = end + 1
    return out


def commands(text: str) -> List[str]:
    """A shell block's commands: continuation lines joined, blank and comment-only lines dropped."""
    out, current = [], ""
    for line in text.splitlines():
        current += line
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip() and not current.strip().startswith("#"):
            out.append(current.strip())
        current = ""
    return out


class Shell:
    """The few shell forms the documents use: ``NAME=value``, ``$NAME``, a command and its words."""

    def __init__(self, cwd: Path, env: dict):
        self.cwd, self.env, self.vars = cwd, env, {}
        self.ran = 0
        self.seconds = {}  # command -> wall clock, to keep the check fast

    def run(self, command: str, where: str) -> None:
        t0 = time.perf_counter()
        try:
            self._run(command, where)
        finally:
            self.seconds[f"{where} {command[:60]}"] = time.perf_counter() - t0
            if os.environ.get("DOCS_TEST_TIMES"):
                print(f"{time.perf_counter() - t0:6.1f} s  {where} {command[:70]}", file=sys.__stderr__)

    def expand(self, command: str) -> str:
        def value(m):
            name = m.group(1) or m.group(2)
            if name not in self.vars:
                raise AssertionError(f"${name} is used but never set in the document")
            return self.vars[name]
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, command)

    def _run(self, command: str, where: str) -> None:
        words = shlex.split(self.expand(command), comments=True)
        if len(words) == 1 and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
            name, _, val = words[0].partition("=")
            self.vars[name] = val
            return
        self.ran += 1
        if words[0] == "vitkit":
            from vitkit.cli import main

            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(words[1:])
            assert code == 0, f"{where}: `{command}` exited {code}:\n{err.getvalue()[-3000:]}"
            return
        env = self.env
        if words[0] in ("torchrun", "python", "python3"):  # this environment's
            words[0] = str(Path(sys.executable).parent / words[0]) if words[0] == "torchrun" else sys.executable
        if words[0].endswith("torchrun"):  # a free port of its own: another test's torchrun may hold 29500
            env = {**(env if env is not None else os.environ), "PET_STANDALONE": "1"}
        done = subprocess.run(words, cwd=self.cwd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{where}: `{command}` exited {done.returncode}:\n{done.stderr[-3000:]}"


# --------------------------------------------------------------------------- stand-ins


def stand_ins(folder: Path) -> Path:
    """Small files in the layouts the README's downloads have; returns the CIFAR-10 data folder."""
    import torchvision
    from PIL import Image

    import vitkit

    torch.manual_seed(0)
    # the official ImageNet-21k ViT-B/16: vit_jax npz with a pre-logits layer and 21,843 classes
    npz = vitkit.create_model("B/16", embed_dim=64, depth=2, num_heads=2, mlp_dim=128, representation_size=64,
                              num_classes=21843)
    vitkit.export_weights(npz, folder / "ViT-B_16.npz", format="npz")
    for name, model in (("S24_224.pth", vitkit.create_model("cait_s24_224", embed_dim=48, depth=2, num_heads=4)),
                        ("convit_small.pth", vitkit.create_model("convit_small", embed_dim=48, depth=3,
                                                                 num_heads=4, local_up_to_layer=2))):
        torch.save({"model": model.state_dict()}, folder / name)  # the official .pth: timm's names under 'model'
    torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), folder / "r18_cifar10.pth")
    rng = np.random.default_rng(0)
    for split in ("train", "val"):  # an ImageNet-style folder: imagenet/{train,val}/<wnid>/*.JPEG
        for wnid in ("n01440764", "n01443537", "n01484850"):
            (folder / "imagenet" / split / wnid).mkdir(parents=True)
            for k in range(6 if split == "train" else 2):
                Image.fromarray(rng.integers(0, 256, (64, 80, 3), dtype=np.uint8)).save(
                    folder / "imagenet" / split / wnid / f"{wnid}_{k}.JPEG")
    data = folder / "data" / "cifar-10-batches-bin"  # the binary version's files, random pixels
    data.mkdir(parents=True)
    from vitkit.data import cifar

    for i, name in enumerate(cifar.VARIANTS["cifar10"].data_files):
        n = 100
        labels = np.arange(n, dtype=np.uint8)[:, None] % 10
        pixels = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        (data / name).write_bytes(np.concatenate([labels, pixels], 1).tobytes())
    return folder / "data"


# --------------------------------------------------------------------------- the documents


def test_the_parser_joins_continuations_reads_marks_and_the_shell_fails_loudly(tmp_path):
    doc = ("text\n<!-- docs-test: skip: needs 8 GPUs -->\n```bash\ntorchrun x\n```\n"
           "```bash\nRUN=runs/a   # the run\nvitkit models \\\n   --filter 'vit_tiny*'\n# only a comment\n"
           "vitkit info $RUN\n```\n<!-- docs-test: file my.yaml -->\n```yaml\nepochs: 1\n```\n")
    found = blocks(doc)
    assert [(b.lang, b.mark, b.arg, b.line) for b in found] == [("bash", "skip", "needs 8 GPUs", 3),
                                                              ("bash", None, "", 6), ("yaml", "file", "my.yaml", 14)]
    assert commands(found[1].text) == ["RUN=runs/a   # the run", "vitkit models     --filter 'vit_tiny*'",
                                       "vitkit info $RUN"]
    shell = Shell(tmp_path, dict(os.environ))
    for command in commands(found[1].text)[:2]:
        shell.run(command, "doc:6")
    assert shell.vars == {"RUN": "runs/a"} and shell.ran == 1
    with pytest.raises(AssertionError, match="exited 2"):  # runs/a is no model: the failure is reported
        shell.run("vitkit info $RUN", "doc:10")
    with pytest.raises(AssertionError, match=r"\$NODE is used but never set"):
        shell.run("torchrun --node-rank $NODE", "doc:11")


def test_every_block_is_run_or_marked_with_a_reason():
    for doc in DOCS:
        for b in blocks((ROOT / doc).read_text(), doc):
            assert b.mark != "skip" or len(b.arg) > 10, f"{b.where}: a skipped block needs its reason"
            assert b.lang in RUN_LANGS or b.mark == "file" or b.lang in ("text", "yaml", "json", "html"), \
                f"{b.where}: a fence needs its language (bash, python, text, ...)"


def vitkit_words(command: str, variables: dict) -> Optional[List[str]]:
    """The words after ``vitkit`` of a command that runs vitkit (``vitkit``, ``python -m vitkit``,
    ``torchrun ... -m vitkit``), with the document's ``$NAME`` values; None for other commands."""
    words = shlex.split(re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: variables.get(m.group(1) or m.group(2), "X"), command),
                        comments=True)
    if words and words[0] == "vitkit":
        return words[1:]
    at = next((i for i in range(len(words) - 1) if words[i:i + 2] == ["-m", "vitkit"]), None)
    return words[at + 2:] if at is not None and words[0] in ("python", "python3", "torchrun") else None


@pytest.mark.parametrize("doc", DOCS)
def test_every_documented_command_parses_and_every_python_block_compiles(doc, tmp_path, monkeypatch):
    """The part of running a document that costs nothing (``make test``; ``make test-full`` runs every page):
    each vitkit command's flags and values are the parser's, a training command's settings are a valid run
    (its recipe, --config file and flags resolved as `vitkit train` resolves them), and the Python is Python."""
    from vitkit.cli import build_parser, train_config

    monkeypatch.chdir(tmp_path)
    variables, parsed = {}, 0
    for b in blocks((ROOT / doc).read_text(), doc):
        if b.mark == "file":
            (tmp_path / b.arg).write_text(b.text)
        if b.mark == "skip" or b.mark == "file":
            continue
        if b.lang == "python":
            compile(b.text, b.where, "exec")
        elif RUN_LANGS.get(b.lang) == "shell":
            for command in commands(b.text):
                assignment = re.fullmatch(r"([A-Za-z_]\w*)=(\S*)(\s+#.*)?", command)
                if assignment:
                    variables[assignment.group(1)] = assignment.group(2)
                    continue
                words = vitkit_words(command, variables)
                if words is None:
                    continue
                parser = build_parser()
                verbs = next(a for a in parser._actions if a.dest == "verb").choices
                try:
                    args, extra = parser.parse_known_args(words)
                    if extra:
                        verbs[args.verb].unknown(extra)
                    if getattr(args, "verb", None):
                        verbs[args.verb].check_values(args)
                except SystemExit:
                    pytest.fail(f"{b.where}: `{command}` does not parse (the error is above)")
                if getattr(args, "verb", None) in ("train", "pretrain") and not args.resume:
                    train_config(args, getattr(args, "objective", None))
                parsed += 1
    assert parsed or doc not in ("README.md", "docs/cli.md", "docs/training.md")


@pytest.mark.slow
@pytest.mark.parametrize("doc", [d if d == "README.md" else pytest.param(d, marks=pytest.mark.full) for d in DOCS])
def test_the_document_runs_as_written(doc, tmp_path, monkeypatch, capsys):
    from vitkit.data import fashion_mnist as fm

    if not fm._complete(fm.DEBIAN_DIR):
        pytest.skip("Debian dataset-fashion-mnist not installed")
    found = blocks((ROOT / doc).read_text(), doc)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VITKIT_TINY", "1")
    monkeypatch.setenv("VITKIT_DATA", str(stand_ins(tmp_path)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    shell = Shell(tmp_path, dict(os.environ))
    namespace = {"__name__": "__docs__"}
    ran, python, skipped = 0, 0, []
    for b in found:
        if b.mark == "skip":
            skipped.append(b)
        elif b.mark == "file":
            (tmp_path / b.arg).write_text(b.text)
        elif RUN_LANGS.get(b.lang) == "shell":
            for command in commands(b.text):
                shell.run(command, b.where)
            ran += 1
        elif b.lang == "python":
            t0 = time.perf_counter()
            exec(compile(b.text, b.where, "exec"), namespace)  # noqa: S102 -- the document's own code
            shell.seconds[f"{b.where} python"] = time.perf_counter() - t0
            python += 1
    with capsys.disabled():
        print(f"\n{doc}: {ran} shell blocks ({shell.ran} commands) and {python} Python blocks ran as written; "
              f"{len(skipped)} marked not to run ({'; '.join(f'{b.where}: {b.arg}' for b in skipped)})")
        slow = sorted(shell.seconds.items(), key=lambda kv: -kv[1])[:8]
        print(f"  {sum(shell.seconds.values()):.0f} s; slowest: " + "; ".join(f"{k} {v:.1f} s" for k, v in slow))
