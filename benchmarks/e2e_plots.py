"""The end-to-end benchmark's two figures, drawn from its records: speedup vs K per task and
method, and measured tokens per round vs the geometric model (1 - a^(K+1)) / (1 - a).

Drawing only: it reads an E2EResult and writes PNGs (harness.plots says so on stderr).
"""
from __future__ import annotations

from pathlib import Path

from benchmarks.e2e_records import E2EResult
from benchmarks.harness import plots

STYLES = {"draft_model": ("C0", "o", "-"), "ngram": ("C1", "^", "-"),
          "hf:assisted": ("C2", "s", "--"), "hf:lookup": ("C3", "v", "--")}   # color, marker, ls
MARKERS = {"draft_model": "o", "ngram": "^", "auto": "*"}


def title(result: E2EResult) -> str:
    c = result.config
    return f"{c.target.name} / {c.draft.name if c.draft else '-'}, {c.dtype}, " \
           f"{c.max_new_tokens} tokens"


def _speedup_axes(ax, task: str, rows) -> None:
    for name, (color, marker, ls) in STYLES.items():
        pts = sorted((s.method.k, s.speedup) for s in rows
                     if (s.method.kind if s.method.engine == "specrt"
                         else f"hf:{s.method.kind}") == name)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, marker=marker,
                    ls=ls, label=name)
    for s in rows:
        if s.method.kind == "auto":
            ax.plot([s.method.k], [s.speedup], "k*", markersize=12, label=s.method.label)
        if s.method.label == "hf:plain":
            ax.axhline(s.speedup, color="C2", ls=":", label="hf:plain")
    ax.axhline(1.0, color="gray", lw=1, label="specrt plain")
    ax.set_xscale("log", base=2)
    ks = sorted({s.method.k for s in rows if s.method.k})
    if ks:
        ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_title(task)
    ax.set_xlabel("K (draft tokens per round)")
    ax.set_ylabel("speedup vs specrt plain")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot_speedup(result: E2EResult, path: Path) -> Path:
    plt = plots.pyplot()
    tasks = list(result.per_task)
    cols = 2 if len(tasks) > 1 else 1
    nrows = (len(tasks) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 4 * nrows), squeeze=False)
    for ax, t in zip(axes.flat, tasks):
        _speedup_axes(ax, t, list(result.per_task[t].values()))
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    fig.suptitle(title(result))
    return plots.save_figure(fig, path)


def plot_theory(result: E2EResult, path: Path) -> Path:
    import numpy as np

    plt = plots.pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    a = np.linspace(0, 0.995, 200)
    records = result.measurements
    kk = sorted({r.method.k for r in records if r.method.k}
                | {m.k for m in result.config.methods if m.k})
    for i, k in enumerate(kk):
        ax.plot(a, (1 - a ** (k + 1)) / (1 - a), color=f"C{i}", lw=1, alpha=0.7,
                label=f"theory K={k}")
    for r in records:
        st = r.stats
        if not st or r.method.kind == "plain" or not st["num_drafts"]:
            continue
        c = f"C{kk.index(r.method.k)}" if r.method.k in kk else "k"
        mk = MARKERS.get(r.method.kind, "o")
        ax.plot([r.a], [st["mean_acceptance_length"]], mk, color=c, alpha=0.8)
        ax.plot([r.a], [st["tokens_per_target_pass"]], mk, color=c, mfc="none", alpha=0.5)
    for kind, mk in MARKERS.items():
        ax.plot([], [], mk, color="gray", label=kind)
    ax.plot([], [], "o", color="gray", mfc="none", label="hollow: tokens per target pass "
            "(all passes)")
    ax.set_xlabel("measured per-position acceptance a")
    ax.set_ylabel("tokens per drafted round (filled)")
    ax.set_xlim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title(result))
    return plots.save_figure(fig, path)


def plot_auto_choices(result: E2EResult, path: Path) -> Path | None:
    """auto's plan per round over one generation per task: which drafter, and K (0: plain)."""
    picks = {}
    for r in result.measurements:
        if r.method.kind == "auto" and r.plans and r.task not in picks:
            picks[r.task] = r
    if not picks:
        return None
    plt = plots.pyplot()
    fig, axes = plt.subplots(len(picks), 1, figsize=(9, 2.2 * len(picks)), squeeze=False)
    for ax, (task, r) in zip(axes.flat, picks.items()):
        for kind, (color, marker, _) in list(STYLES.items())[:2] + [("plain", ("gray", ".",
                                                                                None))]:
            pts = [(i, int(p.split(":")[1]) if ":" in p else 0)
                   for i, p in enumerate(r.plans) if p.split(":")[0] == kind]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, color=color,
                        ls="none", label=kind)
        ax.set_ylabel("K")
        ax.set_title(f"{task} / {r.prompt}: {r.method.label}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes.flat[-1].set_xlabel("round")
    fig.suptitle("auto's choice of drafter and K per round - " + title(result), fontsize=9)
    return plots.save_figure(fig, path)


def draw(result: E2EResult, out: Path) -> tuple[Path, ...]:
    """The figures into `out`: e2e_speedup.png, e2e_theory.png and (with auto in the run)
    e2e_auto_choices.png."""
    pngs = (plot_speedup(result, out / "e2e_speedup.png"),
            plot_theory(result, out / "e2e_theory.png"),
            plot_auto_choices(result, out / "e2e_auto_choices.png"))
    return tuple(p for p in pngs if p is not None)
