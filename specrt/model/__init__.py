"""The model layer: checkpoint config and loading, the transformer and its per-device
backends, the static KV cache, and static-buffer (CUDA-graph) runners. It knows token ids and
tensors only: nothing about drafting, sampling or text."""
from specrt.model.config import ModelConfig
from specrt.model.kv_cache import StaticKVCache
from specrt.model.transformer import Transformer

__all__ = ["ModelConfig", "StaticKVCache", "Transformer"]
