"""`python -m specrt.serve` (see specrt.serve.cli)."""
import sys

from specrt.serve.cli import main

if __name__ == "__main__":
    sys.exit(main())
