"""The test-wide setup and fixtures live in tests/session.py, shared with benchmarks/tests/."""
from tests.session import *  # noqa: F401,F403
