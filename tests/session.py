"""Test-wide setup and the tiny-model fixtures, for tests/ and benchmarks/tests/: each
conftest.py star-imports this module. Its setup runs once per session (one module); each
directory registers the fixtures anew, so a run of both builds its tiny models twice.

Triton reads TRITON_INTERPRET when a kernel module is first imported, so it must be set
here, before any test imports specrt.kernels. Without CUDA the interpreter runs the kernels
on the CPU (correct in fp32/fp16; its bf16 arithmetic is wrong, so bf16 is GPU-only).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from tests import interpreter_dot

    interpreter_dot.install()      # tl.dot in one fixed order, as an MMA (see the module)

torch.set_num_threads(min(2, os.cpu_count() or 1))

# Calibrations of throw-away tiny models must not pile up in the user's SPECRT_CACHE.
from tests.helpers import SCRATCH  # noqa: E402

os.environ["SPECRT_CALIBRATION"] = str(SCRATCH / "calibration.json")

import pytest  # noqa: E402

from specrt.spec import calibration  # noqa: E402

# A calibration here may run beside other tests' threads; tests that count its forwards or its
# saved entries need it taken once. The check itself is tested in tests/test_adaptive.py.
calibration.check_busy = False

from tests.tiny import make_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """Qwen2-style (q/k/v bias, untied head) with tokenizer, chat template and EOS."""
    return make_model(tmp_path_factory.mktemp("tiny_qwen2"), "qwen2", seed=0)


@pytest.fixture(scope="session")
def tiny_noeos_dir(tmp_path_factory):
    """Like tiny_dir but with no EOS, so generations always run to max_new_tokens."""
    return make_model(tmp_path_factory.mktemp("tiny_qwen2_noeos"), "qwen2", seed=0, eos=False)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """Llama-style: no attention bias, tied embeddings."""
    return make_model(tmp_path_factory.mktemp("tiny_llama"), "llama", seed=1, eos=False)


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory, tiny_noeos_dir):
    """A draft that agrees with tiny_noeos_dir most of the time: its weights plus noise."""
    return make_model(tmp_path_factory.mktemp("tiny_draft"), "qwen2", seed=7, eos=False,
                      noise_from=tiny_noeos_dir, noise=0.05)


@pytest.fixture(scope="session")
def tiny128_dir(tmp_path_factory):
    """Like tiny_noeos_dir with hidden size 128: every projection's input a multiple of 128, as
    int4 weights need."""
    return make_model(tmp_path_factory.mktemp("tiny128"), "qwen2", seed=3, eos=False, hidden=128)


@pytest.fixture(scope="session")
def tiny128_draft_dir(tmp_path_factory, tiny128_dir):
    """A draft for tiny128_dir: its weights plus noise."""
    return make_model(tmp_path_factory.mktemp("tiny128_draft"), "qwen2", seed=8, eos=False,
                      hidden=128, noise_from=tiny128_dir, noise=0.05)


@pytest.fixture(scope="session")
def tiny_bad_draft_dir(tmp_path_factory):
    """A draft that shares the vocabulary but is otherwise unrelated (low acceptance)."""
    return make_model(tmp_path_factory.mktemp("tiny_bad_draft"), "qwen2", seed=99, eos=False,
                      hidden=32, layers=1)


@pytest.fixture(scope="session")
def model_dirs():
    """name -> the default pair's converted directory in SPECRT_CACHE (fetched on first use:
    about 2 minutes and 6.5 GB on a fresh machine, then reused by every later run)."""
    from specrt import models

    return {name: models.ensure_model(name, progress=False)
            for name in (models.DEFAULT_TARGET, models.DEFAULT_DRAFT)}
