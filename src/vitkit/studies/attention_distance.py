"""Attention distance (the paper's Figure 7, right, and Figure 11): how far each head looks, per
layer, in the ViTs and hybrids of the compute study.

    vitkit study attention-distance            # after `vitkit study compute`: a minute (it trains nothing)
    vitkit study attention-distance --smoke    # the same, on the compute study's smoke models

The paper computes, per head and layer, the mean distance in pixels between a query patch and
the patches it attends to, weighted by the attention ("attention distance", analogous to a
CNN's receptive field size): "some heads attend to most of the image already in the lowest
layers", others are local there, the distance grows with depth, and "highly localized attention
is less pronounced in hybrid models that apply a ResNet before the Transformer". Here the seed-0
model of every ViT and hybrid of the compute study is measured on 500 test images
(``vitkit.inspect.mean_attention_distance``); both kinds of model have 4x4-pixel tokens on a 7x7
grid, so distances compare directly. A head is *local* when it looks less than half as far as
attention spread evenly over the grid would, *global* when at least 0.8 of that far.

Result (the committed ``docs/studies/attention-distance.json``): see docs/paper.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from .base import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Arm, Options, Study, verdict
from .fewshot_proxy import source_path, source_results

IMAGES = 500
LOCAL, GLOBAL = 0.5, 0.8  # of the uniform attention's distance


#: the least change of the mean distance from the first layer to the last, as a share of the uniform distance,
#: that counts as growth (or shrinking)
GROWTH = 0.05


def uniform_distance(model) -> float:
    """The mean attention distance (px) of attention spread evenly over every patch of the grid."""
    from ..inspect.analysis import patch_distances

    grid = model.patch_embed.grid_size
    return float(patch_distances(grid, model.patch_embed.patch_size).mean())


class AttentionDistance(Study):
    name = "attention-distance"
    title = "Attention distance by layer and head"
    claim = ("Some heads attend globally already in the lowest layers while others are local; attention distance "
             "grows with depth; local heads are fewer in hybrids (Figure 7, Figure 11)")
    setting = ("the seed-0 ViTs and hybrids of the compute study (4x4-px tokens, 7x7 grid), 500 Fashion-MNIST test "
               "images; local: under half the distance of uniform attention, global: at least 0.8 of it")
    paper = {"source": "Dosovitskiy et al. 2021, section 4.5, Figure 7 (right) and Figure 11"}
    notes = ("The paper measures ViT-L/16 at 224 px: 196 tokens, mean distances up to about 120 px. A 28-px "
             "Fashion-MNIST image is 49 tokens, and a local head here would have to keep to its own token and its "
             "neighbours; after two epochs no head does. A larger grid (bigger images or smaller patches, --dataset "
             "with --data-dir) gives the claim room to show.")

    def arms(self, options: Options) -> List[Arm]:
        return []  # it trains nothing: it measures the compute study's models

    def extra(self, results: Dict[str, Any], options: Options) -> None:
        import torch

        import vitkit

        from ..inspect import mean_attention_distance

        compute = source_results("compute", options)
        if compute is None:
            raise ValueError(f"attention distance measures the compute study's models; not found: "
                             f"{source_path('compute', options)}: run `vitkit study compute` first, or point --out or "
                             f"--work at its results")
        settings = compute["settings"]
        first_seed = compute["settings"]["seeds"][0]
        results["models"] = {}
        for arm, facts in compute["arms"].items():
            if facts["family"] not in ("vit", "hybrid"):
                continue
            run = next(r for r in compute["runs"].values() if r["arm"] == arm and r["seed"] == first_seed)
            model = vitkit.from_pretrained(Path(run["run_dir"]) / "model").eval()
            images = test_images(settings["dataset"], settings.get("data_dir"), model, IMAGES)
            with torch.no_grad():
                dist = mean_attention_distance(model, images)
            results["models"][arm] = {"label": facts["label"], "family": facts["family"],
                                      "distance_px": dist.tolist(), "uniform_px": uniform_distance(model)}

    def verdicts(self, results: Dict[str, Any]) -> List[Dict[str, Any]]:
        models = results.get("models", {})
        claims = ("some heads attend globally already in the first layer, others locally",
                  "attention distance grows with depth", "local heads are fewer in hybrids than in ViTs")
        if not models:
            return [verdict(c, INCONCLUSIVE, "no models measured") for c in claims]
        deep = {k: m for k, m in models.items() if len(m["distance_px"]) > 1}
        out = []
        first = {k: m["distance_px"][0] for k, m in deep.items()}
        mixed = [k for k, heads in first.items()
                 if max(heads) >= GLOBAL * models[k]["uniform_px"] and min(heads) < LOCAL * models[k]["uniform_px"]]
        glob = [k for k, heads in first.items() if max(heads) >= GLOBAL * models[k]["uniform_px"]]
        text = (f"first layer: a global head in {len(glob)} of {len(first)} models with more than one layer, global "
                f"and local heads together in {len(mixed)}")
        out.append(verdict(claims[0], REPRODUCED if mixed else NOT_REPRODUCED if not glob else INCONCLUSIVE, text))
        # a change within GROWTH of the uniform distance is none (2 steps of training moved it by 0.1 px: "grown")
        step = {k: (_mean(m["distance_px"][-1]) - _mean(m["distance_px"][0])) / m["uniform_px"]
                for k, m in deep.items()}
        grows, shrinks = [k for k, d in step.items() if d > GROWTH], [k for k, d in step.items() if d < -GROWTH]
        change = ", ".join(f"{models[k]['label']}: {_mean(m['distance_px'][0]):.1f} -> "
                           f"{_mean(m['distance_px'][-1]):.1f}" for k, m in deep.items())
        outcome = REPRODUCED if deep and len(grows) == len(deep) else NOT_REPRODUCED if shrinks and not grows \
            else INCONCLUSIVE
        out.append(verdict(claims[1], outcome, f"mean distance of the first and last layer, px: {change} (a change "
                                               f"within {100 * GROWTH:.0f}% of the uniform distance counts as none)"))
        share = {fam: _local_share(models, fam) for fam in ("vit", "hybrid")}
        if None in share.values():
            out.append(verdict(claims[2], INCONCLUSIVE, "no model of one of the families"))
        else:
            text = f"local heads: {100 * share['vit']:.0f}% of the ViTs', {100 * share['hybrid']:.0f}% of the hybrids'"
            if share["vit"] == share["hybrid"] == 0:  # nothing to be fewer of: the claim is not tested
                out.append(verdict(claims[2], INCONCLUSIVE, f"{text}: no head of any model is local here"))
            else:
                out.append(verdict(claims[2], REPRODUCED if share["hybrid"] < share["vit"] else NOT_REPRODUCED, text))
        return out

    def table(self, results: Dict[str, Any]) -> str:
        lines = ["| model | layers x heads | first layer, px (min-max) | last layer, px (min-max) | local heads | "
                 "uniform, px |", "|---|---:|---:|---:|---:|---:|"]
        for m in results.get("models", {}).values():
            d = m["distance_px"]
            heads = sum(len(layer) for layer in d)
            local = sum(h < LOCAL * m["uniform_px"] for layer in d for h in layer)
            lines.append(f"| {m['label']} | {len(d)} x {len(d[0])} | {min(d[0]):.1f}-{max(d[0]):.1f} | "
                         f"{min(d[-1]):.1f}-{max(d[-1]):.1f} | {local} of {heads} | {m['uniform_px']:.1f} |")
        return "\n".join(lines)

    def figure(self, results: Dict[str, Any], path: Path) -> Optional[Path]:
        """The paper's Figure 7 (right): each head's distance against its layer, one panel per model."""
        from ..utils import pyplot, save_png

        models = list(results.get("models", {}).values())
        if not models:
            return None
        plt = pyplot()
        fig, axes = plt.subplots(1, len(models), figsize=(2.6 * len(models), 3.2), dpi=120, sharey=True, squeeze=False)
        for ax, m in zip(axes[0], models):
            for layer, heads in enumerate(m["distance_px"], 1):
                ax.scatter([layer] * len(heads), heads, s=14, alpha=0.8)
            ax.axhline(m["uniform_px"], ls="--", lw=0.8, color="0.5")
            ax.set_title(m["label"], fontsize=8)
            ax.set_xlabel("layer")
            ax.set_xticks(range(1, len(m["distance_px"]) + 1))
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("mean attention distance (px)")
        fig.suptitle("Each dot a head; dashed: attention spread evenly over the 7x7 grid", fontsize=9)
        fig.tight_layout()
        return save_png(fig, path)


def test_images(dataset: str, data_dir: Optional[str], model, n: int):
    """The first ``n`` test images of any dataset vitkit trains on, as ``model``'s inputs (its size and
    normalisation: the evaluation pipeline of image files, the in-memory resize otherwise)."""
    import torch

    from ..train import TrainConfig
    from ..train.data import open_data

    cfg = TrainConfig(dataset=dataset, data_dir=data_dir, val_size=0, workers=0, progress=False)
    data = open_data(cfg, torch.device("cpu"), channels=1 if model.config.in_chans == 1 else 3)
    taken, count = [], 0
    for x, _, _ in data.eval_batches("test", model.config, n):
        if x is not None:
            taken.append(x[:n - count])
            count += len(taken[-1])
        if count >= n:
            break
    return torch.cat(taken)


def _mean(values: List[float]) -> float:
    return sum(values) / len(values)


def _local_share(models: Dict[str, Any], family: str) -> Optional[float]:
    heads = [h < LOCAL * m["uniform_px"] for m in models.values() if m["family"] == family
             for layer in m["distance_px"] for h in layer]
    return sum(heads) / len(heads) if heads else None


STUDY = AttentionDistance()
