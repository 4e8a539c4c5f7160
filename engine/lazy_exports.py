"""A package's public names imported on first use (PEP 562), so importing the package costs nothing:
a process that needs one corner of the engine (the constraint build server, engine/constraints/
builder.py: numpy and outlines-core, no torch) starts in a tenth of the time the whole engine takes to
import, and `from engine import Engine` still imports what Engine needs."""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable


def lazy_exports(package: str, defined_in: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`, whose public names are `defined_in`'s keys, each
    defined in the submodule its value names. Another attribute is a submodule (`engine.decoders`
    after a bare `import engine`), as an eager package gave."""
    namespace = import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name in defined_in:
            value = getattr(import_module(f".{defined_in[name]}", package), name)
            namespace[name] = value  # imported once: later reads find it without this hook
            return value
        try:
            return import_module(f".{name}", package)
        except ModuleNotFoundError as missing:
            if missing.name != f"{package}.{name}":
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    def __dir__() -> list[str]:
        return sorted({*namespace, *defined_in})

    return __getattr__, __dir__
