"""The package's layers, checked from the code: no import cycles, and no layer
importing one above it (docs/architecture.md draws the same picture).

Imports are read with :mod:`ast` from every module of ``pkg/factstream`` and
every ``.pyx`` under ``csrc/factstream``; imports under ``if TYPE_CHECKING:``
are types only and do not count. An import inside a function counts too: a
lazy import is still a dependency, it only runs later.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "pkg" / "factstream"
CSRC = ROOT / "csrc" / "factstream"

#: Lowest first. A module belongs to the first entry whose prefix it has
#: (a twin at the package root belongs to the layer it serves).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("factstream._compat", "factstream._checks", "factstream.errors", "factstream.redaction", "factstream.metrics", "factstream.backoff",
              "factstream.interpreter", "factstream.status_lines")),
    ("wire", ("factstream._json", "factstream.commands", "factstream._wire", "factstream.wire")),
    ("store", ("factstream.store",)),
    ("ids", ("factstream.ids._heap", "factstream.ids")),
    ("streams", ("factstream.streams",)),
    ("replication", ("factstream.replication._relay", "factstream.replication")),
    ("transport", ("factstream.transport",)),
    ("events", ("factstream.events",)),
    ("spark", ("factstream.spark._archive", "factstream.spark")),
    ("synapse", ("factstream.synapse",)),
    ("demo", ("factstream.demo",)),
    ("cli", ("factstream.cli",)),
]
# The package's own __init__ (factstream.IMPL, __version__) sits with base.
ROOT_MODULE = "factstream"


def layer_of(module: str) -> int:
    if module == ROOT_MODULE:
        return 0
    best = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + ".") or module.startswith(prefix + "_"):
                best = rank if best is None else best
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to tests/test_layers.py and docs/architecture.md")
    return best


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    for path in CSRC.rglob("*.pyx"):
        found[".".join(path.relative_to(CSRC.parent).with_suffix("").parts)] = path
    return found


_PYX_IMPORT = re.compile(r"^\s*(?:from\s+(factstream[\w.]*)\s+c?import\s+([\w, ]+)|c?import\s+(factstream[\w.]*))", re.M)


def _imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    targets: set[str] = set()

    def add(base: str, names: list[str]) -> None:
        for name in names:
            if f"{base}.{name}" in known:
                targets.add(f"{base}.{name}")
            elif base in known:
                targets.add(base)

    if path.suffix == ".pyx":
        for m in _PYX_IMPORT.finditer(path.read_text()):
            if m.group(3):
                add(m.group(3), [])
            else:
                add(m.group(1), [n.strip() for n in m.group(2).split(",")])
        return targets - {module}

    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(id(n) for n in ast.walk(child))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("factstream"):
                    add(alias.name, [])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.startswith("factstream"):
                add(base, [a.name for a in node.names])
    return targets - {module}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {m: _imports(m, p, known) for m, p in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        comp.append(member)
                        if member == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(_graph()) == []


def test_no_import_cycle_between_packages() -> None:
    graph = _graph()
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        top = ".".join(module.split(".")[:2])
        packages.setdefault(top, set()).update(".".join(t.split(".")[:2]) for t in targets)
    packages = {k: v - {k} for k, v in packages.items()}
    assert _cycles(packages) == []


def test_layers_import_only_downwards() -> None:
    upward = []
    for module, targets in sorted(_graph().items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(module):
                upward.append(f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})")
    assert upward == []


def test_the_checker_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    with pytest.raises(AssertionError):
        layer_of("factstream.nowhere")
