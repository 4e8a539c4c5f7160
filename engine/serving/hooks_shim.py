"""TEMPORARY: Engine.generate_ids(..., hooks=RunHooks) until the lead's switch lands; then deleted."""

import inspect

from ..hooks import RunHooks


def generate_ids(engine, prompts, config, hooks: RunHooks):
    if "hooks" in inspect.signature(engine.generate_ids).parameters:
        return engine.generate_ids(prompts, config, hooks=hooks)
    return engine.generate_ids(prompts, config, trace=hooks.trace, on_start=hooks.on_start, on_iteration=hooks.on_iteration, cancel=hooks.cancel)
