"""``vitkit inspect``: the paper's analyses of a model as figures and a report (``vitkit.inspect_model``)."""

from __future__ import annotations

import argparse
import warnings

from ..files import check_output
from .common import add_size_flag, add_threads_flag, load_model, print_json, size_of


def cmd_inspect(args: argparse.Namespace) -> int:
    from ..inspect import default_folder, inspect_model
    from ..inspect.report import free_folder

    out = args.out
    if out is None:
        chosen = default_folder(args.weights)
        out = str(free_folder(chosen, str(args.weights)))
        if out != str(chosen):
            warnings.warn(f"{chosen} holds the report of other weights; this one goes to {out}", stacklevel=1)
    check_output(out, "folder", "--out")
    if args.pca_components < 1:  # (before the model is read: inspect_model says it only after)
        raise ValueError(f"--pca-components must be a positive integer, not {args.pca_components}")
    model = load_model(args, **size_of(args))
    result = inspect_model(model, out, args.image, title=str(args.weights), pca_components=args.pca_components,
                           progress=not args.no_progress)
    if args.json:
        print_json(result.to_dict())
        return 0
    for image, label, prob in result.predictions:
        print(f"{image}: {label} ({100 * prob:.1f}%)")
    print(f"{len(result.figures)} figures and {result.report} written")
    return 0


def add_inspect(verb) -> None:
    p = verb("inspect", "the paper's analyses as PNG figures and a self-contained report.html")
    p.add_argument("--weights", required=True, help="file, folder or hf-hub:org/name")
    p.add_argument("--image", nargs="+",
                   help="image files or folders (default: the first test images of the dataset whose classes the "
                        "model names, where they are on disk, or Fashion-MNIST's for a 28x28 grey model; else "
                        "scikit-image's sample photos)")
    p.add_argument("--out", metavar="DIR", help="folder to write the figures and report.html into (default: "
                                                "RUN/inspect for a run's model, RUN/inspect-step_N for its checkpoint, "
                                                "else runs/inspect-NAME: NAME the file's, or its folder's for a "
                                                "model.safetensors; NAME-2, ... where other weights' report is)")
    p.add_argument("--model", help="architecture name when the weights have no config")
    p.add_argument("--pca-components", type=int, default=28, metavar="N",
                   help="principal components of the patch-embedding filters drawn (the paper's Fig. 7 shows 28; "
                        "at most the filters' count or size) [default: 28]")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    add_size_flag(p, "the model is inspected at")
    add_threads_flag(p, "the analyses")
    p.set_defaults(func=cmd_inspect)

