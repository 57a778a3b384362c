"""The board's planned questions (``params/board_questions.yaml``): per partition, named
families of comparisons written before the runs are read (each trained line against its own
reference, and the contrasts a reader asks within a family of methods), each answered under a
linear model of the runs, Holm-adjusted within the family, with the minimum detectable effect
beside every verdict. The board says which variance its questions use (``variance``; a
family may say otherwise), and ``fedssl advise`` compares lines under the same:

- ``pooled``: each line its own mean, the residual variance pooled over the family's lines
  (2 x lines degrees of freedom at 3 seeds, where a paired t has 2 and its critical value
  alone, 4.3, buries every gain under 9-10 points). For runs that all read one partition draw.
- ``blocked``: ``pooled`` plus a block per (partition draw, seed), the fixed-effect form of a
  mixed model with line fixed and seed/partition random; its contrasts equal the mixed
  model's on a complete grid, and it needs no variance component that 3-10 blocks cannot give.
- ``paired``: each question alone, its two lines blocked by (partition draw, seed): the paired
  t over the blocks both lines ran (n - 1 degrees of freedom). The mixed model with a residual
  variance per line; right where a family's lines differ in noise by construction (supervised
  lines whose probe reads the labels each client's draw holds beside self-supervised ones,
  trained lines beside untrained ones). Pooling there narrows the noisy lines' intervals and
  widens the quiet ones'; at n >= 5 blocks the paired test gives up only the t quantile.
  A family of paired questions borrows no noise, so it has no ``pool``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

import fedssl.reporting.board.imagewise as imagewise
from fedssl.reporting import stats
from fedssl.reporting.board.cells import accuracy_of, pipeline_entry, still_to_come
from fedssl.reporting.formatting import markdown_table
from fedssl.stage.record import ParamsError

QUESTIONS_FILE = Path("params/board_questions.yaml")
Variance = Literal["pooled", "blocked", "paired"]


RESOLVED_MDE = 1.0  # points: a "not separable" with an MDE this small still answers the question
TO_COME = "to come"  # the verdict of a question whose line has no run yet (a partial board)


class Family(BaseModel, extra="forbid"):
    """A named family of questions on one evaluation's lines (by method): each trained line
    against its reference (``lines``: a list, each against ``reference``; or line ->
    its own reference), and each pair of ``contrasts`` (first minus second). ``pool``: more
    lines whose runs enter a pooled or blocked variance, not asked about (a contrast of two
    lines borrows the noise of its encoder's other lines)."""

    says: str
    evaluation: Literal["ssl", "personal"]
    variance: Variance | None = None  # none: the board's
    partitions: list[str] | None = None  # asked on these of the board's (none: on every one)
    reference: str | None = None
    lines: list[str] | dict[str, str] = []
    contrasts: list[tuple[str, str]] = []
    pool: list[str] = []

    @model_validator(mode="after")
    def _some_question(self) -> Family:
        if isinstance(self.lines, list) and bool(self.reference) != bool(self.lines):
            raise ValueError("reference and a list of lines go together (each against it)")
        if isinstance(self.lines, dict) and self.reference:
            raise ValueError("reference: lines already name each line's own reference")
        if not self.lines and not self.contrasts:
            raise ValueError("a family asks at least one question (lines or contrasts)")
        return self

    def asked_on(self, partition: str) -> bool:
        return self.partitions is None or partition in self.partitions

    def questions(self) -> list[tuple[str, str, str]]:
        """(line, against, the field that asks it) in the family's order."""
        lines = self.lines if isinstance(self.lines, dict) else dict.fromkeys(self.lines)
        asked = [(a, b or self.reference, f"lines.{a}") for a, b in lines.items()]
        return asked + [(a, b, f"contrasts.{i}") for i, (a, b) in enumerate(self.contrasts)]


class PlannedBudget(BaseModel, extra="forbid"):
    """A client's budget over the run the board's page answers ``fedssl advise`` for: MB
    exchanged, GFLOPs, peak step MB (none: no limit on it)."""

    says: str
    mb: float | None = Field(None, gt=0)
    gflops: float | None = Field(None, gt=0)
    peak_mb: float | None = Field(None, gt=0)


class BoardQuestions(BaseModel, extra="forbid"):
    """One pipeline's planned questions: the families, asked on each of ``partitions`` (the
    board's partition labels), at family-wise level ``alpha``; the MDE at ``power``; each
    family under ``variance`` unless it names its own. ``advice``: the typical budgets the
    board's page opens with (:func:`.advise.planned_advice`); ``revisits``: an earlier board
    (a pipeline) that asked the same questions, its answers set beside these
    (:mod:`.revisit`)."""

    partitions: list[str] = Field(min_length=1)
    variance: Variance = "pooled"
    alpha: float = Field(stats.ALPHA, gt=0, lt=1)
    power: float = Field(0.8, gt=0, lt=1)
    families: dict[str, Family] = Field(min_length=1)
    advice: list[PlannedBudget] = []
    revisits: str | None = None  # an earlier board whose answers the page sets beside these

    @model_validator(mode="after")
    def _known_partitions(self) -> BoardQuestions:
        for name, family in self.families.items():
            unknown = set(family.partitions or ()) - set(self.partitions)
            if unknown:
                raise ValueError(f"families.{name}.partitions: {sorted(unknown)} not in partitions")
            family.variance = family.variance or self.variance
            if family.pool and family.variance == "paired":
                raise ValueError(
                    f"families.{name}.pool: a paired question takes its noise from its two "
                    "lines alone"
                )
        return self


def load_questions(pipeline: str, path: Path = QUESTIONS_FILE) -> BoardQuestions | None:
    """The pipeline's planned questions (None: no file, or no entry for the pipeline)."""
    return pipeline_entry(path, pipeline, BoardQuestions)


def line_families(plan: BoardQuestions | None) -> dict[tuple[str, str, str], str]:
    """(evaluation, partition, line) -> the first family of the plan that asks about the line
    (as a line, its reference or one side of a contrast; a pool only lends its noise): the
    facet its curves are drawn in (:func:`.figures.plot_over_run`)."""
    found: dict[tuple[str, str, str], str] = {}
    for partition in plan.partitions if plan else []:
        for name, family in plan.families.items():
            for a, b, _ in family.questions() if family.asked_on(partition) else []:
                for line in (a, b):
                    found.setdefault((family.evaluation, partition, line), name)
    return found


def _runs(cell: dict) -> list[tuple[str, str, float]]:
    """A line's runs as (line, block, accuracy): the block is the partition draw and seed."""
    column = accuracy_of(cell)
    draws = cell.get("draws", {})
    return [
        (cell["method"], f"{draws.get(seed, '')}/{seed}", value)
        for seed, value in cell["by_seed"][column].items()
    ]


def _lines_of(cell_list, family: Family, name: str, partition: str, where: str, to_come=()) -> dict:
    """The family's lines on a partition (row label -> cell); a line the board lacks stops here,
    naming the field that asks for it, unless its runs are still ``to_come`` on a board made
    part by part (each labelled with its line: ``row`` or ``title``, and ``column``)."""
    lines = {
        c["method"]: c
        for c in cell_list
        if c["evaluation"] == family.evaluation and c["partition"] == partition and accuracy_of(c)
    }
    asked = [(a, b, field) for a, b, field in family.questions()]
    asked += [(m, m, f"pool.{i}") for i, m in enumerate(family.pool)]
    for a, b, field in asked:
        for label in (a, b):
            if label not in lines and not still_to_come(to_come, "method", label, partition):
                raise ParamsError(
                    f"{where}.families.{name}.{field}: no {family.evaluation} line "
                    f"'{label}' on partition '{partition}'"
                )
    return lines


def ask_family(
    lines: dict[str, dict],
    plan: BoardQuestions,
    name: str,
    partition: str,
    records: dict | None = None,
) -> list[dict]:
    """Family ``name``'s questions on one partition: each a difference in points with its
    interval, raw and Holm-adjusted p, verdict and minimum detectable effect (at the
    family's Bonferroni level alpha / m, Holm's strictest step, and ``plan.power``), and
    where the runs kept per-image ``records`` (:func:`.imagewise.record_files`) its
    test-image bootstrap and McNemar tests (``test_images``). ``lines``: the family's lines on
    the partition (:func:`_lines_of`); a question whose line has no run yet is answered
    "to come", and counts in m as planned."""
    family = plan.families[name]
    asked = family.questions()
    models = _models(lines, family)
    found = [
        model.contrast(a, b) if model and {a, b} <= set(lines) else None
        for (a, b, _), model in zip(asked, models)
    ]
    # a question still to come counts in Holm's m as a p of 1: a partial board is no bolder
    waiting = [not {a, b} <= set(lines) for a, b, _ in asked]
    adjusted = stats.holm([1.0 if w else f and f.p for f, w in zip(found, waiting)])
    level = plan.alpha / len(asked)
    out = []
    for (a, b, _), contrast, p, wait, model in zip(asked, found, adjusted, waiting, models):
        answer = {"family": name, "partition": partition, "line": a, "against": b}
        if wait:
            out.append(answer | {"verdict": TO_COME})
            continue
        answer["n"] = [len(lines[m]["by_seed"][accuracy_of(lines[m])]) for m in (a, b)]
        if contrast is None:
            out.append(answer | {"verdict": "untested"})
            continue
        answer |= _answer(contrast, p, model, family, plan, level)
        images = imagewise.image_bootstrap(lines[a], lines[b], records or {}, imagewise.DRAWS)
        out.append(answer | ({"test_images": images} if images else {}))
    return out


def line_model(cell_list: list[dict], variance: Variance) -> stats.LineModel | None:
    """The linear model of these lines' runs (a block per partition draw and seed unless
    ``pooled``); None without a run. ``paired``: give it the two lines compared alone."""
    runs = [run for cell in cell_list for run in _runs(cell)]
    return stats.LineModel(runs, blocked=variance != "pooled") if runs else None


def _models(lines: dict[str, dict], family: Family) -> list:
    """The linear model each of the family's questions is answered under, in their order:
    one over every line the family names (pooled or blocked), or one per question over its
    two lines (paired)."""
    asked = family.questions()

    def fitted(names) -> stats.LineModel | None:
        return line_model([lines[m] for m in dict.fromkeys(names) if m in lines], family.variance)

    if family.variance == "paired":
        return [fitted((a, b)) for a, b, _ in asked]
    return [fitted([*(m for a, b, _ in asked for m in (a, b)), *family.pool])] * len(asked)


def _answer(contrast, p_adj: float, model, family: Family, plan: BoardQuestions, level: float):
    """A tested question's numbers: the difference, its interval, raw and adjusted p, the
    verdict and the minimum detectable effect at ``level``."""
    mde = contrast.mde(level, plan.power)
    separable = p_adj < plan.alpha
    return {
        "difference": round(contrast.difference, 4),
        "ci95": [round(float(x), 4) for x in contrast.interval],
        "p": round(contrast.p, 6),
        "p_adj": round(p_adj, 6),
        "adjusted": "Holm",
        "test": f"{family.variance} t, df {contrast.df}",
        "sd": round(math.sqrt(model.variance), 4),
        "mde": round(mde, 4),
        "verdict": "separable" if separable else "not separable",
        "resolved": separable or mde <= RESOLVED_MDE,
    }


def ask(
    cell_list: list[dict],
    plan: BoardQuestions | None,
    where: str = "questions",
    records: dict | None = None,
    to_come: list[dict] = (),
) -> list:
    """Every family's questions on every partition of the plan (none without a plan), with
    the runs' per-image ``records`` where they have them; each trained line's answer against
    its reference also goes into its ``vs_reference``. ``to_come``: the runs of a board made
    part by part not made yet (:func:`ask_family`); an answer over a line some of whose runs
    are to come is marked (:func:`_waiting`)."""
    if plan is None:
        return []
    answers = []
    for partition in plan.partitions:
        for name, family in plan.families.items():
            if not family.asked_on(partition):
                continue
            lines = _lines_of(cell_list, family, name, partition, where, to_come)
            found = ask_family(lines, plan, name, partition, records)
            for answer in found:  # answered over the runs made so far: its verdict may change
                if any(
                    still_to_come(to_come, "method", answer[k], partition)
                    for k in ("line", "against")
                ):
                    _waiting(answer)
            answers += found
            _into_cells(cell_list, family, found)
    return answers


def _waiting(answer: dict) -> None:
    """Mark an answer some of whose runs are still to come: a tested one stands over the runs
    made so far (``partial``); one too few runs could test is to come, not untested."""
    if "difference" in answer:
        answer["partial"] = True
    elif answer["verdict"] == "untested":
        answer["verdict"] = TO_COME


def _into_cells(cell_list: list[dict], family: Family, found: list[dict]) -> None:
    by_line = {(c["evaluation"], c["partition"], c["method"]): c for c in cell_list}
    for answer, (_, _, field) in zip(found, family.questions()):
        if field.startswith("lines.") and "difference" in answer:  # tested
            cell = by_line[(family.evaluation, answer["partition"], answer["line"])]
            keep = (
                "against",
                "difference",
                "p",
                "p_adj",
                "adjusted",
                "ci95",
                "test",
                "verdict",
                "mde",
                "family",
            )
            cell["vs_reference"] = {k: answer[k] for k in keep if k in answer}


def interval_text(a: dict) -> str:
    """An answer's difference and its 95 % interval, signed: ``+3.2 [+2.6, +3.9]``."""
    return "{:+.1f} [{:+.1f}, {:+.1f}]".format(a["difference"], *a["ci95"]).replace("-", "−")


def waits(a: dict) -> bool:
    """Whether an answer waits on runs not made yet: none of a line's, or some (partial)."""
    return a["verdict"] == TO_COME or bool(a.get("partial"))


def verdict_text(a: dict) -> str:
    """An answer's verdict, said to be over the runs made so far where it is ``partial``."""
    return a["verdict"] + (" so far (runs to come)" if a.get("partial") else "")


def _answer_row(a: dict) -> list[str]:
    if a["verdict"] in ("untested", TO_COME):
        return [a["family"], a["line"], a["against"], "", "", a["verdict"], "", "", ""]
    points = interval_text(a)
    p = "< 0.001" if a["p_adj"] < 0.001 else f"{a['p_adj']:.2g}"
    resolved = "yes" if a["resolved"] else "no"
    images = imagewise.cell_text(a.get("test_images"))
    return [a["family"], a["line"], a["against"], points, p, verdict_text(a), f"{a['mde']:.1f}"] + [
        resolved,
        images,
    ]


def _with_images(answers: list[dict]) -> str:
    """How many of a partition's tested questions had per-image records for every run
    (nothing while none is tested yet)."""
    tested = [a for a in answers if "difference" in a]
    kept = sum("test_images" in a for a in tested)
    if kept:
        return f"test-image records: {kept} of {len(tested)} tested questions"
    if not tested:
        return ""
    return (
        f"test-image records: none of the {len(tested)} tested questions (their runs were "
        "made before the evaluations kept per-image records): intervals over seeds only"
    )


def questions_text(answers: list[dict], plan: BoardQuestions | None) -> str:
    """The planned questions as tables, one per partition, each family's count of verdicts
    in a line under it (empty without a plan)."""
    if not answers or plan is None:
        return ""
    header = ["family", "line", "against", "difference [95 % CI]", "p (Holm)", "verdict"]
    header += ["MDE", "resolved", "with test images [95 % CI]"]
    caption = (
        "Planned questions (params/board_questions.yaml): the difference in points of the "
        "lines' means under a linear model of the runs (test: the family's variance, pooled "
        "over its lines, blocked by partition draw and seed, or paired: the question's two "
        "lines alone, and its degrees of freedom), its unadjusted 95 % interval, p "
        f"Holm-adjusted within the family (α = {plan.alpha:g}); MDE: the minimum detectable "
        f"effect, the true difference found with {plan.power:.0%} power at the family's level "
        f"α / m; resolved: separable, or an MDE ≤ {RESOLVED_MDE:g} point; with test images: "
        "the difference from the runs' per-image records, its interval from a bootstrap "
        "over runs then test images (personalised: runs, clients, images; the final round), "
        "and McNemar's exact p per seed on the shared test set; — where a run has no "
        "record (runs made before the records were kept): the interval covers seeds only"
    )
    parts = []
    for partition in plan.partitions:
        mine = [a for a in answers if a["partition"] == partition]
        counts = [
            f"{name}: {sum(a['verdict'] == 'separable' for a in of)} of {len(of)} separable, "
            f"{sum(bool(a.get('resolved')) for a in of)} resolved"
            + (f", {n} to come" if (n := sum(waits(a) for a in of)) else "")
            for name in plan.families
            if (of := [a for a in mine if a["family"] == name])
        ]
        counts += [images] if (images := _with_images(mine)) else []
        table = markdown_table(header, [_answer_row(a) for a in mine], f"{caption}; {partition}")
        parts.append(f"{table}\n" + "".join(f"- {c}\n" for c in counts))
    return "**Planned questions, per partition**\n\n" + "\n".join(parts)
