"""specrt.serve: an OpenAI-compatible HTTP server (FastAPI + uvicorn) on `specrt.AsyncLLM`.

    cli         `python -m specrt.serve` flags (after `vllm serve`), logging, uvicorn
    app         the routes, and an OpenAI request turned into a specrt one
    generation  one request's stream: first chunk before the status line, SSE events, cancel
    schemas     request bodies (pydantic, strict) and response bodies
    errors      which failure gets which status and OpenAI error body
    metrics     Prometheus metrics under vLLM's names, in a registry owned by the app

Requests run through specrt.api (`AsyncLLM`); the layers below are used only for their
types and limits (`SpecConfig`, `SamplingParams`, `Request`'s). Library modules log to the `specrt`
logger and never print. Importing this package imports nothing of the `serve` extra (FastAPI,
uvicorn, prometheus-client): `python -m specrt.serve --help` works without it, and the command
says which package is missing.
"""
__all__ = ["ServeConfig", "build_app"]


def __getattr__(name):
    if name in __all__:
        from specrt.serve import app

        return getattr(app, name)
    raise AttributeError(f"module 'specrt.serve' has no attribute {name!r}")
