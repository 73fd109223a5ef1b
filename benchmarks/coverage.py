"""Which of timm's ViT-family architectures vitkit loads with parity, from timm's own hub layout.

For every architecture with pretrained weights in timm's ViT-family modules (vision_transformer,
vision_transformer_hybrid, vision_transformer_relpos, deit, cait, convit, eva, beit, deepseek_vit, qwen3_vit,
naflexvit, vision_transformer_sam, gemma4_vit) up to ``--max-params`` (1B by default), timm builds it with random
weights (every parameter noised, so no mapping is trivial) and saves it as ``timm.models.save_for_hf`` does for the
Hub (``config.json`` + ``model.safetensors``: what ``hf-hub:timm/...`` delivers); ``vitkit.from_pretrained(folder)``
loads it, and the fp32 outputs of two images (logits, or pooled features for towers without a head; where timm's
model gives tokens, DeepSeek's ``_enc`` the language model's, vitkit's ``forward_features``) are compared.
A row is ``parity`` when max |difference| <= 1e-5 x max(1, max |timm's output|) (or, past it, when both
agree within 1e-9 of that in float64: the rounding of a deep stack, said in the row); ``refused`` when vitkit
says in one line why it cannot (the line is kept); ``mismatch`` when it loads and computes something
else; ``error`` for any other exception (a bug: a traceback where a line belongs).

    python benchmarks/coverage.py                         # every architecture up to 1B parameters
    python benchmarks/coverage.py --max-params 120e6      # the smaller ones (minutes)
    python benchmarks/coverage.py --min-params 100e6 --wide   # the larger ones, at two sizes
    python benchmarks/coverage.py --only 'vit_*siglip*'   # a shell pattern
    python benchmarks/coverage.py --markdown docs/models.md   # also rewrite the table in that page
    python benchmarks/coverage.py --recheck results.json      # only the rows that were not parity, again
    python benchmarks/coverage.py --bare                      # bare state dicts (tensors only, no config.json)
    python benchmarks/coverage.py --wide                      # also at a changed, non-square size

``--bare`` saves each model's tensors alone (one ``.safetensors``, no config): vitkit reads the
architecture off the names and shapes. A wrong reading must never pass in silence: a row whose outputs
differ is ``guessed`` when vitkit warned which fields it assumed (``GuessWarning``), ``mismatch`` (a bug)
when it said nothing.

Models past ``--large`` parameters (300M) run at a smaller image size (``model_args`` img_size: the
hub config carries it, so vitkit must read it) to keep the run within the machine. This is a
benchmark, not a test: it takes about an hour on a 2-core CPU for the whole list.
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import timm
import torch
from safetensors.torch import save_model
from timm.models import save_for_hf

import vitkit
from vitkit.weights.pretrained import GuessWarning

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling module, however run
from bench_inference import dated_name, git_revision, machine_info, results_path  # noqa: E402

MODULES = ("vision_transformer", "vision_transformer_hybrid", "vision_transformer_relpos", "deit", "cait", "convit",
           "eva", "beit", "deepseek_vit", "qwen3_vit", "naflexvit", "vision_transformer_sam", "gemma4_vit")
TOLERANCE = 1e-5
#: past the fp32 tolerance, the same check in float64 (models up to FP64_CHECK parameters) tells rounding
#: from another function
FP64_TOLERANCE, FP64_CHECK = 1e-9, 400e6
TABLE_START, TABLE_END = "<!-- coverage-table:start -->", "<!-- coverage-table:end -->"


def architectures(max_params: float, only: str | None, min_params: float = 0.0) -> list:
    """(name, module, parameters) of every ViT-family architecture with pretrained weights, smallest first."""
    rows = []
    for module in MODULES:
        for name in sorted({n.split(".")[0] for n in timm.list_models(module=module, pretrained=True)}):
            if only and not fnmatch.fnmatch(name, only):
                continue
            with torch.device("meta"):
                params = sum(p.numel() for p in timm.create_model(name).parameters())
            if min_params < params <= max_params:
                rows.append((name, module, params))
    return sorted(rows, key=lambda r: r[2])


@torch.no_grad()
def noised(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter replaced by noise (norm weights around 1), scaled to keep deep models finite."""
    g = torch.Generator().manual_seed(seed)
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            noise = torch.randn(p.shape, generator=g) * 0.02
            if "Norm" in type(module).__name__ and name == "weight":
                noise += 1.0
            p.copy_(noise)
    return model.eval()


def small_size(model) -> tuple | None:
    """A smaller image size for a large model (a multiple of its patch, about 112 px; of its merger's or soft
    tokens' blocks of patches where it has them: Qwen3's, Gemma 4's), or None."""
    inner = getattr(model, "encoder", None) or model  # (timm's VLM classifiers keep the ViT in their encoder)
    embed = getattr(inner, "patch_embed", None) or getattr(inner, "embeds", None)  # (NaFlexViT's: embeds)
    patch = getattr(embed, "patch_size", None)
    if patch is None:
        return None
    p = (patch[0] if isinstance(patch, (tuple, list)) else patch) * getattr(inner, "merge_size", 1) * \
        getattr(inner, "pooling_kernel_size", 1)  # (Gemma 4's soft tokens: whole 3 x 3 blocks of patches)
    side = max(1, round(112 / p)) * p
    return (side, side)


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}"[:400]


def wide(ref, folder: Path, size: list, fp64: bool = True) -> dict:
    """The same weights at a changed, non-square size (two more patch columns): timm's ``set_input_size``
    (its tables resampled its way) against ``vitkit.from_pretrained(folder, img_size=...)``: issue 41's "a
    changed image size with the right resampling for each position kind". ``n/a``: timm cannot resize it."""
    grid = getattr(getattr(ref, "patch_embed", None), "grid_size", None)
    if not hasattr(ref, "set_input_size") or grid is None:
        return dict(status="n/a", message="timm has no set_input_size for it")
    new = (size[0], size[1] + 2 * (size[1] // int(grid[1])))  # two more columns of tokens (a hybrid's stride)
    try:
        ref.set_input_size(img_size=new)
    except Exception as e:
        return dict(status="n/a", message=f"timm: {one_line(e)}")
    x = torch.randn(2, 3, *new, generator=torch.Generator().manual_seed(3))
    try:
        expected = ref(x).float()
        ours = vitkit.from_pretrained(folder, img_size=new)
        got = output(ours, x, expected).float()
    except Exception as e:
        return dict(status="error", message=one_line(e), img_size=list(new))
    ok, found = agreement(expected, got, x, ref if fp64 else None, ours)
    found.pop("output_scale")
    return dict(status="parity" if ok else "mismatch", **found, img_size=list(new))


def output(ours, x: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """vitkit's answer to compare with timm's: the forward's, or where timm's model gives tokens (DeepSeek's
    ``_enc``: the language model's), ``forward_features``'."""
    return ours(x) if expected.dim() == 2 else ours.forward_features(x)


def agreement(expected: torch.Tensor, got: torch.Tensor, x: torch.Tensor, ref=None, ours=None) -> tuple:
    """(within the tolerance, {max_diff, output_scale[, fp64_max_diff]}): past it in fp32, with both models
    given, they are compared again in float64 (the rounding of a deep stack agrees to ~1e-13 there, another
    function does not)."""
    diff = (got - expected).abs().max().item() if got.shape == expected.shape else math.inf
    scale = max(1.0, expected.abs().max().item())
    found = dict(max_diff=diff, output_scale=scale)
    ok = diff <= TOLERANCE * scale
    if not ok and ref is not None and got.shape == expected.shape:
        with torch.no_grad():
            found["fp64_max_diff"] = (ref.double()(x.double()) - output(ours.double(), x.double(), expected)
                                      ).abs().max().item()
        ref.float(), ours.float()  # .double() converted them in place: --wide runs them in fp32 after
        ok = found["fp64_max_diff"] <= FP64_TOLERANCE * scale
    return ok, found


def check(name: str, module: str, params: int, large: float, workdir: Path, bare: bool = False,
          wide_too: bool = False) -> dict:
    row = dict(arch=name, module=module, params=params)
    start = time.perf_counter()
    try:
        kw = {}
        if params > large:
            with torch.device("meta"):
                size = small_size(timm.create_model(name))
            if size is not None:
                kw["img_size"] = size
        try:
            ref = noised(timm.create_model(name, **kw))
        except Exception:  # some cannot change their size (fixed tables): native size
            kw = {}
            ref = noised(timm.create_model(name))
        row["img_size"] = list(kw.get("img_size") or ref.pretrained_cfg.get("input_size", (3, 224, 224))[1:])
        folder = workdir / name
        if bare:  # the tensors alone
            folder.mkdir()
            folder = folder / "weights.safetensors"
            save_model(ref, str(folder))
        else:
            save_for_hf(ref, str(folder), safe_serialization=True)
        h, w = row["img_size"]
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(1))
        expected = ref(x).float()
        ref_params = sum(p.numel() for p in ref.parameters())  # at the size it runs at (the table's slots)
        fp64 = ref_params <= FP64_CHECK
        if not fp64 and not wide_too:
            ref = None  # not kept for a float64 check (nor --wide): the memory goes to vitkit's model
            gc.collect()
    except Exception as e:
        row.update(status="skipped", message=f"timm could not build or save it: {one_line(e)}")
        return row
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", GuessWarning)
            ours = vitkit.from_pretrained(folder)
        notes = [" ".join(str(w.message).split()) for w in said if issubclass(w.category, GuessWarning)]
        if notes:
            row["assumed"] = notes
        # the normalisation a bare file is said to have assumed is the images', not the model's: it explains no
        # difference in the outputs compared here
        assumed = [n for n in notes if "input normalisation" not in n]
    except (ValueError, TypeError, OSError) as e:
        row.update(status="refused", message=one_line(e), seconds=round(time.perf_counter() - start, 1))
        return row  # (ref goes with the frame)
    except Exception as e:
        row.update(status="error", message=one_line(e), traceback=traceback.format_exc()[-2000:])
        return row
    try:
        with torch.no_grad():
            try:
                got = output(ours, x, expected).float()
            except ValueError as e:  # timm's input size against the image size vitkit read (or said it assumed)
                row.update(status="guessed" if assumed else "refused", message=one_line(e),
                           seconds=round(time.perf_counter() - start, 1))
                return row
        row["vitkit_params"] = sum(p.numel() for p in ours.parameters())
        same_params = row["vitkit_params"] == ref_params
        # fp32 rounding of a deep stack (a ResNet under a ViT-L amplifies it ~1e-4) or another function?
        ok, found = agreement(expected, got, x, ref if same_params and fp64 else None, ours)
        row.update(found, shape=list(expected.shape))
        ok = ok and same_params
        if ok and "fp64_max_diff" in row:
            row["message"] = f"fp32 rounding: {row['max_diff']:.1e} in fp32, {row['fp64_max_diff']:.1e} in float64"
        row["status"] = "parity" if ok else "guessed" if assumed else "mismatch"
        if row["vitkit_params"] != ref_params:
            row["message"] = f"{row['vitkit_params']:,} parameters where timm has {ref_params:,}"
        if wide_too and row["status"] == "parity" and ref is not None and not bare:
            del ours
            row["wide"] = wide(ref, folder, row["img_size"], fp64)
    except Exception as e:
        row.update(status="error", message=one_line(e), traceback=traceback.format_exc()[-2000:])
    row["seconds"] = round(time.perf_counter() - start, 1)
    del ref
    gc.collect()
    return row


def summary(rows: list) -> dict:
    counts = {s: sum(r["status"] == s for r in rows)
              for s in ("parity", "refused", "guessed", "mismatch", "error", "skipped")}
    counted = len(rows) - counts["skipped"]
    out = dict(architectures=counted, **counts, parity_share=counts["parity"] / counted if counted else 0.0)
    if any("wide" in r for r in rows):
        out["wide"] = {s: sum(r.get("wide", {}).get("status") == s for r in rows)
                       for s in ("parity", "mismatch", "error", "n/a")}
    return out


def markdown(rows: list, info: dict) -> str:
    s = summary(rows)
    lines = [f"{s['parity']} of {s['architectures']} architectures ({100 * s['parity_share']:.0f}%) load with "
             f"parity; {s['refused']} are refused in one line, "
             + (f"{s['guessed']} load with other outputs and say what they assumed, " if s["guessed"] else "")
             + f"{s['mismatch']} load with other outputs, "
             f"{s['error']} fail otherwise (timm {timm.__version__}, vitkit {str(info.get('git_revision'))[:12]}, "
             f"{info.get('date')}).", "",
             "| architecture | timm module | parameters | vitkit |", "|---|---|---|---|"]
    for r in rows:
        if r["status"] == "parity":
            what = f"parity ({r['max_diff']:.1e}" + (f"; float64 {r['fp64_max_diff']:.1e}" if "fp64_max_diff" in r
                                                      else "") + ")"
        else:
            what = f"{r['status']}: {r.get('message', '')}".replace("|", "\\|")
        lines.append(f"| `{r['arch']}` | {r['module']} | {r['params'] / 1e6:.1f}M | {what} |")
    return "\n".join(lines)


def write_markdown(path: Path, table: str, markers: tuple = (TABLE_START, TABLE_END)) -> None:
    """The table between the page's markers (appended with them where the page has none)."""
    start, end = markers
    text = path.read_text() if path.exists() else ""
    block = f"{start}\n{table}\n{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda m: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-params", type=float, default=1e9)
    p.add_argument("--min-params", type=float, default=0.0, help="only architectures with more parameters than this")
    p.add_argument("--large", type=float, default=300e6, help="parameters past which a model runs at ~112 px")
    p.add_argument("--only", help="a shell pattern of architecture names")
    p.add_argument("--out", help="results file or folder (default benchmarks/results/coverage_<device>_<date>.json)")
    p.add_argument("--markdown", type=Path, help="rewrite the coverage table in this page")
    p.add_argument("--bare", action="store_true", help="save the tensors alone (no config.json): vitkit reads "
                                                        "the architecture off their names and shapes")
    p.add_argument("--wide", action="store_true", help="also compare each model with parity at a changed, "
                                                        "non-square size (timm's set_input_size)")
    p.add_argument("--recheck", type=Path, help="a results file: check its rows that were not parity (and match "
                                                 "--only) again, the others kept, into --out or the same file")
    args = p.parse_args(argv)
    with torch.no_grad():  # not set_grad_enabled: main() may run inside another program (the tests)
        return _run(args)


def _run(args) -> int:
    info = machine_info(torch.device("cpu"), limits=False)
    info.update(git_revision=git_revision(), date=time.strftime("%Y-%m-%d"), timm=timm.__version__,
                torch=torch.__version__, tolerance=f"max|diff| <= {TOLERANCE} x max(1, max|timm output|)")
    smoke = bool(args.only) or args.max_params < 1e9 or args.min_params > 0
    info["layout"] = "bare state dict (.safetensors, no config)" if args.bare else "timm hub folder"
    out = results_path(args.out, dated_name("coverage_bare" if args.bare else "coverage", torch.device("cpu"), info),
                       smoke=smoke)
    kept: dict = {}
    if args.recheck:
        earlier = json.loads(args.recheck.read_text())
        layout = earlier["machine"].get("layout", "timm hub folder")  # files before --bare were hub folders
        if layout != info["layout"]:
            print(f"coverage.py: {args.recheck}'s rows are of the layout {layout!r}: recheck it "
                  f"with{'' if args.bare else 'out'} --bare", file=sys.stderr)
            return 2
        # with --only, the other rows are kept as they were too
        kept = {r["arch"]: r for r in earlier["rows"]
                if r["status"] == "parity" or args.only and not fnmatch.fnmatch(r["arch"], args.only)}
        info["rechecked"] = (f"rows other than parity of {earlier['machine'].get('git_revision')}"
                             + (f" matching {args.only!r}" if args.only else "") + " checked again")
        out = str(args.out or args.recheck)
    todo = architectures(args.max_params, None if args.recheck else args.only, args.min_params)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vitkit-coverage-") as tmp:
        for i, (name, module, params) in enumerate(todo):
            row = kept.get(name) or check(name, module, params, args.large, Path(tmp), args.bare, args.wide)
            rows.append(row)
            said = f" {row.get('max_diff', 0):.1e}" if row["status"] == "parity" else f" -- {row.get('message', '')}"
            if "wide" in row:
                said += f"; at {row['wide'].get('img_size', '?')}: {row['wide']['status']} " + (
                    f"{row['wide']['max_diff']:.1e}" if "max_diff" in row["wide"] else row["wide"].get("message", ""))
            print(f"[{i + 1}/{len(todo)}] {name} ({params / 1e6:.1f}M): {row['status']}{said}", flush=True)
            for leftover in Path(tmp).iterdir():
                shutil.rmtree(leftover)
            gc.collect()
    write_results(out, info, summary(rows), rows)
    if args.markdown:
        write_markdown(args.markdown, markdown(rows, info))
    return 0


def write_results(out: str, info: dict, counts: dict, rows: list) -> None:
    """The results file (machine, summary, rows), and the summary's line on stdout."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(dict(machine=info, summary=counts, rows=rows), f, indent=1)
    print(json.dumps(counts), "->", out)


if __name__ == "__main__":
    sys.exit(main())
