"""Compiled automata kept on disk (engine/constraints/stored.py, docs/constraints.md §2): a process
that meets a regex another one compiled over the same vocabulary reads it instead of building it;
the file is the automaton its name asks for or it is removed and rebuilt; the folder stays within
its bound; a folder that cannot be written, or DINFER_VIZ_CACHE=off, only leaves the engine building.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.constraints import TokenVocabulary, bounded, spec, stored
from engine.constraints.vocabulary import token_bytes
from tinymodel.tokenizer import hf_tokenizer, special_ids

PAIR = r"(  [0-9]| [1-9][0-9]) \+(  [0-9]| [1-9][0-9])"
STOP = [special_ids()["eos_token_id"]]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder of this test's own, and no in-process memory of any build."""
    monkeypatch.setenv(stored.CACHE_ENV, str(tmp_path / "cache"))
    spec._byte_states.cache_clear()
    yield tmp_path / "cache" / "automata"
    spec._byte_states.cache_clear()


def fresh_vocabulary(stop: list[int] = STOP) -> TokenVocabulary:
    """A vocabulary with no automaton in memory, as a new process starts with (TokenVocabulary.of
    would return the one this process shares)."""
    tokens = token_bytes(hf_tokenizer())
    return TokenVocabulary(tokens, stop, max(tokens) + 1)


def builds(monkeypatch) -> list[str]:
    """What is built in a bounded child from now on (each build's `what`)."""
    seen: list[str] = []
    run = bounded.run_bounded

    def counted(what, function, *args):
        seen.append(what)
        return run(what, function, *args)

    monkeypatch.setattr("engine.constraints.vocabulary.run_bounded", counted)
    monkeypatch.setattr(bounded, "run_bounded", counted)
    return seen


def same(a, b) -> bool:
    return a.initial == b.initial and all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("class_of", "table", "accepting", "succ"))


def test_an_automaton_built_once_is_read_by_the_next_process_with_no_build(cache, monkeypatch):
    seen = builds(monkeypatch)
    built = fresh_vocabulary().automaton(PAIR)
    assert len(seen) == 2  # the byte-level DFA's size check, then the token-level automaton
    assert len(list(cache.glob("*.safetensors"))) == 2
    spec._byte_states.cache_clear()  # a new process remembers nothing
    read = fresh_vocabulary().automaton(PAIR)
    assert len(seen) == 2 and same(read, built)
    assert read.shortest() == 8


def test_the_size_check_reads_its_count_too(cache, monkeypatch):
    seen = builds(monkeypatch)
    spec.check_regex(PAIR)
    spec._byte_states.cache_clear()
    spec.check_regex(PAIR)
    assert len(seen) == 1


def test_another_vocabulary_builds_its_own(cache, monkeypatch):
    seen = builds(monkeypatch)
    fresh_vocabulary().automaton(PAIR)
    other = fresh_vocabulary(stop=[*STOP, special_ids()["mask_token_id"]]).automaton(PAIR)
    assert [what.startswith("the constraint") for what in seen] == [False, True, True]
    assert len(list(cache.glob("*.safetensors"))) == 3
    assert other.states > 0


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong shape", "state out of range"])
def test_a_damaged_file_is_removed_and_the_automaton_built_again(cache, monkeypatch, damage):
    from safetensors.numpy import load_file, save_file

    built = fresh_vocabulary().automaton(PAIR)
    (path,) = [p for p in cache.glob("*.safetensors") if "class_of" in load_file(p)]
    arrays = load_file(path)
    if damage == "garbage":
        path.write_bytes(b"\x00" * 64)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "wrong shape":
        save_file({**arrays, "class_of": arrays["class_of"][:-1]}, path)
    else:
        table = arrays["table"].copy()
        table[0, 0] = table.shape[1]
        save_file({**arrays, "table": table}, path)
    seen = builds(monkeypatch)
    again = fresh_vocabulary().automaton(PAIR)
    assert [what.startswith("the constraint") for what in seen] == [True]
    assert same(again, built)
    assert stored.load(fresh_vocabulary().digest, PAIR, built.class_of.shape[0]) is not None  # written anew


def test_off_keeps_nothing_and_an_unwritable_folder_only_builds(tmp_path, monkeypatch):
    spec._byte_states.cache_clear()
    monkeypatch.setenv(stored.CACHE_ENV, stored.OFF)
    assert stored.folder() is None
    seen = builds(monkeypatch)
    fresh_vocabulary().automaton(PAIR)
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    monkeypatch.setenv(stored.CACHE_ENV, str(blocked))
    spec._byte_states.cache_clear()
    assert fresh_vocabulary().automaton(PAIR).shortest() == 8
    assert len(seen) == 4  # both built each time: nothing kept, nothing failed
    assert list(tmp_path.iterdir()) == [blocked]
    spec._byte_states.cache_clear()


def test_the_folder_stays_within_its_bound_the_least_recently_used_going_first(cache, monkeypatch):
    vocabulary = fresh_vocabulary()
    first = vocabulary.automaton("[a-c]{2}")
    size = sum(p.stat().st_size for p in cache.glob("*.safetensors"))
    monkeypatch.setattr(stored, "MAX_BYTES", int(size * 2.5))
    vocabulary.automaton("[d-f]{2}")
    assert stored.load(vocabulary.digest, "[a-c]{2}", first.class_of.shape[0]) is not None  # now the most recent
    vocabulary.automaton("[g-i]{2}")  # over the bound: the [d-f] pair goes
    assert sum(p.stat().st_size for p in cache.glob("*.safetensors")) <= stored.MAX_BYTES
    assert stored.load(vocabulary.digest, "[a-c]{2}", first.class_of.shape[0]) is not None
    assert stored.load(vocabulary.digest, "[d-f]{2}", first.class_of.shape[0]) is None
    assert not list(cache.glob("*.part"))


def test_the_default_folder_follows_xdg_and_home(monkeypatch, tmp_path):
    monkeypatch.delenv(stored.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert stored.folder() == tmp_path / "xdg" / "dinfer-viz" / "automata"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert stored.folder() == tmp_path / "home" / ".cache" / "dinfer-viz" / "automata"
