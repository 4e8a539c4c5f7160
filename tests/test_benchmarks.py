"""benchmarks/: the runner's table and JSON, its counting, the presets, the scorers, the sweep, gpu_check --tiny."""

import json
import statistics

import pytest
import torch

from benchmarks import gpu_check, scoring
from benchmarks.presets import parse_configs
from benchmarks.prompts import gsm8k_set, humaneval_set, load_prompt_set, mbpp_set
from benchmarks.run import Call, ConfigRun, main, summarize, total
from benchmarks.sweep import SweepRow, mark_pareto, sweep, sweep_points
from engine import Engine, GenerationConfig, GenerationStats, save_model
from engine.errors import EngineError
from engine.stats import generated_mask
from tinymodel.tasks import get_task
from tinymodel.tokenizer import save_tokenizer, special_ids

from .conftest import tiny_llada


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run faster on one thread, and far faster on a machine whose cores are busy."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench-ckpt")
    save_model(tiny_llada(vocab_size=99, embedding_size=99, **special_ids()), folder)
    save_tokenizer(folder)
    return folder


# ---- the runner ----------------------------------------------------------------------------------
def test_runner_writes_table_and_json_with_the_engines_counts(checkpoint, tmp_path, capsys):
    argv = ["--model", str(checkpoint), "--prompts", "heldout:add,sub", "--limit", "1", "--configs", "llada,fastdllm",
            "--gen-length", "16", "--block-length", "8", "--repeats", "2", "--trace-overhead", "--out", str(tmp_path)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "| config |" in table and "| llada |" in table and "| fastdllm |" in table

    doc = json.loads((tmp_path / "benchmark.json").read_text())
    assert (tmp_path / "benchmark.html").stat().st_size > 0 and (tmp_path / "benchmark.md").read_text().startswith("| config")
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["torch"] == torch.__version__
    llada, fast = doc["results"]
    assert [llada["name"], fast["name"]] == ["llada", "fastdllm"]
    assert llada["config"]["decoder"] == "fixed" and fast["config"]["cache"] == "dual"
    for row in doc["results"]:
        calls = doc["calls"][row["name"]]
        assert row["prompts"] == len(calls) == 2 and row["repeats"] == 2
        # greedy: every pass makes the same tokens and forwards, so a pass's totals are the calls' sums
        assert row["tokens"] == sum(c["tokens"] for c in calls) and row["nfe"] == sum(c["nfe"] for c in calls)
        assert row["tpf"] == pytest.approx(row["tokens"] / row["nfe"])
        assert row["tps_min"] <= row["tps_median"] <= row["tps_max"] and len(row["tps_passes"]) == 2
        assert row["trace_overhead"] > 0
        right = [get_task(c["prompt"].split(":")[0]).check(_example(c["prompt"]), c["text"]) for c in calls]
        assert row["correct"] == 2 * sum(right) and row["scored"] == 4
    assert llada["tps_ratio"] == 1.0 and llada["tpf_ratio"] == 1.0
    assert fast["tpf_ratio"] == pytest.approx(fast["tpf"] / llada["tpf"])


def _example(prompt_id: str):
    from tinymodel.tasks import parse_prompt

    return parse_prompt(prompt_id.split(":", 1)[1])


@pytest.mark.parametrize(
    "args,message",
    [
        (["--configs", "llada,nope"], "unknown configuration 'nope'"),
        (["--configs", "a=threshold:2"], "threshold must be in (0, 1]"),
        (["--prompts", "gsm8k"], "needs a file"),
        (["--prompts", "gsm8k:/no/such.jsonl"], "prompt file not found"),
        (["--set", "cache=disk"], "unknown cache mode 'disk'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


# ---- counting on hand-made outputs --------------------------------------------------------------
def test_tokens_are_the_engines_count_of_a_hand_made_canvas():
    # prompt 2 | generated: 5 7 EOS 9 (after EOS, same block: counts) EOT MASK
    canvas = torch.tensor([[1, 2, 5, 7, 48, 9, 47, 49]])
    assert generated_mask(canvas, [2], stop_ids=[48, 47], mask_id=49).sum(dim=1).tolist() == [3]


def _call(tokens, nfe, seconds, correct=None, wall=None):
    return Call("p", GenerationStats(nfe=nfe, tokens=tokens, seconds=seconds), wall or seconds, "", correct)


def test_totals_are_sums_and_rates_are_ratios_of_sums():
    both = total([GenerationStats(nfe=5, tokens=10, seconds=1.0), GenerationStats(nfe=5, tokens=30, seconds=3.0)])
    assert (both.tokens, both.nfe, both.seconds) == (40, 10, 4.0)
    assert both.tps == 10.0 and both.tpf == 4.0  # not the mean of per-call rates (10 and 10; 2 and 6)


def test_summary_medians_ratios_accuracy_and_trace_overhead():
    base = ConfigRun(parse_configs("llada", GenerationConfig(gen_length=8, block_length=8))[0])
    fast = ConfigRun(parse_configs("fastdllm", GenerationConfig(gen_length=8, block_length=8))[0])
    # three passes of one prompt; the baseline runs at 10, 20, 10 TPS, the other at 30, 40, 50
    base.passes = [[_call(10, 10, 1.0, True)], [_call(10, 10, 0.5, True)], [_call(10, 10, 1.0, True)]]
    fast.passes = [[_call(10, 4, 1 / 3, False)], [_call(10, 4, 0.25, True)], [_call(10, 4, 0.2, True)]]
    fast.traced_passes = [[_call(10, 4, 0.1, wall=w)] for w in (0.5, 0.5, 0.4)]
    rows = summarize([base, fast])
    assert rows[0]["tps_median"] == 10.0 and rows[0]["tps_ratio"] == 1.0 and rows[0]["accuracy"] == 1.0
    assert rows[1]["tps_median"] == pytest.approx(40.0)
    assert rows[1]["tps_ratio"] == pytest.approx(statistics.median([3.0, 2.0, 5.0]))  # per pass, then median
    assert rows[1]["tpf"] == 2.5 and rows[1]["tpf_ratio"] == 2.5
    assert (rows[1]["correct"], rows[1]["scored"]) == (2, 3)
    assert rows[1]["trace_overhead"] == pytest.approx(statistics.median([0.5 * 3, 0.5 / 0.25, 0.4 / 0.2]))
    assert rows[0]["trace_overhead"] is None


# ---- presets ------------------------------------------------------------------------------------
def test_presets_and_user_configurations():
    base = GenerationConfig(gen_length=64, block_length=32)
    named = parse_configs("llada,fastdllm,dinfer,d8=dinfer,threshold:0.8,cache:dual,k2=steps:32", base)
    by_name = {n.name: n.config for n in named}
    assert list(by_name) == ["llada", "fastdllm", "dinfer", "d8", "k2"]
    assert by_name["llada"].decoder == "fixed" and by_name["llada"].total_steps() == 64 and by_name["llada"].cache == "none"
    assert (by_name["fastdllm"].threshold, by_name["fastdllm"].cache, by_name["fastdllm"].smoothing) == (0.9, "dual", False)
    d = by_name["dinfer"]
    assert (d.cache, d.prefix_look, d.after_look, d.warmup, d.smoothing, d.unroll) == ("vicinity", 16, 16, 4, True, True)
    assert (by_name["d8"].threshold, by_name["d8"].cache, by_name["d8"].smoothing) == (0.8, "dual", True)
    assert by_name["k2"].steps == 32 and by_name["k2"].decoder == base.decoder
    assert all(c.gen_length == 64 and c.block_length == 32 for c in by_name.values())


@pytest.mark.parametrize(
    "spec,message",
    [
        ("threshold:0.5", "changes no configuration"),
        ("a=dinfer,colour:red", "unknown generation setting 'colour'"),
        ("a=steps:many", "steps takes a int"),
        ("a=smoothing:maybe", "smoothing takes true or false"),
        ("llada,llada", "named twice"),
    ],
)
def test_bad_configuration_specs(spec, message):
    with pytest.raises(EngineError, match=message):
        parse_configs(spec, GenerationConfig())


# ---- scorers and loaders ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "response,gold,right",
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "7", True),
        ("So the answer is 1,234.", "1234", True),
        ("The total is \\boxed{18}", "18", True),
        ("First 12, then 30, so 42 dollars.", "42", True),  # flexible: the last number
        ("#### 41", "42", False),
        ("The answer is 42.5", "42", False),
        ("I do not know.", "42", False),
    ],
)
def test_gsm8k_exact_numeric_match(response, gold, right):
    assert scoring.numeric_match(response, gold) is right


def test_gsm8k_gold_and_loader(tmp_path):
    assert scoring.gsm8k_gold("48/2 = 24 clips\n#### 1,072") == "1,072"
    path = tmp_path / "gsm.jsonl"
    path.write_text('{"question": "2+2?", "answer": "2+2=4\\n#### 4"}\n{"question": "3*3?", "answer": "#### 9"}\n')
    items = gsm8k_set(path).items
    assert [i.check("#### 4") for i in items] == [True, False] and "3*3?" in items[1].prompt
    path.write_text('{"question": "2+2?", "answer": "4"}\n')
    with pytest.raises(EngineError, match="no '####'"):
        gsm8k_set(path)
    path.write_text("{not json\n")
    with pytest.raises(EngineError, match="gsm.jsonl:1: not JSON"):
        gsm8k_set(path)


PROBLEM = {
    "task_id": "Toy/0",
    "prompt": 'def add(a, b):\n    """Sum of a and b."""\n',
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    "entry_point": "add",
}


@pytest.mark.parametrize(
    "response,passes",
    [
        ("    return a + b\n", True),  # completes the prompt
        ("```python\ndef add(a, b):\n    return b + a\n```\nDone.", True),  # restates the function
        ("    return a - b\n", False),
        ("    return a +\n", False),  # syntax error
        ("    import os\n    os._exit(3)\n", False),
    ],
)
def test_humaneval_scorer_runs_the_tests(response, passes):
    assert scoring.humaneval_passes(PROBLEM, response, timeout=20) is passes


def test_code_that_hangs_fails_at_the_timeout():
    assert scoring.run_python("while True:\n    pass\n", timeout=1.0) is False


@pytest.mark.parametrize(
    "program",
    [
        "open({outside!r}, 'w').write('x')",
        "import os\nos.rename('program.py', {outside!r})",
        "import subprocess\nsubprocess.run(['touch', {outside!r}])",
        "import os\nif os.fork() == 0:\n    os.setsid()\n    open({outside!r}, 'w')",
        "import os\nos.system('touch ' + {outside!r})",
        "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=2)",
    ],
)
def test_the_code_sandbox_refuses_escapes(program, tmp_path):
    outside = str(tmp_path / "escaped")
    assert scoring.run_python(program.format(outside=outside), timeout=20) is False
    assert not (tmp_path / "escaped").exists()


def test_the_code_sandbox_lets_ordinary_tests_run():
    program = "import collections, heapq, itertools, math, re, unittest\nopen('scratch.txt', 'w').write('ok')\nassert math.gcd(12, 18) == 6\n"
    assert scoring.run_python(program, timeout=20) is True


def test_humaneval_and_mbpp_loaders(tmp_path):
    he = tmp_path / "he.jsonl"
    he.write_text(json.dumps(PROBLEM) + "\n")
    item = humaneval_set(he).items[0]
    assert item.id == "Toy/0" and item.check("    return a + b\n") and not item.check("    return 0\n")
    mbpp = tmp_path / "mbpp.jsonl"
    mbpp.write_text(json.dumps({"task_id": 2, "text": "Write a function to double a number.", "test_list": ["assert double(4) == 8"]}) + "\n")
    item = mbpp_set(mbpp).items[0]
    assert "assert double(4) == 8" in item.prompt
    assert item.check("```python\ndef double(x):\n    return 2 * x\n```") and not item.check("def double(x):\n    return x\n")
    with pytest.raises(EngineError, match="unknown prompt set"):
        load_prompt_set("squad:x.jsonl")


def test_heldout_set_is_the_embedded_tasks_held_out_split():
    prompts = load_prompt_set("heldout:add", limit=3)
    assert len(prompts.items) == 3 and prompts.scored
    example = _example(prompts.items[0].id)
    assert prompts.items[0].check(example.response) and not prompts.items[0].check("  1+  2=   0")


def test_outofrange_set_scores_prompts_with_a_four_digit_operand():
    from tinymodel.tasks import parse_prompt

    prompts = load_prompt_set("outofrange:add,sub", limit=4)
    assert prompts.name == "outofrange:add,sub" and len(prompts.items) == 8 and prompts.scored
    for item in prompts.items:
        example = parse_prompt(item.prompt)
        assert item.check(example.response) and not item.check("  1+  2=   0")
        assert max(len(x) for x in item.prompt[3:].split("=")[0].replace("-", "+").split("+")) == 4


# ---- sweep --------------------------------------------------------------------------------------
def test_pareto_front_on_hand_made_rows():
    rows = [SweepRow("t", "threshold", v, acc, tpf, 0, 0, 0, 0) for v, acc, tpf in
            [(0.9, 0.9, 1.0), (0.7, 0.8, 2.0), (0.5, 0.5, 1.5), (0.3, 0.8, 1.9)]]
    assert [r.pareto for r in mark_pareto(rows)] == [True, True, False, False]


def test_sweep_rows_on_a_model(checkpoint):
    engine = Engine(checkpoint)
    seen = []
    rows = sweep(engine, load_prompt_set("heldout:add", limit=2), GenerationConfig(gen_length=16, block_length=8, early_stop=False, align_blocks=False),
                 ["fixed", "threshold"], thresholds=(0.5, 0.95), tokens_per_step=(1, 2, 3), on_row=seen.append)
    assert [(r.decoder, r.knob, r.value) for r in rows] == [
        ("fixed", "tokens_per_step", 1), ("fixed", "tokens_per_step", 2), ("threshold", "threshold", 0.5), ("threshold", "threshold", 0.95)
    ]  # k=3 does not divide the block
    assert seen == rows and any(r.pareto for r in rows)
    fixed1, fixed2 = rows[0], rows[1]
    assert fixed1.nfe == 2 * 16 and fixed2.nfe == 2 * 8  # two prompts, 16 masks, one or two tokens per forward
    assert all(r.tpf == pytest.approx(r.tokens / r.nfe) for r in rows)
    with pytest.raises(EngineError, match="has no answers"):
        from benchmarks.prompts import PromptItem, PromptSet

        sweep(engine, PromptSet("t", [PromptItem("0", "hi")]), GenerationConfig(), ["threshold"])


# ---- gpu_check ----------------------------------------------------------------------------------
def test_gpu_check_tiny_on_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    assert gpu_check.main(["--tiny", "--repeats", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    results = {r["model"]: r for r in doc["results"]}
    assert set(results) == {"llada-8b", "llada-moe-7b-a1b", "diffusion-gemma-26b-a4b"}
    gemma = results.pop("diffusion-gemma-26b-a4b")  # tiny-gemma's shapes: one 16-token canvas, 16 steps
    assert gemma["failures"] == [] and gemma["canvas"] == 16 and gemma["steps"] == 16
    assert gemma["denoise_ms"] > 0 and gemma["floor_ms"] > 0 and gemma["encode_ms"] > 0
    assert gemma["decode_tps"] == pytest.approx(16 / (16 * gemma["denoise_ms"] / 1e3))
    assert gemma["end_to_end_tps"] < gemma["decode_tps"] and (gemma["vllm_decode_tps"], gemma["vllm_end_to_end_tps"]) == (1756.0, 895.0)
    for result in results.values():
        assert [r["mode"] for r in result["block_forward"]] == ["full", "refresh", "prefix", "dual", "window"]
        assert all(r["rel_error"] < 1e-4 and r["ms"] > 0 and r["floor_ms"] > 0 for r in result["block_forward"])
        # gen 16 in blocks of 8, 4 tokens per step: 2 forwards per block in every mode
        assert [(g["cache"], g["nfe"]) for g in result["generate"]] == [("none", 4), ("prefix", 4), ("dual", 4), ("vicinity", 4)]


def test_gpu_check_catches_a_wrong_cache_merge(monkeypatch):
    from engine.models import layers

    def off_by_one(past, fresh, replace):  # writes the fresh K/V one slot to the right
        a, b = replace
        return torch.cat([past[:, :, : a + 1], fresh, past[:, :, b + 1 :]], dim=2)

    monkeypatch.setattr(layers, "merge_past", off_by_one)
    model = gpu_check.build(gpu_check.TINY_LLADA, torch.device("cpu"), torch.float32)
    x = gpu_check.canvas(model, 24, 16, 4, torch.device("cpu"))
    with torch.inference_mode():
        rows = gpu_check.block_forwards(gpu_check.BlockBench(model, x, (24, 32), 16, 8, 1, 1e9, None, torch.device("cpu")))
    errors = {r["mode"]: r["rel_error"] for r in rows}
    assert errors["full"] == 0.0 and errors["refresh"] == 0.0
    assert min(errors["prefix"], errors["dual"], errors["window"]) > 1e-3


def test_floor_reproduces_the_performance_doc_numbers():
    with torch.device("meta"):
        dense = gpu_check.model_class(gpu_check.LLADA_8B)(gpu_check.LLADA_8B).to(torch.bfloat16)
        moe = gpu_check.model_class(gpu_check.LLADA_MOE_7B)(gpu_check.LLADA_MOE_7B).to(torch.bfloat16)
    # docs/performance.md §2.2: 32 query tokens on a cached 512-token prefix, 4.8 TB/s
    floor = gpu_check.Shape.of(dense).floor(32, 544, 512, True, 4.8e12, None)
    assert floor["bytes"] == pytest.approx(15.28e9, rel=1e-3) and floor["floor_s"] == pytest.approx(3.18e-3, rel=1e-2)
    floor = gpu_check.Shape.of(moe).floor(32, 544, 512, True, 4.8e12, None)
    assert floor["floor_s"] == pytest.approx(2.91e-3, rel=1e-2)


def test_stop_latency_cancels_inside_the_first_forward(capsys):
    from benchmarks import stop_latency

    model = stop_latency.model_for(256, layers=2)
    assert stop_latency.stop_seconds(model, 256) >= 0.0  # raises unless the run ended cancelled
    assert stop_latency.main(["--canvas", "128", "--layers", "1", "--repeats", "1"]) == 0
    assert "| 128 | 1 |" in capsys.readouterr().out


def test_a_decoder_swept_by_its_own_option_gets_one_point_per_value():
    """entropy_bound declares its bound (a decoder option) as its sweep setting: one point per
    --option-values value, carried in decoder_options."""
    base = GenerationConfig(gen_length=16, block_length=8)
    points = sweep_points("entropy_bound", base, option_values=(0.05, 1.5))
    assert [(knob, value) for knob, value, _ in points] == [("entropy_bound", 0.05), ("entropy_bound", 1.5)]
    assert [c.decoder_options for _, _, c in points] == [{"entropy_bound": 0.05}, {"entropy_bound": 1.5}]
    assert all(c.decoder == "entropy_bound" for _, _, c in points)


def test_peers_table_at_identical_tokens(tmp_path, capsys):
    """benchmarks/peers.py in a tiny configuration: every row of the table, the peers' own code
    (transformers' DiffusionGemma generate, diffusers' LLaDA2Pipeline) at the engine's tokens on
    every prompt, the profile's forwards counted alike on both sides. Never the timings."""
    pytest.importorskip("diffusers")
    from benchmarks import peers

    argv = ["--gemma-prompts", "2", "--llada2-prompts", "1", "--llada2-prompt-length", "8", "--llada2-gen-length", "16",
            "--repeats", "1", "--warmup", "1", "--profile", "--clock", "cpu", "--json", str(tmp_path / "peers.json")]
    assert peers.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| row | peer | settings | tokens identical |")
    rows = [line for line in lines[2:] if line.startswith("| ") and "side" not in line][:5]
    assert [r.split(" | ")[0][2:] for r in rows] == [
        "DiffusionGemma uniform", "LLaDA2 threshold, prefix cache", "LLaDA2 threshold, no cache", "LLaDA2 edit, prefix cache", "LLaDA2 edit, no cache"]
    assert all(" | yes (" in r and r.rstrip().endswith(") |") and "x (" in r for r in rows)
    doc = json.loads((tmp_path / "peers.json").read_text())
    assert [(s["prompts"], s["identical"]) for s in doc["rows"]] == [(2, 2), (1, 1), (1, 1), (1, 1), (1, 1)]
    assert all(s["tokens"] > 0 and len(s["engine_passes"]) == len(s["peer_passes"]) == 1 for s in doc["rows"])
    sides = {(p["row"], p["side"]): p for p in doc["profile"]}
    assert len(sides) == 10 and all(p["forwards"] > 0 and 0 <= p["network_s"] <= p["seconds"] for p in sides.values())
    # the same prompts make the same forwards on both sides where both run one forward per step
    assert sides["DiffusionGemma uniform", "engine"]["forwards"] == sides["DiffusionGemma uniform", "peer"]["forwards"]
    # the prefix cache stores the prompt and finished blocks on the next forward: no forward of its own
    assert sides["LLaDA2 threshold, prefix cache", "engine"]["forwards"] == sides["LLaDA2 threshold, no cache", "engine"]["forwards"]
    assert peers.main(["--peers", "vllm"]) == 2


SECRET = "DINFER_VIZ_TEST_SECRET"


@pytest.mark.parametrize(
    "program",
    [
        # the caller's environment: neither the program's own nor the sandbox's PID 1 (bwrap) holds it
        f"import sys\nseen = open('/proc/1/environ', 'rb').read() + open('/proc/self/environ', 'rb').read()\nsys.exit(1 if b'{SECRET}' in seen else 0)",
        # each refused with EPERM (the program sees the refusal and says so by exiting 0)
        "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nsys.exit(0 if libc.ptrace(0, 0, 0, 0) == -1 and ctypes.get_errno() == 1 else 1)",
        "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nsys.exit(0 if libc.syscall(250, 0, 0, 0, 0) == -1 and ctypes.get_errno() == 1 else 1)",  # keyctl
        "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nsys.exit(0 if libc.syscall(425, 8, 0) == -1 and ctypes.get_errno() == 1 else 1)",  # io_uring_setup
    ],
    ids=["environment", "ptrace", "keyctl", "io_uring"],
)
def test_the_code_sandbox_hides_the_host(program, monkeypatch):
    """#43 item 3: a scored program read the caller's whole environment through /proc/1/environ,
    and could ptrace, use the kernel keyring and io_uring."""
    import platform

    if platform.machine() != "x86_64" and "syscall(" in program:
        pytest.skip("the raw syscall numbers here are x86_64's")
    monkeypatch.setenv(SECRET, "s3cret")
    assert scoring.run_python(program, timeout=20) is True
