"""An OpenAI-compatible HTTP server for Orion models (the ``serve`` extra: Starlette, uvicorn, sse-starlette).

``python -m orion serve --model DIR [--host 127.0.0.1] [--port 8000]`` loads and compiles the model once,
then prints ``ready: ...`` on stderr. It listens on loopback unless another address is given (and warns
then). Endpoints:

- ``POST /v1/completions`` (``prompt``: a string or token ids) and ``POST /v1/chat/completions``
  (``messages``), both streamed as server-sent events ending in ``data: [DONE]`` with ``stream: true``
  (``stream_options.include_usage`` adds a last chunk with the token counts);
- ``GET /v1/models``, ``GET /v1/models/{id}``, and ``GET /health`` (queue and counters);
- ``POST /tokenize`` and ``POST /detokenize`` in llama-server's and vLLM's shapes (:mod:`orion.serve.tokenize`);
- ``GET /metrics`` in Prometheus' text format: requests, tokens, queue, time to first token, tok/s
  (:mod:`orion.serve.metrics`).

Parameters: ``max_tokens`` (``max_completion_tokens``), ``temperature``, ``top_p``, ``top_k``, ``min_p``,
``seed``, ``stop`` (a string or a list), ``repetition_penalty``, ``frequency_penalty``,
``presence_penalty``, ``logit_bias``, ``n`` (up to ``--max-sequences``), ``logprobs`` (completions: the
number of alternatives; chat: a boolean with ``top_logprobs``), ``user``; for chat also ``response_format`` (``json_object``,
``json_schema``: decoding held to the schema by llguidance, :mod:`orion.generation.structured`) and ``tools``
with ``tool_choice`` (rendered by the model's chat template, calls parsed from the reply into ``tool_calls``,
streamed too; ``"required"`` or a named function constrains decoding to a call: :mod:`orion.serve.tools`). A ``max_tokens`` past the context is cut to what fits and the
answer then ends with ``finish_reason: "length"``; the end-of-text token or a stop string ends it with
``"stop"``. Every other field is refused with a 400 that names it. Errors have OpenAI's shape
``{"error": {"message", "type", "param", "code"}}``: 400 bad JSON or values, 404 unknown model, 408 a body
slower than ``--body-timeout``, 413 a body over ``--max-body-bytes``, 503 with ``Retry-After`` when
``--max-queue`` requests already wait, 500 when generation itself fails (that request only).

One worker thread owns the device: it admits requests in arrival order and steps up to
``--max-sequences`` sequences, each a lane of the decode programs, so that one decode step advances them
all (new prompts are read one prefill chunk per step in between, oldest first, or several in one pass; ``--scheduler turns``
steps each sequence alone instead, the baseline of ``benchmarks/bench_serve.py``); ``n`` choices are forked lanes of one
prompt; a client that disconnects stops its generation before the next token. ``logprobs`` and
``top_logprobs`` come in OpenAI's completions and chat shapes, and ``usage`` also gives each request's
time to first token and tok/s (logged too).

In code: ``create_app(engine)`` builds the ASGI application over any :class:`~orion.serve.engine.Engine`;
:class:`~orion.serve.model_engine.ModelEngine` adapts Orion's GPT-2; ``orion.serve.cli.main(argv)`` is the command.
"""
