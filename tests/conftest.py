"""Shared fixtures: tiny random LLaDA models and checkpoints built by the tests themselves; the
slow lanes (`LANES`)."""

from __future__ import annotations

import os

# Inductor's pool of compile workers costs more than it saves on CI's 2 cores (a first graph took
# about 24 s with it, 9 s without): every compiling test, and the app, server and worker processes
# the tests start (they inherit the environment), compile in their own thread. Set before torch loads.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

# Compiled constraint automata (engine/constraints/stored.py) go to one folder of this run's own,
# never the user's ~/.cache: made here by the first process (pytest itself, or xdist's controller),
# inherited by its workers and every process a test starts, removed when that process ends. A run
# builds each automaton once, as a machine does; a test of the builds themselves sets its own folder.
_OWN_CACHE = "DINFER_VIZ_CACHE" not in os.environ
if _OWN_CACHE:
    import tempfile

    os.environ["DINFER_VIZ_CACHE"] = tempfile.mkdtemp(prefix="dinfer-viz-tests-")

import pytest  # noqa: E402
import torch  # noqa: E402

from engine.decoders import Block
from engine.models.llada import LLaDAModelLM

# The slow lanes: tests that start worker processes, torchrun jobs or a fresh Python with torch
# (the CLI, the server, the app as programs), compile, drive chromium, train or score a shipped model. Each lane is a marker (pyproject.toml) and implies `slow`, so `pytest -m "not slow"` runs the
# engine and app unit tests and `pytest -m workers` one lane. A lane holds whole test files, or one
# test (all its parameter sets) or one parameter set of it, by name in tests/; a test's own
# `@pytest.mark.<lane>` counts too. tests/test_lanes.py checks that every entry names a test.
LANES: dict[str, tuple[str, ...]] = {
    "workers": (
        "test_parallel_engine.py",
        "test_worker_orphans.py",
        "test_worker_scripts.py",  # a plain script's tensor-parallel Engine, as a process
        "test_parallel.py::test_two_processes_give_the_logits_and_tokens_of_one",
        "test_app_cost.py::test_a_run_with_a_system_option_says_so_first_and_draws_its_cost[tp2]",
        "test_compiled.py::test_compile_with_tensor_parallelism_keeps_the_tokens_and_times_each_ranks_all_reduces",
        "test_serve.py::test_sigint_to_the_server_ends_its_stream_with_an_error_event_and_leaves_no_process",
        "test_app_signals.py::test_a_signal_to_the_app_mid_run_exits_0_and_leaves_no_process[sigint-tp2]",
    ),
    "torchrun": ("test_torchrun.py",),
    "processes": (  # each imports torch (or gradio) afresh: seconds apiece before it does anything
        "test_cli.py::test_generate_json_in_a_real_process",
        "test_kinds.py::test_the_cli_refuses_in_one_line_with_exit_2",
        "test_speculative.py::test_a_kind_file_and_a_view_file_dropped_in_run_with_no_other_edit",
        "test_example_kind.py::test_the_cli_loads_it_by_path_and_runs_it",
        "test_decoder_discovery.py::test_a_decoder_file_copied_into_engine_decoders_runs_by_its_new_name",
        "test_analysis.py::test_analyze_command",
        "test_trace_diff.py::test_diff_command",
        "test_reference_record.py::test_record_command_on_the_embedded_gemma_equals_transformers_generate",
        "test_app_cli.py::test_the_server_listens_where_the_environment_says",
        "test_model_names.py::test_the_server_serves_an_embedded_name_from_any_directory",
        "test_security.py::test_app_with_an_address_it_cannot_bind_says_so_in_one_line_and_exits",
        "test_tune.py::test_two_tune_processes_on_one_storage_complete_one_study_of_all_their_trials",
        "test_tune.py::test_a_signal_ends_the_running_trial_and_says_what_the_study_kept",
        "test_hardening_constraints.py",  # constraint builds run to their deadline or memory bound
        "test_constraint_scripts.py",  # plain scripts with a constraint, as processes
        "test_app_signals.py::test_a_signal_to_the_app_mid_run_exits_0_and_leaves_no_process[sigint-sweep]",
    ),
    "compile": (
        "test_compiled.py",
        "test_app_signals.py::test_a_signal_to_the_app_mid_run_exits_0_and_leaves_no_process[sigterm-compile]",
        "test_app_cost.py::test_a_run_with_a_system_option_says_so_first_and_draws_its_cost[compile]",
        "test_serve_kinds_batched.py::test_a_compiled_uniform_state_engine_serves_its_rows_beside_each_other_each_call_alone",
    ),
    "browser": (  # require_browser() fails a test that drives chromium outside this lane
        "test_app_browser.py",
        "test_constraint_browser.py",
        "test_diff_browser.py",
        "test_infill_browser.py",
        "test_page_limits_browser.py",
        "test_panels_browser.py",
        "test_projector_browser.py",
        "test_revision_browser.py",
        "test_run_on_display_browser.py",
        "test_speculative_browser.py",
        "test_stream_keeper.py",
        "test_trace_markup_browser.py",
        "test_uniform_browser.py",
        "test_tune_browser.py",
    ),
    "training": ("test_train.py", "test_distill.py", "test_edit_train.py", "test_uniform_train.py"),
    "evaluation": (  # a shipped model scored on held-out prompts: its quality floors, not the code's rules
        "test_embedded_model.py::test_threshold_decoder_answers_held_out_prompts_of_every_family",
        "test_embedded_model.py::test_the_issues_targets_at_threshold_0_9",
        "test_embedded_model.py::test_pair_sum_shows_the_speed_accuracy_trade_off",
        "test_embedded_model.py::test_blocks_keep_the_eos_march_from_cutting_grammar_short",
        "test_embedded_model.py::test_the_apps_default_sweep_draws_the_curve",
        "test_serve.py::test_lm_eval_scores_the_embedded_model_through_the_server",
        "test_speculative.py::test_on_the_shipped_block_diffusion_model_speculation_writes_the_autoregressive_tokens_in_fewer_forwards",
        "test_infill_eval.py::test_the_infill_model_fills_held_out_pair_sum_holes_through_the_server_and_the_cli",
    ),
    "fuzz": ("test_fuzz.py", "test_fuzz_surfaces.py"),  # generated bad inputs against every interface's one-line contract (#33)
}
SLOW = "slow"


def lanes_of(file: str, name: str, originalname: str, marked: set[str] = frozenset()) -> list[str]:
    """The lanes of the test `name` (with its parameter set; `originalname` without) in tests/`file`,
    `marked` the markers it carries itself."""
    found = set(marked) & set(LANES)
    for lane, entries in LANES.items():
        for entry in entries:
            where, _, test = entry.partition("::")
            if where == file and test in ("", name, originalname):
                found.add(lane)
    return sorted(found)


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        lanes = lanes_of(item.path.name, item.name, getattr(item, "originalname", item.name), {m.name for m in item.iter_markers()})
        for lane in lanes:
            item.add_marker(lane)
        if lanes:
            item.add_marker(SLOW)


_running: dict[str, pytest.Item] = {}  # the test being set up or run (this process runs one at a time)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _running["item"] = item


def assert_in_lane(lane: str, what: str) -> None:
    """Fail the running test unless it is in `lane` (what it does, `what`, belongs there)."""
    item = _running.get("item")
    if item is not None and item.get_closest_marker(lane) is None:
        pytest.fail(f"{item.nodeid} {what}: add it to LANES[{lane!r}] in tests/conftest.py or mark it @pytest.mark.{lane}")


def assert_processes_end(pids: list[int], limit_s: float, who: str) -> None:
    """Each process in `pids` ends within `limit_s` (a bound on a hang, not a speed): its pidfd
    turns readable when it ends; one already gone counts as ended."""
    import os
    import select

    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            assert select.select([fd], [], [], limit_s)[0], f"process {pid} outlived {who}"
        finally:
            os.close(fd)


# Tests use tiny tensors: one thread avoids oversubscribing CI's two cores (measured: 95 s -> 12 s
# for the decoder tests on a loaded machine).
torch.set_num_threads(1)

TINY_CONFIG = dict(
    model_type="llada",
    architectures=["LLaDAModelLM"],
    d_model=64,
    n_heads=4,
    n_kv_heads=4,
    n_layers=2,
    mlp_hidden_size=96,
    vocab_size=50,
    embedding_size=50,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    mask_token_id=49,
    eos_token_id=48,
    pad_token_id=48,
)


def tiny_llada(seed: int = 0, **overrides) -> LLaDAModelLM:
    """A random fp32 LLaDA small enough for exact comparisons in milliseconds."""
    torch.manual_seed(seed)
    model = LLaDAModelLM({**TINY_CONFIG, **overrides})
    with torch.no_grad():  # default init gives near-uniform logits; widen them so confidences vary
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model.eval().requires_grad_(False)


def fill_block(masked: torch.Tensor, threshold: float, mask_id: int) -> Block:
    """The `Block` a decoder's `step` gets for a block whose only change is filling its masks:
    [MASK] at the `masked` positions, the others committed (token 0, editable)."""
    return Block(masked, torch.where(masked, mask_id, 0), ~masked, threshold)


@pytest.fixture
def own_registry(monkeypatch):
    """A decoder registry of the test's own: the decoders it registers in this process (plug-ins
    it loads) are gone for the tests after it, whatever order they run in."""
    from engine import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_loaded_plugins", set(registry._loaded_plugins))


@pytest.fixture
def gate_decoders(own_registry) -> None:
    """The gate decoders of the tests ("turnstile", tests/turnstile_decoder.py, and "marked_gate")
    in the test's own registry. Registered here rather than by importing their modules: an import
    registers once per process, so a test importing a module another test's registry already took
    it into would find the name missing from its own."""
    from engine import registry
    from tests.marked_gate_decoder import MarkedGateDecoder
    from tests.turnstile_decoder import TurnstileDecoder

    for cls in (TurnstileDecoder, MarkedGateDecoder):
        registry._REGISTRY[cls.name] = cls


@pytest.fixture
def own_kinds():
    """A kind registry of the test's own: the kinds it registers are gone for the tests after it.
    KINDS is one dict that modules import by name, so it is restored in place."""
    from engine.kinds import KINDS

    saved = dict(KINDS)
    yield KINDS
    KINDS.clear()
    KINDS.update(saved)


@pytest.fixture
def decoderless_kind(own_kinds) -> type:
    """The test kind that takes no decoder ("fill", tests/decoderless_kind.py) in the test's own
    kind registry (registered here, not on import: `gate_decoders` says why)."""
    from tests.decoderless_kind import FillKind

    own_kinds[FillKind.name] = FillKind
    return FillKind


@pytest.fixture
def model() -> LLaDAModelLM:
    return tiny_llada()


@pytest.fixture(scope="session")
def tiny_gemma_folder(tmp_path_factory):
    """A tiny random DiffusionGemma checkpoint with the char tokenizer (tests/gemma_models.py)."""
    from .gemma_models import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("tiny-gemma"))


@pytest.fixture(scope="module")
def app_in_browser(tmp_path_factory):
    """The app on the test model and Debian's chromium, one of each per module (host, url, browser,
    demo): its pages open here. Not one app per test process, tried to save the 3-8 s an app takes
    to start: a Run clicked by a later module's test then started nothing ("no run yet" for 300 s,
    twice in one fresh-clone CI run, once in four local runs). The same Run started nothing with an
    app per module too, until the page's event stream was kept (dinfer_viz/live/stream_keeper.py), the
    likely cause of both; one app per process was not tried again."""
    from .app_support import app_in_chromium

    with app_in_chromium(tmp_path_factory) as app:
        yield app


def pytest_unconfigure(config):
    if _OWN_CACHE:
        import shutil

        shutil.rmtree(os.environ["DINFER_VIZ_CACHE"], ignore_errors=True)
