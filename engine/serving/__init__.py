"""Serving: the request batcher (batcher.py) and the OpenAI-compatible HTTP server over it
(`python -m engine serve`; docs/serving.md)."""
