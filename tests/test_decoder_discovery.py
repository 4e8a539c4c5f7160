"""engine/decoders/ is discovered (docs/algorithms.md §2.7): a decoder's file dropped there runs by
its name with nothing else edited, and every list of decoders follows `Decoder.order`, never the
order the files happen to import in."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from engine import Engine, GenerationConfig, RunHooks
from engine.decoders import Decoder
from engine.registry import decoder_names, is_builtin, register_decoder

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {"gen_length": 16, "block_length": 8}
PROMPT = "Q: 12+34=? A:"

# Run inside the copy of the engine: the lists of decoders, then a generation by the new name
# through the CLI, as a user would run it.
RUN = """
import json, sys
from engine.__main__ import main
from engine.registry import decoder_names, is_builtin
name, listing, trace = sys.argv[1:]
open(listing, "w").write(json.dumps({"names": decoder_names(), "builtin": is_builtin(name)}))
sys.exit(main(["generate", "--model", "tiny-llada", "--decoder", name, "--prompt", %r,
               "--gen-length", "16", "--block-length", "8", "--trace", trace]))
""" % PROMPT


def test_a_decoder_file_copied_into_engine_decoders_runs_by_its_new_name(tmp_path):
    """factor.py copied as toy_factor.py (class and name changed, `order` between factor's and
    entropy_bound's) into a copy of the engine, so no other test sees it: the CLI runs it, its
    trace names it, it writes what factor writes, and it lists where its `order` puts it, although
    its file imports after every other one there."""
    name = "toy_factor"
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "engine", repo / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "assets").symlink_to(ROOT / "assets")
    source = (ROOT / "engine" / "decoders" / "factor.py").read_text()
    copied = source.replace("class FactorDecoder(", "class ToyFactorDecoder(").replace('name = "factor"', f'name = "{name}"').replace("order = 50", "order = 55")
    assert copied.count(name) == 1 and "order = 55" in copied  # the copy really differs where it should
    (repo / "engine" / "decoders" / f"{name}.py").write_text(copied)
    listing, trace_path = tmp_path / "listing.json", tmp_path / "trace.json"
    run = subprocess.run([sys.executable, "-c", RUN, name, str(listing), str(trace_path)], cwd=repo, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(repo)})
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(listing.read_text())
    at = decoder_names().index("factor") + 1
    assert found == {"names": decoder_names()[:at] + [name] + decoder_names()[at:], "builtin": True}
    trace = json.loads(trace_path.read_text())
    assert trace["config"]["decoder"] == name
    factor = Engine("tiny-llada").generate(PROMPT, GenerationConfig(decoder="factor", **SETTINGS), RunHooks(trace=True)).output.trace
    assert trace["final"] == factor.final and len(trace["iterations"]) == len(factor.iterations)
    assert name not in decoder_names()  # this process never saw it


def test_the_lists_follow_order_then_name_and_plug_ins_follow_in_the_order_they_load(own_registry):
    """Two decoders of the engine's own registered last (as a file dropped in imports) stand by
    their `order`, ties by name; one that says nothing stands after the built-ins; plug-ins, whatever
    their `order`, follow in the order they registered."""
    shipped = decoder_names()
    # today's order, kept when the decoders became a package: a change to it is a change users see
    assert shipped == ["fixed", "threshold", "hierarchical", "credit", "factor", "entropy_bound", "uniform", "edit", "remdm", "wino"]

    def declare(decoder: str, module: str, **attributes: int) -> None:
        register_decoder(type(f"D_{decoder}", (Decoder,), {"name": decoder, "__module__": module, **attributes}))

    declare("plug_b", "plugin_b", order=1)
    declare("plug_a", "plugin_a", order=1)
    declare("zz_between", "engine.decoders.zz", order=15)
    declare("aa_between", "engine.decoders.aa", order=15)
    declare("unordered", "engine.decoders.unordered")
    assert is_builtin("zz_between") and not is_builtin("plug_a")
    assert decoder_names() == [shipped[0], "aa_between", "zz_between", *shipped[1:], "unordered", "plug_b", "plug_a"]
