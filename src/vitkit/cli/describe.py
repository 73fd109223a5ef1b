"""``vitkit models`` and ``vitkit info``: the registered models, and what a model or a weights source costs."""

from __future__ import annotations

import argparse
import errno
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from .common import fmt_bytes, fmt_int, print_json, size_of, table


def cmd_models(args: argparse.Namespace) -> int:
    from ..models import get_model_config, list_models
    from ..models.complexity import complexity
    from ..progress import track

    names = list_models(args.filter)
    if not names:
        raise ValueError(f"no model matches {args.filter!r}")
    # each count builds the model on the meta device: all 256 take about 10 s on a slow CPU (a bar after 5 s)
    infos = [(n, complexity(get_model_config(n))) for n in track(names, "counting parameters", unit="models")]
    if args.json:
        print_json([{"name": n, **c.to_dict()} for n, c in infos])
        return 0
    rows = [[n, f"{c.params / 1e6:.2f}M", f"{c.macs / 1e9:.2f}", f"{c.flops / 1e9:.2f}",
             f"{c.img_size[0]}x{c.img_size[1]}", str(c.tokens)] for n, c in infos]
    print(table(rows, ["model", "params", "GMACs", "GFLOPs", "input", "tokens"]))
    print("\nGFLOPs = 2 x GMACs (matrix products only); also accepted: size strings like 'B/16'.")
    return 0


def _source_lines(info: Dict[str, Any]) -> List[str]:
    """``vitkit info FILE``'s account of a weights source (``weights.describe_source``)."""
    lines = [f"{info['path']}",
             f"  layout      {info['format']}" + (f" ({info['source_name']})" if info.get("source_name") else ""),
             f"  tensors     {info['tensors']:,} holding {fmt_int(info['values'])} values "
             f"({', '.join(info['dtypes'])})"]
    if info.get("pretraining"):
        lines.append(f"  holds       a {info['pretraining']} pre-training model (its encoder is described)")
    if info.get("features"):
        blocks, norm = info["features"]["out_indices"], info["features"]["norm"]
        lines.append(f"  holds       a backbone: features_only=True returns the maps of blocks {blocks}"
                     + (", normalised" if norm else ""))
    if info.get("graph"):  # an exported graph: what it takes and gives
        ports = {k: ", ".join(f"{name} ({', '.join(map(str, dims))}) {kind}" for name, dims, kind in v)
                 for k, v in info["graph"].items()}
        lines.append(f"  graph       {ports['inputs']} -> {ports['outputs']}")
    if "note" in info:
        lines.append(f"  vitkit      {info['note']}")
        return lines
    if "refused" in info:
        lines.append(f"  vitkit      cannot load it: {info['refused']}")
        return lines
    c = info["config"]
    regs = getattr(c, "reg_tokens", 0)
    crop = _CROP_WORDS.get(getattr(c, "crop_mode", ""), "")
    extra = [f"{regs} register{'s' if regs != 1 else ''}" if regs else "",
             f"rotary positions ({c.rope})" if getattr(c, "rope", "none") != "none" else "",
             _projector(c), f"pooling {c.global_pool}", _head(c),
             f"mean {list(c.mean)} std {list(c.std)}, crop {c.crop_pct}{crop}"]
    lines.append(f"  vitkit      architecture {c.architecture!r}" + (f" ({c.name})" if c.name else "") + ": "
                 + ", ".join(e for e in extra if e))
    lines += [f"  assumed     {guess}" for guess in info.get("assumed", ())]  # a bare file: what its tensors do not say
    return lines


#: crop modes other than the centre crop, as ``vitkit info`` says them
_CROP_WORDS = {"squash": " (squashed)", "border": " (the whole image, padded)"}


def _projector(config) -> str:
    """A VLM tower's projector (DeepSeek's aligner, Qwen's merger), where the model has one: what
    ``forward_features`` gives."""
    width = getattr(config, "projector_dim", 0)
    r = getattr(config, "projector_ratio", 0)
    return f"a VLM projector ({r}x{r} patches -> {width:,} wide; forward_features gives its tokens)" if width else ""


def _head(config) -> str:
    """What a model's outputs are, as ``vitkit info`` says it: classes, an image-text projection, or none."""
    if not config.num_classes:
        return "no head (features)"
    if getattr(config, "head_kind", "classes") == "projection":
        return f"head: an image-text projection, {config.num_classes} wide (no classes)"
    return f"head: {config.num_classes:,} classes" + (" (named)" if config.label_names else "")


#: what only a path has: model names are letters, digits, '_', '-' and '.' before a tag
_WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".npz", ".onnx", ".xml", ".json")


def _looks_like_path(name: str) -> bool:
    return "/" in name or "\\" in name or name.startswith(("~", ".")) or name.lower().endswith(_WEIGHT_SUFFIXES)


def cmd_info(args: argparse.Namespace) -> int:
    from ..models import family_of, get_model_config
    from ..models.complexity import complexity

    overrides: Dict[str, Any] = {}
    overrides.update(size_of(args))
    if args.patch_size is not None:
        overrides["patch_size"] = args.patch_size
    source: Optional[Dict[str, Any]] = None
    if Path(args.name).exists() or args.name.startswith("hf-hub:"):  # a weights file or folder: say what it is
        from ..deploy.describe import describe_graph, is_graph
        from ..weights.pretrained import describe_source

        if is_graph(args.name) and overrides:  # an exported graph computes at one size: no other to cost
            flags = [f"--{k.replace('_', '-')}" for k in overrides]
            raise ValueError(f"{args.name} is an exported graph, fixed at the size it was exported at: "
                             f"{' and '.join(flags)} {'apply' if len(flags) > 1 else 'applies'} to weights and "
                             f"model names")
        source = describe_graph(args.name) if is_graph(args.name) else \
            describe_source(args.name, overrides.get("img_size"))  # (a bare table is read at the size given)
        if "refused" in source or "note" in source or source.get("pretraining") and "config" not in source:
            if args.json:
                print_json({k: v for k, v in source.items() if k != "config"})
            else:
                print("\n".join(_source_lines(source)))
            return 2 if "refused" in source else 0
        config = source["config"].replace(**overrides)
    else:
        try:
            named = get_model_config(args.name)
        except ValueError:  # no model of that name: a path that is not there is said as predict says it
            if Path(args.name).is_symlink():
                end = "which leads back to it (a loop of links)" if _link_loop(Path(args.name)) else \
                    "which does not exist"
                raise ValueError(f"weights not found: {args.name} is a symbolic link to {os.readlink(args.name)}, "
                                 f"{end}") from None
            if _looks_like_path(args.name):
                raise ValueError(f"weights not found: {args.name} (no such file or folder; nor a model name: "
                                 f"see vitkit models)") from None
            raise
        config = named.replace(**overrides)
    if not family_of(config).tokens:
        raise ValueError(f"{args.name} is a {config.architecture} CNN, not a ViT: `vitkit info` describes "
                         f"token costs; `vitkit models --filter {args.name}` lists its parameters and GMACs")
    c = complexity(config)
    d = c.to_dict()
    d.update(name=args.name, embed_dim=config.embed_dim, mlp_dim=config.mlp_dim,
             in_chans=config.in_chans, value_tokens=c.pixel_tokens * config.in_chans,
             value_attn_entries=(c.pixel_tokens * config.in_chans) ** 2)
    if source is not None:
        d["source"] = {**{k: v for k, v in source.items() if k != "config"}, "architecture": config.architecture,
                       "config": config.to_dict()}
    if args.json:
        print_json(d)
        return 0
    print("\n".join(_source_lines({**source, "config": config})) if source is not None else f"{args.name}")
    _print_costs(c, config, d)
    return 0


def _link_loop(path: Path) -> bool:
    """Whether the symbolic link ``path`` leads back to itself (it was said to point at a link "which does not
    exist")."""
    try:
        path.resolve(strict=True)
    except RuntimeError:  # (Python 3.11's "Symlink loop")
        return True
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def _print_costs(c, config, d: Dict[str, Any]) -> None:
    """``vitkit info``'s account of a model's tokens, parameters, compute and attention memory."""
    (h, w), (ph, pw), (gh, gw) = c.img_size, c.patch_size, c.grid
    prefix = c.tokens - gh * gw
    patch_entries = c.tokens * c.tokens
    print(f"  input       {h} x {w} x {config.in_chans}")
    print(f"  patches     {ph} x {pw} -> grid {gh} x {gw} = {gh * gw:,} patches"
          + (f" + {prefix} prefix token{'s' if prefix > 1 else ''} = {c.tokens:,} tokens" if prefix
             else f" = {c.tokens:,} tokens"))
    if getattr(config, "pos_embed_size", None) is not None:
        (th, tw), (sh, sw) = config.table_grid, config.pos_embed_size
        tables = "a row and a column table (added)" if config.pos_embed == "factorized" else "a learned table"
        how = ", kept square and cropped (the aspect ratio kept)" if getattr(config, "pos_embed_ar_preserving",
                                                                           False) else ""
        print(f"  positions   {tables} held at {th} x {tw} (pos_embed_size {sh} x {sw}), resampled to each "
              f"input's grid{how}")
    print(f"  encoder     width {config.embed_dim}, {c.depth} layers, {c.heads} heads, MLP {config.mlp_dim}")
    print(f"  parameters  {fmt_int(c.params)}")
    print(f"  compute     {c.macs / 1e9:.3f} GMACs = {c.flops / 1e9:.3f} GFLOPs per image "
          f"(attention mixing {100 * c.attn_macs_share:.1f}%)")
    print(f"  attention   {c.heads} heads x {c.tokens:,} x {c.tokens:,} = {fmt_int(c.attn_entries_per_layer)} "
          f"weights per image and layer = {fmt_bytes(c.attn_bytes_per_layer_fp32)} in fp32")
    if getattr(config, "window_size", 0):  # (SAM's windowed blocks: their maps are the windows')
        side, windowed = config.window_size, sum(not config.is_global(i) for i in range(config.depth))
        hp, wp = -(-gh // side) * side, -(-gw // side) * side
        print(f"  windows     {windowed} of {c.depth} layers attend within {side} x {side} windows "
              f"({fmt_int(side ** 4)} weights each; the grid padded to {hp} x {wp}: {hp * wp // side ** 2} windows), "
              f"the other {c.depth - windowed} over the whole grid")
    print("  the quadratic cost, per head and layer:")
    print(f"    {ph}x{pw} patches as tokens   {fmt_int(c.tokens):>12} tokens -> "
          f"{fmt_int(patch_entries)} attention weights ({fmt_bytes(4 * patch_entries)})")
    print(f"    each pixel a token      {fmt_int(c.pixel_tokens):>12} tokens -> "
          f"{fmt_int(c.pixel_attn_entries)} ({fmt_bytes(4 * c.pixel_attn_entries)}), "
          f"{c.pixel_attn_entries / patch_entries:,.0f}x more")
    print(f"    each value a token      {fmt_int(d['value_tokens']):>12} tokens -> "
          f"{fmt_int(d['value_attn_entries'])} ({fmt_bytes(4 * d['value_attn_entries'])})")


def add_models(verb) -> None:
    p = verb("models", "list the registered models with parameters, compute and tokens")
    p.add_argument("--filter", default="*", help="shell-style name pattern, e.g. 'vit_base*'")
    p.set_defaults(func=cmd_models)



def add_info(verb) -> None:
    p = verb("info", "parameters, FLOPs, tokens and attention memory of a model; what a weights file or folder is")
    p.add_argument("name", metavar="MODEL",
                   help="registered name, size string ('B/16'), or a weights file / folder / hf-hub:org/name "
                        "(its layout and the architecture it loads as, before loading it)")
    p.add_argument("--img-size", type=int, nargs="+", metavar="PX",
                   help="H W (or one value): the size to cost; a bare state dict's position table is read at it")
    p.add_argument("--patch-size", type=int, metavar="P")
    p.set_defaults(func=cmd_info)

