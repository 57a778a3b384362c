"""The report's MocoSFL / MonAcoSFL tables and figures, in the paper's terms: accuracy and
communication per cut for both variants (Figs. 1, 4, 6), misalignment as Eq. 2 has it and as
the authors log it (Fig. 9), the inversion error per cut (Fig. 8), and the analytic Fig. 3 curve.

Rows are the report's rows of this method's experiments (every metric of the steps' and the
evaluation's metrics.json). Repeats (seeds) of a (clients, cut, variant) cell are shown as
mean ± sample SD (each caption says so); MocoSFL / MonAcoSFL ratios pair the runs of one
seed."""

from __future__ import annotations

import csv
import statistics
from functools import partial
from pathlib import Path

from fedssl.reporting.formatting import (
    markdown_table,
    mean_sd,
    number,
    save_figure,
    sd_note,
    to_float,
)

VARIANTS = (("mocosfl", "MocoSFL"), ("monacosfl", "MonAcoSFL"))
SD = "sample"
OVER_SEEDS = sd_note(SD, "seeds")


def _cell(values, spec=".2f") -> str:
    return mean_sd(values, SD, spec)


def _groups(rows):
    """(clients, arch, cut) -> variant -> rows, in a stable order."""
    out: dict[tuple, dict[str, list[dict]]] = {}
    for r in sorted(
        rows, key=lambda r: (int(r.get("clients") or 0), r.get("arch", ""), int(r.get("cut") or 0))
    ):
        if "variant" not in r:
            continue
        key = (int(r["clients"]), r.get("arch", ""), int(r["cut"]))
        out.setdefault(key, {}).setdefault(r["variant"], []).append(r)
    return out


def _where(key, rows) -> list[str]:
    clients, arch, cut = key
    layer = next((r.get("cut_layer") for r in rows if r.get("cut_layer") not in (None, "")), "")
    return [str(clients), arch, f"{cut}" + (f" (L{int(float(layer))})" if layer != "" else "")]


def step_results(rows: list[dict]) -> dict[tuple[str, str], Path]:
    """(experiment, step) -> the folder of committed results its step wrote. A step shared by
    experiments of the same content is named after (and writes under) its owner, which may be
    another experiment than the row's: the report's rows say which
    (:class:`fedssl.plan.layout.ReportRow`)."""
    return {
        (r["experiment"], kind): Path(folder)
        for r in rows
        for kind, folder in getattr(r, "step_results", {}).items()
    }


def steps_of(where: dict, experiment: str) -> list[dict]:
    path = where.get((experiment, "pretrain"), Path("/nonexistent")) / "steps.tsv"
    if not path.exists():
        return []
    with open(path) as f:
        return list(csv.DictReader(f, delimiter="\t"))


def step_ratios(
    where: dict, moco: str, monaco: str, column: str, syncs_only: bool = False
) -> list[float]:
    """MocoSFL / MonAcoSFL ratio of the steps.tsv ``column`` at each step both paired runs
    logged (only the sync steps with ``syncs_only``)."""

    def by_step(experiment):
        return {
            s["step"]: to_float(s.get(column))
            for s in steps_of(where, experiment)
            if s["sync"] == "1" or not syncs_only
        }

    a, b = by_step(moco), by_step(monaco)
    return [a[k] / b[k] for k in a if k in b and a[k] is not None and b[k]]


def _min_median_max(xs: list[float], which=("min", "median", "max")) -> str:
    pick = {"min": min, "median": statistics.median, "max": max}
    return " / ".join(number(pick[w](xs), ".1f") for w in which) if xs else ""


def _per_variant(*columns: str) -> list[str]:
    """Headers of columns shown for both variants, in the order :func:`_column` fills them."""
    return [f"{c} {n}" for c in columns for _, n in VARIANTS]


def _column(by_variant: dict, metric: str, spec: str = ".2f") -> list[str]:
    """A metric's cells for both variants (mean ± SD over seeds)."""
    return [
        _cell([to_float(r.get(metric)) for r in by_variant.get(v, [])], spec) for v, _ in VARIANTS
    ]


def _accuracy_row(by_variant: dict, both: list[dict]) -> list[str]:
    col = partial(_column, by_variant)
    return (
        col("linear_top1")
        + col("knn_top1")
        + col("knn_monitor_last")
        + col("client_MB_total", ".3g")
        + [
            _cell(
                [
                    to_float(r.get("client_MB_paper_formula"))
                    for r in by_variant.get("mocosfl", both)
                ],
                ".3g",
            ),
            "yes" if all(str(r.get("comm_matches_formula")) == "True" for r in both) else "no",
        ]
    )


def _misalignment_row(by_variant: dict, where: dict) -> list[str]:
    """Eq. 2's misalignment before and after the syncs, its MocoSFL / MonAcoSFL ratio per seed
    and per sync, and the authors' squared log with its ratio per step (runs of one seed
    paired)."""
    ratios, per_sync, per_step = [], [], []
    moco = {r.get("seed"): r for r in by_variant.get("mocosfl", [])}
    for r in by_variant.get("monacosfl", []):
        m = moco.get(r.get("seed"))
        if m is None:
            continue
        a, b = to_float(m.get("mis_after_sync_mean")), to_float(r.get("mis_after_sync_mean"))
        if a is not None and b:
            ratios.append(a / b)
        pair = (where, m["experiment"], r["experiment"])
        per_sync += step_ratios(*pair, "misalignment", syncs_only=True)
        per_step += step_ratios(*pair, "misalignment_sq_pre_sync")
    col = partial(_column, by_variant)
    return (
        col("mis_pre_sync_mean", ".2e")
        + col("mis_after_sync_mean", ".2e")
        + [_cell(ratios, ".1f"), _min_median_max(per_sync, ("min", "median"))]
        + col("mis_sq_pre_sync_mean", ".2e")
        + [_min_median_max(per_step)]
    )


def _inversion_row(by_variant: dict, both: list[dict]) -> list[str]:
    mean_image = [
        to_float(r.get("inversion_mse_mean_image")) for r in by_variant.get("mocosfl") or both
    ]
    return (
        _column(by_variant, "inversion_mse", ".4f")
        + _column(by_variant, "inversion_ssim", ".3f")
        + [_cell(mean_image, ".4f")]
    )


def tables(rows: list[dict]) -> dict[str, str]:
    groups = _groups(rows)
    if not groups:
        return {}
    where = step_results(rows)
    acc, mis, inv = [], [], []
    for key, by_variant in groups.items():
        both = [r for v in by_variant.values() for r in v]
        cell = _where(key, both)
        acc.append(cell + _accuracy_row(by_variant, both))
        mis.append(cell + _misalignment_row(by_variant, where))
        inv.append(cell + _inversion_row(by_variant, both))
    head = ["clients", "arch", "cut (L)"]
    out = {
        "MocoSFL / MonAcoSFL: accuracy and communication per cut": markdown_table(
            head
            + _per_variant("linear", "k-NN", "k-NN monitor", "MB/client")
            + ["MB/client paper formula", "bytes = protocol formula"],
            acc,
            f"Top-1 % and MB per client, {OVER_SEEDS}",
        ),
        "MocoSFL / MonAcoSFL: misalignment, Eq. 2's and the authors'": markdown_table(
            head
            + _per_variant("Eq. 2 before sync", "Eq. 2 after sync")
            + [
                "Eq. 2 after sync Moco/Monaco, ratio of the means over syncs",
                "Eq. 2 after sync Moco/Monaco per sync, min / median",
            ]
            + _per_variant("authors' (squared, pre-sync) mean over steps")
            + ["authors' Moco/Monaco per step, min / median / max"],
            mis,
            "Misalignment of the participating clients' online and momentum models per "
            "parameter element. Eq. 2 = mean |difference| just before / right after each sync, "
            f"averaged over the syncs ({OVER_SEEDS}); the ratio of means divides MocoSFL's mean "
            "by MonAcoSFL's per seed. Authors' = their code's log: mean squared difference at "
            "every step before that step's sync. Ratios pair the runs of one seed; min / "
            "median / max are over the steps (or syncs) of all seeds",
        ),
        "MocoSFL / MonAcoSFL: model inversion per cut (MSE higher = more private)": markdown_table(
            head + _per_variant("MSE", "SSIM") + ["MSE of the mean image"],
            inv,
            f"Reconstruction error of the attacker, {OVER_SEEDS}",
        ),
    }
    out["Fig. 3 (analytic): communication per client and epoch, 224 px, 250 images, 10 syncs"] = (
        fig3_table()
    )
    return out


def fig3_table() -> str:
    from fedssl.methods.mocosfl import SflBackbone
    from fedssl.methods.mocosfl.comm import comm_curve

    lines = []
    for arch in ("resnet18", "mobilenetv2"):
        for r in comm_curve(SflBackbone(arch=arch, stem="imagenet"), (3, 224, 224), 250, 10):
            lines.append(
                [
                    arch,
                    f"{r['cut']}" + (f" (L{r['layer']})" if r["layer"] else ""),
                    *(number(r[k], ".1f") for k in ("optimisation_MiB", "sync_MiB", "total_MiB")),
                ]
            )
    return markdown_table(
        ["arch", "cut", "activations + gradients MiB", "sync MiB", "total MiB"], lines
    )


# ------------------------------------------------------------------ figures
def _first_runs(groups: dict) -> list[dict]:
    """The first seed's run of each cell and variant that has runs."""
    return [
        runs[0]
        for by in groups.values()
        for variant, _ in VARIANTS
        if (runs := sorted(by.get(variant, []), key=lambda r: str(r.get("seed"))))
    ]


def _misalignment_panel(ax, key, by_variant: dict, where: dict, column: str, label: str) -> None:
    """One cell's misalignment curve per variant, first seed, the syncs as grey lines."""
    for (variant, name), color in zip(VARIANTS, ("tab:red", "tab:blue")):
        runs = sorted(by_variant.get(variant, []), key=lambda r: str(r.get("seed")))
        steps = steps_of(where, runs[0]["experiment"]) if runs else []
        curve = [(int(s["step"]), to_float(s.get(column))) for s in steps]
        curve = [(x, y) for x, y in curve if y is not None]
        if not curve:
            continue
        ax.plot(*zip(*curve), color=color, lw=1, label=name)
        if variant == "mocosfl":
            for s in steps:
                if s["sync"] == "1":
                    ax.axvline(int(s["step"]), color="grey", alpha=0.25, lw=0.6)
    ax.set_yscale("log")
    ax.set_title(
        f"{key[0]} clients, cut " + " ".join(_where(key, [])[2:]) + f": {label}", fontsize=8
    )
    ax.set_xlabel("step", fontsize=8)
    ax.legend(fontsize=7)


def _inversion_figure(groups: dict, where: dict, path: Path) -> bool:
    """The inversion steps' own pictures stacked, first seed per cell and variant; False
    when no step drew one."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.image import imread

    pictures = [
        where.get((run["experiment"], "inversion"), Path("/nonexistent")) / "inversion.png"
        for run in _first_runs(groups)
    ]
    pictures = [p for p in pictures if p.exists()]
    if not pictures:
        return False
    images = [imread(p) for p in pictures]
    height, width = images[0].shape[:2]
    row = 1.6  # inches a picture: the figure as wide as the pictures, no side margins
    fig = Figure(figsize=(row * width / height, row * len(images)))
    FigureCanvasAgg(fig)
    for i, image in enumerate(images):
        ax = fig.add_subplot(len(images), 1, i + 1)
        ax.imshow(image)
        ax.set_axis_off()
    fig.tight_layout(pad=0.2)
    save_figure(fig, path, dpi=110)
    return True


def figures(rows: list[dict], out_dir: Path) -> dict[str, str]:
    """misalignment.png (Fig. 9: both variants per clients × cut, first seed) and
    inversion.png (the attacker's reconstructions per cut, first seed)."""
    groups = _groups(rows)
    if not groups:
        return {}
    where = step_results(rows)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from fedssl.methods.mocosfl.outputs import MISALIGNMENT_CURVES

    keys = list(groups)
    # which run stands for a cell: in a sweep, every rate's run has the first seed
    drawn = "; runs drawn: " + ", ".join(r["experiment"] for r in _first_runs(groups))
    fig = Figure(figsize=(9, 2.8 * len(keys)))
    FigureCanvasAgg(fig)
    for i, key in enumerate(keys):
        for j, (column, label) in enumerate(MISALIGNMENT_CURVES.items()):
            ax = fig.add_subplot(len(keys), 2, 2 * i + j + 1)
            _misalignment_panel(ax, key, groups[key], where, column, label)
    fig.tight_layout()
    save_figure(fig, out_dir / "misalignment.png", dpi=110)
    out = {
        "misalignment.png": "Misalignment of the participating clients' online and momentum "
        "models per step (grey: syncs), first seed: Eq. 2 (mean |difference|, after each "
        "step's sync; left) and the authors' log (mean squared difference, before the sync; "
        "right)" + drawn
    }
    if _inversion_figure(groups, where, out_dir / "inversion.png"):
        out["inversion.png"] = (
            "Model inversion: test images (top) and the attacker's "
            "reconstructions (bottom) per clients / cut / variant, "
            "first seed" + drawn
        )
    return out
