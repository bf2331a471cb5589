"""The import rules of the repository, checked: layers import only downward, nothing imports in
a circle, and ``meshd/`` keeps few loose modules.

``python -m testbed.imports`` prints the measures (``tests/test_layers.py`` holds them at
zero).  Every ``import`` counts, wherever it stands: at module level, inside a function, or
under ``TYPE_CHECKING`` (a deferred import still ties the two modules together).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LAYERS: tuple[tuple[str, ...], ...] = (
    # the libraries under the agent, each knowing none above it
    ("proto",),
    ("adapters",),
    ("gossip",),
    ("topology",),
    ("certs",),
    ("policy",),
    ("consensus",),
    # the agent, from its plumbing up to the process that ties it together
    ("meshd", "meshd.tracing", "meshd.logs", "meshd.collector"),
    ("meshd.settings",),
    ("meshd.security",),
    ("meshd.coordinates",),
    ("meshd.signals",),
    ("meshd.score",),
    ("meshd.control",),
    ("meshd.models",),
    ("meshd.train",),
    ("meshd.router",),
    ("meshd.metrics",),
    ("meshd.admin",),
    ("meshd.ctl",),
    ("meshd.agent", "meshd.cli"),
    ("meshd.dev",),
    # what runs the product to check and measure it
    ("testbed",),
    ("bench",),
    ("tests",),
)
"""Lowest first.  A module may import its own layer's modules and any layer below; a name
covers the package or module and everything inside it."""

MAX_LOOSE = 8
"""Modules directly in ``meshd/`` (``__init__`` included): the rest live in packages."""


@dataclass(frozen=True)
class Finding:
    importer: str
    imported: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.imported}"


def layer_of(module: str, layers: Iterable[tuple[str, ...]] = LAYERS) -> int | None:
    """The index of the layer holding ``module`` (its longest matching name), or None."""
    best: tuple[int, int] | None = None
    for i, names in enumerate(layers):
        for name in names:
            if module == name or module.startswith(name + "."):
                if best is None or len(name) > best[1]:
                    best = (i, len(name))
    return None if best is None else best[0]


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the repository's packages, by dotted name."""
    tops = {name.split(".")[0] for names in LAYERS for name in names}
    found: dict[str, Path] = {}
    for top in sorted(tops):
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: Mapping[str, Path]) -> list[tuple[str, int]]:
    """The repository modules ``name`` imports, each with the line of its first import."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from pkg import mod`` imports the submodule when there is one
            targets = [f"{module}.{a.name}" for a in node.names] or [module]
        for target in targets:
            found = resolve(target)
            if found is not None and found != name:
                out.setdefault(found, node.lineno)
    return sorted(out.items())


def graph(root: Path = ROOT) -> dict[str, list[tuple[str, int]]]:
    known = modules(root)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def upward(edges: Mapping[str, Iterable[tuple[str, int]]],
           layers: Iterable[tuple[str, ...]] = LAYERS) -> list[Finding]:
    """Imports of a higher layer (or of a module no layer names)."""
    layers = tuple(layers)
    found = []
    for importer, targets in sorted(edges.items()):
        mine = layer_of(importer, layers)
        for imported, line in targets:
            theirs = layer_of(imported, layers)
            if mine is None or theirs is None or theirs > mine:
                found.append(Finding(importer, imported, line))
    return found


def cycles(edges: Mapping[str, Iterable[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
    succ = {m: [t for t, _ in ts] for m, ts in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in sorted(succ):
        if start in index:
            continue
        work = [(start, iter(succ.get(start, ())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(succ.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def loose(root: Path = ROOT) -> list[str]:
    """The modules directly in ``meshd/``."""
    return sorted(p.name for p in (root / "meshd").glob("*.py"))


def main() -> int:
    edges = graph()
    up, loops, top = upward(edges), cycles(edges), loose()
    print(f"modules directly in meshd/: {len(top)} (bar <= {MAX_LOOSE}): {' '.join(top)}")
    print(f"import cycles: {len(loops)} (bar 0)")
    for group in loops:
        print("  " + " -> ".join(group))
    print(f"upward imports: {len(up)} (bar 0)")
    for finding in up:
        print(f"  {finding}")
    return 0 if not up and not loops and len(top) <= MAX_LOOSE else 1


if __name__ == "__main__":
    sys.exit(main())
