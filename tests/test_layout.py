"""The house's layout as docs/architecture.md draws it: imports point down the layers only, and no
two modules import each other (directly or round a longer circle), counting imports inside
functions and type-only ones too -- a lazy import is still a dependency.

Nothing is left to allow for: the studies call the library, not the command line."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "src"

#: docs/architecture.md's layers, top first: a package imports only packages of a lower rank
RANK = {"__main__": 11, "cli": 10, "studies": 9, "serve": 9, "train": 8, "inspect": 8, "deploy": 7, "evaluate": 6,
        "weights": 5, "data": 5, "selfsup": 4, "models": 3, "utils": 2, "errors": 2, "extras": 1, "files": 1,
        "signals": 0, "machine": 0, "_version": 0, "runlock": 0, "parallel": 0, "progress": 0, "tiny": 0,
        "__init__": 0}  # vitkit/__init__ imports _version only (the rest on first use, PEP 562)
#: what is left to undo: nothing (issue 44 removed the last circle, the studies running the command line)
KNOWN_CIRCLES: list = []
KNOWN_UPWARD: set = set()


def modules():
    found = {}
    for path in (ROOT / "vitkit").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def import_graph():
    """module -> the vitkit modules it imports (a name from a package that is a submodule counts as
    that submodule, so ``from . import registry`` is an edge to ``models.registry``, not ``models``)."""
    mods = modules()
    edges = {}
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else (node.module or "")
                for alias in node.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base
                    if target in mods and target != mod:
                        out.add(target)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in mods and a.name != mod)
        edges[mod] = out
    return edges


def circles(edges):
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on, groups, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return groups


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_two_modules_import_each_other():
    found = circles(import_graph())
    assert sorted(map(sorted, found)) == sorted(map(sorted, KNOWN_CIRCLES)), found


def test_imports_point_down_the_layers():
    edges = import_graph()
    unknown = sorted({_package(m) for m in edges} - set(RANK))
    assert not unknown, f"packages docs/architecture.md does not place: {unknown}"
    upward = {(a, b) for a, outs in edges.items() for b in outs
              if _package(a) not in (_package(b), "__init__") and RANK[_package(a)] <= RANK[_package(b)]}
    assert upward == KNOWN_UPWARD, sorted(upward)


def test_the_checker_sees_lazy_type_only_and_relative_imports(tmp_path, monkeypatch):
    """The graph counts what a circle hides behind: an import inside a function, one under
    TYPE_CHECKING, a relative one; and a name imported from a package that is a submodule."""
    pkg = tmp_path / "vitkit"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    (pkg / "c.py").write_text("from .sub import a\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    edges = import_graph()
    assert edges["vitkit.c"] == {"vitkit.sub.a"}
    assert circles(edges) == [{"vitkit.sub.a", "vitkit.sub.b"}]


#: the rooms' size: a file a newcomer can read through, a function one screen long (the parser is
#: built from per-verb pieces, the checks of a config from per-field ones)
MAX_FILE_LINES, MAX_FUNCTION_LINES = 600, 60


def test_no_file_or_function_outgrows_a_room():
    long_files, long_functions = [], []
    for path in sorted((ROOT / "vitkit").rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(ROOT).as_posix()
        if len(text.splitlines()) > MAX_FILE_LINES:
            long_files.append(f"{name} ({len(text.splitlines())} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long_files and not long_functions, (long_files, long_functions)


def test_the_size_check_sees_a_long_function(tmp_path, monkeypatch):
    pkg = tmp_path / "vitkit"
    pkg.mkdir()
    (pkg / "long.py").write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    with pytest.raises(AssertionError, match=r"long.py:1 f \(61 lines\)"):
        test_no_file_or_function_outgrows_a_room()
