"""The command line's parser: one line for every mistake (exit 2) with the flag meant, and each
verb's flags from the module that handles it."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, List, Sequence

from .. import __version__
from . import describe, evaluate, inspect, serve, study, train, weights


class _Parser(argparse.ArgumentParser):
    """Command-line mistakes are one line like every other input error (exit 2), with the flag
    meant when one is close, instead of argparse's usage block. No abbreviations: ``--epoch 3``
    would be read as ``--epochs 3``, and a typo would silently start a long run."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)  # the verbs' parsers are made by this class too
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._given = list(sys.argv[1:] if args is None else args)  # for the hints of error()
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        if message.startswith("the following arguments are required"):  # a misspelt flag is why, often
            unknown = [w for w in getattr(self, "_given", []) if w.startswith("--")
                       and w.split("=")[0] not in self._option_string_actions]
            meant = self._meant(unknown)  # said with what was typed: "required: --weights (did you mean --weights?)"
            message += meant.replace(" (did you mean", f" ({', '.join(unknown)} is no flag: did you mean", 1) \
                if meant else self._files_taken()
        message += _eaten_path(message)
        if "--json" in self._option_string_actions and "--json" in getattr(self, "_given", []):
            # a script reading stdout has an answer to parse here too, as for every error of the verb's own
            print(json.dumps({"verb": self.prog.split()[-1], "error": message, "exit": 2}), flush=True)
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _meant(self, words: Sequence[str]) -> str:
        import difflib

        flags = [f for f in self._option_string_actions if f.startswith("--")]
        positional = {(a.metavar or a.dest).lower().replace("_", "-"): a  # info's MODEL: other verbs' --model
                      for a in self._actions if not a.option_strings and a.nargs != 0}
        given = [w.split("=")[0][2:] for w in words if w.startswith("--")]
        meant = next((positional[w] for w in given if w in positional), None)
        if meant is not None:  # `vitkit serve --weights w`: the flag of other verbs is an argument here
            name = meant.metavar or meant.dest.upper()
            return f" ({name} is an argument of {self.prog}, without a flag: {self.prog} {name} ...)"
        placed = [w for w in words if w.split("=")[0] in flags]  # `vitkit --json models`: a verb's flag before it
        if placed:
            return f" ({placed[0].split('=')[0]} goes after the verb: {self.prog} {placed[0]} ...)"
        if "--out" in [w.split("=")[0] for w in words] and "--runs-dir" in flags:  # (train: "did you mean --cutmix?")
            return f" ({self.prog} writes into --runs-dir DIR, its run's folder named by --name)"
        guesses = [g for word in words if word.startswith("-")
                   for g in difflib.get_close_matches(word.split("=")[0], flags, n=1)]
        return f" (did you mean {', '.join(dict.fromkeys(guesses))}?)" if guesses else ""

    def _files_taken(self) -> str:
        """Files read as the values of a flag of several values before them (``--labels cat dog a.png``
        leaves no images): said as such, with the two ways out."""
        flag, taken = None, {}
        for word in getattr(self, "_given", []):
            if word == "--":
                break
            if word.startswith("-") and not _NUMBER.match(word):
                action = self._option_string_actions.get(word)
                flag = word if action is not None and action.nargs in ("+", "*") else None
            elif flag is not None and _looks_like_file(word):
                taken.setdefault(flag, []).append(word)
        if not taken:
            return ""
        flag, files = next(iter(taken.items()))
        were = "was" if len(files) == 1 else "were"
        return f" ({', '.join(files)} {were} read as {flag}'s values: {_ways_out(flag)})"

    def check_values(self, args: argparse.Namespace) -> None:
        """Values no flag means. An empty string is no path or name: ``--out ""`` would mean the
        current folder, or nothing at all (``--dry-run ""`` would push for real). A file among a
        list of names (``predict a.png --labels cat dog b.png``) is an image read as a class name."""
        for action in self._actions:
            value = getattr(args, action.dest, None)
            name = action.option_strings[-1] if action.option_strings else action.dest.upper()
            if value == "" or (isinstance(value, list) and any(v == "" for v in value)):
                self.error(f"argument {name}: an empty value (leave the flag out, or give it one)")
            files = [v for v in value if os.path.isfile(v)] if action.dest in NAME_LISTS and value else []
            if files:
                self.error(f"argument {name}: {', '.join(files)} {'is a file' if len(files) == 1 else 'are files'}, "
                           f"not {'a class name' if len(files) == 1 else 'class names'} ({_ways_out(name)})")

    def unknown(self, extra: List[str]):
        self.error(f"unrecognized arguments: {' '.join(extra)}{self._meant(extra)}")


#: flags whose values are names, never files (a file among them was meant as an input)
NAME_LISTS = ("labels",)
_NUMBER = re.compile(r"^-\d|^-\.\d")


def _looks_like_file(word: str) -> bool:
    return "/" in word or os.path.exists(word) or re.search(r"\.[A-Za-z]{2,5}$", word) is not None


def _eaten_path(message: str) -> str:
    """A flag of several numbers (``--img-size 32 a.png``) reads on into the file names after it: said
    as such, rather than as a number that is not one."""
    found = re.match(r"argument (--[\w-]+): invalid (?:int|float) value: '(.*)'$", message)
    if found is None or not _looks_like_file(found.group(2)):
        return ""
    return f" ({found.group(2)} looks like a file: {_ways_out(found.group(1))})"


def _ways_out(flag: str) -> str:
    """How to keep files out of a flag of several values."""
    return f"put files before {flag}, or end its values with --"


def build_parser() -> argparse.ArgumentParser:
    """The parser of every verb, each verb's flags added by the module of its handler."""
    parser = _Parser(prog="vitkit", description="Vision Transformers: build, "
                     "convert, inspect and run ViT-family models.")
    parser.add_argument("--version", action="version", version=f"vitkit {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    for add in (describe.add_models, describe.add_info, weights.add_convert, weights.add_push, evaluate.add_predict,
                evaluate.add_eval, evaluate.add_fewshot, inspect.add_inspect, serve.add_serve, study.add_study,
                train.add_train, train.add_pretrain):
        add(verb)
    return parser
