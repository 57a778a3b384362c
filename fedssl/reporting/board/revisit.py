"""An earlier board's findings asked again: where a board's planned questions name the board
they revisit (``revisits`` in ``params/board_questions.yaml``), its page sets each question
the earlier board answered beside this board's answer, and says which findings hold, which
reverse, which this board does not confirm and which it finds anew. Read from the earlier
board's committed ``board.json``, so a fresh clone renders the same table."""

from __future__ import annotations

import json
from pathlib import Path

from fedssl.reporting.board.questions import (
    TO_COME,
    BoardQuestions,
    interval_text,
    verdict_text,
    waits,
)
from fedssl.reporting.formatting import markdown_table
from fedssl.stage.record import ParamsError

SEPARABLE = "separable"


def _key(answer: dict) -> tuple[str, str, str, str]:
    return answer["partition"], answer["family"], answer["line"], answer["against"]


def outcome(before: dict, now: dict) -> str:
    """What became of an earlier answer (``before``, with a difference) in ``now``."""
    if "difference" not in now or waits(now):
        return TO_COME
    was, is_ = before["verdict"] == SEPARABLE, now["verdict"] == SEPARABLE
    if was and is_:
        return "holds" if (before["difference"] > 0) == (now["difference"] > 0) else "reversed"
    if was:
        return "not confirmed"
    return "newly separable" if is_ else "still not separable"


def _answer_cell(a: dict) -> str:
    if "difference" not in a:
        return a["verdict"]
    mde = f", MDE {a['mde']:.1f}" if a["verdict"] != SEPARABLE else ""
    design = f" (n {'/'.join(map(str, a['n']))}, {a['test']})" if "test" in a else ""
    return f"{interval_text(a)} {verdict_text(a)}{mde}{design}"


def _summary(pairs: list[tuple[dict, dict]]) -> str:
    found = [outcome(b, n) for b, n in pairs if b["verdict"] == SEPARABLE]
    open_ = [outcome(b, n) for b, n in pairs if b["verdict"] != SEPARABLE]
    said = ", ".join(f"{found.count(o)} {o}" for o in dict.fromkeys(found))
    left = ", ".join(f"{open_.count(o)} {o}" for o in dict.fromkeys(open_))
    return (
        f"{len(found)} separable before ({said or 'none'}); "
        f"{len(open_)} not separable before ({left or 'none'})"
    )


def revisit_text(answers: list[dict], earlier: list[dict], name: str, partitions) -> str:
    """The table of ``earlier`` answers (board ``name``'s) beside this board's ``answers``,
    one per partition of ``partitions`` the earlier board answered, a summary under each."""
    now = {_key(a): a for a in answers}
    header = ["family", "line", "against", f"{name} (before)", "this board", "outcome"]
    caption = (
        f"The planned questions board `{name}` answered, asked again (`revisits: {name}`): its "
        "answer (difference [95 % CI], verdict, MDE where not separable; runs of the line and "
        "of what it is set against, and the test) beside this board's; holds: "
        "separable on both boards with one sign; reversed: separable on both, signs "
        "opposite; not confirmed: separable before, not now; newly separable: not separable "
        "before, separable now; to come: this board has not made all its runs of the two lines"
    )
    parts = []
    for partition in partitions:
        pairs = [
            (b, now.get(_key(b), {"verdict": TO_COME}))
            for b in earlier
            if b["partition"] == partition and "difference" in b
        ]
        if not pairs:
            continue
        rows = [
            [b["family"], b["line"], b["against"], _answer_cell(b), _answer_cell(n), outcome(b, n)]
            for b, n in pairs
        ]  # fmt: skip
        table = markdown_table(header, rows, f"{caption}; {partition}")
        parts.append(f"{table}\n- {partition}: {_summary(pairs)}\n")
    if not parts:
        return ""
    return f"**The findings of board `{name}`, asked again**\n\n" + "\n".join(parts)


def revisited(answers: list[dict], plan: BoardQuestions | None, reports: Path, where: str) -> str:
    """:func:`revisit_text` for the board ``plan`` revisits, from its committed board.json
    under ``reports`` (empty where the plan names none; ``where``: the plan's file and entry,
    which an error names where that board is not rendered)."""
    if plan is None or plan.revisits is None:
        return ""
    path = reports / plan.revisits / "board.json"
    if not path.exists():
        raise ParamsError(f"{where}: revisits: {path} not found (render board {plan.revisits})")
    earlier = json.loads(path.read_text()).get("questions", [])
    return revisit_text(answers, earlier, plan.revisits, plan.partitions)
