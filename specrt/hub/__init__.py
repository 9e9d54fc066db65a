"""Models by name: the registry of known models, where files live, fetching and GGUF
conversion, and resolving what a user asked for into a model directory. Nothing here runs a
model."""
from specrt.hub.paths import cache_dir, gguf_path, is_present, model_dir
from specrt.hub.registry import DEFAULT_DRAFT, DEFAULT_TARGET, KNOWN_MODELS, ModelSpec
from specrt.hub.resolve import resolve_model_dir, resolve_pair

__all__ = ["DEFAULT_DRAFT", "DEFAULT_TARGET", "KNOWN_MODELS", "ModelSpec", "cache_dir",
           "gguf_path", "is_present", "model_dir", "resolve_model_dir", "resolve_pair"]
