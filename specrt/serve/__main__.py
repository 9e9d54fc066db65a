"""`python -m specrt.serve` (see specrt.serve.cli). A Ctrl-C at any moment, imports included,
ends it with `interrupted` and exit status 130 until the server runs."""
import sys

from specrt.commands import interrupted_status

try:
    from specrt.serve.cli import main
except KeyboardInterrupt:
    if __name__ != "__main__":
        raise
    sys.exit(interrupted_status())

if __name__ == "__main__":
    sys.exit(main())
