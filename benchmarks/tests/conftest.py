"""The benchmarks' own tests (their parsing, tables, replays and llama.cpp's commands), apart from
tests/, which never imports benchmarks/. The setup and the tiny-model fixtures are tests/'s."""
from tests.session import *  # noqa: F401,F403
