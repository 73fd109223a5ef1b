"""Position embeddings (the paper's Appendix D.4, Table 8): how much does a ViT gain from knowing
where its patches are, and does it matter how it is told?

    vitkit study position-embeddings            # 5 kinds x 2 grids x 3 seeds: about 75 min on 2 CPU cores
    vitkit study position-embeddings --smoke    # 7x7 alone, one seed, 20 steps a run: about 2 minutes

The paper trains ViT-B/16 on ImageNet with no positions, a learned 1D table, learned 2D (a row
and a column table of D/2 each, concatenated) and learned relative positions: without positions
it is clearly worst (61.4% 5-shot against 64.0-64.2%), the three ways of encoding them are level
("little difference"), and it explains why: at 14x14 patches, telling spatial relations apart is
easy, whatever the encoding. Here the plain ``vit_fmnist`` (width 96, 4 layers, mean pooling) is
trained on Fashion-MNIST with each of vitkit's five kinds (``none``, ``learned``, ``learned_2d``,
``sincos2d``, ``relative``: a bias per head and 2D offset in every layer) at two grids: 4 px
patches (7x7 tokens) and, where position should matter more, 2 px patches (14x14 tokens, each
seeing a quarter of the pixels). Scores: test top-1 after training and the frozen features'
5- and 25-shot accuracy; the figure shows each kind's learned positions beside its numbers.

Result (the committed ``docs/studies/position-embeddings.json``): see docs/paper.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from .base import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Arm, Options, Study, differ, spread, too_few_seeds, verdict

KINDS = ("none", "learned", "learned_2d", "sincos2d", "relative")
LABELS = {"none": "none", "learned": "learned 1D", "learned_2d": "learned 2D (row + column)",
          "sincos2d": "sine-cosine 2D (fixed)", "relative": "learned relative bias"}
#: patch size -> (grid label, optimiser steps of batch 128): 3 epochs at 7x7 (~1,600 img/s on 2 cores,
#: bf16), 1 at 14x14 (~300 img/s: four times the tokens, attention over 196 of them)
GRIDS = {4: ("7x7", 1290), 2: ("14x14", 430)}
#: the ways of encoding position are "level" when their means are within this (points of accuracy)
LEVEL = 0.01
#: the recipe every run shares: the bf16 default run's until 2026-12-06 (label smoothing 0.1, random erasing 0.25)
TRAIN = {"model": "vit_fmnist", "recipe": "fmnist-adamw", "batch_size": 128, "warmup_steps": 200}


class PositionEmbeddings(Study):
    name = "position-embeddings"
    title = "Position embeddings: none, 1D, 2D, sine-cosine, relative"
    claim = ("No position embedding performs worst; the ways of encoding position (1D, 2D, relative) differ "
             "little, because at the patch level spatial relations are easy to learn (Appendix D.4, Table 8)")
    setting = ("vit_fmnist (0.30M parameters, mean pooling, no class token) on Fashion-MNIST, recipe fmnist-adamw, "
               "the same number of steps for every kind: 1,290 steps of 128 (3 epochs) at 4 px patches (7x7 "
               "tokens), 430 (1 epoch) at 2 px patches (14x14 tokens); test top-1 and the frozen features' "
               "5- and 25-shot accuracy")
    paper = {"source": "Dosovitskiy et al. 2021, Table 8: ViT-B/16 on ImageNet, 5-shot linear accuracy",
             "5-shot": {"none": 0.61382, "learned": 0.64206, "learned_2d": 0.64001, "relative": 0.64032}}
    notes = ("The paper's relative variant is an extra attention of each query against an embedding per "
             "offset, whose logits are added to the content attention's; vitkit's is the bias form that Swin and "
             "BEiT use (one learned scalar per head and offset, timm's RelPosBias): it cannot depend on the query.")
    fewshot = True

    def arms(self, options: Options) -> List[Arm]:
        arms = []
        for patch, (grid, steps) in list(GRIDS.items())[:1 if options.smoke else None]:  # smoke: 7x7 alone
            for kind in KINDS:
                train = {**TRAIN, "max_steps": steps, "val_every": steps, "checkpoint_every": max(steps // 4, 1),
                         "model_args": {"pos_embed": kind, "patch_size": patch}}
                arms.append(Arm(f"{kind}-{grid}", f"{LABELS[kind]}, {grid}", train, {"kind": kind, "grid": grid}))
        return arms

    # ---------------------------------------------------------------------------- deciding

    def verdicts(self, results: Dict[str, Any]) -> List[Dict[str, Any]]:
        out = []
        grids = _grids(results)
        for metric, what in (("test_top1", "test top-1"), ("fewshot_25", "25-shot")):
            out.append(self._none_worst(results, grids, metric, what))
            out.append(self._level(results, grids, metric, what))
        if len(grids) > 1:
            out.append(self._matters_more(results, grids))
        return out

    def _none_worst(self, results, grids, metric, what) -> Dict[str, str]:
        claim = f"no position embedding is worst ({what})"
        if too_few_seeds(results):
            return verdict(claim, INCONCLUSIVE, "one seed: no spread to judge differences by")
        beaten, level, below = [], [], []
        for grid in grids:
            none = spread(results, f"none-{grid}", metric)
            for kind in KINDS[1:]:
                other = spread(results, f"{kind}-{grid}", metric)
                gap = f"{kind} at {grid}: {100 * (other.mean - none.mean):+.1f}"
                if other.mean <= none.mean:
                    below.append(gap)
                elif differ(other, none):
                    beaten.append(gap)
                else:
                    level.append(gap)
        if below:
            return verdict(claim, NOT_REPRODUCED, f"not above none: {', '.join(below)} points")
        if level:
            return verdict(claim, INCONCLUSIVE,
                           f"above none but within the seeds' spread: {', '.join(level)} points")
        return verdict(claim, REPRODUCED,
                       f"every kind above none beyond the seeds' spread ({', '.join(beaten)} points)")

    def _level(self, results, grids, metric, what) -> Dict[str, str]:
        claim = f"1D, 2D, sine-cosine and relative positions differ little ({what})"
        if too_few_seeds(results):
            return verdict(claim, INCONCLUSIVE, "one seed: no spread to judge differences by")
        notes, apart, unclear = [], [], []
        for grid in grids:
            spreads = {k: spread(results, f"{k}-{grid}", metric) for k in KINDS[1:]}
            best = max(spreads, key=lambda k: spreads[k].mean)
            worst = min(spreads, key=lambda k: spreads[k].mean)
            gap = spreads[best].mean - spreads[worst].mean
            notes.append(f"{grid}: {100 * gap:.1f} points between {best} and {worst}")
            if gap > LEVEL:
                (apart if differ(spreads[best], spreads[worst]) else unclear).append(grid)
        if apart:
            return verdict(claim, NOT_REPRODUCED, f"{'; '.join(notes)}: beyond the seeds' spread at {', '.join(apart)}")
        if unclear:
            return verdict(claim, INCONCLUSIVE, f"{'; '.join(notes)}: over {100 * LEVEL:g} points at "
                                                f"{', '.join(unclear)} but within the seeds' spread")
        return verdict(claim, REPRODUCED, f"{'; '.join(notes)}: within {100 * LEVEL:g} point")

    def _matters_more(self, results, grids) -> Dict[str, str]:
        claim = "positions matter more when each token sees less (14x14 against 7x7 tokens; test top-1)"
        if too_few_seeds(results):
            return verdict(claim, INCONCLUSIVE, "one seed: no spread to judge differences by")
        gains = {}
        for grid in grids:
            none = spread(results, f"none-{grid}")
            best = max((spread(results, f"{k}-{grid}") for k in KINDS[1:]), key=lambda s: s.mean)
            gains[grid] = (best.mean - none.mean, differ(best, none))
        (small, (g_small, _)), (large, (g_large, beyond)) = list(gains.items())[:2]
        text = f"the best kind gains {100 * g_small:.1f} points over none at {small}, {100 * g_large:.1f} at {large}"
        if g_large <= g_small:
            return verdict(claim, NOT_REPRODUCED, text)
        if not beyond:
            return verdict(claim, INCONCLUSIVE, text + f", within the seeds' spread at {large}")
        return verdict(claim, REPRODUCED, text)

    # ---------------------------------------------------------------------------- showing

    def table(self, results: Dict[str, Any]) -> str:
        grids = _grids(results)
        head = "| position embedding | " + " | ".join(f"{g}: test top-1 | {g}: 5-shot | {g}: 25-shot" for g in grids)
        lines = [head + " |", "|---|" + "---:|" * (3 * len(grids))]
        for kind in KINDS:
            cells = []
            for grid in grids:
                cells += [spread(results, f"{kind}-{grid}", m).text() for m in ("test_top1", "fewshot_5", "fewshot_25")]
            lines.append(f"| {LABELS[kind]} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def figure(self, results: Dict[str, Any], path: Path) -> Optional[Path]:
        """Per kind (columns) at 7x7: what its seed-0 model knows of positions (the similarity of one
        patch's embedding to every patch's; for the relative kind, the first layer's bias per offset,
        heads averaged), above its test top-1 on both grids."""
        from .figures import positions_figure

        return positions_figure(results, path, KINDS, LABELS, _grids(results))


def _grids(results: Dict[str, Any]) -> List[str]:
    """The grids the results hold runs of, in GRIDS' order."""
    present = {arm["grid"] for arm in results["arms"].values()}
    return [g for g, _ in GRIDS.values() if g in present]


STUDY = PositionEmbeddings()
