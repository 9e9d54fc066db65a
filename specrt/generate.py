"""`python -m specrt.generate`: kept as the entry point it has always been; the CLI lives in
`specrt.api.cli`. A Ctrl-C at any moment, imports included, ends it with `interrupted` and
exit status 130 (specrt.commands)."""
import sys

from specrt.commands import exits_on_ctrl_c

with exits_on_ctrl_c(__name__):
    from specrt.api.cli import main

if __name__ == "__main__":
    sys.exit(main())
