"""Few-shot as a proxy for fine-tuning (the paper's section 4.1 and Appendix D): does a model's
linear few-shot accuracy rank models as their full training does?

    vitkit study fewshot-proxy            # after the other three: seconds (it trains nothing)
    vitkit study fewshot-proxy --smoke    # the same, on their smoke results

The paper uses linear few-shot accuracy of frozen features "for fast on-the-fly evaluation where
fine-tuning would be too costly", trusting that it ranks models as fine-tuning does. Here every
model of the position-embedding, compute and data-size studies (each arm, its seeds averaged)
gives two numbers: its test top-1 after training and the 25-shot (and 5-shot) linear accuracy of
its frozen features on the same classes. The study measures Spearman's rank correlation over
the models, with a permutation p-value (10,000 shuffles), overall and within each study. It reads
the three studies' results (``NAME.json``) from ``--out`` when they are there, else from
``runs/studies/NAME``: run them first.

Result (the committed ``docs/studies/fewshot-proxy.json``): see docs/paper.md.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .base import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Arm, Options, Study, spread, verdict

SOURCES = ("position-embeddings", "compute", "data-size")
#: a rank correlation this strong, with p < 0.05, reproduces the claim; under WEAK it is not
STRONG, WEAK = 0.7, 0.3
SHUFFLES = 10_000


def ranks(values: Sequence[float]) -> List[float]:
    """Ranks 1..n, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: Pearson's correlation of the ranks."""
    rx, ry = ranks(x), ranks(y)
    n = len(rx)
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx and vy else float("nan")


def permutation_p(x: Sequence[float], y: Sequence[float], rho: float, shuffles: int = SHUFFLES) -> float:
    """One-sided p-value of rho: the share of shuffles of y whose rho is at least as large."""
    rng = random.Random(0)
    y = list(y)
    hits = 0
    for _ in range(shuffles):
        rng.shuffle(y)
        hits += spearman(x, y) >= rho
    return (hits + 1) / (shuffles + 1)


def source_path(name: str, options: Options) -> Path:
    """Where another study's NAME.json is: in the --out or the --work given to this one (both studies run with one
    --work W: it looked in runs/studies alone), else in that study's own default folder."""
    for folder in (options.out, options.work):
        if folder and (Path(folder) / f"{name}.json").is_file():
            return Path(folder) / f"{name}.json"
    return Path("runs") / "studies" / (name + ("-smoke" if options.smoke else "")) / f"{name}.json"


def source_results(name: str, options: Options) -> Optional[Dict[str, Any]]:
    """Another study's results (its NAME.json at :func:`source_path`), None when it has none; a
    file that is not a study's results is named in the error."""
    path = source_path(name, options)
    if not path.is_file():
        return None
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not a study's results ({e}): run `vitkit study {name}` again to rewrite it")
    if not isinstance(results, dict) or not {"arms", "runs", "settings"} <= results.keys():
        raise ValueError(f"{path} is not a study's results (no arms, runs and settings): run `vitkit study {name}` "
                         f"again to rewrite it")
    return results


class FewShotProxy(Study):
    name = "fewshot-proxy"
    title = "Few-shot accuracy as a proxy for full training"
    claim = ("Linear few-shot accuracy of frozen features ranks models as their fine-tuned accuracy does, so it "
             "can stand in for it when fine-tuning is too costly (section 4.1)")
    setting = ("every model (arm, seeds averaged) of the position-embedding, compute and data-size studies: test "
               "top-1 after training against its frozen features' 25-shot linear accuracy; Spearman's rho with a "
               "permutation p-value")
    paper = {"source": "Dosovitskiy et al. 2021, section 4.1",
             "words": "linear few-shot accuracy for fast on-the-fly evaluation where fine-tuning would be too costly"}
    notes = ("Here both numbers come from the same trained model (its frozen features after supervised training, "
             "and its own test accuracy), where the paper probes pre-trained features and fine-tunes them on another "
             "dataset: an easier setting for a high rank correlation. It still says the cheap probe orders models as "
             "the expensive measure does; the self-supervision study probes encoders that never saw a label.")

    def arms(self, options: Options) -> List[Arm]:
        return []  # it trains nothing: it reads the other studies' models

    def extra(self, results: Dict[str, Any], options: Options) -> None:
        points: List[Dict[str, Any]] = []
        missing = []
        for name in SOURCES:
            other = source_results(name, options)
            if other is None:
                missing.append(f"{name} ({source_path(name, options)})")
                continue
            for arm, facts in other["arms"].items():
                top1, shot5, shot25 = (spread(other, arm, m) for m in ("test_top1", "fewshot_5", "fewshot_25"))
                if top1.n and shot25.n:
                    points.append({"study": name, "arm": arm, "label": facts["label"], "test_top1": top1.mean,
                                   "fewshot_5": shot5.mean, "fewshot_25": shot25.mean, "seeds": top1.n})
        if missing:
            raise ValueError(f"the few-shot proxy reads the other studies' results; not found: {', '.join(missing)}: "
                             f"run those studies first (vitkit study NAME), or point --out or --work at their results")
        results["points"] = points
        results["correlation"] = {}
        for group in ("all",) + SOURCES:
            chosen = [p for p in points if group == "all" or p["study"] == group]
            if len(chosen) < 3:
                continue
            top1 = [p["test_top1"] for p in chosen]
            entry = {"models": len(chosen)}
            for shots in ("fewshot_5", "fewshot_25"):
                rho = spearman([p[shots] for p in chosen], top1)
                entry[shots] = {"rho": rho, "p": permutation_p([p[shots] for p in chosen], top1, rho)}
            results["correlation"][group] = entry

    def verdicts(self, results: Dict[str, Any]) -> List[Dict[str, Any]]:
        claim = "25-shot linear accuracy ranks the models as their trained accuracy does"
        overall = results.get("correlation", {}).get("all")
        if overall is None:
            return [verdict(claim, INCONCLUSIVE, "fewer than three models to rank")]
        rho, p = overall["fewshot_25"]["rho"], overall["fewshot_25"]["p"]
        within = "; ".join(f"{g}: {v['fewshot_25']['rho']:.2f}" for g, v in results["correlation"].items()
                           if g != "all")
        why = f"Spearman's rho {rho:.2f} over {overall['models']} models (p = {p:.4f}); within each study: {within}"
        if rho >= STRONG and p < 0.05:
            return [verdict(claim, REPRODUCED, why)]
        if rho < WEAK or p >= 0.05:
            return [verdict(claim, NOT_REPRODUCED, why)]
        return [verdict(claim, INCONCLUSIVE, why + f": between {WEAK} and {STRONG}")]

    def table(self, results: Dict[str, Any]) -> str:
        lines = ["| models | count | rho, 5-shot | rho, 25-shot |", "|---|---:|---:|---:|"]
        for group, entry in results.get("correlation", {}).items():
            cells = [f"{entry[s]['rho']:.2f} (p {entry[s]['p']:.4f})" for s in ("fewshot_5", "fewshot_25")]
            lines.append(f"| {'all studies' if group == 'all' else group} | {entry['models']} | " + " | ".join(cells)
                         + " |")
        return "\n".join(lines)

    def figure(self, results: Dict[str, Any], path: Path) -> Optional[Path]:
        from ..utils import pyplot, save_png

        plt = pyplot()
        fig, ax = plt.subplots(figsize=(6.2, 4.6), dpi=120)
        for name, marker in zip(SOURCES, "osD"):
            pts: List[Tuple[float, float]] = [(100 * p["fewshot_25"], 100 * p["test_top1"])
                                              for p in results.get("points", []) if p["study"] == name]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, label=name, alpha=0.8)
        ax.set_xlabel("25-shot linear accuracy of the frozen features (%)")
        ax.set_ylabel("test top-1 after training (%)")
        overall = results.get("correlation", {}).get("all")
        if overall:
            ax.set_title(f"Spearman's rho {overall['fewshot_25']['rho']:.2f} over {overall['models']} models",
                         fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        return save_png(fig, path)


STUDY = FewShotProxy()
