"""Reading a training config file (YAML or JSON) within bounds: its size, the number and nesting
of its values (a YAML alias "bomb" stands for far more than it holds), duplicate keys, and tags other than
YAML's own, each refused in one line naming the file (and the line and column); dates and YAML 1.1's other
number forms stay text."""

from __future__ import annotations

import json
import re
import stat
import sys
from pathlib import Path
from typing import Any, Dict

from ..extras import require
from .config_types import _show

#: What a config file may hold, checked before anything is expanded, printed or written: its
#: size, and the number and nesting of its values (a YAML alias "bomb" repeats a list by
#: reference: a 1 KB file can stand for 10^9 values once written out).
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 10_000
MAX_CONFIG_DEPTH = 32
#: The suffixes of the files read as YAML (the rest must be .json).
YAML_SUFFIXES = (".yaml", ".yml")


def load_config_file(path: str) -> Dict[str, Any]:
    """A YAML or JSON file of TrainConfig fields: read within bounds, refused in one line naming
    the file (and the line and column) when it is no mapping of fields, with duplicate keys, too
    large, too deeply nested, or not text. YAML dates stay text (``name: 2024-01-01``)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"config file not found: {p}")
    if p.is_dir() or not stat.S_ISREG(p.stat().st_mode):
        raise ValueError(f"config file {p} is not a regular file (a folder, a FIFO?)")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"config file {p} is {p.stat().st_size:,} bytes: a training config is a few hundred "
                         f"(at most {MAX_CONFIG_BYTES:,} are read)")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"config file {p} is not UTF-8 text (byte {e.start})") from None
    suffix = p.suffix.lower()
    if suffix not in YAML_SUFFIXES + (".json",):
        raise ValueError(f"config file {p}: name it .yaml, .yml or .json (its suffix says how to read it)")
    try:
        data = _read_yaml(p, text) if suffix in YAML_SUFFIXES else _read_json(p, text)
    except ValueError as e:
        if "integer string conversion" not in str(e):
            raise
        raise ValueError(f"config file {p} holds a number of more than {sys.get_int_max_str_digits():,} digits") \
            from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {p}: expected a mapping of config fields (field: value), got "
                         f"{type(data).__name__}")
    _check_shape(p, data)
    keys = [k for k in data if not isinstance(k, str)]
    if keys:
        raise ValueError(f"config file {p}: field names are text, not {_show(keys[0])}")
    return data


def own_run_name(path: str, data: Dict[str, Any]) -> bool:
    """Whether ``data`` is a run's own config.json, read where the run left it: its ``name`` is that run's folder
    (a new run reusing its settings gets a folder of its own), not a name chosen for the next."""
    p = Path(path).resolve()  # (config.json given from inside the run's folder: its parent is ".")
    return p.name == "config.json" and data.get("name") == p.parent.name and (p.parent / ".lock").is_file()


def _read_json(p: Path, text: str) -> Any:
    def no_duplicates(pairs):
        seen, twice = set(), set()
        for key, _ in pairs:
            (twice if key in seen else seen).add(key)
        twice = sorted(twice)
        if twice:
            raise ValueError(f"config file {p}: {', '.join(twice)} given twice")
        return dict(pairs)

    try:
        return json.loads(text, object_pairs_hook=no_duplicates)
    except json.JSONDecodeError as e:
        empty = " (the file is empty)" if not text.strip() else ""
        raise ValueError(f"config file {p} is not valid JSON{empty}: {e.msg} at line {e.lineno}, column {e.colno}") \
            from None
    except RecursionError:
        raise ValueError(f"config file {p} is nested too deeply (at most {MAX_CONFIG_DEPTH} levels)") from None


def _read_yaml(p: Path, text: str) -> Any:
    yaml = require("yaml", "train", f"YAML config files such as {p.name} (or write it as JSON)")
    try:
        return yaml.load(text, Loader=_yaml_loader(yaml, p))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(e.problem or e.context or "").split())
        if "tab" in problem or "'\\t'" in problem:
            problem += " (YAML indents with spaces, not tabs)"
        if "constructor for the tag" in problem:
            problem += " (vitkit reads plain YAML, without tags)"
        raise ValueError(f"config file {p} is not valid YAML{at}: {problem}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"config file {p} is not valid YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise ValueError(f"config file {p} is nested too deeply (at most {MAX_CONFIG_DEPTH} levels)") from None


#: numbers as YAML 1.2 reads them: YAML 1.1's other forms (octal 0042 was 34, 0b1000 8, 0x10 16, 1:30 the
#: sexagesimal 90, 1_000 1000) are left as text, which the fields' check reads or refuses with a note, and
#: 1e-3 is the number (YAML 1.1 wanted a dot: text, which model_args refused)
PLAIN_INT = re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$")
PLAIN_FLOAT = re.compile(r"^(?:[-+]?(?:(?:\.[0-9]+|[0-9]+\.[0-9]*)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)"
                         r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")  # (a dot or an exponent: 12 is an int)


def _yaml_loader(yaml, p: Path):
    """PyYAML's safe loader without its date resolver (a date is text to vitkit), with numbers only as
    written plainly (PLAIN_INT, PLAIN_FLOAT), refusing duplicate keys (PyYAML keeps the last silently)."""

    class Loader(yaml.SafeLoader):
        pass

    plain = {"tag:yaml.org,2002:int": PLAIN_INT, "tag:yaml.org,2002:float": PLAIN_FLOAT}
    Loader.yaml_implicit_resolvers = {
        first: [(tag, plain.get(tag, regexp)) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}

    def mapping(loader, node):
        seen, twice = set(), set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            key = key if isinstance(key, (str, int, float, bool, type(None))) else repr(key)
            (twice if key in seen else seen).add(key)
        twice = sorted(map(str, twice))
        if twice:
            raise ValueError(f"config file {p}: {', '.join(twice)} given twice (line {node.start_mark.line + 1})")
        return loader.construct_mapping(node, deep=True)

    Loader.add_constructor("tag:yaml.org,2002:map", mapping)
    return Loader


def _check_shape(p: Path, data: Any) -> None:
    """Count values and nesting with a budget, so that shared references (YAML aliases) are
    counted as often as they would be written out, and the walk stops at the first bound."""
    budget = [MAX_CONFIG_VALUES]

    def walk(value: Any, depth: int) -> None:
        if depth > MAX_CONFIG_DEPTH:
            raise ValueError(f"config file {p} is nested too deeply (at most {MAX_CONFIG_DEPTH} levels)")
        budget[0] -= 1
        if budget[0] < 0:
            raise ValueError(f"config file {p} holds more than {MAX_CONFIG_VALUES:,} values once its references "
                             f"(YAML aliases) are written out: a training config holds a few dozen")
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        for child in children:
            walk(child, depth + 1)

    walk(data, 0)


__all__ = [
    "MAX_CONFIG_BYTES", "MAX_CONFIG_DEPTH", "MAX_CONFIG_VALUES", "YAML_SUFFIXES", "load_config_file", "own_run_name",
]
