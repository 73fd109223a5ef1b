"""``VITKIT_TINY=1``: every command at a tiny scale, with the same words.

The test suite runs each command of README.md and docs/*.md as written (tests/test_docs.py);
this switch makes that take seconds instead of hours without changing a single flag. It is
read in two places only: the training configuration (steps, batch, validation size) and the
in-memory datasets (the first images of each split; image folders and Hugging Face datasets
score a fixed sample of their test images through ``test_size``). Never set it for real work: it is printed
in every run's summary, so a tiny result cannot pass for a real one.
"""

from __future__ import annotations

import os
from typing import Any, Dict

#: Images kept of each in-memory split: enough for every class, a validation carve and a
#: few-shot draw of 25 shots + 50 held out per class; 100 test images hold every class of
#: Fashion-MNIST 6-14 times (200 cost the docs test a minute of scoring at 224 px).
SPLIT_IMAGES = {"train": 3000, "test": 100}
#: At most this many optimisation steps, images per batch, validation and evaluation images.
LIMITS = {"max_steps": 2, "batch_size": 16, "val_size": 50, "eval_batch_size": 250}


def enabled() -> bool:
    return os.environ.get("VITKIT_TINY", "") not in ("", "0")


def shrink_config(values: Dict[str, Any], defaults: Any, stream: bool = False) -> Dict[str, Any]:
    """Training option values with the tiny limits applied (``defaults``: TrainConfig, for unset ones;
    ``stream``: the data is tar shards or a streamed Hugging Face dataset, which have no "first N")."""
    out = dict(values)
    for key, limit in LIMITS.items():
        value = out.get(key, getattr(defaults, key))
        if key == "val_size" and value == 0:
            continue  # no validation carve stays none
        out[key] = limit if value is None else min(value, limit)
    out["micro_batch"] = None
    # tar shards and streams have no positions to sample (test_size refuses them): they score every test image
    if not stream:
        size = out.get("test_size")
        out["test_size"] = SPLIT_IMAGES["test"] if size is None else min(size, SPLIT_IMAGES["test"])
    return out


def shrink_split(split: str, images, labels):
    """The first images of a split (Fashion-MNIST's and CIFAR's are in no class order)."""
    n = SPLIT_IMAGES.get(split, len(labels))
    return images[:n], labels[:n]
