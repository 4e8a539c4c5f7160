"""What a /v1/completions or /v1/chat/completions body may say, checked into a `ParsedRequest`.

The OpenAI fields the server honours, those it accepts only at their neutral value (so a client
that sends its defaults works, and one that asks for something the engine does not do is told),
and every GenerationConfig field by its own name as an extra field (`decoder`, `threshold`,
`cache`, `block_length`, ...; `temperature` and `seed` are both OpenAI's and the config's). Every
problem is one line (`EngineError`), which the routes answer as a 4xx in OpenAI's error shape.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config import MOVED_KIND_SETTINGS, MOVED_SETTINGS, GenerationConfig
from ..constraints import CONSTRAINT_FIELDS, ConstraintSpec
from ..errors import EngineError
from .limits import RequestLimits

if TYPE_CHECKING:
    from ..pipeline import Engine

CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(GenerationConfig))
# settings taken by name: the config's fields and the old names of those that became decoder or
# kind options, which GenerationConfig lifts into `decoder_options` or `kind_options`
SETTING_FIELDS = (*CONFIG_FIELDS, *MOVED_SETTINGS, *MOVED_KIND_SETTINGS)
# OpenAI fields accepted only at the value that asks for nothing (the engine has no such feature)
NEUTRAL_FIELDS: dict[str, tuple[object, ...]] = {
    "n": (1,), "best_of": (1,), "top_p": (1, 1.0), "echo": (False,), "logprobs": (False, 0), "top_logprobs": (0,),
    "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logit_bias": ({},),
}
IGNORED_FIELDS = ("user", "metadata", "store")  # bookkeeping a client may send; nothing to do
COMMON_FIELDS = ("model", "max_tokens", "max_completion_tokens", "stop", "stream", "stream_options", "response_format", "structured_outputs", "provisional")
# vLLM's `structured_outputs` keys the engine serves, and the GenerationConfig field each sets
STRUCTURED_OUTPUTS = {"regex": "regex", "json": "json_schema", "choice": "choice"}
ROLES = ("system", "user", "assistant")
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 200


@dataclass
class ParsedRequest:
    """`prompts`: one per batch row (a chat has one: its messages). `max_tokens`: the completion's
    bound in tokens, where its text is cut (the canvas is `config.gen_length`, a whole number of
    blocks at least as long, and at least the model's answer length: `canvas_length`)."""

    chat: bool
    prompts: list[str] | list[list[dict[str, str]]]
    config: GenerationConfig
    max_tokens: int
    stop: list[str]
    stream: bool
    include_usage: bool
    model: str | None
    provisional: bool = False  # each streamed chunk also carries the row's draft after its final text (streaming.py)

    def prompt_chars(self, index: int) -> int:
        prompt = self.prompts[index]
        return len(prompt) if isinstance(prompt, str) else sum(len(m["content"]) for m in prompt)


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise EngineError(message)


def _positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    _need(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1), f"{name} must be a positive integer, got {str(value)[:40]!r}")
    return value


def _stop(value: Any) -> list[str]:
    stops = [] if value is None else [value] if isinstance(value, str) else value
    _need(isinstance(stops, list) and all(isinstance(s, str) and s for s in stops), "stop must be a string or a list of non-empty strings")
    _need(len(stops) <= MAX_STOP_STRINGS and all(len(s) <= MAX_STOP_CHARS for s in stops), f"stop takes at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} characters")
    return stops


def _messages(value: Any) -> list[dict[str, str]]:
    """Chat messages as {role, content} with text content (OpenAI's list of text parts joined)."""
    _need(isinstance(value, list) and len(value) > 0, "messages must be a non-empty list of {role, content}")
    out = []
    for i, message in enumerate(value):
        _need(isinstance(message, dict) and message.get("role") in ROLES, f"messages[{i}].role must be one of {', '.join(ROLES)}")
        content = message.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            _need(all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content), f"messages[{i}].content: only text parts are supported")
            content = "".join(p["text"] for p in content)
        _need(isinstance(content, str), f"messages[{i}].content must be text")
        out.append({"role": message["role"], "content": content})
    _need(out[-1]["role"] == "user", "the last message must be the user's")
    return out


def _prompts(value: Any, limits: RequestLimits) -> list[str]:
    prompts = [value] if isinstance(value, str) else value
    _need(isinstance(prompts, list) and len(prompts) > 0 and all(isinstance(p, str) for p in prompts), "prompt must be a string or a non-empty list of strings (token ids are not accepted)")
    _need(len(prompts) <= limits.max_prompts, f"at most {limits.max_prompts} prompts in one request, got {len(prompts)}")
    _need(all(p.strip() for p in prompts), "empty prompt")
    return prompts


def _constraint(body: dict[str, Any]) -> dict[str, Any]:
    """The answer's constraint as config settings, from OpenAI's `response_format`
    ({"type": "json_schema", "json_schema": {"schema": ...}}, {"type": "json_object"}, {"type":
    "text"}) or vLLM's `structured_outputs` ({"regex": ...}, {"json": ...}, {"choice": [...]});
    at most one source (the config's own fields count as one)."""
    out: dict[str, Any] = {}
    fmt = body.get("response_format")
    if fmt is not None:
        _need(isinstance(fmt, dict) and fmt.get("type") in ("text", "json_object", "json_schema"), "response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": {\"schema\": ...}}")
        if fmt["type"] == "json_object":
            out["json_schema"] = {"type": "object"}
        elif fmt["type"] == "json_schema":
            spec = fmt.get("json_schema")
            _need(isinstance(spec, dict) and isinstance(spec.get("schema"), dict), "response_format json_schema needs json_schema.schema, a JSON Schema object")
            out["json_schema"] = spec["schema"]
    structured = body.get("structured_outputs")
    if structured is not None:
        _need(isinstance(structured, dict) and len(structured) == 1 and next(iter(structured)) in STRUCTURED_OUTPUTS, f"structured_outputs takes one of {', '.join(STRUCTURED_OUTPUTS)} (this server has no grammar, json_object or structural_tag)")
        _need(not out, "give response_format or structured_outputs, not both")
        (key, value), = structured.items()
        out[STRUCTURED_OUTPUTS[key]] = value
    _need(not (out and any(name in body for name in STRUCTURED_OUTPUTS.values())), "give the answer's constraint once: response_format, structured_outputs or regex/json_schema/choice")
    return out


def constraint_of(body: Any) -> ConstraintSpec | None:
    """The constraint a request body asks for, read before its checks (which may compile it: the
    server runs those apart, app.py); None when it names none, or names one its checks refuse."""
    if not isinstance(body, dict):
        return None
    try:
        asked = {name: body[name] for name in CONSTRAINT_FIELDS if body.get(name) is not None} | _constraint(body)
    except EngineError:
        return None
    if len(asked) != 1:
        return None
    (kind, value), = asked.items()
    return ConstraintSpec(kind, tuple(value) if isinstance(value, list) else value)


def canvas_length(max_tokens: int | None, block: int, answer_length: int | None, limits: RequestLimits) -> int | None:
    """The canvas of a request that gives no gen_length (docs/serving.md §1): whole blocks holding
    `max_tokens` and at least the model's answer length (its card's: engine/models/card.py), so a
    max_tokens below that length cuts the answer rather than changing it; None (the config's
    default) when neither is known. The answer length yields to the server's --max-gen-length."""
    least = max(max_tokens or 0, answer_length or 0)
    if least == 0:
        return None
    canvas = -(-least // block) * block  # whole numbers: a huge max_tokens is no float overflow
    if canvas > limits.max_gen_length:  # a max_tokens past the limit is refused as it was asked
        canvas = max(-(-(max_tokens or 0) // block) * block, limits.max_gen_length // block * block)
    return canvas


def _config(body: dict[str, Any], chat: bool, max_tokens: int | None, answer_length: int | None, limits: RequestLimits) -> GenerationConfig:
    """The extra fields as a GenerationConfig. A completion's prompt is raw text unless the request
    sets use_chat_template; a chat's goes through the template. Without `gen_length` the canvas is
    `canvas_length`'s; with a `suffix` it is the hole, `max_tokens` exactly, and a `template`'s holes
    are its own (docs/serving.md §1). A setting given as null is the default, as if left out (docs/serving.md):
    every optional setting's default is None, so `kind: null` and `verify: null` mean alike."""
    settings = {name: body[name] for name in SETTING_FIELDS if body.get(name) is not None} | _constraint(body)
    settings.setdefault("use_chat_template", chat)
    block = settings.get("block_length", GenerationConfig.block_length)
    if settings.get("suffix") and max_tokens is not None and "gen_length" not in settings:
        settings["gen_length"] = max_tokens  # the hole between the prompt and the suffix: OpenAI's fill-in-the-middle
    elif "gen_length" not in settings and "template" not in settings and isinstance(block, int) and not isinstance(block, bool) and block >= 1:
        canvas = canvas_length(max_tokens, block, answer_length, limits)
        if canvas is not None:
            settings["gen_length"] = canvas
    return GenerationConfig.from_dict(settings)


def parse_request(body: Any, chat: bool, limits: RequestLimits, answer_length: int | None = None) -> ParsedRequest:
    """Check a request body (parsed JSON) field by field; EngineError names the first problem.
    `answer_length`: the served model's (its card's), the least canvas (`canvas_length`)."""
    _need(isinstance(body, dict), "the request body must be a JSON object")
    known = {*COMMON_FIELDS, *NEUTRAL_FIELDS, *IGNORED_FIELDS, *SETTING_FIELDS, "messages" if chat else "prompt"}
    unknown = sorted(set(body) - known)
    _need(not unknown, f"unknown field(s): {', '.join(unknown)[:200]} (generation settings: {', '.join(CONFIG_FIELDS)})")
    for name, allowed in NEUTRAL_FIELDS.items():
        value = body.get(name)
        if value is not None and not any(value == a and type(value) is type(a) for a in allowed):
            raise EngineError(f"{name}={json.dumps(value, default=str)[:40]} is not supported by this server (only {json.dumps(allowed[0])})")
    model = body.get("model")
    _need(model is None or isinstance(model, str), "model must be a string")
    _need(isinstance(body.get("stream", False), bool), "stream must be true or false")
    _need(isinstance(body.get("provisional", False), bool), "provisional must be true or false")
    _need(not body.get("provisional") or body.get("stream") is True, "provisional text is streamed: provisional needs stream: true")
    options = body.get("stream_options") or {}
    _need(isinstance(options, dict) and set(options) <= {"include_usage"} and isinstance(options.get("include_usage", False), bool), "stream_options takes only include_usage (true or false)")
    max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    if chat:
        _need("messages" in body, "a chat completion needs messages")
        prompts: list = [_messages(body["messages"])]
    else:
        _need("prompt" in body, "a completion needs a prompt")
        prompts = _prompts(body["prompt"], limits)
    config = _config(body, chat, max_tokens, answer_length, limits)
    return ParsedRequest(
        chat=chat, prompts=prompts, config=config, max_tokens=max_tokens or config.gen_length, stop=_stop(body.get("stop")),
        stream=bool(body.get("stream", False)), include_usage=bool(options.get("include_usage", False)), model=model,
        provisional=bool(body.get("provisional", False)),
    )


def encode_prompt(engine: "Engine", prompt: str | list[dict[str, str]], use_chat_template: bool) -> list[int]:
    """A completion's text, or a chat's messages: one user message through `Engine.encode`, several
    through the tokenizer's chat template (a model without one takes a single user message)."""
    if isinstance(prompt, str):
        return engine.encode(prompt, use_chat_template)
    if len(prompt) == 1:
        return engine.encode(prompt[0]["content"], use_chat_template)
    if not (use_chat_template and getattr(engine.tokenizer, "chat_template", None)):
        raise EngineError("this model has no chat template (or use_chat_template is false): send one user message")
    ids = engine.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
