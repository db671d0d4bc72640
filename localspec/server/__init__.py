"""``localspec serve``: an OpenAI-compatible HTTP endpoint over one loaded engine.

- ``schema``: request bodies parsed and checked as pure functions (no web framework);
- ``responses``: the JSON shapes the server answers with (bodies, stream chunks, ``timings``);
- ``slot``: the one engine, one generation at a time in a worker thread, a bounded queue;
- ``metrics``: the Prometheus counters behind ``GET /metrics``;
- ``app``: the Starlette routes, the API-key gate and the event stream.

Only ``app`` and ``metrics`` import the ``serve`` extra (Starlette, uvicorn, prometheus-client);
the engine imports none of this package.
"""
