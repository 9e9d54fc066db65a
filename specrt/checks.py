"""Argument checks shared by every entry point (LLM, generate, the CLIs, the server): an int, a
number or a bool in range, or an ArgumentError naming the argument, the value and the fix."""
from __future__ import annotations

import math
import numbers

from specrt.errors import ArgumentError


def show(value, limit: int = 60) -> str:
    """repr(value), shortened: a 10**5-digit int or a megabyte string must not flood a message
    (and repr of an int over 4300 digits raises)."""
    try:
        text = repr(value)
    except Exception:                      # noqa: BLE001 - any repr failure: describe the type
        return f"<a {type(value).__name__} too large to print>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_int(name: str, value, lo: int, hi: int | None = None, fix: str = "") -> int:
    """An integer (bool is not one; numpy's are) in lo..hi -> int, else ArgumentError naming
    `name`, the value, the fix."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < lo \
            or (hi is not None and value > hi):
        rng = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ArgumentError(f"{name} must be an integer {rng}, got {show(value)}"
                            + (f"; {fix}" if fix else ""))
    return int(value)


def check_number(name: str, value, lo: float, hi: float = math.inf, lo_open: bool = False,
                 fix: str = "") -> float:
    """A finite real number (not bool, not str; numpy's are) in [lo, hi] ((lo, hi] if lo_open)
    -> float."""
    x = math.nan
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            x = float(value)
        except OverflowError:              # an int too large for a float
            pass
    if not (math.isfinite(x) and (x > lo if lo_open else x >= lo) and x <= hi):
        rng = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]" if math.isfinite(hi) \
            else f"{'>' if lo_open else '>='} {lo:g}"
        raise ArgumentError(f"{name} must be a finite number {rng}, got {show(value)}"
                            + (f"; {fix}" if fix else ""))
    return x


def check_bool(name: str, value, allow_none: bool = False) -> bool | None:
    """True or False (or None where None means "choose for me"), never a truthy stand-in."""
    if isinstance(value, bool) or (allow_none and value is None):
        return value
    raise ArgumentError(f"{name} must be True or False{' or None' if allow_none else ''}, "
                        f"got {show(value)}")


DEVICE_TYPES = ("cpu", "cuda")      # the devices a model runs on


def check_device(device):
    """'cpu', 'cuda', 'cuda:N' or a torch.device -> torch.device. None picks CUDA when it is
    available, else the CPU (what the CLIs do with no --device)."""
    import torch      # here: importing specrt.checks stays cheap

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise ArgumentError(f"device must be 'cpu', 'cuda' or 'cuda:N' (or None: CUDA if "
                            f"available), got {show(device)}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):    # torch's text lists ~20 device types
        raise ArgumentError(f"device {show(device)} is not a device name; use 'cpu', 'cuda' "
                            "or 'cuda:N'") from None
    if dev.type not in DEVICE_TYPES:
        raise ArgumentError(f"device {show(device)} is not supported; use 'cpu' or 'cuda'")
    if dev.type == "cpu":
        if dev.index not in (None, 0):      # torch takes 'cpu:5' and runs on the one CPU
            raise ArgumentError(f"device {show(device)}: the CPU is one device and has no "
                                "index; use 'cpu'")
        return torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(f"device {show(device)} requested but CUDA is not available; "
                                "use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ArgumentError(f"device {show(device)}: this machine has "
                                f"{torch.cuda.device_count()} CUDA device(s)")
    return dev
