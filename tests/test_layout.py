"""The package layout the code relies on, read from the sources' import statements (module and
function level alike): the engine never imports the app, the embedded model's package or the
benchmarks, and no two of its modules import each other."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "engine"


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
    ("engine.errors", "engine.arguments"),
    ("engine.registry", "engine.cache_modes", "engine.system_options", "engine.constraints", "engine.config", "engine.stats", "engine.step_state", "engine.trace_upgrade", "engine.trace", "engine.hooks", "engine.trace_diff", "engine.analysis"),
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
