"""The third board's tuning (issue 51, equal footing): every trained line gets the same budget,
its run ``dir01_s0`` at its starting learning rate beside the same run at half and twice it
(``params/grids.yaml``, axis ``lr_sweep``), and keeps the rate whose run scores highest on the
validation split (training images no client holds: the linear probe's accuracy, or the
clients' mean personal accuracy). The test split is never read here. A line whose three runs
all fail keeps its starting rate and is marked untuned."""

from __future__ import annotations

import json
from pathlib import Path

from fedssl.params import federation_of
from fedssl.presets import Presets
from fedssl.reporting.formatting import markdown_table

SWEEP_RUN = "_dir01_s0"  # the run every line is tuned on
SWEEP_LABELS = ("lrh", "lr2")  # the sweep's other points (grids.yaml, axis lr_sweep)
VALIDATION = ("linear_top1_val", "personal_top1_val")  # the first a run has decides
RESULTS = Path("results/experiments")


def line_of(experiment: str) -> str:
    """The board line a sweep's run belongs to: ``board2_fedbyol_lr2_dir01_s0`` ->
    ``board2_fedbyol``."""
    line = experiment.removesuffix(SWEEP_RUN)
    for label in SWEEP_LABELS:
        line = line.removesuffix(f"_{label}")
    return line


def validation_score(experiment: str, results: Path = RESULTS) -> float | None:
    """The run's validation accuracy (none: not run, failed, or scored on no validation)."""
    path = results / experiment / "metrics.json"
    if not path.is_file():
        return None
    metrics = json.loads(path.read_text())
    return next((metrics[k] for k in VALIDATION if metrics.get(k) is not None), None)


def sweeps(pipelines: list[str], presets: Presets, results: Path = RESULTS) -> dict[str, dict]:
    """line -> {lr: validation accuracy or None} over the tuning pipelines' runs."""
    out: dict[str, dict] = {}
    for pipeline in pipelines:
        for name in presets.pipeline_experiments(pipeline):
            lr = federation_of(presets.load("experiment", name).method).lr
            out.setdefault(line_of(name), {})[lr] = validation_score(name, results)
    return out


def choose(points: dict[float, float | None], start: float) -> tuple[float, str]:
    """The rate a line keeps and why: the best validation accuracy (ties: the starting rate,
    then the smaller), or the starting rate when no run of the sweep scored."""
    scored = {lr: acc for lr, acc in points.items() if acc is not None}
    if not scored:
        return start, "untuned: no run of the sweep scored"
    best = max(scored.values())
    tied = sorted(lr for lr, acc in scored.items() if acc == best)
    return (start if start in tied else tied[0]), f"{len(scored)} of {len(points)} scored"


def tuning_table(pipelines: list[str], presets: Presets | None = None) -> list[dict]:
    """A row per line: each rate's validation accuracy, the starting and the chosen rate."""
    presets = presets or Presets()
    rows = []
    for line, points in sweeps(pipelines, presets).items():
        start = federation_of(presets.load("experiment", line + SWEEP_RUN).method).lr
        chosen, why = choose(points, start)
        rows.append(
            {"line": line, "points": dict(sorted(points.items())), "start": start}
            | {"chosen": chosen, "why": why}
        )
    return rows


def tuning_markdown(rows: list[dict]) -> str:
    def cell(lr: float, acc: float | None) -> str:
        return f"{lr:g}: " + ("—" if acc is None else f"{acc:.2f}")

    table = [
        [r["line"], ", ".join(cell(lr, a) for lr, a in r["points"].items())]
        + [f"{r['start']:g}", f"**{r['chosen']:g}**", r["why"]]
        for r in rows
    ]
    caption = (
        "The third board's learning rates: each trained line's run dir01_s0 at half, one and "
        "twice its starting rate, scored on the validation split (training images no client "
        "holds; never the test split); the best is kept for every run of the line"
    )
    header = ["line", "lr: validation accuracy", "starting lr", "chosen", "runs"]
    return markdown_table(header, table, caption)


def write_tuning(board: str, presets: Presets | None = None) -> Path:
    """The board's tuning table from its tuning parts (the pipelines ``<board>_tune*``) into
    ``results/reports/<board>/tuning.md`` and ``tuning.json`` (committed: the grids' learning
    rates are read against it)."""
    from fedssl.plan.layout import report_dir

    presets = presets or Presets()
    parts = [p for p in presets.pipelines().pipelines if p.startswith(f"{board}_tune")]
    rows = tuning_table(parts, presets)
    folder = Path(report_dir(board))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tuning.md").write_text(tuning_markdown(rows) + "\n")
    for r in rows:
        r["points"] = [[lr, acc] for lr, acc in r["points"].items()]
    (folder / "tuning.json").write_text(json.dumps(rows, indent=1) + "\n")
    return folder / "tuning.md"
