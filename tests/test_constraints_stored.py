"""Compiled automata kept on disk (engine/constraints/stored.py, docs/constraints.md §2): a process
that meets a regex another one compiled over the same vocabulary reads it instead of building it;
the file is the automaton its name asks for (its key, its digest, its shapes) or, being the store's,
it is removed and rebuilt; the store uses only a folder of its own and removes only files it wrote;
the folder stays within its bound; a folder that cannot be written, or DINFER_VIZ_CACHE=off, only
leaves the engine building.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import Engine, GenerationConfig
from engine.constraints import TokenVocabulary, bounded, spec, stored, vocabulary
from engine.constraints.automaton import TokenAutomaton
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
    return a.initial == b.initial and all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("class_of", "table", "accepting"))


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


def rewrite(path, arrays: dict[str, np.ndarray]) -> None:
    """`arrays` at `path` under the header the store wrote there (its key) and their own digest:
    a file only the automaton checks can refuse."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    with safe_open(path, "np") as kept:
        metadata = kept.metadata()
    save_file(arrays, path, metadata={**metadata, "sha256": stored.content_digest(arrays)})


@pytest.mark.parametrize("damage", ["wrong shape", "state out of range", "an array of the old format (succ)"])
def test_arrays_that_are_no_automaton_of_this_vocabulary_are_removed_and_built_again(cache, monkeypatch, damage):
    from safetensors.numpy import load_file

    built = fresh_vocabulary().automaton(PAIR)
    (path,) = [p for p in cache.glob("*.safetensors") if "class_of" in load_file(p)]
    arrays = load_file(path)
    if damage == "wrong shape":
        rewrite(path, {**arrays, "class_of": arrays["class_of"][:-1]})
    elif damage.startswith("an array"):  # what the store no longer keeps: derived on reading
        rewrite(path, {**arrays, "succ": np.ones((built.states, built.states), dtype=bool)})
    else:
        table = arrays["table"].copy()
        table[0, 0] = table.shape[1]
        rewrite(path, {**arrays, "table": table})
    seen = builds(monkeypatch)
    again = fresh_vocabulary().automaton(PAIR)
    assert [what.startswith("the constraint") for what in seen] == [True]
    assert same(again, built)
    assert stored.load(fresh_vocabulary().digest, PAIR, built.class_of.shape[0]) is not None  # written anew


@pytest.mark.parametrize("stranger", ["garbage", "truncated", "no header of the store's"])
def test_a_file_the_store_did_not_write_is_neither_read_nor_removed_nor_overwritten(cache, monkeypatch, stranger):
    from safetensors.numpy import load_file, save_file

    built = fresh_vocabulary().automaton(PAIR)
    (path,) = [p for p in cache.glob("*.safetensors") if "class_of" in load_file(p)]
    if stranger == "garbage":
        path.write_bytes(b"\x00" * 64)
    elif stranger == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    else:
        save_file(load_file(path), path)
    planted = path.read_bytes()
    seen = builds(monkeypatch)
    assert same(fresh_vocabulary().automaton(PAIR), built)
    assert [what.startswith("the constraint") for what in seen] == [True]
    assert path.read_bytes() == planted


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
    # a file written and one touched within one tick of the file system's clock share an mtime: the
    # four kept so far are made an hour old, so the touch below alone decides which is recent
    for path in cache.glob("*.safetensors"):
        os.utime(path, (path.stat().st_atime, path.stat().st_mtime - 3600))
    assert stored.load(vocabulary.digest, "[a-c]{2}", first.class_of.shape[0]) is not None  # now the most recent
    vocabulary.automaton("[g-i]{2}")  # over the bound: the [d-f] pair goes
    assert sum(p.stat().st_size for p in cache.glob("*.safetensors")) <= stored.MAX_BYTES
    assert stored.load(vocabulary.digest, "[a-c]{2}", first.class_of.shape[0]) is not None
    assert stored.load(vocabulary.digest, "[d-f]{2}", first.class_of.shape[0]) is None
    assert not list(cache.glob("*.part"))


def test_past_the_bound_an_eighth_is_freed_so_the_next_writes_read_no_header(cache, monkeypatch):
    """A full folder: each write sized the files and, over the bound, read every header. Removing
    down to seven eighths leaves room, so the write after one that passed reads none."""
    vocabulary = fresh_vocabulary()
    regexes = [f"[{a}-{b}]{{2}}" for a, b in ("ac", "df", "gi", "jl", "mo", "pr", "su", "vx")]
    vocabulary.automaton(regexes[0])
    pair = sum(p.stat().st_size for p in cache.glob("*.safetensors"))  # a regex's two files
    monkeypatch.setattr(stored, "MAX_BYTES", int(pair * 7.5))
    for regex in regexes[1:7]:  # seven pairs: under the bound
        vocabulary.automaton(regex)
    headers = []
    real = stored._own_header
    monkeypatch.setattr(stored, "_own_header", lambda descriptor, name: headers.append(name) or real(descriptor, name))
    vocabulary.automaton(regexes[7])  # the eighth pair passes the bound: headers read, files removed
    total = sum(p.stat().st_size for p in cache.glob("*.safetensors"))
    assert headers and total <= stored.MAX_BYTES - stored.MAX_BYTES // 8, (total, stored.MAX_BYTES)
    headers.clear()
    vocabulary.automaton("[a-c]{3}")  # one more pair fits in the eighth freed: no header read
    assert headers == [] and sum(p.stat().st_size for p in cache.glob("*.safetensors")) <= stored.MAX_BYTES


def test_a_process_sizes_the_folder_again_only_once_it_has_written_the_room_it_found(cache, monkeypatch):
    """Room found at a look: at most an eighth of the bound (other processes write too)."""
    vocabulary = fresh_vocabulary()
    regexes = [f"[{a}-{b}]{{{n}}}" for n in (2, 3) for a, b in ("ac", "df", "gi", "jl", "mo", "pr", "su", "vx")]
    vocabulary.automaton(regexes[0])
    pair = sum(p.stat().st_size for p in cache.glob("*.safetensors"))  # a regex's two files
    monkeypatch.setattr(stored, "MAX_BYTES", pair * 40)  # a bound of its own: looked at afresh, room for 5 pairs
    looks = []
    real = stored._bound
    monkeypatch.setattr(stored, "_bound", lambda descriptor: looks.append(1) or real(descriptor))
    vocabulary.automaton(regexes[1])
    assert len(looks) == 1
    for regex in regexes[2:5]:  # three more pairs: within the room
        vocabulary.automaton(regex)
    assert len(looks) == 1
    for regex in regexes[5:9]:  # past it, the folder is sized again
        vocabulary.automaton(regex)
    assert len(looks) == 2


def test_a_file_holds_the_automatons_own_arrays_and_a_write_under_the_bound_reads_no_other_file(cache, monkeypatch):
    """`succ` (states x states) is derived from the table, not kept: it was twenty times the table
    at 2,000 states, and every new constraint's write digested it and read every kept file's header."""
    from safetensors.numpy import load_file

    vocabulary = fresh_vocabulary()
    built = vocabulary.automaton(PAIR)
    (path,) = [p for p in cache.glob("*.safetensors") if "class_of" in load_file(p)]
    assert sorted(load_file(path)) == sorted(stored.ARRAYS)
    kept = stored.load(vocabulary.digest, PAIR, built.class_of.shape[0])
    assert same(kept, built) and kept.shortest() == built.shortest() == 8
    headers = []
    monkeypatch.setattr(stored, "_own_header", lambda descriptor, name: headers.append(name))
    vocabulary.automaton("[a-c]{2}")  # a write, far under the bound
    assert headers == []


def test_the_default_folder_follows_xdg_and_home(monkeypatch, tmp_path):
    monkeypatch.delenv(stored.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert stored.folder() == tmp_path / "xdg" / "dinfer-viz" / "automata"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert stored.folder() == tmp_path / "home" / ".cache" / "dinfer-viz" / "automata"


# What the store reads decides an answer, and what it removes could be anyone's (issue #55 items 1
# and 2): each test below ends in a real generation on the embedded model, whose answer must keep
# the constraint whatever was planted, and checks the planted file was neither read nor removed
# where it was not the store's own.
EMBEDDED = Path(__file__).resolve().parent.parent / "assets" / "tiny-llada"
LETTERS, OTHERS = "[a-c]{3}", "[x-z]{3}"  # their automata have the same shapes over this vocabulary
WEIGHTS = "model-weights.safetensors"


@pytest.fixture(scope="module")
def embedded() -> Engine:
    return Engine(str(EMBEDDED))


def answer(engine: Engine, regex: str, monkeypatch) -> str:
    """`engine`'s answer under `regex`, as a new process gives it (no automaton in memory)."""
    monkeypatch.setattr(vocabulary, "_shared", OrderedDict())
    monkeypatch.setattr(engine, "_vocabulary", None)
    spec._byte_states.cache_clear()
    torch.manual_seed(0)
    return engine.generate("Q: 12+34=? A:", GenerationConfig(gen_length=8, block_length=8, regex=regex)).text


def automaton_files(root: Path) -> set[Path]:
    from safetensors.numpy import load_file

    return {p for p in root.glob("*.safetensors") if p.name != WEIGHTS and "class_of" in load_file(p)}


def kept_for(engine: Engine, regex: str, root: Path, monkeypatch) -> Path:
    """The file the store writes for `regex`'s automaton (a first generation under it)."""
    before = automaton_files(root)
    assert re.fullmatch(regex, answer(engine, regex, monkeypatch))
    (path,) = automaton_files(root) - before
    return path


def contents(path: Path) -> tuple[dict[str, str], dict[str, bytes]]:
    """A kept file's header metadata and arrays (its bytes may order the metadata otherwise)."""
    from safetensors import safe_open

    with safe_open(path, "np") as kept:
        return kept.metadata(), {name: kept.get_tensor(name).tobytes() for name in kept.keys()}


def allow_all(vocab_size: int) -> TokenAutomaton:
    """One state, accepting, every token leading back to it: an automaton that allows any answer."""
    return TokenAutomaton(np.zeros(vocab_size, dtype=np.int64), np.zeros((1, 1), dtype=np.int64), 0, np.ones(1, dtype=bool))


def allow_all_arrays(vocab_size: int) -> dict[str, np.ndarray]:
    """allow_all as a file holds it."""
    planted = allow_all(vocab_size)
    return {"class_of": planted.class_of, "table": planted.table, "initial": np.array([0]), "accepting": planted.accepting}


def engine_vocabulary() -> vocabulary.TokenVocabulary:
    (shared,) = vocabulary._shared.values()
    return shared


@pytest.mark.parametrize("tamper", ["another constraint's file", "allow-all under its header", "a flipped byte", "allow-all, no header"])
def test_a_tampered_file_is_never_read_and_the_answer_keeps_its_constraint(cache, embedded, monkeypatch, tamper):
    from safetensors.numpy import load_file, save_file

    path = kept_for(embedded, LETTERS, cache, monkeypatch)
    good, written = path.read_bytes(), contents(path)
    size = engine_vocabulary().vocab_size
    if tamper == "another constraint's file":
        path.write_bytes(kept_for(embedded, OTHERS, cache, monkeypatch).read_bytes())
    elif tamper == "allow-all under its header":
        save_file(allow_all_arrays(size), path, metadata=written[0])
    elif tamper == "a flipped byte":  # the initial state made accepting: still a well-formed automaton
        header = int.from_bytes(good[:8], "little")
        start = 8 + header + json.loads(good[8:8 + header])["accepting"]["data_offsets"][0]
        initial = int(load_file(path)["initial"][0])
        path.write_bytes(good[:start + initial] + bytes([good[start + initial] ^ 1]) + good[start + initial + 1:])
    else:
        save_file(allow_all_arrays(size), path)
    bad = path.read_bytes()
    assert re.fullmatch(LETTERS, answer(embedded, LETTERS, monkeypatch))
    # the store's own file is removed and written anew; one it did not write is left as it was
    if tamper == "allow-all, no header":
        assert path.read_bytes() == bad
    else:
        assert contents(path) == written


FOREIGN = ["no marker: a folder the store did not make", "writable by others", "a symbolic link", "another user's"]


def make_foreign(root: Path, how: str) -> Path:
    """The store's folder at `root` made one it may not use; the folder its files are now in."""
    if how.startswith("no marker"):
        (root / stored.MARKER).unlink(missing_ok=True)
    elif how == "writable by others":
        root.chmod(0o777)
    elif how == "a symbolic link":
        elsewhere = root.with_name("elsewhere")
        root.rename(elsewhere)
        root.symlink_to(elsewhere, target_is_directory=True)
        return elsewhere
    else:
        os.chown(root, 65534, -1)
    return root


@pytest.mark.parametrize("how", FOREIGN)
def test_a_perfect_file_in_a_folder_not_the_stores_own_is_never_read(cache, embedded, monkeypatch, caplog, how):
    if how == "another user's" and os.getuid() != 0:
        pytest.skip("giving the folder to another user needs root")
    monkeypatch.setattr(stored, "_warned", set(), raising=False)
    path = kept_for(embedded, LETTERS, cache, monkeypatch)
    stored.save(engine_vocabulary().digest, LETTERS, allow_all(engine_vocabulary().vocab_size))  # key, digest: all as the store writes
    planted = make_foreign(cache, how) / path.name
    bad = planted.read_bytes()
    with caplog.at_level(logging.WARNING, logger=stored.__name__):
        for _ in range(2):
            assert re.fullmatch(LETTERS, answer(embedded, LETTERS, monkeypatch))
    assert planted.read_bytes() == bad
    (line,) = [r.getMessage() for r in caplog.records if r.name == stored.__name__]  # one line, once
    assert str(cache) in line and "built in memory" in line and "\n" not in line


@pytest.mark.parametrize("how", ["a symbolic link to the user's folder", "the user's own folder", "the store's own folder"])
def test_eviction_removes_only_files_the_store_wrote(cache, embedded, monkeypatch, how):
    """The issue's case: the folder holds a model's weights, and generations push the store over
    its bound (here one byte, so every write evicts)."""
    user = cache.with_name("models")
    if how == "the store's own folder":
        kept_for(embedded, OTHERS, cache, monkeypatch)
        user = cache
    else:
        user.mkdir(parents=True, mode=0o700)
        if how.startswith("a symbolic link"):
            cache.symlink_to(user, target_is_directory=True)
        else:
            user.rename(cache)
            user = cache
    strangers = {user / WEIGHTS: b"weights" * 1000, user / ("0" * 64 + ".safetensors"): b"not the store's" * 100}
    for path, data in strangers.items():
        path.write_bytes(data)
    monkeypatch.setattr(stored, "MAX_BYTES", 1)
    for regex in (LETTERS, OTHERS, "[d-f]{2}"):
        assert re.fullmatch(regex, answer(embedded, regex, monkeypatch))
    assert {path: path.read_bytes() for path in strangers} == strangers
    if how != "the store's own folder":
        assert sorted(user.iterdir()) == sorted(strangers)  # nothing written there either


def test_a_caller_waits_for_the_build_another_has_under_way_and_reads_it(cache, monkeypatch):
    """While another caller builds an automaton (it holds `stored.building` for its key), a caller
    with a vocabulary of its own (another process, as far as the store can tell) that found no file
    waits, then reads the one the builder kept: nothing is built twice. Ordered by events: the
    waiter has looked in the store and found nothing before the builder keeps its file."""
    built = fresh_vocabulary().automaton(PAIR)  # what the "other process" will keep
    digest = fresh_vocabulary().digest
    for kept in cache.glob("*.safetensors"):
        kept.unlink()
    spec._byte_states.cache_clear()
    seen = builds(monkeypatch)
    looked = threading.Event()
    real_load = stored.load

    def load(*args):
        found = real_load(*args)
        looked.set()
        return found

    monkeypatch.setattr(stored, "load", load)
    answer: dict = {}
    with stored.building(digest, PAIR):
        waiter = threading.Thread(target=lambda: answer.update(automaton=fresh_vocabulary().automaton(PAIR)))
        waiter.start()
        assert looked.wait(60)  # a bound on a hang: the waiter found no file, and now waits here
        stored.save(digest, PAIR, built)
    waiter.join(60)
    assert not waiter.is_alive() and same(answer["automaton"], built)
    assert seen == []  # neither the size check nor the automaton built: read from the builder's file
