# Quick start: `make demo` (set up, fetch the default pair, run it) and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: install build test compile-check demo bench-llamacpp clean

# The pinned requirements need Python >= 3.11: `$(PYTHON) $(PY311)` succeeds on one. $(VENV)'s
# must be too: a venv made by hand with another Python, or whose interpreter was upgraded away,
# failed deep in pip or with "No such file or directory".
PY311  := -c 'import sys; sys.exit(sys.version_info < (3, 11))'
VENV_BAD = { echo "make: $(VENV) runs $$($(PY) --version 2>/dev/null || echo 'a Python that is gone');" \
	  "the pinned requirements need Python >= 3.11: run make clean, then make again" \
	  "(with PYTHON=python3.11 or newer)"; exit 1; }
VENV_OK = $(PY) $(PY311) 2>/dev/null

$(STAMP): requirements.txt
	@$(PYTHON) $(PY311) 2>/dev/null || { \
	  echo "make: the pinned requirements need Python >= 3.11; '$(PYTHON)' is" \
	    "$$($(PYTHON) --version 2>/dev/null || echo missing): run make PYTHON=python3.11 (or newer)"; \
	  exit 1; }
	@{ test ! -e $(PY) && test ! -L $(PY); } || $(VENV_OK) || $(VENV_BAD)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

install: $(STAMP)

# The C++ extensions (specrt._ngram, specrt._gemv, specrt._cpu_ops, specrt._cpu_layers; see
# setup.py), built in place next to the sources.
build: $(STAMP)
	@$(VENV_OK) || $(VENV_BAD)
	$(PY) setup.py --quiet build_ext --inplace

# Everything, the packaging tests too (tests/test_packaging.py: build the sdist and wheels and
# install them outside the repo, ~1-2 min); a quicker local run: PYTEST_ARGS='-m "not packaging"'
test: build compile-check
	$(PY) -m pytest -q tests benchmarks/tests $(PYTEST_ARGS)

# Every Triton kernel variant the launchers can pick, compiled for sm_90 and sm_80 with the
# triton wheel's ptxas: no GPU needed, under a minute on 2 cores. Fails on a compile error, a bf16
# register spill, shared memory over a target's limit, or a missing ptxas (never skips).
compile-check: $(STAMP)
	@$(VENV_OK) || $(VENV_BAD)
	$(PY) -m specrt.kernels.compile_check

demo: build
	$(PY) -m specrt.models fetch
	$(PY) -m specrt.generate

# Optional, not part of `make test`: llama.cpp for `python -m benchmarks.e2e --llamacpp`, built
# once from the llama-cpp-python sdist's vendored sources into ~/.cache/specrt/llamacpp/
# (~10 min on 2 cores), with the default pair converted to bf16 GGUF by llama.cpp's own
# converter (its own venv there). Needs the pair fetched (`make demo` or specrt.models fetch).
bench-llamacpp:
	PYTHON=$(PYTHON) bash benchmarks/llamacpp/build.sh

clean:
	rm -rf build dist *.egg-info specrt/*.so $(VENV)
