"""The report's MocoSFL / MonAcoSFL tables and figures, in the paper's terms: accuracy and
communication per cut for both variants (Figs. 1, 4, 6), misalignment around the syncs
(Fig. 9), the inversion error per cut (Fig. 8), and the analytic Fig. 3 curve.

Rows are the report's rows of this method's experiments (every metric of the steps' and the
evaluation's metrics.json). Repeats (seeds) of a (clients, cut, variant) cell are shown as
mean ± sample SD (each caption says so); MocoSFL / MonAcoSFL ratios pair the runs of one
seed."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from fedssl.report_format import markdown_table, mean_sd, number, save_figure, sd_note, to_float

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


def sync_ratios(where: dict, moco: str, monaco: str) -> list[float]:
    """MocoSFL / MonAcoSFL misalignment right after each sync, for two paired runs."""
    a = [to_float(s["misalignment"]) for s in steps_of(where, moco) if s["sync"] == "1"]
    b = [to_float(s["misalignment"]) for s in steps_of(where, monaco) if s["sync"] == "1"]
    return [x / y for x, y in zip(a, b) if x is not None and y]


def tables(rows: list[dict]) -> dict[str, str]:
    groups = _groups(rows)
    if not groups:
        return {}
    where = step_results(rows)
    acc, mis, inv = [], [], []
    for key, by_variant in groups.items():
        both = [r for v in by_variant.values() for r in v]
        cell = _where(key, both)

        def col(metric, spec=".2f"):
            return [
                _cell([to_float(r.get(metric)) for r in by_variant.get(v, [])], spec)
                for v, _ in VARIANTS
            ]

        acc.append(
            cell
            + col("linear_top1")
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
        ratios, per_sync = [], []
        moco = {r.get("seed"): r for r in by_variant.get("mocosfl", [])}
        for r in by_variant.get("monacosfl", []):
            m = moco.get(r.get("seed"))
            if m is None:
                continue
            a, b = to_float(m.get("mis_after_sync_mean")), to_float(r.get("mis_after_sync_mean"))
            if a is not None and b:
                ratios.append(a / b)
            per_sync += sync_ratios(where, m["experiment"], r["experiment"])
        mis.append(
            cell
            + col("mis_pre_sync_mean", ".2e")
            + col("mis_after_sync_mean", ".2e")
            + [
                _cell(ratios, ".1f"),
                f"{number(min(per_sync), '.1f')} / {number(statistics.median(per_sync), '.1f')}"
                if per_sync
                else "",
            ]
        )
        inv.append(
            cell
            + col("inversion_mse", ".4f")
            + col("inversion_ssim", ".3f")
            + [
                _cell(
                    [
                        to_float(r.get("inversion_mse_mean_image"))
                        for r in by_variant.get("mocosfl") or both
                    ],
                    ".4f",
                )
            ]
        )
    names = [n for _, n in VARIANTS]
    head = ["clients", "arch", "cut (L)"]
    out = {
        "MocoSFL / MonAcoSFL: accuracy and communication per cut": markdown_table(
            head
            + [f"linear {n}" for n in names]
            + [f"k-NN {n}" for n in names]
            + [f"k-NN monitor {n}" for n in names]
            + [f"MB/client {n}" for n in names]
            + ["MB/client paper formula", "bytes = protocol formula"],
            acc,
            f"Top-1 % and MB per client, {OVER_SEEDS}",
        ),
        "MocoSFL / MonAcoSFL: misalignment (Eq. 2) around the syncs": markdown_table(
            head
            + [f"before sync {n}" for n in names]
            + [f"after sync {n}" for n in names]
            + ["after-sync ratio Moco/Monaco (mean over syncs)", "per-sync ratio min / median"],
            mis,
            f"Mean misalignment before and after the syncs, {OVER_SEEDS}; ratios pair the "
            "runs of one seed",
        ),
        "MocoSFL / MonAcoSFL: model inversion per cut (MSE higher = more private)": markdown_table(
            head
            + [f"MSE {n}" for n in names]
            + [f"SSIM {n}" for n in names]
            + ["MSE of the mean image"],
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
def figures(rows: list[dict], out_dir: Path) -> dict[str, str]:
    """misalignment.png (Fig. 9: both variants per clients × cut, first seed) and
    inversion.png (the attacker's reconstructions per cut, first seed)."""
    groups = _groups(rows)
    if not groups:
        return {}
    where = step_results(rows)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = list(groups)
    fig = Figure(figsize=(4.2 * min(3, len(keys)), 3.0 * -(-len(keys) // 3)))
    FigureCanvasAgg(fig)
    for i, key in enumerate(keys):
        ax = fig.add_subplot(-(-len(keys) // 3), min(3, len(keys)), i + 1)
        for (variant, name), color in zip(VARIANTS, ("tab:red", "tab:blue")):
            runs = sorted(groups[key].get(variant, []), key=lambda r: str(r.get("seed")))
            if not runs:
                continue
            steps = steps_of(where, runs[0]["experiment"])
            ax.plot(
                [int(s["step"]) for s in steps],
                [float(s["misalignment"]) for s in steps],
                color=color,
                lw=1,
                label=name,
            )
            for s in steps:
                if s["sync"] == "1" and variant == "mocosfl":
                    ax.axvline(int(s["step"]), color="grey", alpha=0.25, lw=0.6)
        ax.set_yscale("log")
        ax.set_title(f"{key[0]} clients, cut " + " ".join(_where(key, [])[2:]), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("misalignment (Eq. 2)", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out_dir / "misalignment.png", dpi=110)
    out = {
        "misalignment.png": "Misalignment (Eq. 2) of the participating clients' online and "
        "momentum models per step (grey: syncs), first seed"
    }
    pictures = [
        (
            key,
            variant,
            where.get((runs[0]["experiment"], "inversion"), Path("/nonexistent")) / "inversion.png",
        )
        for key, by in groups.items()
        for variant, _ in VARIANTS
        if (runs := sorted(by.get(variant, []), key=lambda r: str(r.get("seed"))))
    ]
    pictures = [p for p in pictures if p[2].exists()]
    if pictures:
        from matplotlib.image import imread

        fig = Figure(figsize=(9, 1.6 * len(pictures)))
        FigureCanvasAgg(fig)
        for i, (_key, _variant, path) in enumerate(pictures):
            ax = fig.add_subplot(len(pictures), 1, i + 1)
            ax.imshow(imread(path))
            ax.set_axis_off()
        fig.tight_layout()
        save_figure(fig, out_dir / "inversion.png", dpi=110)
        out["inversion.png"] = (
            "Model inversion: test images (top) and the attacker's "
            "reconstructions (bottom) per clients / cut / variant, "
            "first seed"
        )
    return out
