"""`python -m specrt.generate`: kept as the entry point it has always been; the CLI lives in
`specrt.api.cli`. A Ctrl-C at any moment, imports included, ends it with `interrupted` and
exit status 130 (specrt.commands)."""
import sys

from specrt.commands import interrupted_status

try:
    from specrt.api.cli import main
except KeyboardInterrupt:
    if __name__ != "__main__":
        raise
    sys.exit(interrupted_status())

if __name__ == "__main__":
    sys.exit(main())
