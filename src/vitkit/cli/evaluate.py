"""``vitkit predict``, ``vitkit eval`` and ``vitkit fewshot``: a model's answers and scores
(``vitkit.evaluate.predict_images``, ``score_dataset`` and ``fewshot_on_dataset``)."""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from ..files import check_output
from .common import (
    add_hf_flags,
    add_runtime_flags,
    add_size_flag,
    add_stand_in_flags,
    add_threads_flag,
    load_model,
    print_json,
    runtime_model,
    runtime_name,
    size_of,
)


def cmd_predict(args: argparse.Namespace) -> int:
    from ..data.folder import image_files
    from ..errors import AnsweredError
    from ..evaluate import predict_images
    from ..evaluate.predict import NOT_FINITE

    if args.top_k < 1:  # before the weights are read
        raise ValueError(f"--top-k must be a positive integer, not {args.top_k}")
    image_files(args.images, say=False)  # a folder's images listed (or refused) before the weights are read
    model = runtime_model(args)
    # the paths as given: a folder's dangling link or FIFO is said in its place (listed, it was a path given)
    preds = predict_images(model, args.images, top_k=args.top_k, progress=not args.no_progress)
    if args.json:
        print_json([p.to_dict() for p in preds])
    else:
        for p in preds:
            print(p.image)
            if p.error:
                print(f"  {'no answer' if p.error == NOT_FINITE else 'cannot read it'}: {p.error}")
            for rank, (index, label, prob) in enumerate(p.top, 1):
                print(f"  {rank:>{len(str(len(p.top)))}}. {label:<30} {100 * prob:6.2f}%  (class {index})")
    broken = [p.image for p in preds if p.error]
    if broken:  # every other image answered above; the exit code says not all were
        error = AnsweredError if args.json else ValueError  # --json: the document above holds each image's error
        raise error(f"{len(broken)} of {len(preds)} images have no answer ({', '.join(broken[:3])}"
                    f"{', ...' if len(broken) > 3 else ''}; each said above)")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from ..data.datasets import dataset_for_labels
    from ..evaluate import plot_confusion, score_dataset
    from ..evaluate.dataset import check_hf_options, check_score_options, run_data_of
    from ..files import files_together, write_json

    check_score_options(args.batch_size, args.max_images)  # before the weights are read
    check_hf_options(args.dataset, args.data_dir, args.hf_split, args.image_key, args.label_key)
    if args.out:  # checked before the evaluation, not after it
        check_output(args.out, "folder", "--out")
        held = _earlier_eval_files(Path(args.out))
    model = runtime_model(args)
    dataset, data_dir = args.dataset, args.data_dir
    if not dataset and (found := run_data_of(args.weights, data_dir)):  # a run's own data, as the run's last
        dataset, data_dir, note = found  # line tells (a folder run's "next vitkit eval --weights RUN" was refused)
        if dataset != dataset_for_labels(model.config.label_names):  # (said where the names say another)
            warnings.warn(note, stacklevel=1)
    score = score_dataset(model, dataset, args.split, data_dir=data_dir, hf_split=args.hf_split,
                          image_key=args.image_key, label_key=args.label_key, max_images=args.max_images,
                          batch_size=args.batch_size, tta=args.tta, progress=not args.no_progress)
    report, total = score.report, score.total
    result = {"weights": args.weights, "dataset": score.dataset, "split": score.split,
              "precision": runtime_name(model), "tta": args.tta, **report.to_dict()}
    if args.max_images is not None:
        result["split_images"] = total
    if score.skipped:
        result["skipped"] = len(score.skipped)
    png = None
    if args.out:  # files only where asked: the confusion matrix and the numbers beside it
        if held:  # an earlier evaluation's: replaced, as convert replaces, but said (its numbers went in silence)
            warnings.warn(f"{args.out} held {' and '.join(held)} before: replaced", stacklevel=1)
        with files_together(args.out) as stage:  # a failure (a full disk, a signal) leaves what was there
            png = result["confusion_png"] = str(Path(args.out) / "confusion_matrix.png")
            plot_confusion(report, stage / "confusion_matrix.png")
            write_json(stage / "eval.json", result)
    if args.json:
        print(json.dumps(result))
        return 0
    _print_score(args, score, runtime_name(model), png)
    return 0


#: what an earlier ``vitkit eval --out`` wrote there
EVAL_FILES = ("eval.json", "confusion_matrix.png")


def _earlier_eval_files(out: Path) -> list:
    """The files of :data:`EVAL_FILES` in ``out``, each an earlier evaluation's (replaced, and said); a file of
    those names that no evaluation wrote is the user's and refused, before any work, as ``inspect`` refuses
    (an eval.json and a picture of the user's were replaced). An evaluation's eval.json is a JSON object with its
    scores; the confusion matrix is its where that eval.json stands beside it."""
    held = [n for n in EVAL_FILES if (out / n).is_file()]
    ours = False
    if "eval.json" in held:
        try:
            saved = json.loads((out / "eval.json").read_text())
            ours = isinstance(saved, dict) and {"weights", "dataset", "split", "top1"} <= set(saved)
        except (OSError, UnicodeDecodeError, ValueError):
            ours = False
    if held and not ours:
        raise ValueError(f"{out} holds {' and '.join(held)}, which no earlier vitkit eval there wrote: the "
                         f"evaluation would replace {'it' if len(held) == 1 else 'them'}; give another --out")
    return held


def _print_score(args: argparse.Namespace, score, runtime: str, png) -> None:
    report, total = score.report, score.total
    tta = "" if args.tta == "none" else f", {args.tta} TTA"
    cut = args.max_images is not None and args.max_images < total
    first = (f"the first {report.count:,} of {total:,} images" if score.first_only else
             f"{report.count:,} of {total:,} images, a fixed sample") if cut else f"{report.count:,} images"
    n = len(report.confusion)
    top5 = f"top-5 {100 * report.top5:.2f}%" if n > 5 else f"top-5 n/a ({n} classes)"  # (100%: says nothing)
    print(f"{score.dataset} {score.split}: top-1 {100 * report.top1:.2f}%  {top5}  ({first}, {runtime}{tta})")
    present = sum(acc is not None for acc in report.per_class.values())
    if cut and present < n:  # (a stream's first images may be one class's)
        print(f"note: the {report.count:,} images scored hold {present} of the {n} classes: the score is of those "
              f"classes only; a larger --max-images, or none, scores the whole split")
    if score.skipped:
        print(f"skipped {len(score.skipped)} unusable images (first: {score.skipped[0]}); see the log for why")
    for name, acc in report.per_class.items():
        print(f"  {name:<16} {100 * acc:6.2f}%" if acc is not None else f"  {name:<16}    n/a (no images)")
    print(f"confusion matrix: {png} (and eval.json)" if png else "(--out DIR writes confusion_matrix.png and "
          "eval.json there)")


def cmd_fewshot(args: argparse.Namespace) -> int:
    from ..evaluate import fewshot_on_dataset
    from ..evaluate.dataset import check_fewshot_options, check_hf_options, fewshot_data_of

    check_fewshot_options(args.shots, args.seeds, args.pool)  # before the features are computed
    if args.dataset:
        check_hf_options(args.dataset, args.data_dir, args.hf_split, args.image_key, args.label_key,
                         args.hf_test_split)
    model = load_model(args, encoder_only=True, **size_of(args))  # a pre-training model's ViT
    dataset, data_dir, note = fewshot_data_of(model, args.weights, args.dataset, args.data_dir)
    if note:
        warnings.warn(note, stacklevel=1)  # (the command line's one "vitkit fewshot: note:" line)
    score = fewshot_on_dataset(model, dataset, args.shots, args.seeds, args.pool, data_dir=data_dir,
                               hf_split=args.hf_split, image_key=args.image_key, label_key=args.label_key,
                               progress=not args.no_progress, hf_test_split=args.hf_test_split)
    if score.skipped:  # (the command line's "vitkit fewshot: note:" line, as every note)
        warnings.warn(f"skipped {len(score.skipped)} unusable images (first: {score.skipped[0]})", stacklevel=1)
    if args.json:
        print(json.dumps({"weights": args.weights, "dataset": dataset, "seeds": args.seeds,
                          "results": [r.to_dict() for r in score.results.values()]}))
        return 0
    spread = ": mean +- sample std" if args.seeds > 1 else ""
    print(f"few-shot linear evaluation ({dataset}, {args.seeds} seed{'s' * (args.seeds != 1)}{spread}, ridge to "
          f"{{-1, 1}} targets)")
    for r in score.results.values():
        print(f"  {r.shots:>3}-shot  {100 * r.mean:6.2f}%" + (f" +- {100 * r.std:.2f}" if args.seeds > 1 else ""))
    return 0


def add_predict(verb) -> None:
    p = verb("predict", "top-k classes of images")
    p.add_argument("images", nargs="+", help="image files, or folders (the images under them)")
    p.add_argument("--weights", required=True, help="file, folder, hf-hub:org/name or an .onnx file")
    p.add_argument("--model", help="architecture name when the weights have no config")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    add_threads_flag(p, "the model")
    add_runtime_flags(p)
    add_stand_in_flags(p)
    p.set_defaults(func=cmd_predict)



def add_eval(verb) -> None:
    from ..train.config import CHOICES

    p = verb("eval", "top-1, top-5, per-class accuracy and a confusion-matrix PNG")
    p.add_argument("--weights", required=True, help="file, folder, hf-hub:org/name or an .onnx file")
    p.add_argument("--dataset", help="fashion-mnist, cifar10, cifar100, folder, shards or hf:NAME_OR_DIR (default: "
                                     "the one a run folder's run trained on, else the one whose classes the weights "
                                     "name)")
    p.add_argument("--data-dir")
    p.add_argument("--split", default="test", choices=["train", "test"])
    add_hf_flags(p, "the split to score (default: --split train's train, else test, or validation)")
    p.add_argument("--model", help="architecture name when the weights have no config")
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--max-images", type=int, metavar="N",
                   help="score only N of the split's images (a fixed random sample; of tar shards, the first N), for "
                        "a quick check of a large set (default: all)")
    p.add_argument("--tta", default="none", choices=CHOICES["test_tta"],
                   help="test-time augmentation: flip scores the mean probabilities of each image and its mirror, "
                        "flip-shift of those and their one-pixel shifts up, down, left and right (10 views; for "
                        "classes a mirror and a small shift do not change) [default: none]")
    add_runtime_flags(p)
    add_stand_in_flags(p)  # (an .onnx without metadata was told to give them, and eval had none)
    p.add_argument("--out", metavar="DIR", help="folder to write confusion_matrix.png and eval.json into "
                                                "(default: print only, write nothing)")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    add_threads_flag(p, "the model")
    p.set_defaults(func=cmd_eval)



def add_fewshot(verb) -> None:
    p = verb("fewshot", "the paper's few-shot linear evaluation of frozen features")
    p.add_argument("--weights", required=True, help="file, folder or hf-hub:org/name")
    p.add_argument("--dataset", help="fashion-mnist, cifar10, cifar100, folder or hf:NAME_OR_DIR (default: the one "
                                     "whose classes the weights name, else the one their run trained on)")
    p.add_argument("--data-dir")
    add_hf_flags(p, "the split shots are drawn from (default: train)")
    p.add_argument("--hf-test-split", help="hf: datasets: the split the probes are scored on (default: the first of "
                                           "test, validation, valid, val)")
    p.add_argument("--shots", type=int, nargs="+", default=[1, 5, 10, 25])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--pool", type=int, default=10_000,
                   help="training images to draw shots and the held-out split from (0: all)")
    p.add_argument("--model", help="architecture name when the weights have no config")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    add_size_flag(p, "the features are computed at")
    add_threads_flag(p, "the features")
    p.set_defaults(func=cmd_fewshot)

