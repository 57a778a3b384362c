"""The third board's tuning (issue 51, equal footing): every trained line gets the same rule,
its run ``dir01_s0`` at its starting learning rate beside the same run at half and twice it
(``params/grids.yaml``, axes ``lr_*``), one point further (a quarter or four times the
start) where the best of those three lies at an edge, and keeps the rate whose run scores
highest on the validation split (training images no client holds: the linear probe's
accuracy, or the clients' mean personal accuracy). The test split is never read here. A line
whose runs all fail keeps its starting rate and is marked untuned; a choice still at the
sweep's edge after the extra point is marked so. The board states each line's rate and
whether it is the sweep's choice (:func:`mark_tuning`: its ``lr, tuning`` column). A line is
decided once (:func:`decided_once`): a run of its sweep made again later does not move it."""

from __future__ import annotations

import json
import math
from pathlib import Path

from fedssl.params import federation_of
from fedssl.presets import Presets
from fedssl.reporting.board.cells import is_reference, line_label
from fedssl.reporting.formatting import markdown_table
from fedssl.stage.record import ParamsError

SWEEP_RUN = "_dir01_s0"  # the run every line is tuned on
SWEEP_LABELS = ("lrq", "lrh", "lr2", "lr4")  # the sweep's other points (axes lr_*)
VALIDATION = ("linear_top1_val", "personal_top1_val")  # the first a run has decides
RESULTS = Path("results/experiments")
TUNING_FILE = "tuning.json"  # in the board's report folder (:func:`write_tuning`)
HEADER = "lr, tuning"


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
            out.setdefault(line_of(name), {})[learning_rate(name, presets)] = validation_score(
                name, results
            )
    return out


def choose(points: dict[float, float | None], start: float) -> tuple[float, str]:
    """The rate a line keeps and why: the best validation accuracy (ties: the starting rate,
    then the smaller), or the starting rate when no run of the sweep scored. A best at the
    smallest or largest rate swept says so: the sweep needs (or had) its point beyond it."""
    scored = {lr: acc for lr, acc in points.items() if acc is not None}
    if not scored:
        return start, "untuned: no run of the sweep scored"
    best = max(scored.values())
    tied = sorted(lr for lr, acc in scored.items() if acc == best)
    chosen = start if start in tied else tied[0]
    why = f"{len(scored)} of {len(points)} scored"
    if len(scored) > 1 and chosen in (min(points), max(points)):
        side = "smallest" if chosen == min(points) else "largest"
        # the extra point is the edge it chose (not one swept on the other side)
        extra = not any(math.isclose(chosen, f * start) for f in (0.5, 1.0, 2.0))
        why += f"; best at the {side} rate" + (" after the extra point" if extra else
                                                 ": one point beyond it is due")  # fmt: skip
    return chosen, why


def stopped(pipelines: list[str], reports: Path | None = None) -> set[str]:
    """The tuning runs the pipelines' committed reports list as stopped with an error (a
    diverged loss): they score nothing, and the table says why."""
    from fedssl.reporting.report import committed_failures

    return {name for p in pipelines for name in committed_failures(p, reports)}


def tuning_table(
    pipelines: list[str],
    presets: Presets | None = None,
    results: Path = RESULTS,
    reports: Path | None = None,
) -> list[dict]:
    """A row per line: each rate's validation accuracy (and the rates whose run diverged),
    the starting and the chosen rate."""
    presets = presets or Presets()
    failed = stopped(pipelines, reports)
    diverged: dict[str, list[float]] = {}
    for name in sorted(failed):
        diverged.setdefault(line_of(name), []).append(learning_rate(name, presets))
    rows = []
    for line, points in sweeps(pipelines, presets, results).items():
        start = learning_rate(line + SWEEP_RUN, presets)
        chosen, why = choose(points, start)
        label, _, encoder = line_label(line + SWEEP_RUN, presets)
        rows.append(
            {"line": line, "label": label, "encoder": encoder}
            | {"points": dict(sorted(points.items())), "start": start}
            | {"chosen": chosen, "why": why, "diverged": sorted(diverged.get(line, []))}
        )
    return rows


def tuning_markdown(rows: list[dict]) -> str:
    def cell(lr: float, acc: float | None, diverged: list[float]) -> str:
        shown = "diverged" if lr in diverged else "—"
        return f"{lr:g}: " + (shown if acc is None else f"{acc:.2f}")

    table = [
        [r["line"], ", ".join(cell(lr, a, r["diverged"]) for lr, a in r["points"].items())]
        + [f"{r['start']:g}", f"**{r['chosen']:g}**", r["why"]]
        for r in rows
    ]
    caption = (
        "The third board's learning rates: each trained line's run dir01_s0 at half, one and "
        "twice its starting rate (and a quarter or four times it where the best of three lay "
        "at an edge), scored on the validation split (training images no client holds; never "
        "the test split); the best is kept for every run of the line; —: not run yet; "
        "diverged: the run stopped on a non-finite loss (its tuning part's report says where)"
    )
    header = ["line", "lr: validation accuracy", "starting lr", "chosen", "runs"]
    return markdown_table(header, table, caption)


def write_tuning(
    board: str,
    presets: Presets | None = None,
    results: Path = RESULTS,
    folder: Path | None = None,
    reports: Path | None = None,
) -> Path:
    """The board's tuning table from its tuning parts (the pipelines ``<board>_tune*``) into
    ``folder`` (the board's, ``results/reports/<board>/``): ``tuning.md`` and ``tuning.json``
    (committed: the board reads each line's rate against it, :func:`mark_tuning`)."""
    from fedssl.plan.layout import report_dir

    presets = presets or Presets()
    parts = [p for p in presets.pipelines().pipelines if p.startswith(f"{board}_tune")]
    folder = folder or Path(report_dir(board))
    rows = decided_once(tuning_table(parts, presets, results, reports), folder / TUNING_FILE)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tuning.md").write_text(tuning_markdown(rows) + "\n")
    for r in rows:
        r["points"] = [[lr, acc] for lr, acc in r["points"].items()]
    (folder / TUNING_FILE).write_text(json.dumps(rows, indent=1) + "\n")
    return folder / "tuning.md"


def settled(row: dict) -> bool:
    """Whether a line's tuning is decided: every rate of its sweep scored or diverged, and no
    point beyond an edge is due."""
    points = dict(row["points"])  # [[lr, acc], ...] as committed, or {lr: acc}
    done = all(acc is not None or lr in row["diverged"] for lr, acc in points.items())
    return done and "is due" not in row["why"]


def decided_once(rows: list[dict], committed: Path) -> list[dict]:
    """Each line is tuned once: a line the committed table (``committed``) has settled keeps
    that row, its scores and choice, over the same rates, though a run of its sweep is made
    again later (made on another machine, a run's validation score moves by up to a few points,
    and deciding again on it would give that line more runs than the rule's)."""
    if not committed.exists():
        return rows
    before = {r["line"]: r for r in json.loads(committed.read_text())}
    kept = []
    for row in rows:
        old = before.get(row["line"])
        if old and settled(old) and [lr for lr, _ in old["points"]] == list(row["points"]):
            row = old | {"points": {lr: acc for lr, acc in old["points"]}}
        kept.append(row)
    return kept


def learning_rate(experiment: str, presets: Presets) -> float | None:
    """The learning rate of an experiment's federated training (None: no such block, or no
    preset of that name)."""
    try:
        block = federation_of(presets.load("experiment", experiment).method)
    except (KeyError, ParamsError):
        return None
    return getattr(block, "lr", None)


def tuning_text(rates: list[float], row: dict | None, reference: bool) -> str:
    """A line's ``lr, tuning`` cell from its runs' rates and its sweep's row (None: its line
    was not swept): tuned where every run uses the rate the sweep chose; untuned (and why)
    otherwise; a dash for a reference with no sweep (nothing trained to tune)."""
    if not rates or (row is None and reference):
        return "—"
    shown = "/".join(f"{lr:g}" for lr in sorted(set(rates)))
    if row is None:
        return f"{shown}, untuned (no sweep)"
    if row["why"].startswith("untuned"):
        return f"{shown}, untuned (no run of its sweep scored)"
    if set(rates) != {row["chosen"]}:
        return f"{shown}, untuned (its sweep chose {row['chosen']:g})"
    return f"{shown}, tuned"


def mark_tuning(cell_list: list[dict], folder: Path, presets: Presets | None = None) -> bool:
    """Into each line, ``cell["tuning"]`` (:func:`tuning_text`), where the board's folder holds
    its tuning (:data:`TUNING_FILE`); a line finds its sweep by its report label and encoder,
    so the same method on another partition (100 clients) reads the rate tuned on the sweep's
    partition. Returns whether the board has a tuning."""
    path = folder / TUNING_FILE
    if not path.is_file():
        return False
    presets = presets or Presets()
    rows = {(r["label"], r["encoder"]): r for r in json.loads(path.read_text())}
    for r in rows.values():
        r["chosen"] = float(r["chosen"])
    for cell in cell_list:
        rates = [learning_rate(e, presets) for e in cell["experiments"]]
        rates = [lr for lr in rates if lr is not None]
        row = rows.get((cell["method"], cell["encoder"]))
        cell["tuning"] = tuning_text(rates, row, is_reference(cell))
    return True
