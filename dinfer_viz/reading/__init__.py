"""A trace as the page reads it, the floor the rest of the app stands on (docs/app.md, module map).

- timeline: one row of a trace as per-position history, live or loaded
- tokens: the trace's token pieces as readable text
- words: how the page writes counts

Imports nothing of the app.
"""
