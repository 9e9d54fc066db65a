"""`python -m specrt.serve` (see specrt.serve.cli). A Ctrl-C at any moment, imports included,
ends it with `interrupted` and exit status 130 until the server runs."""
import sys

from specrt.commands import exits_on_ctrl_c

with exits_on_ctrl_c(__name__):
    from specrt.serve.cli import main

if __name__ == "__main__":
    sys.exit(main())
