"""The engine behind the open page (docs/app.md, module map; the concurrency rule: §10).

- host: the loaded engines and the one lock every use of them takes
- runner: a live run on a worker thread, paced into frames, cancelled by Stop
- jobs: an engine job on a thread under the lock, followed by the tab that shows it; events: what
  its thread reports
- batching: concurrent visitors' runs decoded as one engine batch
- system: what this machine and this engine build support
- stream_keeper: the page's event stream reopened where Gradio's client leaves it closed

Imports from reading/ only.
"""
