"""matplotlib for the benchmarks: a headless pyplot and saving a figure as PNG.

Scripts draw their own figures; this module only sets the backend (Agg: no display on the
benchmark machines) and writes files. It says what it wrote on stderr, never on stdout (stdout
is for tables and the JSON last line).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Lay out, save at 120 dpi, close; -> path."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")    # keeps the format's suffix
    fig.tight_layout()
    try:
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, path)          # a run killed mid-write leaves no half a picture
    finally:
        tmp.unlink(missing_ok=True)
        pyplot().close(fig)
    print(f"wrote {path}", file=sys.stderr)
    return path
