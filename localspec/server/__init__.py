"""``localspec serve``: an OpenAI-compatible HTTP endpoint over one loaded engine.

- ``schema``: request bodies parsed and checked as pure functions (no web framework);
- ``responses``: the JSON shapes the server answers with (bodies, stream chunks, ``timings``);
- ``slot``: the one engine, one generation at a time in a worker thread, a bounded queue;
- ``metrics``: the Prometheus counters behind ``GET /metrics``;
- ``stream``: a generation as a response, whole or as server-sent events, cancelled when its client leaves;
- ``middleware``: the API-key gate and the request log;
- ``app``: the Starlette routes; ``run``: uvicorn on a bound socket, with one-line logging.

``schema``, ``responses`` and ``slot`` import no web framework; the others need the ``serve`` extra
(Starlette, uvicorn, prometheus-client). The engine imports none of this package.
"""
