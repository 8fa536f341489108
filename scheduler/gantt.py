"""A Gantt chart of one simulated iteration: one row per peer, one colour per microbatch.

Forward passes are solid, backward passes hatched, the loss step dark; the makespan is marked.
"""

from __future__ import annotations

from pathlib import Path

from scheduler.simulator import BACKWARD, FORWARD, SimResult


def render_gantt(result: SimResult, ids: tuple[str, ...] | list[str], path: str | Path, *, title: str = "") -> Path:
    """Write `result` (simulated with record_ops=True) as a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not result.ops:
        raise ValueError("no operations recorded: simulate with record_ops=True")
    rows = sorted({op.node for op in result.ops})
    row_of = {v: i for i, v in enumerate(rows)}
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(12, max(3, 0.35 * len(rows) + 1.5)))
    for op in result.ops:
        color = cmap(op.microbatch % 20)
        style = {"hatch": "////", "alpha": 0.75} if op.kind == BACKWARD else {}
        if op.kind not in (FORWARD, BACKWARD):
            color = "black"
        ax.barh(row_of[op.node], op.end - op.start, left=op.start, height=0.8, color=color, edgecolor="black",
                linewidth=0.3, **style)
    ax.axvline(result.makespan, color="red", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([ids[v] for v in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(title or f"iteration {result.makespan:.2f} s")
    handles = [Patch(facecolor="grey", label="forward"), Patch(facecolor="grey", hatch="////", label="backward"),
               Patch(facecolor="black", label="loss")]
    ax.legend(handles=handles, loc="lower right", fontsize=7)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
