"""The one exception type the engine raises for anything a user can fix.

The CLI turns it into a one-line message and a non-zero exit; the app shows it in the page.
"""


class EngineError(Exception):
    """A problem with the user's input (model folder, arguments, prompt) or an engine guard."""
