"""The package layout the code relies on, read from the sources' import statements (module and
function level alike): the engine never imports the app, the embedded model's package or the
benchmarks, and no two of its modules import each other; the engine and the app each stand on
floors, none importing from a floor above (the app's: docs/app.md, module map)."""

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "engine"
APP = ROOT / "dinfer_viz"


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, absolute, at any depth (inside functions too)."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}  # `from . import cache`
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_engine_never_imports_the_app_the_tiny_model_or_the_benchmarks():
    for path in ENGINE.rglob("*.py"):
        outside = {m for m in imports_of(path) if m.split(".")[0] in ("dinfer_viz", "tinymodel", "benchmarks", "app")}
        assert not outside, f"{path.relative_to(ROOT)} imports {sorted(outside)}"


def test_no_two_engine_modules_import_each_other():
    modules = {module_name(p): p for p in ENGINE.rglob("*.py")}
    graph = {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}
    # a package's __init__ re-exports its modules: that direction is not a cycle of the design
    mutual = sorted(
        (a, b) for a, deps in graph.items() for b in deps
        if a < b and a in graph.get(b, set()) and not (a == b.rsplit(".", 1)[0] or b == a.rsplit(".", 1)[0])
    )
    assert not mutual, f"modules that import each other: {mutual}"
    assert "engine.config" in graph["engine.decoders.base"] and "engine.registry" in graph["engine.config"]  # the graph is read


# The engine's floors, lowest first: a module imports only from its own floor or below. The loop
# (floors 0-4) knows nothing of the runtime that wraps it, the text-level API or the server.
FLOORS = (
    ("engine.errors", "engine.arguments", "engine.lazy_exports"),
    ("engine.registry", "engine.cache_modes", "engine.system_options", "engine.constraints", "engine.infill", "engine.config", "engine.stats", "engine.step_state", "engine.trace_upgrade", "engine.trace", "engine.hooks", "engine.trace_diff", "engine.analysis"),
    ("engine.models",),
    ("engine.decoders", "engine.cache"),
    ("engine.run", "engine.kinds", "engine.fill", "engine.generation", "engine.settings_read"),
    ("engine.runtime",),
    ("engine.pipeline", "engine.reference"),
    ("engine.serving", "engine.cli", "engine.tuning", "engine.__main__"),
)


def floor_of(module: str) -> int | None:
    for level, names in enumerate(FLOORS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return level
    return None


def package_graph(*roots: Path) -> dict[str, set[str]]:
    modules = {module_name(p): p for root in roots for p in root.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def test_every_engine_module_has_a_floor_and_imports_nothing_above_it():
    graph = package_graph(ENGINE)
    for name, deps in graph.items():
        if name == "engine" or name.endswith(".__init__") or module_name(ENGINE / "runtime" / "__init__.py") == name:
            continue
        assert floor_of(name) is not None, f"{name} has no floor in FLOORS"
        upward = sorted(d for d in deps if d != "engine" and floor_of(d) is not None and floor_of(d) > floor_of(name))
        assert not upward, f"{name} (floor {floor_of(name)}) imports from a higher floor: {upward}"


# The app's floors, lowest first (docs/app.md, module map), each holding layers: packages or
# top-level modules. A module imports only from its own layer and from the floors below, so two
# layers of one floor know nothing of each other.
APP_FLOORS = (
    ("dinfer_viz.reading",),
    ("dinfer_viz.drawing", "dinfer_viz.live"),
    ("dinfer_viz.views", "dinfer_viz.settings"),
    ("dinfer_viz.panes",),
    ("dinfer_viz.studies",),
    ("dinfer_viz.sample_traces",),
    ("dinfer_viz.tabs",),
    ("dinfer_viz.ui",),
)


def app_layer_of(module: str) -> tuple[int, str] | None:
    """(floor, layer) of an app module, None where no layer of APP_FLOORS holds it."""
    for level, layers in enumerate(APP_FLOORS):
        for layer in layers:
            if module == layer or module.startswith(layer + "."):
                return level, layer
    return None


def test_every_app_module_has_a_floor_and_imports_only_from_its_layer_and_the_floors_below():
    graph = package_graph(APP)
    assert "dinfer_viz.reading.timeline" in graph["dinfer_viz.drawing.cells"]  # the graph is read
    for name, deps in graph.items():
        if name == "dinfer_viz":  # the package itself: its docstring, no import
            continue
        floor, layer = app_layer_of(name) or (None, None)
        assert layer is not None, f"{name} has no floor in APP_FLOORS"
        wrong = sorted(d for d in deps if (other := app_layer_of(d)) and other[1] != layer and other[0] >= floor)
        assert not wrong, f"{name} (floor {floor}) imports from another layer of its floor or from a higher floor: {wrong}"


def test_no_app_module_name_is_used_twice():
    """A name says where a thing lives: no two modules (or a module and a package) under dinfer_viz/
    share one, however deep."""
    names = Counter(p.parent.name if p.name == "__init__.py" else p.stem for p in APP.rglob("*.py") if p != APP / "__init__.py")
    assert names, "no module found under dinfer_viz/"
    twice = sorted(name for name, count in names.items() if count > 1)
    assert not twice, f"module names used more than once under dinfer_viz/: {twice}"


def test_no_import_cycle_in_the_tree():
    """No cycle of any length among the modules of engine/, dinfer_viz/, tinymodel/ and benchmarks/
    (a package's __init__ re-exporting its modules excepted)."""
    graph = package_graph(ENGINE, ROOT / "dinfer_viz", ROOT / "tinymodel", ROOT / "benchmarks")
    graph = {a: {b for b in deps if not (b == a.rsplit(".", 1)[0] or a == b.rsplit(".", 1)[0]) and "." in b} for a, deps in graph.items() if "." in a}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            assert state.get(nxt) != 1, f"import cycle: {' -> '.join(path[path.index(nxt):] + [nxt]) if nxt in path else nxt}"
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node, [node])


def test_no_engine_or_app_module_is_over_500_lines():
    modules = [*ENGINE.rglob("*.py"), *(ROOT / "dinfer_viz").rglob("*.py")]
    long = {str(p.relative_to(ROOT)): n for p in modules if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"modules over 500 lines (split them by what their parts do): {long}"
