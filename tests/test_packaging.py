"""specrt as users install it: the sdist and wheels built by pip, installed outside the repo.

How (and why this way): a fresh virtual environment per run would have to download torch
(~200 MB) every time, so instead each wheel is installed with `pip install --no-deps --target
<dir>` and run by this interpreter with PYTHONPATH=<dir> from a directory outside the repo:
torch, transformers, ... come from the test environment, specrt only from the installed wheel
(each run checks specrt.__file__). Declared dependencies are read from the wheel's METADATA.
Builds use `--no-build-isolation --no-index` (the build requirements are in requirements.txt),
so nothing is downloaded.

Built once per module, in parallel: the sdist (PEP 517 `build_sdist`, as `python -m build`
calls it), a wheel built by pip from that sdist (compiles the C++, ~30 s on 2 cores), and a
wheel built from a checkout with the compiler hidden (CC=CXX=/bin/false): a pure-Python package.
Skip with `-m "not packaging"`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

import specrt
from tests.helpers import imports_benchmarks

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[1]
EXTENSIONS = ("_ngram", "_gemv", "_cpu_ops", "_cpu_layers")
SCRIPTS = {"specrt": "specrt.api.cli:main", "specrt-models": "specrt.hub.cli:main",
           "specrt-serve": "specrt.serve.cli:main"}
# Third-party modules specrt imports only where an extra is installed -> (the extra, the
# distribution in it that brings the module). Every other module its sources import (lazily
# too) must be a hard dependency: psutil, imported on every model load, was only in the test
# extra, so a plain `pip install` could not load a model.
EXTRA_ONLY = {"triton": ("cuda", "triton"), "fastapi": ("serve", "fastapi"),
              "uvicorn": ("serve", "uvicorn"), "prometheus_client": ("serve", "prometheus-client"),
              "pydantic": ("serve", "fastapi"), "starlette": ("serve", "fastapi")}
NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.so", "*.egg-info",
                                    "__pycache__", ".pytest_cache", "benchmarks", ".whl", ".gl")


def _pip(*args, env=None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)


def _finish(proc: subprocess.Popen, what: str) -> str:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"{what} failed:\n{out[-4000:]}"
    return out


def _wheel(dirname: Path) -> Path:
    (wheel,) = dirname.glob("specrt-*.whl")
    return wheel


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "checkout"
    shutil.copytree(ROOT, src, ignore=NOT_COPIED)
    subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                    "print(build_meta.build_sdist(sys.argv[1]))", str(tmp / "sdist")],
                   cwd=src, check=True, capture_output=True)
    (sdist,) = (tmp / "sdist").glob("specrt-*.tar.gz")
    build = ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "--no-cache-dir", "-w"]
    no_cc = dict(os.environ, CC="/bin/false", CXX="/bin/false")
    compiled = _pip(*build, str(tmp / "w_compiled"), str(sdist))
    pure = _pip(*build, str(tmp / "w_pure"), "-v", str(src), env=no_cc)
    pure_log = _finish(pure, "wheel build without a compiler")
    _finish(compiled, "wheel build from the sdist")
    d = SimpleNamespace(tmp=tmp, sdist=sdist, pure_log=pure_log,
                        compiled=_wheel(tmp / "w_compiled"), pure=_wheel(tmp / "w_pure"))
    for kind in ("compiled", "pure"):
        site = tmp / f"site_{kind}"
        _finish(_pip("install", "--no-deps", "--no-index", "--target", str(site),
                     str(getattr(d, kind))), f"installing the {kind} wheel")
        setattr(d, f"site_{kind}", site)
    return d


def _start_installed(site: Path, code: str, *args, cwd: Path) -> subprocess.Popen:
    """`code` in a fresh interpreter that sees specrt only from `site`."""
    env = dict(os.environ, PYTHONPATH=str(site), HF_HUB_OFFLINE="1")
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_installed(site: Path, code: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    proc = _start_installed(site, code, *args, cwd=cwd)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _metadata(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        (path,) = [n for n in z.namelist() if n.endswith(f".dist-info/{name}")]
        return z.read(path).decode()


def test_sdist_has_what_the_build_needs(dists):
    with tarfile.open(dists.sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for f in ("LICENSE", "README.md", "pyproject.toml", "setup.py", "csrc/build_id.h",
              "csrc/ngram/ngram.h", "csrc/cpu/cpu_features.h", "csrc/cpu/gemv.h",
              "csrc/cpu/ops.h", "csrc/cpu/ops.cpp", "specrt/__init__.py",
              "requirements.txt"):                  # the shipped tests read the lock file
        assert f in names, f"{f} missing from the sdist"
    assert not any(n.endswith(".so") for n in names)
    with tarfile.open(dists.sdist) as tar:      # the shipped tests run without benchmarks/
        tests = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()
                 if re.search(r"/tests/[^/]+\.py$", m.name)}
    assert any(n.endswith("/tests/test_packaging.py") for n in tests), sorted(tests)[:5]
    assert not [n for n, text in tests.items() if imports_benchmarks(text)]


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    name = re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_modules() -> set[str]:
    """The top-level third-party modules specrt's sources import, anywhere (lazily too)."""
    import ast

    found = set()
    for path in (ROOT / "specrt").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"specrt"}


def runtime_deps() -> set[str]:
    """The distributions every install needs: those bringing the modules specrt imports,
    less the extras' (EXTRA_ONLY)."""
    from importlib.metadata import packages_distributions

    brings = packages_distributions()
    return {_name(brings[m][0]) for m in imported_modules() - EXTRA_ONLY.keys()}


def test_every_imported_package_is_declared():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    hard = {_name(r) for r in project["dependencies"]}
    assert runtime_deps() <= hard, f"imported, not declared: {sorted(runtime_deps() - hard)}"
    assert {"torch", "psutil", "gguf"} <= runtime_deps()        # the scan finds them
    extras = project["optional-dependencies"]
    for module, (extra, dist) in EXTRA_ONLY.items():
        assert dist in {_name(r) for r in extras[extra]}, (module, extra)


def test_every_declared_dependency_is_pinned_in_the_lock_file():
    """requirements.txt is what CI installs: a dependency pyproject declares (or an extra of
    it) that the lock file does not pin arrives at whatever version the day's resolver picks,
    and one it pins that nothing declares is an undeclared dependency."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        declared |= {_name(r) for r in extra if _name(r) != "specrt"}
    pinned = {_name(line) for line in (ROOT / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    build = {"pybind11", "setuptools"}          # build-system requirements, pinned for builds
    assert declared <= pinned, f"declared, not pinned: {sorted(declared - pinned)}"
    assert pinned - build <= declared, f"pinned, not declared: {sorted(pinned - build - declared)}"


def test_wheel_metadata(dists):
    meta = _metadata(dists.pure, "METADATA")
    fields = [line.split(": ", 1) for line in meta.splitlines() if ": " in line]
    assert ["Version", specrt.__version__] in fields
    assert ["License-Expression", "Apache-2.0"] in fields
    requires = [v for k, v in fields if k == "Requires-Dist"]
    hard = {r.split(";")[0] for r in requires if "extra ==" not in r}
    names = {r.split(">")[0].split("<")[0].split("=")[0].strip().lower().replace("_", "-")
             for r in hard}
    assert runtime_deps() <= names, f"undeclared: {runtime_deps() - names}"
    assert "triton" not in names
    assert any(r.startswith("triton") and 'extra == "cuda"' in r for r in requires)
    entry_points = _metadata(dists.pure, "entry_points.txt")
    for script, target in SCRIPTS.items():
        assert f"{script} = {target}" in entry_points


def test_extensions_are_optional(dists):
    with zipfile.ZipFile(dists.compiled) as z:
        compiled = {Path(n).name.split(".")[0] for n in z.namelist() if n.endswith(".so")}
    with zipfile.ZipFile(dists.pure) as z:
        pure = [n for n in z.namelist() if n.endswith(".so")]
    assert compiled == set(EXTENSIONS)
    assert pure == []
    assert "specrt: specrt._ngram not built" in dists.pure_log


def test_installed_package_and_console_scripts(dists, tmp_path):
    code = ("import json, specrt; from importlib.metadata import version; "
            "print(json.dumps([specrt.__file__, specrt.__version__, version('specrt')]))")
    run = _run_installed(dists.site_compiled, code, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    file, version, dist_version = json.loads(run.stdout)
    assert Path(file).is_relative_to(dists.site_compiled)
    assert version == dist_version == specrt.__version__
    for script in SCRIPTS:
        exe = dists.site_compiled / "bin" / script
        env = dict(os.environ, PYTHONPATH=str(dists.site_compiled))
        run = subprocess.run([str(exe), "--help"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, f"{script} --help: {run.stderr}"
        assert run.stdout.startswith(f"usage: {script} ")      # not `python -m ...`


GENERATE = """
import json, sys
if sys.argv[2] == "no-triton":
    sys.modules["triton"] = None        # `import triton` now raises ImportError
import specrt
from specrt.logs import configure_logging
configure_logging("INFO")
llm = specrt.LLM(model=sys.argv[1], dtype="float32")
res = llm.generate([5, 17, 42, 5, 17], max_new_tokens=24, temperature=0.0, chat=False,
                   speculative={"method": "ngram", "num_speculative_tokens": 4})
from specrt.kernels.cpu import gemv, ops
from specrt.spec.drafters import ngram_index
print(json.dumps({"file": specrt.__file__, "tokens": res.token_ids, "ngram": ngram_index.BACKEND,
                  "gemv": gemv.AVAILABLE, "ops": ops.AVAILABLE,
                  "triton": "triton" in sys.modules and sys.modules["triton"] is not None}))
"""


def test_same_tokens_without_extensions_or_triton(dists, tiny_noeos_dir, tmp_path):
    cases = {"compiled": (dists.site_compiled, "all"), "pure": (dists.site_pure, "all"),
             "no_triton": (dists.site_pure, "no-triton")}
    procs = {name: _start_installed(site, GENERATE, tiny_noeos_dir, mode, cwd=tmp_path)
             for name, (site, mode) in cases.items()}     # concurrently: ~6 s each
    runs = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name}: {err[-3000:]}"
        runs[name] = (json.loads(out.splitlines()[-1]), err)
        assert Path(runs[name][0]["file"]).is_relative_to(cases[name][0])
    compiled, pure, no_triton = (runs[k][0] for k in ("compiled", "pure", "no_triton"))
    assert compiled["ngram"] == "cpp" and pure["ngram"] == "python"
    assert not (pure["gemv"] or pure["ops"])
    assert not no_triton["triton"]
    assert len(compiled["tokens"]) == 24
    assert pure["tokens"] == compiled["tokens"] == no_triton["tokens"]
    # Each missing extension is one log line, not a Python warning.
    stderr = runs["pure"][1]
    assert stderr.count("specrt._ngram (the C++ n-gram matcher) is not available") == 1
    assert "Warning" not in stderr
    # ... and says how an installed package gets them (build_ext --inplace meant nothing there)
    assert "--force-reinstall" in stderr and "build_ext" not in stderr
