"""What CP-CFL's ``cfl`` step writes besides its models: one communication.json for every
federation it ran, and the per-round cluster choices (Fig. 5) as a TSV and a picture."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedssl.fl.state import FedState
from fedssl.stage.runtime import write_tsv


def _ledger_rows(state: FedState, prefix: str) -> list[dict]:
    return [
        {
            "up": {prefix + k: v for k, v in up.items()},
            "down": {prefix + k: v for k, v in down.items()},
        }
        for up, down in zip(state.ledger.up, state.ledger.down)
    ]


def communication(parts: list[tuple[str, int, FedState]], sizes: list[int]) -> dict:
    """One communication.json for every federation the step ran: per client the bytes by kind
    (the final run's kinds unprefixed, earlier runs' prefixed ``warmup/`` / ``failedA/``) and
    per federation the rounds each client spent exploring and exploiting."""
    clients = [
        {"client": i, "up_by_kind": {}, "down_by_kind": {}, "samples": s}
        for i, s in enumerate(sizes)
    ]
    feds = []
    for prefix, clusters, state in parts:
        for row, led in zip(clients, _ledger_rows(state, prefix)):
            row["up_by_kind"].update(led["up"])
            row["down_by_kind"].update(led["down"])
        zero = [0] * len(sizes)
        feds.append(
            {
                "name": prefix.rstrip("/") or "final",
                "clusters": clusters,
                "explore_rounds": state.memo.get("explore_rounds", zero),
                "exploit_rounds": state.memo.get("exploit_rounds", zero),
            }
        )
    for row in clients:
        row["bytes_up"] = sum(row["up_by_kind"].values())
        row["bytes_down"] = sum(row["down_by_kind"].values())
        row["rounds"] = sum(
            f["explore_rounds"][row["client"]] + f["exploit_rounds"][row["client"]] for f in feds
        )
    return {
        "per_client": clients,
        "federations": feds,
        "total_bytes_up": sum(r["bytes_up"] for r in clients),
        "total_bytes_down": sum(r["bytes_down"] for r in clients),
    }


def write_choices(choices: np.ndarray, groups, explore: int, results: Path) -> None:
    """The per-round choice trace (Fig. 5): a TSV and a picture (clients x rounds)."""
    k = choices.shape[1] if choices.size else 0
    rows = [
        {"round": r + 1, **{f"client_{c}": int(v) for c, v in enumerate(row)}}
        for r, row in enumerate(choices)
    ]
    write_tsv(rows, results / "choices.tsv", ["round"] + [f"client_{c}" for c in range(k)])
    draw_choices(choices, groups, explore, results / "choice_trace.png")


def draw_choices(choices: np.ndarray, groups, explore: int, path: Path) -> None:
    """Clients x rounds, coloured by the model chosen; dashed: the end of T_c; white lines
    between the true groups."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    k = choices.shape[1] if choices.size else 0
    fig = Figure(figsize=(min(12, 3 + 0.15 * len(choices)), min(10, 2 + 0.2 * k)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    n = int(choices.max()) + 1 if choices.size else 1
    cmap = ListedColormap(
        ["#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb"][: max(n, 1)]
    )
    if choices.size:
        im = ax.imshow(
            choices.T,
            aspect="auto",
            cmap=cmap,
            interpolation="nearest",
            vmin=-0.5,
            vmax=n - 0.5,
            extent=(0.5, len(choices) + 0.5, k - 0.5, -0.5),
        )
        fig.colorbar(im, ax=ax, ticks=range(n), label="model chosen (n_u)")
    if explore:
        ax.axvline(explore + 0.5, color="black", lw=1, ls="--")
    if groups is not None:
        for c in range(1, k):
            if groups[c] != groups[c - 1]:
                ax.axhline(c - 0.5, color="white", lw=2)
    ax.set_xlabel("round")
    ax.set_ylabel("client (white lines: true groups)")
    ax.set_title("cluster choice per round (dashed: end of T_c)")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=90, metadata={"Software": None})
