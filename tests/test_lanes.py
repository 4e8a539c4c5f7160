"""The slow lanes (tests/conftest.py LANES): every entry names a test that exists, every lane is a
registered marker, and a test's lanes come from its file, its name, its parameter set or its own
marker."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from .conftest import LANES, SLOW, assert_in_lane, lanes_of

TESTS = Path(__file__).resolve().parent


def test_every_entry_names_a_test_file_and_a_test_defined_in_it():
    for lane, entries in LANES.items():
        for entry in entries:
            file, _, test = entry.partition("::")
            path = TESTS / file
            assert path.is_file(), f"LANES[{lane!r}]: {file} is not a test file (renamed?)"
            function = test.split("[")[0]
            assert not function or re.search(rf"^(async )?def {re.escape(function)}\(", path.read_text(), re.M), f"LANES[{lane!r}]: {entry} names no test (renamed?)"


def test_every_lane_and_slow_are_registered_markers():
    config = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())
    registered = {line.split(":")[0] for line in config["tool"]["pytest"]["ini_options"]["markers"]}
    assert {SLOW, *LANES} <= registered


def test_a_tests_lanes_come_from_its_file_its_name_its_parameter_set_or_its_marker():
    assert lanes_of("test_torchrun.py", "test_x[a]", "test_x") == ["torchrun"]
    assert lanes_of("test_parallel.py", "test_two_processes_give_the_logits_and_tokens_of_one[llada tp2]", "test_two_processes_give_the_logits_and_tokens_of_one") == ["workers"]
    assert lanes_of("test_parallel.py", "test_degrees_that_do_not_divide_the_model_are_refused[a]", "test_degrees_that_do_not_divide_the_model_are_refused") == []
    cost = "test_a_run_with_a_system_option_says_so_first_and_draws_its_cost"
    assert lanes_of("test_app_cost.py", f"{cost}[compile]", cost) == ["compile"]
    assert lanes_of("test_app_cost.py", f"{cost}[tp2]", cost) == ["workers"]
    assert lanes_of("test_compiled.py", "test_compile_with_tensor_parallelism_keeps_the_tokens_and_times_each_ranks_all_reduces", "x") == ["compile", "workers"]
    assert lanes_of("test_app_models.py", "test_y", "test_y", {"browser", "filterwarnings"}) == ["browser"]
    assert lanes_of("test_lifecycle.py", "test_y", "test_y") == []  # plain Python workers: the fast lane


def test_a_test_that_drives_chromium_outside_the_browser_lane_fails():
    """require_browser() (tests/app_support.py) calls this first, so no browser test can slip into
    `pytest -m "not slow"` unlisted; this test is in no lane."""
    with pytest.raises(pytest.fail.Exception, match=r"test_lanes.py::test_a_test_that_drives_chromium_outside_the_browser_lane_fails drives chromium: add it to LANES\['browser'\]"):
        assert_in_lane("browser", "drives chromium")
