"""Which of open_clip's image towers vitkit loads with parity, from the files its hub repositories hold.

The companion of ``coverage.py`` (timm's list) and ``coverage_hf.py`` (transformers' classes) for open_clip:
every model config open_clip lists whose image tower is a ViT (its own ``VisionTransformer``, or a timm model
of timm's ViT-family modules under ``visual.trunk.``) is built with every parameter noised, its text tower
made small (vitkit reads the image tower only), saved as open_clip's hub repositories hold it
(``open_clip_model.safetensors`` and ``open_clip_config.json``) and read with ``vitkit.from_pretrained``;
``encode_image`` of two images is compared in fp32 with vitkit's output. Rows: ``parity`` (max |difference|
<= 1e-5 x max(1, max |reference|)), ``refused`` (one line, kept), ``mismatch`` (loads, computes something
else: a bug), ``error`` (another exception: a bug), ``skipped`` (a ResNet or a convolutional timm trunk: not
a ViT; past ``--max-params``; or open_clip cannot build it here). ``--layers N`` builds open_clip's own towers
N blocks deep (a smoke run; timm's are built as named).

    python benchmarks/coverage_open_clip.py                       # every ViT tower up to 1B parameters
    python benchmarks/coverage_open_clip.py --markdown docs/weights.md
    python benchmarks/coverage_open_clip.py --only 'ViT-B-*' --layers 1
    python benchmarks/coverage_open_clip.py --only 'coca_*' --merge benchmarks/results/coverage_open_clip_X.json
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import inspect
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import open_clip
import timm
import torch

import vitkit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, however run
from bench_inference import dated_name, git_revision, machine_info, results_path  # noqa: E402

_spec = importlib.util.spec_from_file_location("vitkit_bench_coverage", Path(__file__).with_name("coverage.py"))
_timm_coverage = importlib.util.module_from_spec(_spec)  # by path: a `coverage` package may be imported already
_spec.loader.exec_module(_timm_coverage)
TOLERANCE, MODULES, noised, one_line = (_timm_coverage.TOLERANCE, _timm_coverage.MODULES, _timm_coverage.noised,
                                        _timm_coverage.one_line)
write_markdown, write_results = _timm_coverage.write_markdown, _timm_coverage.write_results

#: the text tower every model is built with: vitkit reads the image tower and leaves the text tower out
TEXT = {"context_length": 8, "vocab_size": 100, "width": 32, "heads": 2, "layers": 1}
TABLE = ("<!-- open-clip-coverage-table:start -->", "<!-- open-clip-coverage-table:end -->")


def tower_kind(vision: dict) -> str | None:
    """'native' (open_clip's VisionTransformer), 'timm' (a ViT-family timm model), or None: not a ViT (a
    ResNet, a convolutional or hybrid timm trunk, a transformers tower)."""
    if isinstance(vision.get("layers"), (list, tuple)) or vision.get("hf_model_name"):
        return None
    name = vision.get("timm_model_name")
    if not name:
        return "native"
    return "timm" if timm.models.is_model_in_modules(name, MODULES) else None


def configs(only: str | None = None) -> list:
    """(name, model config) of every open_clip config (``only``: a shell pattern of names)."""
    return [(n, open_clip.get_model_config(n)) for n in open_clip.list_models()
            if not only or fnmatch.fnmatch(n, only)]


def build(cfg: dict, layers: int | None):
    """open_clip's CLIP of ``cfg`` with the small text tower (and ``layers`` blocks in its own tower)."""
    vision = dict(cfg["vision_cfg"])
    if layers and tower_kind(vision) == "native":
        vision["layers"] = min(int(vision["layers"]), layers)
    accepted = inspect.signature(open_clip.CLIP).parameters
    kw = {k: v for k, v in cfg.items() if k in accepted and k not in ("vision_cfg", "text_cfg")}
    return open_clip.CLIP(vision_cfg=vision, text_cfg=dict(TEXT), **kw), dict(kw, vision_cfg=vision, text_cfg=TEXT)


def check(name: str, cfg: dict, workdir: Path, max_params: float, layers: int | None) -> dict:
    row = dict(name=name)
    kind = tower_kind(cfg.get("vision_cfg", {}))
    if kind is None:
        row.update(status="skipped", message="not a ViT tower")
        return row
    row["tower"] = kind
    start = time.perf_counter()
    try:
        with torch.device("meta"):
            params = sum(p.numel() for p in build(cfg, layers)[0].visual.parameters())
        row["params"] = params
        if params > max_params:
            row.update(status="skipped", message=f"{params / 1e6:.0f}M parameters, past --max-params")
            return row
        ref, saved_cfg = build(cfg, layers)
        ref = noised(ref)
    except Exception as e:  # open_clip cannot build it here (a tokenizer or a download it needs)
        row.update(status="skipped", message=one_line(e))
        return row
    folder = workdir / name
    folder.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": saved_cfg, "preprocess_cfg": {}}))
    try:
        ours = vitkit.from_pretrained(folder).eval()
    except vitkit.weights.io.WeightsError as e:
        row.update(status="refused", message=str(e).replace(str(folder), "FOLDER"))
        return row
    except Exception as e:
        row.update(status="error", message=one_line(e))
        return row
    size = ref.visual.image_size if hasattr(ref.visual, "image_size") else cfg["vision_cfg"].get("image_size", 224)
    h, w = (size, size) if isinstance(size, int) else size
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(1))
    try:
        want, got = ref.encode_image(x), ours(x)
        want = want[0] if isinstance(want, tuple) else want  # (pooled, tokens) of a tower that outputs its tokens
    except Exception as e:
        row.update(status="error", message=one_line(e))
        return row
    diff = (want - got).abs().max().item() if want.shape == got.shape else float("inf")
    ok = diff <= TOLERANCE * max(1.0, want.abs().max().item())
    row.update(status="parity" if ok else "mismatch", max_diff=diff, architecture=ours.config.name
               or ours.config.architecture, seconds=round(time.perf_counter() - start, 2))
    if not ok:
        row["message"] = f"max |difference| {diff:.2e} ({list(want.shape)} vs {list(got.shape)})"
    return row


def summary(rows: list) -> dict:
    counts = {s: sum(r["status"] == s for r in rows) for s in ("parity", "refused", "mismatch", "error", "skipped")}
    counted = len(rows) - counts["skipped"]
    return dict(towers=counted, **counts, parity_share=counts["parity"] / max(1, counted))


def _merged_note(merged) -> str:
    if not merged:
        return ""
    return (f"; {len(merged['rerun'])} configs run then, the others at {str(merged['git_revision'])[:12]}, "
            f"{merged['date']}")


def markdown(rows: list, info: dict) -> str:
    s = summary(rows)
    lines = [f"{s['parity']} of {s['towers']} ViT towers of open_clip's configs load with parity; {s['refused']} "
             f"are refused in one line, {s['mismatch']} load with other outputs, {s['error']} fail otherwise "
             f"({s['skipped']} configs skipped: not a ViT, or past {info['max_params'] / 1e9:g}B parameters; "
             f"open_clip {open_clip.__version__}, vitkit {str(info.get('git_revision'))[:12]}, {info.get('date')}"
             f"{', open_clip towers ' + str(info['layers']) + ' blocks deep' if info.get('layers') else ''}"
             f"{_merged_note(info.get('merged'))}).", "",
             "| config | tower | vitkit |", "|---|---|---|"]
    for r in rows:
        if r["status"] == "skipped":
            continue
        what = f"parity ({r['max_diff']:.1e}, as `{r['architecture']}`)" if r["status"] == "parity" else \
            f"{r['status']}: {r.get('message', '')}".replace("|", "\\|")
        lines.append(f"| `{r['name']}` | {r.get('tower', '')} | {what} |")
    return "\n".join(lines)


def merged(earlier: dict, rerun: list, info: dict, source: str) -> list:
    """The earlier run's rows in their order, each config run again replaced by its new row; the info says which
    rows are whose (the earlier run's revision and date stay in ``merged``)."""
    if earlier.get("machine", {}).get("layers") or earlier.get("machine", {}).get("max_params") != info["max_params"]:
        raise SystemExit(f"coverage_open_clip: --merge {source} is a smoke run or another --max-params: merge into a "
                         f"full run's results")
    new = {r["name"]: r for r in rerun}
    rows = [new.pop(r["name"], r) for r in earlier["rows"]] + list(new.values())
    info["merged"] = dict(file=source, rerun=sorted(r["name"] for r in rerun),
                          git_revision=earlier["machine"].get("git_revision"), date=earlier["machine"].get("date"))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="results file or folder (default benchmarks/results/coverage_open_clip_<device>_"
                                 "<date>.json)")
    p.add_argument("--markdown", type=Path, help="rewrite the coverage table in this page")
    p.add_argument("--only", help="a shell pattern of open_clip config names (a smoke run)")
    p.add_argument("--max-params", type=float, default=1e9, help="the largest image tower built (default 1e9)")
    p.add_argument("--layers", type=int, help="open_clip's own towers this many blocks deep (a smoke run)")
    p.add_argument("--merge", type=Path, help="an earlier full run's results: its rows are kept, those of the "
                                              "configs --only names are run again (a change that touches a few)")
    args = p.parse_args(argv)
    if args.merge and (args.layers or not args.only):
        p.error("--merge reruns the configs --only names at full depth (no --layers) over a full run's results")
    info = machine_info(torch.device("cpu"), limits=False)
    info.update(git_revision=git_revision(), date=time.strftime("%Y-%m-%d"), open_clip=open_clip.__version__,
                timm=timm.__version__, torch=torch.__version__, max_params=args.max_params, layers=args.layers,
                tolerance=f"max|diff| <= {TOLERANCE} x max(1, max|reference|)")
    out = results_path(args.out, dated_name("coverage_open_clip", torch.device("cpu"), info),
                       smoke=bool((args.only and not args.merge) or args.layers))
    todo = configs(args.only)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vitkit-coverage-open-clip-") as tmp, torch.no_grad(), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # open_clip's and vitkit's notes: the row says what matters
        for i, (name, cfg) in enumerate(todo):
            row = check(name, cfg, Path(tmp), args.max_params, args.layers)
            rows.append(row)
            said = f" {row['max_diff']:.1e}" if row["status"] == "parity" else f" -- {row.get('message', '')[:160]}"
            print(f"[{i + 1}/{len(todo)}] {name}: {row['status']}{said}", flush=True)
            for leftover in Path(tmp).iterdir():  # one tower's files at a time on the disk
                for f in leftover.iterdir():
                    f.unlink()
                leftover.rmdir()
    if args.merge:
        rows = merged(json.loads(args.merge.read_text()), rows, info, args.merge.name)
    write_results(out, info, summary(rows), rows)
    if args.markdown:
        write_markdown(args.markdown, markdown(rows, info), TABLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
