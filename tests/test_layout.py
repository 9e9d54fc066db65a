"""Rules of the tree, checked from the source: tests/ (the package's suite, shipped in the
sdist) never imports benchmarks/, whose own tests live in benchmarks/tests/; the kernels check
their inputs with ValueError, never `assert`, which `python -O` removes."""
import ast
from pathlib import Path

from tests.helpers import imports_benchmarks

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_check_reads_imports_not_text():
    assert imports_benchmarks("x = 1\nfrom benchmarks.harness import cli\n")
    assert imports_benchmarks("import os, benchmarks.e2e\n")
    assert imports_benchmarks("def f():\n    from benchmarks import e2e\n")
    assert not imports_benchmarks("# from benchmarks import e2e\ns = 'import benchmarks'\n")


def test_tests_never_import_benchmarks():
    offenders = [p.name for p in (ROOT / "tests").glob("*.py")
                 if imports_benchmarks(p.read_text())]
    assert not offenders, f"{offenders} import benchmarks/: move them to benchmarks/tests/"


def asserts_outside_kernels(source: str) -> list[int]:
    """Lines of the `assert`s in functions that are not @triton.jit kernels (a kernel's
    assert is a device assert, not an input check)."""
    lines = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and not any(
                "jit" in ast.unparse(d) for d in fn.decorator_list):
            lines += [a.lineno for a in ast.walk(fn) if isinstance(a, ast.Assert)]
    return sorted(set(lines))


def test_the_assert_check_skips_kernels_only():
    source = ("@triton.jit\ndef k(x):\n    assert x\n\n"
              "def launch(x):\n    assert x.dim() == 2, 'x must be 2-d'\n")
    assert asserts_outside_kernels(source) == [6]


def test_kernel_launchers_and_the_reference_check_inputs_without_assert():
    files = sorted((ROOT / "specrt" / "kernels" / "triton").glob("*.py"))
    files.append(ROOT / "specrt" / "kernels" / "reference.py")
    found = {f.name: asserts_outside_kernels(f.read_text()) for f in files}
    assert not {k: v for k, v in found.items() if v}, (
        "use specrt.kernels.checks.require (a ValueError that python -O keeps)")
