"""The shared evaluations and the metrics they report, one drop-in file each, found like the
methods: every module of this package is imported when the registry is first read.

An evaluation is a per-experiment stage ``<kind>__<experiment>``, one file here holding all of
it (:class:`Evaluation`: what it reads, its inputs, which experiments have it, the experiment
params sections it adds, what it writes, and its ``run(ctx)``, which
``python -m stages.evaluation <kind> <experiment>`` calls); a :class:`Metric` is one number the
report and the board show (its key in the report's rows, its label, unit and direction, and the
report pivot or board table it heads). The planner (:mod:`fedssl.plan.dag`), the experiment
model (:mod:`fedssl.experiment`), the report and the board read them here; nothing else
describes an evaluation or a metric. A file imports its computing code inside its ``run``, so
reading the declarations (planning) loads no torch; its files are found by name, so adding one
edits no other file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedssl.stage.contract import DATA, PARTITION

__all__ = [
    "DATA",
    "PARTITION",
    "Evaluation",
    "Metric",
    "Section",
    "accuracies",
    "all",
    "client_costs",
    "declare",
    "evaluated_by",
    "get",
    "metrics",
    "modules",
    "register",
    "sections",
]


@dataclass(frozen=True)
class Metric:
    """A number of a report row (a key of a metrics file an evaluation or a step writes).

    ``order``: its place among the report's pivots, the runs table's columns and the board's
    columns. ``pivot``: the title of the report's pivot table of it (None: no pivot) and
    ``pivot_costs`` whether the mean per-client costs stand beside it. ``board``: the board
    table whose column it is (None: none).

    A client cost (``costs``, set): the mean of the ``costs`` stage's file it is read from
    (``costs.json``'s ``mean_<costs>``), times ``scale`` into its unit; ``beside``: it stands
    beside the pivots and on the board (else it is a column of the full table, which a
    method's own tables may show)."""

    key: str
    label: str  # its column header (runs table, board)
    order: int
    unit: str = "%"
    higher_is_better: bool = True
    pivot: str | None = None
    pivot_name: str | None = None  # the pivot's name among the report's tables
    pivot_costs: bool = False
    board: str | None = None
    costs: str | None = None
    scale: float = 1.0
    beside: bool = False


@dataclass(frozen=True)
class Section:
    """A section an evaluation adds to the experiment params: ``name``, its params ``model``
    (None when absent) and ``description``. ``by_method``: the method says whether an
    experiment has it (its ``evaluation_sections``: then it must be there exactly when the
    method names it); else it is the experiment's choice, which ``refuse(method)`` may refuse
    (a reason, or None)."""

    name: str
    model: type
    description: str = ""
    by_method: bool = True
    refuse: Callable[[Any], str | None] | None = None


@dataclass(frozen=True)
class Evaluation:
    """A shared per-experiment stage ``<kind>__<experiment>``, run by
    ``python -m stages.evaluation <kind> <experiment>``: its ``run(ctx)``.

    ``reads``: the experiment params it reads; ``inputs``: ``data``, ``partition`` or earlier
    evaluations' kinds. ``uses``: what it takes from the experiment's method, which adds that
    part's params and steps to its reads and inputs: ``"encoder"`` (the frozen encoder, built
    by the method's hook), ``"personal"`` (the steps that logged personalised results) or
    ``"costs"`` (the client-costs hook and the steps it reads). ``applies(method, experiment
    params)``: whether the experiment has this stage. ``metrics`` and ``plots``: the files it
    writes under the experiment's ``results/`` folder; ``declares``: the metrics in them.
    ``order``: its place among the evaluations joining an experiment (after the method's
    steps; an evaluation comes after those whose outputs it reads). ``sections``: the
    experiment params sections it adds (:class:`Section`). ``run(ctx)``: the stage, handed its
    :class:`~fedssl.stage.context.StageContext`. ``results``: other files it commits there
    (DVC outs with ``cache: false``, neither metrics nor plots: per-image predictions).
    ``more_inputs(experiment params)``: inputs a setting adds (a validation split read
    from the partition), so an experiment without it keeps its stage, shared as before."""

    kind: str
    reads: tuple[str, ...]
    inputs: tuple[str, ...]
    applies: Callable[[Any, Any], bool]
    order: int
    uses: str | None = None
    gpu: bool = False
    metrics: tuple[str, ...] = ()
    plots: tuple[str, ...] = ()
    results: tuple[str, ...] = ()
    declares: tuple[Metric, ...] = ()
    sections: tuple[Section, ...] = ()
    run: Callable[[Any], None] | None = None
    more_inputs: Callable[[Any], tuple[str, ...]] = lambda exp: ()


_EVALUATIONS: dict[str, Evaluation] = {}
_METRICS: dict[str, Metric] = {}
_discovered = False


def register(evaluation: Evaluation) -> Evaluation:
    """Make an evaluation (and the metrics it declares) known to the planner and the report."""
    if evaluation.kind in _EVALUATIONS:
        raise ValueError(f"evaluation {evaluation.kind!r} is registered twice")
    _EVALUATIONS[evaluation.kind] = evaluation
    declare(*evaluation.declares)
    return evaluation


def declare(*declared: Metric) -> None:
    """Make metrics known to the report and the board (those of an evaluation, or that a
    method's own steps write)."""
    for metric in declared:
        if _METRICS.setdefault(metric.key, metric) != metric:
            raise ValueError(f"metric {metric.key!r} is declared twice, differently")


def modules() -> list[str]:
    """The declaration files, as modules (what the report's look of its metrics depends on)."""
    return [f"{__name__}.{info.name}" for info in pkgutil.iter_modules(__path__)]


def _discover() -> None:
    global _discovered
    if not _discovered:
        _discovered = True
        for module in modules():
            importlib.import_module(module)


def all() -> list[Evaluation]:  # noqa: A001 - evaluations.all() reads well at call sites
    """The evaluations, in the order they join an experiment."""
    _discover()
    return sorted(_EVALUATIONS.values(), key=lambda e: (e.order, e.kind))


def get(kind: str) -> Evaluation:
    """The evaluation of kind ``kind``; an unknown kind is refused, naming the known ones."""
    _discover()
    if kind not in _EVALUATIONS:
        raise KeyError(f"no evaluation {kind!r} (there are: {', '.join(sorted(_EVALUATIONS))})")
    return _EVALUATIONS[kind]


def sections() -> list[Section]:
    """The experiment params sections the evaluations add, in the evaluations' order."""
    return [s for e in all() for s in e.sections]


def metrics() -> list[Metric]:
    """Every declared metric, in order."""
    _discover()
    return sorted(_METRICS.values(), key=lambda m: (m.order, m.key))


def accuracies() -> list[Metric]:
    """The declared metrics that are not client costs (the pivots' and the runs' columns)."""
    return [m for m in metrics() if m.costs is None]


def client_costs() -> list[Metric]:
    """The declared client costs, in order (the ``costs`` stage's columns of a report row)."""
    return [m for m in metrics() if m.costs is not None]


def evaluated_by(section: str) -> Callable[[Any, Any], bool]:
    """Applies when the method is evaluated through ``section`` of the experiment params."""
    return lambda method, exp: section in method.evaluation_sections
