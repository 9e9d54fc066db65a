"""Every benchmark honours the common flags it accepts: a `--dtype`, `--device`, `--out` or
`--no-progress` that a benchmark takes and never reads would run something other than what the
user asked for, silently. Read from the source, so a new benchmark or flag is checked too."""
import argparse
import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import benchmarks

COMMON = ("dtype", "device", "out", "no_progress", "threads", "model", "draft")
# harness functions that read flags off the `args` they are handed
READERS = {"out_dir": {"out"}, "resolve_models": {"model", "draft"},
           "resolve_with_draft": {"model", "draft"}}


def benchmark_modules() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(benchmarks.__path__) if not m.ispkg]
    return [n for n in names
            if "def build_parser" in Path(benchmarks.__path__[0], f"{n}.py").read_text()]


def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and each of its subcommands' parsers."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [parser] if not subs else [p for a in subs for p in a.choices.values()]


def _module(name: str) -> bool:
    return Path(benchmarks.__path__[0], f"{name}.py").is_file()


def flags_read(name: str) -> set[str]:
    """The `args.X` a benchmark module reads, with those of the sibling modules whose functions
    it hands `args` to, and the flags of the harness READERS it hands `args` to."""
    seen, todo, read = set(), [name], set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        tree = ast.parse(Path(benchmarks.__path__[0], f"{mod}.py").read_text())
        siblings = {}      # a name bound here -> the sibling module it comes from
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module \
                    and node.module.split(".")[0] == "benchmarks":
                parts = node.module.split(".")
                for a in node.names:
                    if len(parts) == 1 and _module(a.name):       # from benchmarks import X
                        siblings[a.asname or a.name] = a.name
                    elif len(parts) == 2 and _module(parts[1]):   # from benchmarks.X import f
                        siblings[a.asname or a.name] = parts[1]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "args":
                read.add(node.attr)
            elif isinstance(node, ast.Call) and any(
                    isinstance(a, ast.Name) and a.id == "args"
                    for a in [*node.args, *(k.value for k in node.keywords)]):
                fn = node.func
                owner = fn.value.id if isinstance(fn, ast.Attribute) and isinstance(
                    fn.value, ast.Name) else getattr(fn, "id", None)
                called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
                if owner in siblings:
                    todo.append(siblings[owner])
                read |= READERS.get(called, set())
    return read


def test_the_benchmarks_are_found():
    assert {"e2e", "layer_loop", "decode", "serve", "calibration_points"} <= set(
        benchmark_modules())


@pytest.mark.parametrize("name", benchmark_modules())
def test_each_common_flag_a_benchmark_accepts_is_read(name):
    module = importlib.import_module(f"benchmarks.{name}")
    accepted = {a.dest for p in parsers(module.build_parser()) for a in p._actions}
    unread = sorted((accepted & set(COMMON)) - flags_read(name))
    assert not unread, (f"benchmarks.{name} accepts --{', --'.join(unread)} but never reads "
                        "it: drop it (cli.add_common_args(..., dtype=False, ...)) or honour it")


def test_the_check_sees_a_flag_that_is_not_read():
    # the scan itself: layer_loop runs bf16 on the CPU only, and reads neither flag
    assert not {"dtype", "device"} & flags_read("layer_loop")
    assert {"rounds", "threads", "no_progress", "model", "draft"} <= flags_read("layer_loop")


def test_a_benchmark_without_the_flag_refuses_it(capsys):
    from benchmarks import layer_loop

    with pytest.raises(SystemExit) as e:
        layer_loop.build_parser().parse_args(["--dtype", "float32"])
    assert e.value.code == 2
    assert "--dtype" in capsys.readouterr().err
