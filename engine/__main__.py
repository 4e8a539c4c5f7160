"""`python -m engine generate ...`: the engine's command line (thin: argparse -> API).

Every GenerationConfig field is a flag (`gen_length` -> `--gen-length`, booleans as
`--smoothing/--no-smoothing`), so a setting added to the config is on the CLI at once.
Errors print one line to stderr and exit 2. Under torchrun (docs/scaling.md) every rank runs the
command: rank 0 prints the result, the first process of each node an error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import typing
from pathlib import Path

from .cli import DEFAULT_MODEL, MODEL_HELP, OneLineParser, check_threads, checked_device, printable, add_runtime_args, add_system_flags, apply_runtime, set_cpu_threads, system_kwargs
from .arguments import read_text_file
from .config import GenerationConfig, parse_schema, setting_choices, setting_help
from .constraints.spec import MAX_SCHEMA_CHARS
from .kinds import KINDS, kind_options, kinds_described
from .registry import KIND_OPTION_PREFIX, OPTION_SETTING_PREFIX, DecoderOption, decoder_options
from .settings_read import readers_note
from .errors import EngineError
from .serving.command import add_serve_command
from .tuning.command import add_tune_command
from .hooks import RunHooks

# constraint settings whose flags are not the field's type (a schema file or JSON, a repeated text)
CONSTRAINT_FLAGS = ("json_schema", "choice")
# the fields whose flags are their entries' own, one per declared option (below)
OPTION_FIELDS = ("decoder_options", "kind_options")
from .runtime.launch import first_on_its_node, wait_for_the_reporter



def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per GenerationConfig field: typed from its annotation, its default, choices and help
    from the field's declaration (engine/config.py), and who reads it (engine/settings_read.py)."""
    hints = typing.get_type_hints(GenerationConfig)
    group = parser.add_argument_group("generation settings (every GenerationConfig field)")
    for field in dataclasses.fields(GenerationConfig):
        if field.name in (*OPTION_FIELDS, *CONSTRAINT_FLAGS):  # one flag per declared option, and the constraint's, below
            continue
        flag = "--" + field.name.replace("_", "-")
        kind = hints[field.name]
        choices, described = setting_choices(field.name), ""
        if field.name == "kind":  # the discovered kinds, each with its summary
            choices, described = tuple(KINDS), kinds_described()
        text = " ".join(filter(None, (setting_help(field.name), described, readers_note(field.name)))).replace("%", "%%")
        if kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default, help=text)
            continue
        base = next((t for t in typing.get_args(kind) if t is not type(None)), kind)
        group.add_argument(
            flag, type=base, default=field.default, choices=choices, metavar="{" + ",".join(choices) + "}" if choices else base.__name__.upper(),
            help=f"{text} (default: %(default)s)",
        )


    answer = parser.add_argument_group("the answer's constraint (at most one; docs/constraints.md)")
    answer.add_argument("--json-schema", metavar="FILE_OR_JSON", default=None, help=setting_help("json_schema") + ": a file, or the JSON itself")
    answer.add_argument("--choice", metavar="TEXT", action="append", default=None, help=setting_help("choice") + " (repeat the flag, one text each)")

    kinds = parser.add_argument_group("the kinds' own settings (config.kind_options; given only when set)")
    for name, (_, option) in kind_options().items():
        add_option_flag(kinds, KIND_OPTION_PREFIX + name, KIND_OPTION_PREFIX + name, option)
    options = decoder_options()
    if options:
        plugins = parser.add_argument_group("decoders' own settings (config.decoder_options; given only when set)")
    for name, (_, option) in options.items():
        add_option_flag(plugins, name, OPTION_SETTING_PREFIX + name, option)


def add_option_flag(group: argparse._ArgumentGroup, dest: str, setting: str, option: DecoderOption) -> None:
    """`--<name>` for a declared option (a decoder's or a kind's), None when not given: only given
    options are sent."""
    text = f"{option.help} {readers_note(setting)} (default: {option.default})".replace("%", "%%")
    name = setting.rsplit(".", 1)[-1]
    if isinstance(option.default, bool):
        group.add_argument("--" + name.replace("_", "-"), dest=dest, action=argparse.BooleanOptionalAction, default=None, help=text)
    else:
        metavar = None if option.choices else name.upper()
        group.add_argument("--" + name.replace("_", "-"), dest=dest, type=type(option.default), default=None, choices=option.choices or None, metavar=metavar, help=text)


def config_from_args(args: argparse.Namespace) -> GenerationConfig:
    """The config the flags describe, not validated yet (the command's `fit` validates it, once); a
    declared option goes to decoder_options or kind_options when given."""
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(GenerationConfig) if f.name not in (*OPTION_FIELDS, "json_schema")}
    if args.json_schema is not None:
        fields["json_schema"] = read_schema(args.json_schema)
    given = {name: getattr(args, name) for name in decoder_options() if getattr(args, name, None) is not None}
    kind_given = {name: getattr(args, KIND_OPTION_PREFIX + name) for name in kind_options() if getattr(args, KIND_OPTION_PREFIX + name, None) is not None}
    return GenerationConfig(**fields, decoder_options=given, kind_options=kind_given)


def read_schema(value: str) -> dict:
    """`--json-schema`: JSON text (it starts with `{`) or a file holding it; EngineError in one line."""
    text = value if value.lstrip().startswith("{") else read_text_file(value, "--json-schema: the file", MAX_SCHEMA_CHARS * 4)
    return parse_schema(text)


def check_writable(path: Path) -> None:
    """Refuse an unwritable --trace path before generating (not after the whole generation); an
    existing path must be a regular file (a FIFO would block the write, a device swallow it)."""
    folder = path.parent if str(path.parent) else Path(".")
    try:
        bad = path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK) or (path.exists() and not (path.is_file() and os.access(path, os.W_OK)))
    except (OSError, ValueError) as exc:  # a name too long for the file system, a NUL byte
        raise EngineError(f"cannot write the trace to {str(path)[:200]}: {getattr(exc, 'strerror', None) or exc}") from None
    if bad:
        raise EngineError(f"cannot write the trace to {str(path)[:200]}: not a writable regular file in an existing folder")


def write_trace(path: Path, text: str) -> None:
    """The trace written, or one line saying why not (a full disk, a quota)."""
    try:
        path.write_text(text)
    except OSError as exc:
        raise EngineError(f"cannot write the trace to {str(path)[:200]}: {exc.strerror or exc}") from None


def _generate(args: argparse.Namespace) -> int:
    from .kinds import fit
    from .models import model_skeleton
    from .pipeline import Engine

    config = config_from_args(args)
    try:
        if not args.prompt or not args.prompt.strip():
            raise EngineError("empty prompt")
        system = system_kwargs(args)
        if args.trace:
            check_writable(Path(args.trace))
        check_threads(args.threads)
        skeleton = model_skeleton(args.model)
    except EngineError:
        config.validate()  # a bad config is the first thing said, as ever
        raise
    config = fit(config, skeleton)  # validated here, once, before the (slow) model load; the engine trusts it
    runtime = apply_runtime(args)
    # before the engine: --tp/--ep worker processes share this process's threads (engine/runtime/workers.py)
    set_cpu_threads(skeleton, args.threads)
    with Engine(args.model, **runtime, **system) as engine:
        missing = engine.unencodable(args.prompt, config.use_chat_template)
        if missing and engine.rank == 0:
            print(f"warning: the tokenizer has no token for {''.join(sorted(set(missing)))!r}: the model sees an unknown token there", file=sys.stderr)
        result = engine.generate(args.prompt, config, hooks=RunHooks(trace=bool(args.trace)), fitted=True)
    out = result.output
    if engine.rank != 0:  # a launched job's other ranks hold the same output: rank 0 speaks for the job
        return 0
    if args.trace:
        write_trace(Path(args.trace), out.trace.to_json())
    if args.json:
        print(json.dumps({"text": result.text, "token_ids": out.token_ids[0], **out.stats.to_dict()}))
    else:
        s = out.stats
        print(result.text)
        compiled = f"  compiled {s.compiles} graph(s) in {s.compile_seconds:.1f}s" if s.compiles else ""
        print(f"[nfe {s.nfe}  tokens {s.tokens}  {s.seconds:.3f}s  tps {s.tps:.1f}  tpf {s.tpf:.2f}{compiled}]", file=sys.stderr)
    return 0


def _record(args: argparse.Namespace) -> int:
    from .kinds import fit
    from .models import model_skeleton
    from .reference import check_model, check_settings, record_reference

    config = config_from_args(args)
    try:
        skeleton = model_skeleton(args.model)
    except EngineError:
        config.validate()  # a bad config is the first thing said, as `generate` says it
        raise
    check_model(args.reference, skeleton.diffusion_kind)
    config = fit(config, skeleton)  # the request as the model's kind runs it, as `generate` fits it
    check_settings(args.reference, config)  # before the (slow) model load
    check_writable(Path(args.trace))
    trace = record_reference(args.reference, args.model, args.prompt, config, device=args.device)
    write_trace(Path(args.trace), trace.to_json())
    print(f"[{args.reference}: {len(trace.iterations)} steps, trace written to {args.trace}]", file=sys.stderr)
    return 0


def read_trace(path: str):
    """A trace file, checked on load; EngineError in one line naming the file."""
    from .trace import MAX_TRACE_BYTES, Trace

    text = read_text_file(path, "the trace", MAX_TRACE_BYTES)
    try:
        return Trace.from_json(text)
    except EngineError as exc:
        raise EngineError(f"{path}: {exc}") from None


def _diff(args: argparse.Namespace) -> int:
    from .trace_diff import diff_traces

    diff = diff_traces(read_trace(args.a), read_trace(args.b), args.row_a, args.row_b)
    print(json.dumps(diff.to_dict()) if args.json else diff.summary())
    return 0 if diff.final_equal else 1


def _analyze(args: argparse.Namespace) -> int:
    from .analysis import CONVERGED_WORDS, analyze, figure_text

    trace = read_trace(args.trace)
    if not 0 <= args.row < len(trace.initial):
        raise EngineError(f"the trace has no row {args.row} (it has {len(trace.initial)})")
    result = analyze(trace, args.row)
    if args.json:
        print(json.dumps(result))
        return 0
    rho, within = (figure_text(result[k]) for k in ("order_correlation", "order_correlation_within_blocks"))
    print(f"steps {result['steps']}  order correlation {rho} (within blocks {within})  converged {CONVERGED_WORDS[result['converged']]}")
    print("step  finalized  kl_to_final  gate  mean  commits")
    for i in range(result["steps"]):
        figures = "  ".join(figure_text(result[k][i], 4) for k in ("finalized_fraction", "kl_to_final", "gate_confidence", "mean_confidence"))
        print(f"{i:4d}  {figures}  {result['commits'][i]}")
    return 0


def add_trace_commands(sub) -> None:
    """`record`, `diff` and `analyze` (docs/analysis.md)."""
    rec = sub.add_parser("record", help="run a reference implementation (transformers, diffusers) and write its run as a trace")
    rec.add_argument("--reference", required=True, choices=["transformers", "diffusers"])
    rec.add_argument("--model", required=True, help="model folder (a DiffusionGemma checkpoint for transformers, an LLaDA2 one for diffusers)")
    rec.add_argument("--prompt", required=True)
    rec.add_argument("--trace", required=True, metavar="FILE", help="where to write the trace (JSON)")
    rec.add_argument("--device", type=checked_device, default="cpu", help="cpu, cuda, cuda:1, mps")
    add_config_flags(rec)
    rec.set_defaults(run=_record)
    diff = sub.add_parser("diff", help="compare two traces of one prompt step by step (exit 1 when the final tokens differ)")
    diff.add_argument("a", metavar="A.json")
    diff.add_argument("b", metavar="B.json")
    diff.add_argument("--row-a", type=int, default=0, help="the row of A (default 0)")
    diff.add_argument("--row-b", type=int, default=0, help="the row of B (default 0)")
    diff.add_argument("--json", action="store_true", help="print one JSON object")
    diff.set_defaults(run=_diff)
    ana = sub.add_parser("analyze", help="per-step and per-run analyses of a trace")
    ana.add_argument("trace", metavar="TRACE")
    ana.add_argument("--row", type=int, default=0, help="which row (default 0)")
    ana.add_argument("--json", action="store_true", help="print one JSON object")
    ana.set_defaults(run=_analyze)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m engine", description="dinfer-viz engine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    gen = sub.add_parser("generate", help="generate from one prompt")
    gen.add_argument("--model", default=DEFAULT_MODEL, help=MODEL_HELP)
    gen.add_argument("--prompt", required=True, help="the text to continue (the model's chat template is applied when it has one)")
    add_runtime_args(gen)
    gen.add_argument("--trace", metavar="FILE", help="write the per-iteration trace as JSON")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    add_system_flags(gen)
    add_config_flags(gen)
    gen.set_defaults(run=_generate)
    add_serve_command(sub)
    add_tune_command(sub)
    add_trace_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()  # lists the decoders, loading $DINFER_VIZ_DECODERS plug-ins
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except EngineError as exc:
        message = str(exc)
    # what the operating system or Python's number and text handling refuse, past every check
    except (OSError, UnicodeError, OverflowError, MemoryError) as exc:
        message = f"{type(exc).__name__}: {exc}"
    except KeyboardInterrupt:
        message = "interrupted"
    if first_on_its_node():
        print(f"error: {printable(message)}", file=sys.stderr)  # one line, whatever the message held
    else:
        wait_for_the_reporter()
    return 2


if __name__ == "__main__":
    sys.exit(main())
