"""The one exception type users of specrt catch.

Every bad-input path (missing files, bad config, incompatible draft, cache too small, invalid
K, ...) raises SpecrtError with a message that names the problem and the fix. Subclasses
exist only where a caller may want to tell cases apart.
"""


class SpecrtError(Exception):
    """A problem with the user's input or environment, explained in the message."""


class ConfigError(SpecrtError, ValueError):
    """config.json or a speculative/sampling configuration is invalid or unsupported."""


class CheckpointError(SpecrtError):
    """Model files are missing, corrupt, or do not match the config."""


class CapacityError(SpecrtError, ValueError):
    """A request does not fit in the preallocated KV cache."""


class ModelFetchError(SpecrtError):
    """Fetching or converting a model failed; the message says what to do."""


class QueueFullError(SpecrtError):
    """Every slot is busy and the waiting queue is full; retry later (HTTP 503)."""
