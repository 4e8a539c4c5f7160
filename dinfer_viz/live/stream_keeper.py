"""Reopen the page's event stream where Gradio's client leaves an event without one.

Gradio's browser client hears every queued event of a page over one stream (`/queue/data`), which
the server closes once no event of the page is pending. The client opens a new stream after joining
an event (`/queue/join`) only if it believes none is open. When it reads the join's answer before
the close of a stream the server had already decided to close, it keeps believing a stream is open,
then closes it: the server runs the event, and its messages wait for a stream that nobody opens
until the page sends another event. A Run clicked just as a settings check finished showed nothing
but a counting timer, its run finished on the server (Gradio 6.31: seen under load, and made
certain in tests/test_stream_keeper.py by holding a stream until its close).

The page's script here watches the same requests the client makes (it wraps `fetch`): the events
the client joined while a stream was open, and the completions that stream carried. When the client
closes that stream (it aborts the request: Gradio sets its "open" flag off at the same moment) with
an event it joined left incomplete, the script sends one queued no-op event: joining it, the client
finds no stream open and opens one, and the waiting messages arrive. An event joined while no stream
was open gets the stream the client opens for it and is never counted.
"""

from __future__ import annotations

import gradio as gr

# The no-op event's trigger; the component itself shows nothing.
KEEPER_ID = "stream-keeper"

KEEPER_JS = r"""
// the no-op event, which a nudge sends: a click anywhere on the keeper's block
const keeperBlock = element.closest('#KEEPER_ID') || element;
keeperBlock.addEventListener('click', () => trigger('click'));
if (!window.__dinferStreamKeeper) {
  window.__dinferStreamKeeper = {nudges: 0};
  const keeper = window.__dinferStreamKeeper;
  const base = window.fetch.bind(window);
  let current = null;  // the stream the client reads now: {joined: Set, completed: Set}
  const urlOf = (input) => (input instanceof Request ? input.url : String(input));
  async function readCompletions(body, stream) {
    const reader = body.getReader(), decoder = new TextDecoder();
    let text = '';
    try {
      for (;;) {
        const {done, value} = await reader.read();
        if (done) return;
        text += decoder.decode(value, {stream: true});
        const messages = text.split('\n\n');
        text = messages.pop();
        for (const message of messages) {
          for (const line of message.split('\n')) {
            if (!line.startsWith('data:')) continue;
            try {
              const data = JSON.parse(line.slice(5));
              if (data.msg === 'process_completed' && data.event_id) stream.completed.add(data.event_id);
            } catch (e) { /* not JSON: nothing of ours */ }
          }
        }
      }
    } catch (e) { /* aborted: the client closed it */ }
  }
  window.fetch = async function (input, init) {
    const url = urlOf(input);
    if (url.includes('/queue/data')) {
      const stream = {joined: new Set(), completed: new Set()};
      current = stream;
      const signal = input instanceof Request ? input.signal : init && init.signal;
      if (signal) signal.addEventListener('abort', () => {
        if (current === stream) current = null;
        const left = [...stream.joined].filter((id) => !stream.completed.has(id));
        // out of the client's own call: the no-op's join then finds its flag off
        if (left.length) setTimeout(() => { keeper.nudges += 1; keeperBlock.click(); }, 0);
      });
      const response = await base(input, init);
      if (!response.body) return response;
      const [mine, theirs] = response.body.tee();
      readCompletions(mine, stream);
      return new Response(theirs, {status: response.status, statusText: response.statusText, headers: response.headers});
    }
    const response = await base(input, init);
    // the client reads this answer only once it is returned below: a close it handles before the
    // event is counted here, it handles before the answer too, and then opens a stream itself
    if (url.includes('/queue/join') && current !== null && response.ok) {
      const stream = current;
      try { const answer = await response.clone().json(); if (answer.event_id) stream.joined.add(answer.event_id); } catch (e) { /* no event id */ }
    }
    return response;
  };
}
""".replace("KEEPER_ID", KEEPER_ID)


def add_keeper() -> None:
    """The keeper in the page being built (inside a gr.Blocks), wired to its no-op event."""
    keeper = gr.HTML("", js_on_load=KEEPER_JS, elem_id=KEEPER_ID, visible="hidden", padding=False)
    # queued (a join is what makes the client open a stream), in no concurrency group (it never
    # waits behind the engine's events), no endpoint, no spinner
    keeper.click(lambda: None, None, None, queue=True, concurrency_limit=None, api_visibility="private", show_progress="hidden")
