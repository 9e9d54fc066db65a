"""`python -m specrt.models`: kept as the entry point and import path it has always been; the
code lives in `specrt.hub`. Run as a command, a Ctrl-C at any moment, these imports of torch
included, ends it with `interrupted` and exit status 130 (specrt.commands)."""
import sys

from specrt.commands import exits_on_ctrl_c

with exits_on_ctrl_c(__name__):
    if __name__ == "__main__":
        from specrt.commands import import_torch

        import_torch()      # these imports bring torch in (specrt.commands.import_torch)
    from specrt.errors import ModelFetchError
    from specrt.hub.cli import main
    from specrt.hub.fetch import cached_models, ensure_gguf, ensure_model, fetch, verify_file
    from specrt.hub.gguf_convert import convert_gguf
    from specrt.hub.paths import cache_dir, gguf_path, is_present, model_dir
    from specrt.hub.registry import DEFAULT_DRAFT, DEFAULT_TARGET, KNOWN_MODELS, ModelSpec

__all__ = ["KNOWN_MODELS", "DEFAULT_TARGET", "DEFAULT_DRAFT", "ModelSpec", "ModelFetchError",
           "cache_dir", "model_dir", "gguf_path", "is_present", "verify_file", "ensure_gguf",
           "ensure_model", "fetch", "cached_models", "convert_gguf", "main"]

if __name__ == "__main__":
    sys.exit(main())
