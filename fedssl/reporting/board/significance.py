"""Which lines of the board separate: the screening of every trained line against the best
(false-discovery rate, Benjamini-Hochberg: the best is chosen from the same data, so it is a
screening, not a planned question), each line against its zero-cost reference (paired over
seeds, Holm-corrected; the planned questions of :mod:`.questions` replace these where the
pipeline has them), and their text under a table."""

from __future__ import annotations

import statistics

from fedssl.reporting import stats
from fedssl.reporting.board.cells import EVALUATIONS, SD, accuracy_of, cell_key, is_reference


def compare_lines(cell_list: list[dict]) -> None:
    """For each evaluation and partition, every trained line against the best trained line
    (the screening: the references left out, p adjusted by Benjamini-Hochberg) and against
    its reference (:func:`is_reference`, same encoder; Holm over the partition's): the paired
    t-test over seeds (:func:`fedssl.reporting.stats.compare`), into ``cell["vs_best"]`` /
    ``cell["vs_reference"]``. The best is the highest mean accuracy among the trained lines of
    two runs or more, which a test can compare with (on a board made part by part, a line's
    single first run would otherwise be the best and leave every comparison untested); the
    highest of all where no line has two."""
    groups: dict[tuple, list[dict]] = {}
    for cell in cell_list:
        if accuracy_of(cell):
            groups.setdefault((cell["evaluation"], cell["partition"]), []).append(cell)
    for mine in groups.values():
        trained = [c for c in mine if not is_reference(c)]
        if trained:
            testable = [c for c in trained if len(c["values"][accuracy_of(c)]) > 1]
            best = max(
                testable or trained, key=lambda c: statistics.mean(c["values"][accuracy_of(c)])
            )
            best["vs_best"] = {"verdict": "best"}
            others = [c for c in trained if c is not best]
            _verdicts(others, [best] * len(others), "vs_best", stats.benjamini_hochberg, "BH")
        refs = {c["encoder"]: c for c in mine if is_reference(c)}
        paired = [c for c in trained if c["encoder"] in refs]
        _verdicts(paired, [refs[c["encoder"]] for c in paired], "vs_reference", stats.holm, "Holm")


def _verdicts(cells_: list[dict], against: list[dict], name: str, adjust, adjusted: str) -> None:
    found = [
        stats.compare(c["by_seed"][accuracy_of(c)], o["by_seed"].get(accuracy_of(c), {}))
        for c, o in zip(cells_, against)
    ]
    for cell, other, comparison, p in zip(cells_, against, found, adjust([f.p for f in found])):
        verdict = "untested" if p is None else "separable" if p < stats.ALPHA else "not separable"
        cell[name] = {
            "against": other["method"],
            "difference": round(comparison.difference, 4),
            "p": None if comparison.p is None else round(comparison.p, 4),
            "p_adj": None if p is None else round(p, 4),
            "adjusted": adjusted,
            "ci95": comparison.interval and [round(x, 4) for x in comparison.interval],
            "test": comparison.test,
            "verdict": verdict,
        }


def verdict_text(v: dict | None) -> str:
    """A comparison as a table cell: "best", "−3.1 [−4.0, −2.2] (p 0.004)" or "−0.4 [−2.9,
    +2.1] not separable, MDE 2.5 (p 0.6)" (the difference in points, its 95 % interval, the
    minimum detectable effect where the analysis gives one, the adjusted p-value)."""
    if not v:
        return ""
    if v["verdict"] == "best":
        return "best"
    diff = f"{v['difference']:+.1f}".replace("-", "−")
    if v["verdict"] == "untested":
        return f"{diff} (n < 2)"
    if v.get("ci95"):
        diff += " [{:+.1f}, {:+.1f}]".format(*v["ci95"]).replace("-", "−")
    words = " not separable" if v["verdict"] == "not separable" else ""
    if words and v.get("mde") is not None:
        words += f", MDE {v['mde']:.1f}"
    p = "p < 0.001" if v["p_adj"] < 0.001 else f"p {v['p_adj']:.2g}"
    return f"{diff}{words} ({p})"


def metrics(cell_list: list[dict]) -> dict:
    """board.json's numbers: per line, the mean and SD of every column (SD only over two
    runs or more), its accuracy's 95 % interval, its comparisons, and the runs."""
    spread = statistics.stdev if SD == "sample" else statistics.pstdev
    out = {}
    for cell in cell_list:
        numbers = {"runs": cell["runs"]}
        if cell.get("failed"):
            numbers["failed_runs"] = len(cell["failed"])
        for column, values in cell["values"].items():
            numbers[f"{column}_mean"] = round(statistics.mean(values), 4)
            if len(values) > 1:
                numbers[f"{column}_sd"] = round(spread(values), 4)
        accuracy = accuracy_of(cell)
        ci = stats.interval(cell["values"][accuracy]) if accuracy else None
        if ci:
            numbers[f"{accuracy}_ci95"] = [round(ci[0], 4), round(ci[1], 4)]
        for name in ("tuning", "vs_best", "vs_reference", "to_target"):
            if cell.get(name):
                numbers[name] = cell[name]
        if cell.get("flags"):
            numbers["flags"] = [
                {k: f[k] for k in ("kind", "column", "diagnosis")} for f in cell["flags"]
            ]
        out[cell_key(cell)] = numbers
    return out


def significance_text(cell_list: list[dict]) -> str:
    """The comparisons in words, per evaluation and partition: the best line, the lines
    separable from it and those not, and which lines beat their reference."""
    parts = []
    for evaluation, (heading, accuracies) in EVALUATIONS.items():
        by_partition: dict[str, list[dict]] = {}
        for c in cell_list:
            if c["evaluation"] == evaluation and c.get("vs_best"):
                by_partition.setdefault(c["partition"], []).append(c)
        for partition, mine in by_partition.items():
            best = next(c for c in mine if c["vs_best"]["verdict"] == "best")
            acc = accuracy_of(best)
            tied = [c["method"] for c in mine if c["vs_best"]["verdict"] == "not separable"]
            below = [c["method"] for c in mine if c["vs_best"]["verdict"] == "separable"]
            untested = [c["method"] for c in mine if c["vs_best"]["verdict"] == "untested"]
            text = (
                f"- **{partition}**, {accuracies[acc]}: best **{best['method']}** "
                f"({statistics.mean(best['values'][acc]):.1f}); not separable from it: "
                f"{', '.join(tied) or 'none'}; below it: {', '.join(below) or 'none'}"
                + (f"; untested (one run): {', '.join(untested)}" if untested else "")
            )
            parts.append(text + _against_references(mine) + ".")
        if by_partition:
            parts.insert(len(parts) - len(by_partition), f"\n*{heading}*\n")
    if not parts:
        return ""
    return (
        "**Which differences are significant.** Against the best: a *screening* (the best "
        "is picked from the same runs; paired t-test over seeds, false-discovery rate 5 % "
        "by Benjamini-Hochberg, the zero-cost references left out). Against the reference: "
        "the planned questions where the pipeline has them (the table of questions), else "
        "the paired t-test, Holm-adjusted per partition, α = 0.05:\n" + "\n".join(parts) + "\n"
    )


def _against_references(cells: list[dict]) -> str:
    """The clause on the lines that beat, match or trail their encoder's reference."""
    ref = [c for c in cells if c.get("vs_reference")]
    if not ref:
        return ""
    level = [c["method"] for c in ref if c["vs_reference"]["verdict"] == "not separable"]
    return (
        f". Against the reference of their encoder: above "
        f"{_names([c['method'] for c in ref if _beats(c, 1)])}; not separable "
        f"{_names(level)}; below {_names([c['method'] for c in ref if _beats(c, -1)])}"
    )


def _beats(cell: dict, sign: int) -> bool:
    """Separable from its reference, on the side ``sign`` says (1 above, -1 below)."""
    versus = cell["vs_reference"]
    return versus["verdict"] == "separable" and sign * versus["difference"] > 0


def _names(methods: list[str]) -> str:
    return ", ".join(methods) or "none"
