"""specrt.serve: an OpenAI-compatible HTTP server (FastAPI + uvicorn) on `specrt.AsyncLLM`.

    cli         `python -m specrt.serve` flags (after `vllm serve`), logging, uvicorn
    app         the routes, and an OpenAI request turned into a specrt one
    generation  one request's stream: first chunk before the status line, SSE events, cancel
    schemas     request bodies (pydantic, strict) and response bodies
    errors      which failure gets which status and OpenAI error body
    metrics     Prometheus metrics under vLLM's names, in a registry owned by the app

Built on specrt.api only, never on the engine below it. Library modules log to the `specrt`
logger and never print.
"""
from specrt.serve.app import ServeConfig, build_app

__all__ = ["ServeConfig", "build_app"]
