"""`python -m specrt.generate`: kept as the entry point it has always been; the CLI lives in
`specrt.api.cli`."""
import sys

from specrt.api.cli import main

if __name__ == "__main__":
    sys.exit(main())
