"""Loading one of the optional C++ CPU extensions: the module and whether it serves here.

A missing build is reported once through logging (`specrt.logs.extension_missing`) and the
callers fall back to PyTorch; `ENV_VAR=0` (or false, off, no) turns a built extension off
(for comparisons)."""
from __future__ import annotations

import importlib
import os

# The kernels' level: "avx2" forces the AVX2 kernels on an AVX-512 CPU (tests, comparisons).
# Each extension reads it once, when it loads (csrc/cpu/cpu_features.h); they load at different
# times (the layer loop only when a CPU backend is chosen), so the value they read is kept here
# and a change after that is refused where a model is loaded (specrt.model.backends): two
# extensions at two levels would read each other's int8 weight layout.
CPU_LEVEL_VAR = "SPECRT_CPU_LEVEL"
CPU_LEVELS = ("avx2",)      # the values the extensions act on; unset: the best this CPU has
CPU_LEVEL_READ = os.environ.get(CPU_LEVEL_VAR)


OFF = ("0", "false", "off", "no")
ON = ("", "1", "true", "on", "yes")


def switched_off(env_var: str) -> bool:
    """Whether an on/off switch in the environment (unset: on) says off: 0, false, off or no,
    any case, spaces around ignored. Another value leaves it on, with a warning naming it."""
    value = os.environ.get(env_var, "").strip().lower()
    if value not in OFF + ON:
        import logging

        logging.getLogger("specrt").warning(
            "%s=%r is not a switch value: left on; set 0 (or false, off, no) to turn it off",
            env_var, os.environ[env_var])
    return value in OFF


def load(module: str, env_var: str, what: str, fallback: str):
    """(the extension module or None, available): built, this CPU runs it, not turned off."""
    try:
        ext = importlib.import_module(module)
    except ImportError as exc:
        from specrt.logs import extension_missing

        extension_missing(module, what, fallback, exc)
        return None, False
    return ext, bool(ext.cpu_supported()) and not switched_off(env_var)
