"""An OpenAI-compatible HTTP server for Orion models (the ``serve`` extra: Starlette, uvicorn, sse-starlette).

``create_app(engine)`` builds the ASGI application over any :class:`~orion.serve.engine.Engine`;
:class:`~orion.serve.gpt2.GPT2Engine` adapts Orion's GPT-2; ``orion.serve.cli.main(argv)`` is
``python -m orion serve``.
"""
