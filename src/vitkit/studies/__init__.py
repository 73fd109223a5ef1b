"""The paper's experiments as studies anyone can rerun: one claim each, a verdict each.

``vitkit study NAME`` runs one (``vitkit study list`` names them); each module opens with the
command, its cost on 2 CPU cores and where its result is. :mod:`.base` holds what they share:
arms x seeds as resumable ``vitkit train`` runs, the numbers over seeds, the verdict rule.
"""

from __future__ import annotations

import importlib
from typing import Dict, List

from .base import Options, Study, run_study

#: study name -> the module that defines it (its ``STUDY``)
STUDIES: Dict[str, str] = {"position-embeddings": "positions", "compute": "compute", "data-size": "data_size",
                           "fewshot-proxy": "fewshot_proxy", "attention-distance": "attention_distance",
                           "self-supervision": "selfsup", "registers": "registers"}


def list_studies() -> List[str]:
    return list(STUDIES)


def get_study(name: str) -> Study:
    """The study registered as ``name`` (:func:`list_studies`); an unknown name is refused with the list."""
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; the studies: {', '.join(STUDIES)}")
    return importlib.import_module(f".{STUDIES[name]}", __name__).STUDY


__all__ = ["STUDIES", "list_studies", "get_study", "Options", "Study", "run_study"]
