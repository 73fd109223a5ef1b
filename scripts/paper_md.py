"""Write docs/paper.md from the studies' committed results (docs/studies/NAME.json): a section per
study with its claim, setting, command, measured cost, table, figure and verdicts.

    python scripts/paper_md.py            # rewrite docs/paper.md
    python scripts/paper_md.py --check    # exit 1 when docs/paper.md is not what the results give

Every number in the page comes from a results file (tests/test_studies.py checks it), and the
page is regenerated rather than edited: rerun a study with ``--out docs/studies``, then this.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List

from vitkit.studies import get_study

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "docs" / "studies"
PAGE = ROOT / "docs" / "paper.md"

INTRO = """# The paper's experiments

Each claim below is a study that anyone can rerun with one command (`vitkit study NAME`), on two
CPU cores in under an hour to about two hours of training (the two analysis studies in seconds).
Each section gives the training time its runs took; they shared the machine with another study or
the test suite, so a quiet machine is faster. The models,
recipes and analyses are vitkit's own; the data is Fashion-MNIST by default (`--dataset` and
`--data-dir` take any other: CIFAR, an image folder, tar shards, a Hugging Face dataset).
Every arm runs with three seeds; a difference counts when the means are further apart than twice
the standard error of their gap. A verdict is *reproduced*,
*not reproduced at this scale* or *inconclusive*, with the numbers behind it. The scale is a
thousand times smaller than the paper's, so a claim that does not reproduce here says something
about small data and small models, not about the paper.

A study's runs live in `runs/studies/NAME/` (a finished run is reused and an interrupted one
resumed, so a study stopped at any point goes on where it was); its results, table and figure
go to `--out` (here: `docs/studies/`).

```bash
vitkit study list                  # the studies
```

A smoke run checks a study end to end in minutes (a few steps per run, one seed; its runs go to
`runs/studies/NAME-smoke`):

<!-- docs-test: skip: tests/test_studies.py runs every study's smoke check end to end (at test scale) -->
```bash
vitkit study compute --smoke
```
"""


def _minutes(results: Dict[str, Any]) -> str:
    """The training the study's runs took, with the pre-training its prepare step ran (self-supervision's)."""
    seconds = sum(r.get("seconds") or 0 for r in results["runs"].values())
    before = sum(r.get("seconds") or 0 for r in results.get("prepared", {}).get("pretrain", {}).values())
    if not seconds + before:
        return "seconds (it trains nothing)"
    first = f"{before / 60:.0f} min of pre-training, then " if before else ""
    return f"{first}{seconds / 60:.0f} min of training"


def _value(v: Any) -> str:
    return f"{100 * v:.1f}%" if isinstance(v, float) and v <= 1 else str(v)


def paper_line(paper: Dict[str, Any]) -> str:
    """The paper's own numbers the claim rests on, as the results file records them."""
    if not paper:
        return ""
    parts = []
    for key, value in paper.items():
        if key in ("source", "words"):
            continue
        if isinstance(value, dict):
            parts.append(f"{key}: " + ", ".join(f"{k.replace('_', ' ')} {_value(v)}" for k, v in value.items()))
        else:
            parts.append(f"{key.replace('_', ' ')}: {_value(value)}")
    words = f' "{paper["words"]}"' if "words" in paper else ""
    said = "; ".join(([words.strip()] if words else []) + parts)
    source = paper.get("source", "Dosovitskiy et al. 2021")
    return f"**The paper** ({source}): {said}." if said else f"**The paper**: {source}."


def _sentence(text: str) -> str:
    """A sentence from a study's phrase: a capital first letter, or a first word that is a name
    (vit_fmnist) in code style, since a capital would misspell it."""
    first, _, rest = text.partition(" ")
    if "_" in first:
        return f"`{first}` {rest}"
    return text[0].upper() + text[1:]


def section(results: Dict[str, Any]) -> List[str]:
    name = results["study"]
    notes = get_study(name).notes
    lines = [f"## {results['title']}", "", f"**The claim.** {results['claim']}.", ""]
    if results.get("paper"):
        lines += [paper_line(results["paper"]), ""]
    lines += [f"**Here.** {_sentence(results['setting'])}.", "",
              "<!-- docs-test: skip: " + (f"the whole study is {_minutes(results)}" if results["runs"] else
                                          "it reads the training studies' runs (hours of training)") +
              "; tests/test_studies.py runs every study end to end at test scale -->",
              "```bash", f"vitkit study {name} --out docs/studies", "```", ""]
    seeds = len(results["settings"]["seeds"])
    if results["runs"]:
        lines += [f"Measured: {_minutes(results)} over {len(results['runs'])} runs ({seeds} seeds); "
                  f"`{name}.json` holds every run.", ""]
    else:
        lines += [f"It trains nothing: it reads the models the other studies trained, in seconds; `{name}.json` "
                  "holds what it measured.", ""]
    lines += [results["table"], ""]
    if (STUDIES / f"{name}.png").is_file():
        lines += [f"![{results['title']}](studies/{name}.png)", ""]
    lines += ["**Verdicts.**", ""]
    lines += [f"- {_sentence(v['claim'])}: **{v['verdict']}** ({v['why']})." for v in
              results["verdicts"]]
    if notes:
        lines += ["", f"**To read it.** {notes}"]
    return lines + [""]


ORDER = ("position-embeddings", "compute", "data-size", "fewshot-proxy", "attention-distance", "self-supervision",
         "registers")


def page() -> str:
    lines, missing = [INTRO], []
    for name in ORDER:
        path = STUDIES / f"{name}.json"
        results = json.loads(path.read_text()) if path.is_file() else {}
        if "verdicts" in results:  # a study still running has no verdicts yet
            lines += section(results)
        else:
            missing.append(name)
    if missing:  # said, never silently left out
        lines += ["## Not run here yet", "",
                  "These studies have no committed results yet; each runs with the same command as the others:", ""]
        lines += [f"- {get_study(n).title}: `vitkit study {n} --out docs/studies`" for n in missing]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args(argv)
    text = page()
    if args.check:
        same = PAGE.is_file() and PAGE.read_text() == text
        print("docs/paper.md is " + ("current" if same else "stale: run python scripts/paper_md.py"))
        return 0 if same else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
