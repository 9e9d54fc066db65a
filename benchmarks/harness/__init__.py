"""The benchmark harness: what every script in benchmarks/ shares, one concern per module.

    cli         argument groups, argument parsing helpers, torch set-up, fail(), progress bars
    model_dirs  which model directories a run uses (the one place that asks specrt for the
                default pair)
    machine     facts about the machine (CPU, threads, load, contention, read bandwidth)
    timing      timing one call, timing repeated calls, median
    compare     comparing two generations token for token
    results     benchmarks/RESULTS.md: section rewriting and the locked, atomic write
    report      rendering: text and markdown tables, the run header, the JSON last line
    plots       matplotlib set-up and figure saving
    hf          Hugging Face transformers, the comparison (never the runtime)

Nothing in here knows about a particular benchmark, and specrt never imports it; tests do not
import it either (they keep their own helpers).
"""
