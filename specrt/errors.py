"""The one exception type users of specrt catch.

Every bad-input path (missing files, bad config, incompatible draft, cache too small, invalid
K, ...) raises SpecrtError with a message that names the problem and the fix. Subclasses
exist only where a caller may want to tell cases apart (one per family of bad input). The
argument checks live in `specrt.checks`, the command lines' exit policy in `specrt.commands`.
"""


class SpecrtError(Exception):
    """A problem with the user's input or environment, explained in the message."""


class ConfigError(SpecrtError, ValueError):
    """config.json or a speculative/sampling configuration is invalid or unsupported."""


class CheckpointError(SpecrtError):
    """Model files are missing, corrupt, or do not match the config."""


class CapacityError(SpecrtError, ValueError):
    """A request does not fit in the preallocated KV cache."""


class TextTooLongError(CapacityError):
    """Text with more characters than max_seq_len tokens can hold: refused before it is
    tokenized. `describe(limit)` words it for the setting a caller raises (the server's flag)."""

    def __init__(self, what: str, chars: int, most: int, max_seq_len: int):
        self.what, self.chars, self.most, self.max_seq_len = what, chars, most, max_seq_len
        super().__init__(self.describe("max_seq_len"))

    def describe(self, limit: str) -> str:
        return (f"{self.what} is {self.chars:,} characters, more than {limit} "
                f"({self.max_seq_len}) tokens can hold (at most {self.most:,} with this "
                f"tokenizer); shorten it or raise {limit}")


class ModelFetchError(SpecrtError):
    """Fetching or converting a model failed; the message says what to do."""


class QueueFullError(SpecrtError):
    """Every slot is busy and the waiting queue is full; retry later (HTTP 503)."""


class ClosedError(SpecrtError):
    """The LLM was closed (a server shutting down: HTTP 503); create a new one."""


# --- bad model files, one family each (issue 18) -------------------------------------------
class ConfigValueError(ConfigError):
    """A config.json / generation_config.json field has the wrong type or an impossible value."""


class IndexFileError(CheckpointError):
    """model.safetensors.index.json is malformed or names a file outside the model directory."""


class NotRegularFileError(CheckpointError, ConfigError):
    """A model file is a FIFO, device or directory; reading it could block forever."""


class WeightsSizeError(CheckpointError):
    """The config implies more (or fewer) parameters than the weight files can hold."""


class MemoryCapacityError(CapacityError):
    """A KV cache would not fit in the memory this machine has available."""


class TokenizerFileError(CheckpointError):
    """tokenizer.json, tokenizer_config.json or the chat template is malformed."""


class ChecksumError(CheckpointError):
    """Converted weights changed since conversion (their sha256 no longer matches)."""


class ArgumentError(ConfigError):
    """A public argument (of `LLM`, `generate`/`stream`/`submit`, a CLI flag, the speculative
    config) has the wrong type or is out of range; the message names it, the value and the fix."""


class CachePathError(SpecrtError):
    """A cache or state path (`SPECRT_CACHE`, `SPECRT_CALIBRATION`) cannot be used."""


class UnsupportedGGUF(SpecrtError, ValueError):
    """The GGUF file is not a Qwen2 / Llama model this converter understands."""
