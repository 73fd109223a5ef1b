"""What a run learns: classification (``vitkit train``) or a self-supervised objective
(``vitkit pretrain``). One loop (:mod:`.loop`) serves both; a task says how its model is
built, what one micro-batch's loss is, how a split is scored and what the summary reports.

Pre-training draws each micro-batch's masks from ``(seed, "mask", step, micro-batch)`` for the
whole global micro-batch and keeps this rank's part, as augmentation does, so a resumed run and
a run on any number of processes draw what one uninterrupted process draws. Validation and
test losses use masks from ``(0, "eval-mask", batch)``: the same for every run and seed, so
curves and runs compare. Labels are never read by pre-training; at the end, when the data is
in memory, the frozen encoder's few-shot accuracy (the paper's linear evaluation) says what
the features are worth.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..data.mixing import mixup_cutmix, random_erasing
from ..evaluate.tta import probabilities as tta_probabilities
from ..files import as_argument
from ..models import build_from_config, config_from_dict, get_model_config
from ..parallel import BatchParallel, add_in_order
from ..progress import track
from ..selfsup import Pretrainer, encoder_of, objective_class
from ..utils import seed_for
from . import finetune
from .batches import MicroBatch, generator
from .config import TrainConfig, resolve_width
from .data import RunData
from .distill import distillation_loss, split_outputs
from .init import model_from_init, saved_fresh_parts
from .memory import check_model_fits

if TYPE_CHECKING:
    from .state import Run

#: a run folder's file holding the model config an --init run built (written at its start, before any checkpoint)
INIT_MODEL = "init_model.json"
#: its entry naming the parts --init started afresh beside the heads (they train in every mode: a resume too)
FRESH_PARTS = "fresh_parts"

#: the few-shot evaluation a pre-training run ends with: shots per class, seeds, training pool
FEWSHOT_SHOTS, FEWSHOT_SEEDS, FEWSHOT_POOL = (1, 5, 10, 25), 3, 10_000


def autocast(device: torch.device, amp: Optional[torch.dtype]):
    if amp is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=amp)


def data_args_for(cfg: TrainConfig, data: RunData) -> Dict[str, Any]:
    """What the data decides of any model, a new one or an --init one: its size, channels and classes, and how
    predict and the exports see an image as training saw it (in-memory images whole: no centre crop)."""
    args = data.model_args(cfg.img_size)
    if data.kind == "memory":
        args["crop_pct"] = 1.0
        (h, w), (dh, dw) = args.get("img_size") or (1, 1), data.img_size or (1, 1)
        if h * dw != w * dh:  # stretched to another shape: predict and the exports squash an image as training did
            args["crop_mode"] = "squash"  # (they cut a 28x28 image's rows to fill 28x40: half the classes changed)
    return args


def model_args_for(cfg: TrainConfig, data: RunData) -> Dict[str, Any]:
    """The model's config overrides: the data's size, channels, classes and statistics, then the run's."""
    own = resolve_width(cfg.model_args, get_model_config(cfg.model))
    stats = {"mean": tuple(data.mean), "std": tuple(data.std)}
    channels = own.get("in_chans")
    if isinstance(channels, int) and channels > 1 and len(stats["mean"]) == 1:  # grey images fed as RGB, as
        if channels != 3:  # prepare_batch repeats them (they were refused: "mean/std need 3 values")
            raise ValueError(f"in_chans {channels} in --model-args: {cfg.dataset}'s images are grey, fed to a model "
                             f"of 1 channel or 3 (RGB, the grey repeated), which predict and the exports feed alike")
        stats = {k: v * channels for k, v in stats.items()}
    return {**data_args_for(cfg, data), **stats, **own}


class Classification:
    """``vitkit train``: cross-entropy on labels (with DeiT's distillation, Mixup/CutMix, erasing)."""

    name = "classify"
    has_accuracy = True

    def build_model(self, cfg: TrainConfig, data: RunData, log, saved_init: Optional[Dict[str, Any]] = None
                    ) -> nn.Module:
        """A new model shaped for the data, or (``--init``) the given weights' architecture fitted to it;
        ``saved_init``: that architecture as the run saved it (:data:`INIT_MODEL`), which a resume builds
        (the checkpoint holds every weight: the --init file may be gone or replaced since)."""
        said: List[str] = []  # said once the fine-tuning flags fit the model: a refusal is the only line
        if cfg.init and saved_init is not None:
            saved = dict(saved_init)
            fresh = saved.pop(FRESH_PARTS, [])  # (a run from before it was written: none)
            model = build_from_config(config_from_dict(saved))
            model.fresh_parts = saved_fresh_parts(model, fresh, f"the run's {INIT_MODEL}")
            said.append(f"the --init architecture as {INIT_MODEL} holds it (the weights come from the checkpoint)")
        elif cfg.init:  # fine-tuning: the architecture and normalisation come from the weights
            model = model_from_init(cfg.init, data_args_for(cfg, data), cfg.model_args, cfg.init_head,
                                    log=said.append, interpolation=cfg.init_interpolation)
            held = model.config.name or model.config.architecture
            if "model" in (getattr(cfg, "chosen", None) or ()) and cfg.model != held:  # a config file's, with --init
                raise ValueError(f"the config file's model {cfg.model} is not the --init weights' architecture, "
                                 f"{held}: the architecture comes from the weights (leave model out)")
        if cfg.init:
            if cfg.finetune != "full" or cfg.freeze_blocks:
                targets = [t.strip() for t in cfg.lora_targets.split(",") if t.strip()]
                if cfg.finetune == "lora":  # the layers they name in this model (qkv: q_proj, k_proj, v_proj ...)
                    parts = [n.rsplit(".", 1)[-1] for n in finetune.lora_target_names(model, targets)]
                    shown = list(dict.fromkeys(parts))
                finetune.prepare(model, cfg.finetune, cfg.lora_rank, cfg.lora_alpha, targets, cfg.freeze_blocks)
                n, total = finetune.trainable(model)
                said.append(f"fine-tuning {cfg.finetune}" + (f" (rank {cfg.lora_rank}, {', '.join(shown)})"
                                                             if cfg.finetune == "lora" else "")
                            + (f", first {cfg.freeze_blocks} blocks frozen" if cfg.freeze_blocks else "")
                            + f": {n:,} of {total:,} parameters train ({100 * n / total:.2f}%)")
            for line in said:
                log(line)
            return model
        config = get_model_config(cfg.model).replace(**model_args_for(cfg, data))
        check_model_fits(config)  # before it is built: a typo must not fill the memory first
        return build_from_config(config)

    def inputs(self, run: "Run", step: int, k: int, x: torch.Tensor, y: torch.Tensor
               ) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]:
        """Micro-batch ``k`` of ``step`` as the model sees it: erased and mixed with draws from
        (seed, step, k, rank) over the whole micro-batch (its parts then share them)."""
        cfg = run.cfg
        mixing = cfg.mixup > 0 or cfg.cutmix > 0
        if mixing or cfg.random_erasing:
            gen = generator(cfg.seed, "mix", step, k, run.dist.rank)
            x = random_erasing(x, cfg.random_erasing, gen)
            if mixing:
                x, y, _ = mixup_cutmix(x, y, run.model.config.num_classes, cfg.mixup, cfg.cutmix,
                                       cfg.mixup_switch_prob, cfg.label_smoothing, gen)
        return x, y, {}

    def loss(self, run: "Run", x: torch.Tensor, y: torch.Tensor, extra: Dict[str, torch.Tensor]
             ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(mean loss, (summed loss, correct)) of the inputs, under the caller's autocast."""
        cfg = run.cfg
        outputs = run.forward(x)
        taught = run.teacher(x, run.student_input) if run.teacher is not None else None
        loss = distillation_loss(outputs, y, taught, cfg.distill, cfg.alpha, cfg.tau, cfg.label_smoothing)
        logits = split_outputs(outputs)[0]
        hard = y.argmax(-1) if y.is_floating_point() else y  # with mixing: the argmax of the mixed targets
        return loss, torch.stack([loss.detach().float() * len(y), (logits.argmax(-1) == hard).sum().float()])

    def evaluate(self, model: nn.Module, batches: Iterable[MicroBatch], amp: Optional[torch.dtype],
                 parallel: Optional[BatchParallel] = None, tta: str = "none", config: Any = None
                 ) -> Tuple[float, Optional[float]]:
        """(mean cross-entropy, top-1 accuracy) over (inputs, labels, skipped) batches; one host sync.
        ``tta`` (:mod:`vitkit.evaluate.tta`, ``config`` the model's input config): both scored on
        the mean probabilities of each image's views."""
        def score(i: int, x: torch.Tensor, y: torch.Tensor, part: slice) -> torch.Tensor:
            x, y = x[part], y[part]
            if tta == "none":
                log_p = F.log_softmax(model(x).float(), -1)
            else:
                log_p = tta_probabilities(model, x, tta, config).clamp_min(1e-12).log()
            return torch.stack([F.nll_loss(log_p, y, reduction="sum").double(), (log_p.argmax(-1) == y).sum().double()])

        return _evaluate(model, batches, amp, score, parallel)

    def results(self, run: "Run") -> Dict[str, Any]:
        """The summary's scores: test and validation top-1 (and the EMA's)."""
        test_loss, test_acc = final_score(run, run.model, "test")
        # the loop validated after its last step; a run resumed at its end has not run the loop
        val_loss, val_acc = run.final_val if run.final_val is not None else final_score(run, run.model, "val")
        out = {"test_top1": test_acc, "test_loss": test_loss, "val_top1": val_acc}
        tta = run.cfg.test_tta
        if tta != "none":  # the views named beside their score: the summary says what it holds
            out.update(test_tta=tta, test_top1_tta=final_score(run, run.model, "test", tta=tta)[1])
        if run.ema is not None:
            ema_test_loss, ema_test_acc = final_score(run, run.ema.module, "test", "EMA")
            out.update(test_top1_ema=ema_test_acc, test_loss_ema=ema_test_loss,
                       val_top1_ema=final_score(run, run.ema.module, "val", "EMA")[1])
            if tta != "none":
                out["test_top1_ema_tta"] = final_score(run, run.ema.module, "test", "EMA", tta)[1]
        return out


class Pretraining:
    """``vitkit pretrain``: a :mod:`vitkit.selfsup` objective on the images alone."""

    def __init__(self, objective: str):
        self.name = objective
        self.has_accuracy = objective == "mpp"  # MPP's colour classes; pixel regression has no accuracy

    def build_model(self, cfg: TrainConfig, data: RunData, log, saved_init: Optional[Dict[str, Any]] = None
                    ) -> nn.Module:
        encoder = get_model_config(cfg.model).replace(**{**model_args_for(cfg, data), "num_classes": 0,
                                                         "label_names": None})
        objective = objective_class(cfg.objective).config_cls().replace(**cfg.objective_options())
        check_model_fits(encoder, objective)  # (MAE's decoder and its table too)
        model = objective_class(cfg.objective)(encoder, objective)
        problems = model.draw_problems()  # the masks it will draw, checked before the run folder is made
        if problems:
            raise ValueError(f"invalid {cfg.objective} config: " + "; ".join(problems))
        return model

    def _draws(self, model: Pretrainer, batch: int, gen: torch.Generator, device: torch.device,
               part=None) -> Dict[str, torch.Tensor]:
        draws = model.draw(batch, gen)
        return {k: (v if part is None else part(v)).to(device, non_blocking=True) for k, v in draws.items()}

    def inputs(self, run: "Run", step: int, k: int, x: torch.Tensor, y: torch.Tensor
               ) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]:
        """Micro-batch ``k`` of ``step`` erased, with its masks: the global micro-batch's, then
        this rank's part (as augmentation draws)."""
        cfg, device = run.cfg, run.dist.device
        if cfg.random_erasing:
            x = random_erasing(x, cfg.random_erasing, generator(cfg.seed, "mix", step, k, run.dist.rank))
        draws = self._draws(run.model, run.layout.micro, generator(cfg.seed, "mask", step, k), device,
                            run.layout.mine)
        return x, y, draws

    def loss(self, run: "Run", x: torch.Tensor, y: torch.Tensor, draws: Dict[str, torch.Tensor]
             ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(loss, (summed loss, summed accuracy)) of the inputs, under the caller's autocast."""
        out = run.forward(x, **draws)
        n = len(x)
        return out.loss, torch.stack([out.loss.detach().float() * n, _accuracy(out) * n])

    def evaluate(self, model: nn.Module, batches: Iterable[MicroBatch], amp: Optional[torch.dtype],
                 parallel: Optional[BatchParallel] = None) -> Tuple[float, Optional[float]]:
        """(mean pre-training loss, MPP's colour accuracy or None) with the fixed evaluation masks."""
        def score(i: int, x: torch.Tensor, y: torch.Tensor, part: slice) -> torch.Tensor:
            gen = torch.Generator().manual_seed(seed_for(0, "eval-mask", i))  # the whole batch's masks
            out = model(x[part], **self._draws(model, len(x), gen, x.device, lambda v: v[part]))
            return torch.stack([out.loss.double(), _accuracy(out).double()]) * len(x[part])

        loss, acc = _evaluate(model, batches, amp, score, parallel)
        return loss, acc if self.has_accuracy else None

    def results(self, run: "Run") -> Dict[str, Any]:
        """The summary's scores: the pre-training loss on test and validation images (and the
        EMA's), and the frozen encoder's few-shot accuracy when the data is in memory (unless
        the run says ``fewshot`` off)."""
        test_loss, test_acc = final_score(run, run.model, "test")
        val_loss, val_acc = run.final_val if run.final_val is not None else final_score(run, run.model, "val")
        out: Dict[str, Any] = {"objective": self.name, "test_loss": test_loss, "val_loss": val_loss}
        if self.has_accuracy:
            out.update(test_colour_acc=test_acc, val_colour_acc=val_acc)
        if run.ema is not None:
            out["test_loss_ema"] = final_score(run, run.ema.module, "test", "EMA")[0]
        if run.data.kind == "memory" and run.cfg.fewshot:
            try:
                out["fewshot"] = fewshot_probe(encoder_of(run.ema.module if run.ema is not None else run.model),
                                               run.data, progress=run.cfg.progress and run.main)
            except ValueError as e:  # too few labelled images per class for the shots
                run.note(f"no few-shot evaluation: {e}")
        elif run.cfg.fewshot and run.data.kind != "memory":  # it was left out without a word
            probe = "no few-shot evaluation: the run's probe needs an in-memory dataset (fashion-mnist, cifar10); "
            if run.cfg.dataset == "shards":  # (vitkit fewshot draws a random pool, which a stream does not offer)
                run.note(probe + f"vitkit fewshot --weights {as_argument(run.run_dir)} --dataset folder --data-dir "
                                 f"DIR scores the image folder the shards were written from")
            else:
                run.note(probe + f"vitkit fewshot --weights {as_argument(run.run_dir)} --dataset {run.cfg.dataset}"
                         + (f" --data-dir {as_argument(run.cfg.data_dir)}" if run.cfg.data_dir else "")
                         + " scores these images")
        return out


def final_score(run: "Run", net: nn.Module, split: str, which: str = "", tta: str = "none"
                ) -> Tuple[float, Optional[float]]:
    """``run.score(net, split)`` with a progress line: the scoring after training starts when the
    training bar has ended and takes minutes on large splits (ViT-S/16: ~110 s for test,
    validation and the EMA's). Rank 0 draws it, unless the run has ``progress`` off; like any
    :func:`~vitkit.progress.track`, it prints nothing when the split is scored within 5 s.
    ``tta``: classification's test-time augmentation (:mod:`vitkit.evaluate.tta`)."""
    source = run.data.val if split == "val" else run.data.test
    size = run.cfg.eval_batch_size
    total = -(-len(source) // size) if hasattr(source, "__len__") else None  # shards: a stream
    unread: List[str] = []  # this split's, in the order met
    batches = _counted(run, split, run.data.eval_batches(split, run.input_config, size), unread)
    label = " ".join(filter(None, ["evaluating", which, split, "" if tta == "none" else f"({tta} TTA)"]))
    # counts the batches handed to the device: on a GPU a few ahead of those computed, as no
    # host sync is added (the task's one sync ends the scoring)
    shown = track(batches, label, total, enabled=run.cfg.progress and run.main, unit="batches")
    views = {} if tta == "none" else {"tta": tta, "config": run.input_config}
    scores = run.task.evaluate(net, shown, run.amp, run.parallel, **views)
    if run.scored.get(split) == 0:  # every image unreadable: scored "0.00% on 20 images", exit 0
        first = unread[0] if unread else "none named"
        raise ValueError(f"none of the {split} split's images could be read (first: {first}): there is nothing to "
                         f"score; replace the files (--strict-data stops at the first), then --resume "
                         f"{as_argument(run.run_dir)} scores the trained model")
    return scores


def _counted(run: "Run", split: str, batches: Iterable[MicroBatch], unread: Optional[List[str]] = None
             ) -> Iterator[MicroBatch]:
    """``batches`` as they are, the images read and the unreadable samples named kept on ``run`` (a stream's
    test samples that did not decode were lost from the summary: skipped_files 0, no test_images), the split's
    own unreadable ones in ``unread``."""
    run.scored[split] = 0
    for x, y, bad in batches:
        run.skipped.update(bad)
        if unread is not None:
            unread.extend(bad)
        run.scored[split] += 0 if x is None else len(y)
        yield x, y, bad


@torch.inference_mode()
def _evaluate(model: nn.Module, batches: Iterable[MicroBatch], amp: Optional[torch.dtype], score,
              parallel: Optional[BatchParallel] = None) -> Tuple[float, float]:
    """Both of ``score(batch index, inputs, labels, part)``'s sums (a (2,) tensor) over the
    batches, divided by the images, in eval mode; one host sync at the end. ``parallel``: the
    parts of each batch (slices) scored at once and added in order."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total = torch.zeros(2, dtype=torch.float64, device=device)
    n = 0
    for i, (x, y, _) in enumerate(batches):
        if x is None:
            continue
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        def scored(part: slice, i=i, x=x, y=y) -> torch.Tensor:
            with autocast(x.device, amp):
                return score(i, x, y, part)

        total += scored(slice(None)) if parallel is None else add_in_order(parallel.run(scored, len(y)))
        n += len(y)
    model.train(was_training)
    first, second = (total / max(n, 1)).tolist()
    return first, second


def _accuracy(out) -> torch.Tensor:
    """The share of scored patches predicted right (MPP), else 0."""
    if out.correct is None:
        return out.loss.new_zeros(()).float()
    return out.correct.float() / out.mask.sum().clamp_min(1).float()


def fewshot_probe(encoder: nn.Module, data: RunData, progress: bool = False) -> Dict[str, float]:
    """Few-shot linear accuracy of the frozen ``encoder`` (``FEWSHOT_SHOTS`` per class, mean over
    ``FEWSHOT_SEEDS``) with shots drawn from ``FEWSHOT_POOL`` training images (the same for every
    run, as ``vitkit fewshot`` draws them): {shots: accuracy}. ``progress``: lines on stderr
    while the features are extracted, when that takes more than 5 s."""
    from ..evaluate import extract_features, fewshot_from_features

    train, test = data.train, data.test
    pick = torch.randperm(len(train.labels), generator=torch.Generator().manual_seed(0))[:FEWSHOT_POOL]
    pick = pick.to(train.labels.device)
    feats_tr = extract_features(encoder, train.images[pick], progress=progress, label="extracting train features").cpu()
    feats_te = extract_features(encoder, test.images, progress=progress, label="extracting test features").cpu()
    results = fewshot_from_features(feats_tr, train.labels[pick].cpu(), feats_te, test.labels.cpu(),
                                    FEWSHOT_SHOTS, FEWSHOT_SEEDS, progress=progress, class_names=data.classes)
    return {str(k): r.mean for k, r in results.items()}


def task_for(cfg: TrainConfig):
    return Classification() if cfg.objective == "classify" else Pretraining(cfg.objective)


__all__ = ["Classification", "Pretraining", "task_for", "fewshot_probe", "final_score", "autocast", "model_args_for"]
