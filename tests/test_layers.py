"""The import contract (issue 29): loglake's packages in layers, and no import cycle.

`LAYERS` lists them high to low, one line per layer. A module may import its own package and
packages of lower lines; an import of a higher line, or of another package of its own line, is a
violation. The graph is scripts/architecture_figures.py's (every import of a loglake module
anywhere in a module: top level, in functions, under TYPE_CHECKING), so the figures issue 29
quotes and this test read one graph.

`ALLOWED_CYCLES` and `ALLOWED_IMPORTS` are today's known exceptions, each with the change that
removes it. The test fails on anything else, and on an entry that no longer occurs exactly as
written: the lists only shrink.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("architecture_figures", ROOT / "scripts" / "architecture_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


figures = _figures()
Import = figures.Import

#: High to low. An entry is a package (with every module under it) or a single module; the face
#: `loglake` is only src/loglake/__init__.py.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("loglake.cli",),
    ("loglake.spark",),
    # cluster mode implements the engine's and the broker's seams; nothing below imports it
    ("loglake.cluster",),
    # the package face re-exports the embedded API (loglake.open, Log)
    ("loglake",),
    ("loglake.broker", "loglake.log"),
    # the schema registry: a broker fact over the metadata store, whose API the broker serves
    ("loglake.registry",),
    ("loglake.engine",),
    ("loglake.meta",),
    # the metadata log is a WAL and its tables hold segment refs: meta sits on both
    ("loglake.segment", "loglake.wal"),
    # segments are read from and written to the object store
    ("loglake.store",),
    ("loglake.records", "loglake.fs"),
    # which extra installs which optional module: a MissingExtraError is a ConfigError
    ("loglake.extras",),
    ("loglake.errors", "loglake.logsafe", "loglake.canary", "loglake.scram", "loglake.locks"),
    # the one table of Kafka error codes; loglake.errors takes its numbers from it
    ("loglake.kafka_errors",),
)

#: Cycles of today, each exactly as the graph finds it (its modules), and what removes it.
ALLOWED_CYCLES: dict[tuple[str, ...], str] = {}

#: Imports up or across the layers of today, (importer, imported), and what removes them.
ALLOWED_IMPORTS: dict[tuple[str, str], str] = {}


def place(module: str) -> tuple[int, str] | None:
    """(layer index, entry) of the entry `module` lies in: the longest one, None if none."""
    best: tuple[int, str] | None = None
    for i, line in enumerate(LAYERS):
        for entry in line:
            inside = module == entry or (entry != figures.PACKAGE and module.startswith(entry + "."))
            if inside and (best is None or len(entry) > len(best[1])):
                best = (i, entry)
    return best


def layer_violations(edges: Iterable[Import]) -> list[Import]:
    """Edges that import a higher layer or another entry of their own layer."""
    out = []
    for e in edges:
        src, dst = place(e.source), place(e.target)
        assert src is not None and dst is not None, f"unplaced: {e.source} -> {e.target}"
        if src[1] != dst[1] and dst[0] <= src[0]:
            out.append(e)
    return out


def cycles_of(edges: list[Import]) -> list[tuple[str, ...]]:
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    return [tuple(c) for c in figures.cycles(graph)]


def describe(e: Import) -> str:
    path = e.path.relative_to(ROOT) if e.path.is_relative_to(ROOT) else e.path
    return f"{e.source} -> {e.target} ({path}:{e.line})"


def contract_breaches(edges: list[Import]) -> list[str]:
    """What breaks the contract: cycles and layer violations not allowed, and allowed entries that
    no longer occur."""
    out: list[str] = []
    found = cycles_of(edges)
    for cycle in found:
        if cycle not in ALLOWED_CYCLES:
            members = set(cycle)
            out.append(f"import cycle of {len(cycle)} modules:")
            out.extend(f"  {describe(e)}" for e in edges if e.source in members and e.target in members)
    out.extend(
        f"allowed cycle no longer occurs as listed (shrink or drop its entry): {' <-> '.join(c)}"
        for c in ALLOWED_CYCLES
        if c not in found
    )
    violations = layer_violations(edges)
    out.extend(
        f"import against the layers: {describe(e)}" for e in violations if (e.source, e.target) not in ALLOWED_IMPORTS
    )
    seen = {(e.source, e.target) for e in violations}
    out.extend(
        f"allowed import no longer occurs (drop its entry): {a} -> {b}" for a, b in ALLOWED_IMPORTS if (a, b) not in seen
    )
    return out


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in figures.modules() if place(m) is None)
    assert not unplaced, f"modules in no layer (add their package to LAYERS): {unplaced}"


def test_imports_follow_the_layers_without_cycles() -> None:
    breaches = contract_breaches(figures.import_edges())
    assert not breaches, "the import contract is broken:\n" + "\n".join(breaches)


def test_allowed_entries_say_why() -> None:
    for key, reason in [*ALLOWED_CYCLES.items(), *ALLOWED_IMPORTS.items()]:
        assert reason.strip(), key
    for cycle in ALLOWED_CYCLES:
        assert list(cycle) == sorted(cycle), f"list the modules of {cycle} sorted (as the graph reports them)"


def _edge(a: str, b: str, line: int = 1) -> Import:
    return Import(a, b, ROOT / "src" / (a.replace(".", "/") + ".py"), line)


def test_contract_catches_a_cycle_an_upward_and_a_sideways_import() -> None:
    """The checks themselves: on a made-up graph they name each offending edge with its place."""
    edges = [
        _edge("loglake.meta.a", "loglake.meta.b", 3),
        _edge("loglake.meta.b", "loglake.meta.a", 7),  # cycle inside one package
        _edge("loglake.engine.x", "loglake.broker.y", 12),  # upward
        _edge("loglake.broker.y", "loglake.log", 5),  # sideways (one line)
        _edge("loglake.cli.z", "loglake.kafka_errors", 9),  # downward: fine
    ]
    breaches = contract_breaches(edges)
    assert "  loglake.meta.a -> loglake.meta.b (src/loglake/meta/a.py:3)" in breaches
    assert "  loglake.meta.b -> loglake.meta.a (src/loglake/meta/b.py:7)" in breaches
    assert "import against the layers: loglake.engine.x -> loglake.broker.y (src/loglake/engine/x.py:12)" in breaches
    assert "import against the layers: loglake.broker.y -> loglake.log (src/loglake/broker/y.py:5)" in breaches
    assert not any("loglake.cli.z" in b for b in breaches)
    # every allowed entry is absent from this graph, so each is reported as stale
    assert sum("no longer occurs" in b for b in breaches) == len(ALLOWED_CYCLES) + len(ALLOWED_IMPORTS)


def test_graph_counts_hidden_imports_and_names_the_module_not_its_package(tmp_path: Path) -> None:
    """The graph's reading of import statements: function-level and TYPE_CHECKING imports count;
    `from pkg import submodule` is an edge to the submodule."""
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "from loglake import canary\n"
        "if TYPE_CHECKING:\n"
        "    from loglake.engine import Engine\n"
        "def f():\n"
        "    from loglake.meta.state import MetaState\n"
    )
    known = {"loglake", "loglake.canary", "loglake.engine", "loglake.engine.engine", "loglake.meta.state", "loglake.x"}
    found = {(e.target, e.line) for e in figures.imports_in("loglake.x", path, known)}
    assert found == {("loglake.canary", 2), ("loglake.engine", 4), ("loglake.meta.state", 6)}
