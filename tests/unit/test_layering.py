"""The import structure of `compaction`: no circle between its modules, no private name imported from another one.

Read from the source (the AST), not by importing: every import counts, at module level, inside a function (a
deferred import is still a dependency) and under `if TYPE_CHECKING:` (a type a module needs is one too).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "compaction"

KNOWN_CIRCLES: dict[frozenset[str], str] = {}
"""Circles not broken yet, each with why it is still there."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(node: ast.AST, importer: str, is_package: bool) -> Iterator[tuple[str, str | None]]:
    """(module, name) pairs one import statement reads: the module a name is taken from, or the module itself."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, None
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = importer.split(".")[: len(importer.split(".")) - node.level + (1 if is_package else 0)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            yield base, alias.name


def owner(name: str) -> str | None:
    """The module of ours `name` (a dotted path) lives in, or None for another library's."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def dependencies() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        deps = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for module, attr in imported(node, name, path.name == "__init__.py"):
                target = owner(f"{module}.{attr}") if attr and f"{module}.{attr}" in MODULES else owner(module)
                if target and target != name:
                    deps.add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_modules() -> None:
    found = circles(dependencies())
    new = [sorted(c) for c in found if c not in KNOWN_CIRCLES]
    assert not new, f"import circles: {new}"
    gone = [sorted(c) for c in KNOWN_CIRCLES if c not in found]
    assert not gone, f"broken since (take them off KNOWN_CIRCLES): {gone}"


def test_no_private_name_imported_from_another_module() -> None:
    private = [
        f"{name} imports {attr} from {module}"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        for module, attr in imported(node, name, path.name == "__init__.py")
        if attr and attr.startswith("_") and not attr.startswith("__") and owner(module) not in (None, name)
    ]
    assert not private, "\n".join(private)


@pytest.mark.parametrize(("graph", "expected"), [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [frozenset("abc")]),
])
def test_circles_finds_what_it_should(graph: dict[str, set[str]], expected: list[frozenset[str]]) -> None:
    assert circles(graph) == expected


RUN_LAYERS = ("run", "spark", "rewrite")
"""A compaction run goes down these packages: the driver's run (`run.stage.stage`), the Spark data path, the
executors' rewrite, and on into what they share below them (`compaction.tasks`, format, strategies, storage...)."""


def layer(module: str) -> int:
    parts = module.split(".")
    return RUN_LAYERS.index(parts[1]) if len(parts) > 2 and parts[1] in RUN_LAYERS else len(RUN_LAYERS)


def test_a_runs_call_path_never_climbs_back_up_its_layers() -> None:
    """No module a run reaches from `run.stage` imports one of a layer above its own (the spark layer reading the
    run's task values back from run/ was four such imports)."""
    graph = dependencies()
    reached: set[str] = set()
    todo = ["compaction.run.stage"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += sorted(graph.get(module, ()))
    assert "compaction.rewrite.upload" in reached and "compaction.spark.scan" in reached
    climbs = sorted((m, d) for m in reached for d in graph.get(m, ()) if layer(d) < layer(m))
    assert climbs == []


LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundations", ("errors", "counters", "progress", "kernels", "packing", "config", "delta_protocol", "pipes")),
    ("formats and stores", ("format", "storage", "remote_storage", "dump")),
    ("model", ("metadata", "strategies", "planner", "producers", "retention", "tasks", "bloom")),
    ("log", ("tier", "wal", "reader", "gc", "remote_log_metadata", "generate")),
    ("executors", ("rewrite", "topic_table", "verify")),
    ("spark", ("spark",)),
    ("drivers", ("run", "=topic_table", "topic_table.run", "topic_table.upkeep", "=verify")),
    ("interfaces", ("=", "cli", "arguments", "prebuild")),
)
"""The whole package's layers, bottom first, each a set of modules under `compaction.`: a name holds the module and
everything below it, `=name` the module alone (a package's `__init__` that drives its own lower modules, as
`compaction.verify` runs `compaction.spark.verify`, which reads verify's columnar views). Where a module falls under
two names, the longer one decides. docs/layout.md describes the same layers."""

KNOWN_CLIMBS: dict[tuple[str, str], str] = {}
"""Imports that still run up the layers, each with why (the issue's bound: at most 5)."""


def package_layer(module: str) -> int:
    rest = module.partition(".")[2]
    best: tuple[int, int] | None = None
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            exact = name.startswith("=")
            name = name.removeprefix("=")
            holds = rest == name or (not exact and rest.startswith(f"{name}."))
            if holds and (best is None or len(name) >= best[1]):
                best = (index, len(name))
    assert best is not None, f"{module} is in no layer of LAYERS: place it"
    return best[0]


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        package_layer(module)


def test_imports_run_down_the_layers() -> None:
    """No module imports one of a layer above its own, bar the few `KNOWN_CLIMBS` (at most 5)."""
    graph = dependencies()
    climbs = {(m, d) for m, deps in graph.items() for d in deps if package_layer(d) > package_layer(m)}
    named = "\n".join(f"{m} ({LAYERS[package_layer(m)][0]}) imports {d} ({LAYERS[package_layer(d)][0]})"
                      for m, d in sorted(climbs - KNOWN_CLIMBS.keys()))
    assert not named, f"imports up the layers:\n{named}"
    assert not KNOWN_CLIMBS.keys() - climbs, f"gone (take them off KNOWN_CLIMBS): {KNOWN_CLIMBS.keys() - climbs}"
    assert len(KNOWN_CLIMBS) <= 5


@pytest.mark.parametrize(("module", "expected"), [
    ("compaction", "interfaces"), ("compaction.verify", "drivers"), ("compaction.verify.span", "executors"),
    ("compaction.topic_table.run", "drivers"), ("compaction.topic_table.plan", "executors"),
    ("compaction.errors", "foundations"), ("compaction.spark.table", "spark"),
])
def test_package_layer_reads_the_layers_as_documented(module: str, expected: str) -> None:
    assert LAYERS[package_layer(module)][0] == expected
