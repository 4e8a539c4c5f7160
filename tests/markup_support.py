"""A trace whose every string field carries markup (#43 item 2), found by walking the trace's JSON
Schema (docs/trace.schema.json), for the tests that load it into the page (chromium's, the fuzz
lane's) and look for anything it made live.

MARKUP is each way a string could become a live element or a request: a tag that fetches (`<img>`),
a link, a Markdown link and image, an autolink, a script; every one names BEACON, an address that
resolves nowhere, so a request to it means a string reached the page as markup.
"""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path
from typing import Any, Callable

from engine import Trace

from .app_support import handmade_trace

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "trace.schema.json").read_text())
BEACON = "http://beacon.invalid"
MARKUP = (
    f'<img src="{BEACON}/img" id="injected-img"><a href="{BEACON}/a" id="injected-a">a</a>'
    f'<script id="injected-script">fetch("{BEACON}/script")</script>[l]({BEACON}/md)![i]({BEACON}/mdimg)<{BEACON}/auto>'
)
INJECTED = ("#injected-img", "#injected-a", "#injected-script")
# JavaScript: every attribute of the page that would fetch or link the beacon (SVG's xlink:href
# included, which plotly writes for a link in a figure's text), as "tag attribute"
LINKING = (
    "() => Array.from(document.querySelectorAll('*')).flatMap(e => Array.from(e.attributes)"
    ".filter(a => ['href', 'src', 'srcset', 'action', 'formaction', 'poster', 'data', 'background'].includes(a.localName)"
    f" && a.value.includes('{BEACON[7:]}')).map(a => e.tagName + ' ' + a.name))"
)
# live markup in a handler's output (the page's components before the browser): a tag or an
# attribute naming the beacon in HTML and Markdown, a Markdown link in Markdown only
TAGS = re.compile(r"<img[^>]*beacon|<a [^>]*beacon|<script|src=[\"']?http://beacon|href=[\"']?http://beacon")
MARKDOWN_LINKS = re.compile(r"\]\(http://beacon|<http://beacon")
# the page's components that show their value as Markdown, and those that show it as plain text
MARKDOWN_SLOTS = {"readout", "message", "explain", "header", "note", "lesson_note", "settings_msg"}
TEXT_SLOTS = {"text", "prompt", "expected", "model_box"}
# strings a loader reads as names, whose marked-up value refuses the file (that refusal's message
# is checked as text elsewhere): the kind (a registered diffusion kind) and a revision's kind
NAMES = {("kind",), ("iterations", "revisions", "kind")}


def _resolve(node: dict) -> dict:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def string_fields(node: dict | None = None, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every place the schema gives a string, or an object free to hold any (config, stats, extras,
    a kind's state), as paths of property names (arrays walked through)."""
    node = _resolve(SCHEMA if node is None else node)
    kinds = node.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    out = []
    if "string" in kinds:
        out.append(path)
    if "object" in kinds and "properties" not in node and not isinstance(node.get("additionalProperties"), dict):
        out.append(path + ("*",))  # a free object: markup as a key and as a value
    for name, sub in node.get("properties", {}).items():
        out += string_fields(sub, path + (name,))
    if isinstance(node.get("additionalProperties"), dict):
        out += string_fields(node["additionalProperties"], path + ("*",))
    for key in ("items", "oneOf", "anyOf"):
        subs = node.get(key)
        for sub in subs if isinstance(subs, list) else [subs] if isinstance(subs, dict) else []:
            out += string_fields(sub, path)
    return sorted(set(out))


def _mark(value: Any, path: tuple[str, ...], text: Callable[[str], str]) -> Any:
    """`value` with the strings at `path` replaced by `text(old)`: a free object's values all and
    one marked-up key added."""
    if isinstance(value, list):
        return [_mark(v, path, text) for v in value]
    if not path:
        return text(value) if isinstance(value, str) else value
    head, rest = path[0], path[1:]
    if not isinstance(value, dict):
        return value
    if head == "*":
        if not rest:  # a free object (config, stats, extras): every string value, and a key whose value is of its kind
            first = next(iter(value.values()), "")
            return {k: (text(v) if isinstance(v, str) else v) for k, v in value.items()} | {text("k"): text(first) if isinstance(first, str) else first}
        return {k: _mark(v, rest, text) for k, v in value.items()}
    if head in value and value[head] is not None:
        return {**value, head: _mark(value[head], rest, text)}
    return value


def marked_trace(text: Callable[[str], str] = lambda old: old + MARKUP) -> dict:
    """The hand-made trace (with a revision, so that every field the schema names is there) as a
    dict whose every string field the schema gives, except the NAMES, is `text(old)`."""
    data = handmade_trace().to_dict()
    rec = data["iterations"][3]
    rec["revisions"] = [[{"position": 8, "old": 0, "new": 20, "kind": "edit", "rule": "p(new) > edit threshold", "score": 0.9, "bound": 0.5}]]
    data["final"][0][8] = 20
    data = copy.deepcopy(data)
    for path in string_fields():
        if path not in NAMES and path != ("tokens", "*"):
            data = _mark(data, path, text)
    data["tokens"] = {k: text(v) for k, v in data["tokens"].items()}  # keys are ids: only values are free
    Trace.from_dict(copy.deepcopy(data))  # still a trace the app loads
    return data


def random_markup(rng: random.Random) -> str:
    """One of MARKUP's pieces, or several, with text around (the fuzz lane's draw)."""
    pieces = [p for p in MARKUP.replace("><", ">\x00<").replace(")[", ")\x00[").replace(")!", ")\x00!").replace(")<", ")\x00<").split("\x00") if p]
    return "".join(rng.choice(["", "x", " ", "*"]) + rng.choice(pieces) for _ in range(rng.randint(1, 3)))


def strings(value: Any) -> list[str]:
    """Every string a page output carries (figures as their JSON: plotly draws some tags in text)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in strings(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in strings(v)]
    if hasattr(value, "to_plotly_json"):
        return [json.dumps(value.to_plotly_json(), default=str)]
    return []


def live_markup(slots: Any, values: Any) -> list[str]:
    """The live markup in a handler's outputs, by the kind of component each slot is."""
    found = []
    for name, value in zip(slots, values):
        if name in TEXT_SLOTS:
            continue
        for text in strings(value):
            found += [f"{name}: {m.group(0)}" for m in TAGS.finditer(text)]
            found += [f"{name}: {m.group(0)}" for m in MARKDOWN_LINKS.finditer(text)] if name in MARKDOWN_SLOTS else []
    return found
