"""The registries are the one place that lists the built-in decoders and cache modes, and every
declared cache mode and system option carries the help and the explanation the app shows."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from dinfer_viz.panes.explain import explain, system_markdown
from dinfer_viz.settings import all_controls, visible_fields
from engine.__main__ import build_parser
from engine.cache import BlockCausalCache
from engine.cache_modes import cache_modes
from engine.config import GenerationConfig, setting_choices, setting_help
from engine.registry import builtin_decoder_names
from engine.system_options import system_options

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("engine", "dinfer_viz", "benchmarks", "tinymodel", "app.py")
# The modules that declare the names (a decoder's name sits in its class, a mode's in its declaration)
REGISTRIES = {"engine/registry.py", "engine/cache_modes.py", "engine/system_options.py"}
# Lists still to go, in files owned elsewhere: (file, names) -> the declaration that replaces it.
# Only that list is let through; remove the entry once the file reads the declaration.
PENDING: dict[tuple[str, tuple[str, ...]], str] = {}  # (file, names) -> why a list is let through; none now


def name_lists(tree: ast.AST, names: set[str]) -> list[tuple[int, list[str]]]:
    """(line, names) of each literal tuple, list or set, and each dict's keys, made of string
    constants only, two or more different ones, every one in `names`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [key for key in node.keys if key is not None]
        else:
            continue
        if not all(isinstance(item, ast.Constant) and isinstance(item.value, str) for item in items):
            continue
        values = {item.value for item in items}
        if len(values) >= 2 and values <= names:
            found.append((node.lineno, sorted(values)))
    return found


def source_files() -> list[Path]:
    files = []
    for entry in SCANNED:
        path = ROOT / entry
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def test_the_scan_finds_a_list_of_names_and_only_that() -> None:
    names = {"fixed", "threshold", "credit"}
    tree = ast.parse('A = ("fixed", "threshold")\nB = {"credit": 1, "fixed": 2}\nC = ("fixed", "fixed")\nD = ("fixed", "other")\nE = ["fixed", x]')
    assert name_lists(tree, names) == [(1, ["fixed", "threshold"]), (2, ["credit", "fixed"])]


@pytest.mark.parametrize("kind", ["decoder", "cache mode"])
def test_no_list_of_built_in_names_outside_the_registries(kind: str) -> None:
    names = set(builtin_decoder_names()) if kind == "decoder" else {mode.name for mode in cache_modes()}
    assert len(names) >= 2
    offenders = []
    for path in source_files():
        relative = path.relative_to(ROOT).as_posix()
        if relative in REGISTRIES:
            continue
        for line, found in name_lists(ast.parse(path.read_text(encoding="utf-8")), names):
            if (relative, tuple(found)) not in PENDING:
                offenders.append(f"{relative}:{line} {found}")
    assert not offenders, f"{kind} names listed outside the registries (read engine/registry.py, engine/cache_modes.py):\n" + "\n".join(offenders)


def cli_help(capsys: pytest.CaptureFixture[str]) -> str:
    """`python -m engine generate --help`, whitespace collapsed (argparse wraps lines)."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_every_cache_mode_is_declared_whole_and_shown() -> None:
    fields = set(GenerationConfig.__dataclass_fields__)
    generate = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["generate"]
    flag_help = {action.dest: action.help for action in generate._actions}
    assert setting_choices("cache") == tuple(mode.name for mode in cache_modes())
    for mode in cache_modes():
        assert set(mode.settings) <= fields and all(setting_help(s) for s in mode.settings)
        assert mode.explanation and mode.forward_rule
        shown = explain("threshold", mode.name)
        assert mode.explanation in shown and (mode.exact or mode.forward_rule in shown)
        # the mode's settings are the cache controls the app shows, and the CLI names the mode beside each
        cache_controls = {c.field for c in all_controls()} & {s for m in cache_modes() for s in m.settings}
        assert visible_fields("threshold", mode.name, False, False) & cache_controls == set(mode.settings)
        for setting in mode.settings:
            assert f"cache {mode.name}" in flag_help[setting]
    assert any(mode.exact for mode in cache_modes()) and not all(mode.exact for mode in cache_modes())
    # the block-causal store runs exactly the modes declared for it (engine/cache.py keeps the rule)
    assert {mode.name for mode in cache_modes() if mode.block_causal} == set(BlockCausalCache.MODES)


def test_every_system_option_is_declared_whole_and_shown(capsys: pytest.CaptureFixture[str]) -> None:
    help_text = cli_help(capsys)
    for option in system_options():
        assert option.help and option.label and option.explanation and option.kind in (int, bool)
        assert option.flag in help_text and " ".join(option.help.split()) in help_text
        assert option.explanation in system_markdown()
        assert option.explanation in explain("threshold", "none", system={option.name: 2 if option.kind is int else True})
        assert option.explanation not in explain("threshold", "none", system={option.name: option.off})
        assert not option.is_set(option.off)
