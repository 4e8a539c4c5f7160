"""Structured output for diffusion decoding (docs/constraints.md): a regex, a JSON schema or a list
of choices that the answer obeys whatever order the decoder commits in.

`spec.py` what a request asks (GenerationConfig's `regex`, `json_schema`, `choice`) and its bounds;
`vocabulary.py` the tokenizer's tokens as outlines-core reads them and the token automaton of a
regex over them; `automaton.py` that automaton and the dynamic programme over a canvas;
`canvas.py` the run's seam: `restrict` before the decoder, `admit` and `draft` after it;
`limits.py` the bounds a request is held to; `bounded.py` a build in a child within its deadline
and memory bound; `stored.py` built automata kept on disk for every process.
"""

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports

# Imported on first use (engine/lazy_exports.py): the build server (builder.py) imports the modules a
# build runs and none that imports torch (canvas.py).
_DEFINED_IN = {
    "Sets": "automaton", "TokenAutomaton": "automaton",
    "CanvasConstraint": "canvas", "Compiler": "canvas", "Restriction": "canvas",
    "CONSTRAINT_FIELDS": "spec", "ConstraintSpec": "spec", "check_config": "spec", "escape": "spec", "spec_of": "spec",
    "TokenVocabulary": "vocabulary", "compile_in_background": "vocabulary", "token_bytes": "vocabulary",
}
__all__ = sorted(_DEFINED_IN)

if TYPE_CHECKING:
    from .automaton import Sets, TokenAutomaton
    from .canvas import CanvasConstraint, Compiler, Restriction
    from .spec import CONSTRAINT_FIELDS, ConstraintSpec, check_config, escape, spec_of
    from .vocabulary import TokenVocabulary, compile_in_background, token_bytes

__getattr__, __dir__ = lazy_exports(__name__, _DEFINED_IN)
