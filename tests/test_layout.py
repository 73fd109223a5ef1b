"""The house's layout as docs/architecture.md draws it: imports point down the layers only, and no
two modules import each other (directly or round a longer circle), counting imports inside
functions and type-only ones too -- a lazy import is still a dependency.

The one circle and the one upward arrow left (the studies run the command line in-process) are
listed by name; the test fails when they are gone too, so that the list only shrinks."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src"

#: docs/architecture.md's layers, top first: a package imports only packages of a lower rank
RANK = {"__main__": 9, "cli": 8, "studies": 7, "train": 6, "inspect": 6, "deploy": 5, "evaluate": 4, "weights": 3,
        "data": 3, "selfsup": 2, "models": 1, "utils": 0, "_version": 0, "runlock": 0, "parallel": 0, "progress": 0,
        "tiny": 0, "__init__": 0}  # vitkit/__init__ imports _version only (the rest on first use, PEP 562)
#: what is left to undo (issue 44: the studies call library functions, not the command line)
KNOWN_CIRCLES = [{"vitkit.cli", "vitkit.studies", "vitkit.studies.base"}]
KNOWN_UPWARD = {("vitkit.studies.base", "vitkit.cli")}


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
