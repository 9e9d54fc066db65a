"""Benchmark: what `auto`'s cost calibration measures and costs, with every T timed (the current
scheme, `specrt.spec.calibration.timed_points`) against T = 1, 2, the middle and max_t timed
with the rest on a straight line (the scheme before 2026-12-02).

Run: python -m benchmarks.calibration_points [--rounds 2] [--k 8]

Each round calibrates the pair once per scheme, alternating, each on an empty calibration file
(nothing is written to the real one), and prints the seconds it took and verify(T) / verify(1)
for T = 1..K + 1. Both schemes time the models interleaved within each repeat; only the points
differ.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from benchmarks.harness import cli
from benchmarks.harness.model_dirs import resolve_models


def sparse_points(max_t: int) -> list[int]:
    return sorted({1, min(2, max_t), (max_t + 1) // 2, max_t})


def build_parser() -> argparse.ArgumentParser:
    p = cli.parser("benchmarks.calibration_points", __doc__)
    cli.add_common_args(p, out=False, progress=False)     # a line per calibration
    p.add_argument("--rounds", type=cli.count, default=2,
                   help="calibrations per scheme (default 2)")
    p.add_argument("--k", type=cli.count, default=8, help="auto's K_max (default 8)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    cli.setup_torch(args.threads, args.device)
    import specrt
    from specrt.spec import calibration

    target_dir, draft_dir = resolve_models(args)
    llm = specrt.LLM(target_dir, draft=draft_dir, dtype=args.dtype, device=args.device)
    schemes = {"every T to 9": calibration.timed_points, "1, 2, middle, max": sparse_points}
    tmp = tempfile.mkdtemp(prefix="specrt-calibration-")
    print(f"scheme             seconds  verify(T) / verify(1), T = 1..{args.k + 1}")
    try:
        for r in range(args.rounds):
            for s, (name, points) in enumerate(schemes.items()):
                os.environ["SPECRT_CALIBRATION"] = os.path.join(tmp, f"{r}-{s}.json")
                calibration._cache.clear()
                calibration.timed_points = points
                t0 = time.perf_counter()
                costs = llm.cost_model(args.k)     # on the engine's thread
                seconds = time.perf_counter() - t0
                ratios = " ".join(f"{v / costs.verify[0]:.2f}" for v in costs.verify[:args.k + 1])
                print(f"{name:18s} {seconds:7.1f}  {ratios}", flush=True)
    finally:
        calibration.timed_points = schemes["every T to 9"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
