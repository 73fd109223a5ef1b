"""``python -m vitkit`` (also what ``torchrun -m vitkit`` runs)."""

import sys

from .cli import main

sys.exit(main())
