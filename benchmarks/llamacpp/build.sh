#!/usr/bin/env bash
# Build llama.cpp for the side-by-side benchmark (`make bench-llamacpp`), once, into a cache
# folder, and convert the default model pair to bf16 GGUF with llama.cpp's own converter.
#
# Source: the vendored llama.cpp of the llama-cpp-python sdist on PyPI (pinned below), so the
# build is reproducible from PyPI alone. Every step is skipped when its output exists; delete
# the cache folder (or one of its parts) to redo it.
#
#   $SPECRT_LLAMACPP_DIR (default $SPECRT_CACHE/llamacpp, i.e. ~/.cache/specrt/llamacpp)
#     sdist/        the downloaded sdist          src/   its unpacked tree
#     build/bin/    llama-bench, llama-completion, llama-speculative-simple
#     venv/         the converter's Python (torch, numpy, sentencepiece, transformers, gguf-py)
#     gguf/         <model>-bf16.gguf for the default pair
#
# Needs cmake, a C++17 compiler and python3 (ninja if present). Run it under `nice` on a shared
# machine: it compiles with $JOBS jobs (default: nproc).
set -euo pipefail

VERSION=0.3.36
CACHE=${SPECRT_CACHE:-$HOME/.cache/specrt}
CACHE=${CACHE/#\~/$HOME}
DIR=${SPECRT_LLAMACPP_DIR:-$CACHE/llamacpp}
MODELS=$CACHE/models
PAIR=(qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct)
TARGETS=(llama-bench llama-completion llama-speculative-simple)
JOBS=${JOBS:-$(nproc)}
PYTHON=${PYTHON:-python3}

say() { echo "[bench-llamacpp] $*"; }

# The pair must be fetched before the build (~10 min), not found missing after it
for m in "${PAIR[@]}"; do
    [ -f "$DIR/gguf/$m-bf16.gguf" ] || [ -f "$MODELS/$m/config.json" ] || {
        echo "error: $MODELS/$m not found; fetch the default pair first:" \
            "python -m specrt.models fetch" >&2
        exit 2; }
done

mkdir -p "$DIR"
SRC="$DIR/src/llama_cpp_python-$VERSION/vendor/llama.cpp"

if [ ! -f "$SRC/CMakeLists.txt" ]; then
    [ -x "$DIR/venv/bin/python" ] || "$PYTHON" -m venv "$DIR/venv"
    say "downloading the llama-cpp-python==$VERSION sdist"
    "$DIR/venv/bin/pip" download --quiet --no-binary :all: --no-deps \
        "llama-cpp-python==$VERSION" -d "$DIR/sdist"
    mkdir -p "$DIR/src"
    tar xzf "$DIR/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$DIR/src"
fi

missing=0
for t in "${TARGETS[@]}"; do [ -x "$DIR/build/bin/$t" ] || missing=1; done
if [ "$missing" = 1 ]; then
    gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
    say "configuring (Release, GGML_NATIVE=ON, static, CPU only)"
    cmake -S "$SRC" -B "$DIR/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF >/dev/null
    say "building ${TARGETS[*]} with $JOBS jobs (~10 min on 2 cores)"
    cmake --build "$DIR/build" --config Release -j "$JOBS" --target "${TARGETS[@]}"
fi

if [ ! -f "$DIR/venv/.convert-stamp" ]; then
    [ -x "$DIR/venv/bin/python" ] || "$PYTHON" -m venv "$DIR/venv"
    say "installing the converter's packages into $DIR/venv"
    # torch as requirements.txt pins it (the CPU wheel here; an unpinned torch from PyPI is the
    # CUDA build, ~5 GB with its nvidia-* packages); transformers as the converter's
    # requirements pin it
    "$DIR/venv/bin/pip" install --quiet torch==2.13.0 numpy sentencepiece protobuf \
        safetensors transformers==4.57.6 "$SRC/gguf-py"
    touch "$DIR/venv/.convert-stamp"
fi

mkdir -p "$DIR/gguf"
for m in "${PAIR[@]}"; do
    out="$DIR/gguf/$m-bf16.gguf"
    [ -f "$out" ] && continue
    say "converting $m to bf16 GGUF with llama.cpp's convert_hf_to_gguf.py"
    "$DIR/venv/bin/python" "$SRC/convert_hf_to_gguf.py" --outtype bf16 --outfile "$out.part" \
        "$MODELS/$m"
    mv "$out.part" "$out"
done
say "done: binaries in $DIR/build/bin, GGUFs in $DIR/gguf"
say "next: python -m benchmarks.e2e --llamacpp --no-hf   (see --help)"
