"""llama.cpp side by side with specrt (`python -m benchmarks.e2e --llamacpp`).

llama.cpp is built once by `make bench-llamacpp` (benchmarks/llamacpp/build.sh) into a cache
folder; this package finds that build (install.py), builds its command lines (commands.py),
runs them with timeouts (run.py) and reads llama.cpp's own timing lines (parse.py).

It knows nothing of specrt: it takes an already formatted prompt (the chat template applied
in Python, so both systems see the same tokens) and returns what llama.cpp generated and how
long its decode phase took. llama.cpp stays optional: nothing under tests/ needs it built.
"""
