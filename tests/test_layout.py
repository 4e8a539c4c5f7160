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
    assert "engine.config" in graph["engine.decoders"] and "engine.registry" in graph["engine.config"]  # the graph is read
