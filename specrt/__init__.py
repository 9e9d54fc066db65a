"""specrt: a speculative-decoding runtime for Qwen2-family language models."""
from specrt.errors import SpecrtError

__all__ = ["LLM", "AsyncLLM", "SpecrtError", "GenerationResult", "StreamChunk"]
__version__ = "0.1.0"


def __getattr__(name):
    # Lazy so that `import specrt` (e.g. for the models CLI) does not pay for torch start-up
    # of the whole runtime until LLM is actually used.
    if name in ("LLM", "GenerationResult", "StreamChunk"):
        from specrt.api import llm

        return getattr(llm, name)
    if name == "AsyncLLM":
        from specrt.api.async_llm import AsyncLLM

        return AsyncLLM
    raise AttributeError(f"module 'specrt' has no attribute {name!r}")
