"""The architecture's figures, as docs/ARCHITECTURE.md quotes them: import cycles, mode branches
and `Any` in the broker, the engine's public surface.

    .venv/bin/python scripts/architecture_figures.py [--json]

* import cycles: strongly connected components of more than one module in the graph of every
  `import` of a `loglake` module anywhere in a module (top level, inside functions, under
  TYPE_CHECKING alike: a cycle a function-level import hides is still a cycle of meaning);
* mode branches: lines of `src/loglake/broker/` that ask which mode the broker runs in (the
  `cluster` attribute of a context or config tested, or fetched with getattr);
* `Any` in broker/: uses of the name outside import lines;
* engine surface: public members of `loglake.engine.Engine` (methods and properties of the class
  and its bases, and the public attributes an open engine carries).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE = "loglake"

#: A line of broker/ that asks which mode it runs in.
MODE_BRANCH = re.compile(
    r"""getattr\(\s*\w+\s*,\s*["']cluster["']|\.cluster\s+is\s+(not\s+)?None|if\s+[\w.]*\.cluster\s*[:)]|\bClusterEngine\b"""
)
ANY_NAME = re.compile(r"\bAny\b")


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


class Import(NamedTuple):
    """One import statement's edge: `source` imports `target` at path:line."""

    source: str
    target: str
    path: Path
    line: int


def imports_in(name: str, path: Path, known: set[str]) -> list[Import]:
    """Every import of a loglake module in module `name`, anywhere in it, with its line.

    `from P import n` is an edge to P.n when that is a module, and to P only when some imported
    name is not a submodule (a name P itself defines or re-exports): the parent package runs first
    for any submodule import, so that alone is no edge, just as `import P.n` is none to P.
    """
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    out: list[Import] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            names = [f"{stem}.{a.name}" for a in node.names]
            targets = [n for n in names if n in known]
            if len(targets) < len(names):
                targets.append(stem)
        else:
            continue
        for t in targets:
            # the longest known module the name lies in (an imported name or a submodule)
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith(PACKAGE):
                out.append(Import(name, t, path, node.lineno))
    return out


def import_edges() -> list[Import]:
    """Every import edge between loglake modules, in module order then line order."""
    mods = modules()
    known = set(mods)
    edges = [edge for name, path in mods.items() for edge in imports_in(name, path, known)]
    return sorted(set(edges), key=lambda e: (e.source, e.line, e.target))


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    for edge in import_edges():
        graph[edge.source].add(edge.target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def broker_lines() -> list[tuple[Path, int, str]]:
    rows = []
    for path in sorted((SRC / PACKAGE / "broker").rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            rows.append((path, i, line))
    return rows


def mode_branches() -> list[str]:
    return [
        f"{p.relative_to(ROOT)}:{i}"
        for p, i, line in broker_lines()
        if MODE_BRANCH.search(line) and not line.lstrip().startswith("#")
    ]


def any_uses() -> int:
    total = 0
    for _p, _i, line in broker_lines():
        stripped = line.lstrip()
        if stripped.startswith(("from ", "import ", "#")):
            continue
        total += len(ANY_NAME.findall(line.split("#", 1)[0]))
    return total


def engine_surface() -> list[str]:
    sys.path.insert(0, str(SRC))
    from loglake.engine import Engine

    members = {m for m in dir(Engine) if not m.startswith("_")}
    init = Engine.__init__
    source = ast.parse(Path(sys.modules[init.__module__].__file__ or "").read_text())
    for node in ast.walk(source):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and not node.attr.startswith("_")
        ):
            members.add(node.attr)
    return sorted(members)


def figures() -> dict[str, object]:
    graph = import_graph()
    found = cycles(graph)
    branches = mode_branches()
    surface = engine_surface()
    return {
        "modules": len(graph),
        "import_cycles": len(found),
        "modules_in_cycles": sum(len(c) for c in found),
        "cycles": found,
        "mode_branches_in_broker": len(branches),
        "mode_branch_lines": branches,
        "any_in_broker": any_uses(),
        "engine_public_members": len(surface),
        "engine_members": surface,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print every figure and list as JSON")
    args = parser.parse_args()
    f = figures()
    if args.json:
        print(json.dumps(f, indent=2))
        return 0
    print(f"modules                   {f['modules']}")
    print(f"import cycles             {f['import_cycles']} ({f['modules_in_cycles']} modules)")
    for c in f["cycles"]:  # type: ignore[attr-defined]
        print(f"  - {' <-> '.join(c)}")
    print(f"mode branches in broker/  {f['mode_branches_in_broker']}")
    for line in f["mode_branch_lines"]:  # type: ignore[attr-defined]
        print(f"  - {line}")
    print(f"Any in broker/            {f['any_in_broker']}")
    print(f"engine public members     {f['engine_public_members']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
