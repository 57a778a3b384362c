"""Numbers in the results pages' sentences are generated from the committed reports
(fedssl.reporting.readme_facts): each kind of fact computes from a report's rows, the pages'
facts equal what their files give (a drifted number fails), a fact is a number and a key in the
prose with its definition at the page's end (the prose reads as prose), and the sentences issue
39 found untrue are facts now."""

from __future__ import annotations

import json
import re

import pytest

from fedssl.reporting.readme_facts import (
    MARKER,
    definitions,
    fact_text,
    fill_facts,
    keyed,
    strip_facts,
    typed_figures,
)
from fedssl.reporting.report import fill_blocks
from tests.fixtures import REPO

ROWS = [
    {"row": "A", "column": "x", "acc": 70.0},
    {"row": "A", "column": "x", "acc": 72.0, "experiment": "e2"},  # two seeds: the cell is 71
    {"row": "A", "column": "y", "acc": 60.0},
    {"row": "B", "column": "x", "acc": 80.0},
    {"row": "B", "column": "y", "acc": 65.5, "hit_a": 0.09, "hit_b": 0.08},
    {"row": "C (μ=1)", "column": "x", "acc": None},
]


@pytest.mark.parametrize(
    "spec,text",
    [
        ("value | A | x | acc | 1", "71.0"),
        ("range | A | * | acc | 0", "60-71"),
        ("range | A,B | x | acc | 1", "71.0-80.0"),
        ("range | B | x | acc | 2", "80.00"),  # lo = hi: one number
        ("runs | A | x | acc | 0", "70-72"),
        ("gap | A | B | acc | 1", "5.5-9.0"),  # B - A per column: 80 - 71, 65.5 - 60
        ("range | B | y | hit_a, hit_b | 0%", "8-9"),  # several metrics, as percentages
        ("value | A | x | acc | .2g", "71"),  # a format spec
        ("sd | A | x | acc | 2", "1.41"),  # the sample SD of 70 and 72
        ("sd | A,B | * | acc | 1", "1.4"),  # only A's x cell has two runs
        ("psd | A | x | acc | 1", "1.0"),  # the population SD (CP-CFL's tables)
        ("spread | A,B | acc | 1", "9.0"),  # per column 80 - 71 and 65.5 - 60: the larger
        ("diff | A | B | x | acc | +1", "-9.0"),
        ("diff | B | A | y | acc | +1", "+5.5"),
        ("ratio | B | A | y | acc | 2", "1.09"),
        ("value | e2 | x | acc | 0", "72"),  # one run, by its experiment
    ],
)
def test_each_kind_of_fact_computes_from_the_rows(spec, text):
    assert fact_text(ROWS, [a.strip() for a in spec.split("|")]) == text


@pytest.mark.parametrize(
    "spec,error",
    [
        ("value | Z | x | acc | 1", KeyError),
        ("range | A,Z | * | acc | 1", KeyError),
        ("value | C (μ=1) | x | acc | 1", KeyError),  # a missing metric is not a number
        ("mean | A | acc | 1", ValueError),
        ("sd | B | x | acc | 1", KeyError),  # one run has no SD
        ("diff | A | Z | x | acc | 1", KeyError),
    ],
)
def test_a_fact_without_its_data_names_the_file(spec, error):
    with pytest.raises(error, match="r.json"):
        fact_text(ROWS, [a.strip() for a in spec.split("|")], "r.json")


def test_a_fact_of_a_log_picks_its_row_and_follows_the_file(tmp_path):
    log = tmp_path / "results" / "experiments" / "e" / "rounds.tsv"
    log.parent.mkdir(parents=True)
    log.write_text("# a comment\nround\tloss\tknn\n1\t4.99\t70.1\n2\t4.5\t\n3\t3.13\t72.25\n")
    reports = tmp_path / "results" / "reports"
    path = "results/experiments/e/rounds.tsv"
    cases = {
        "first | loss | 2": "4.99",
        "last | loss | 2": "3.13",
        "round=2 | loss | 1": "4.5",
        "last | knn | 1": "72.2",  # the last row with a value; 72.25 to one decimal, half-even
        "max | loss | 1": "5.0",
        "min | knn | 0": "70",
        "sum | loss | 2": "12.62",
        "sum round=3 | knn | 2": "72.25",
    }
    for spec, text in cases.items():
        page = f"reads 0[^a].\n\n[^a]: file | {path} | {spec}\n"
        assert fill_facts(page, reports) == page.replace("0[", f"{text}["), spec
    log.write_text("round\tloss\tknn\n1\t2.5\t\n")
    page = f"reads 4.99[^a].\n\n[^a]: file | {path} | first | loss | 2\n"
    assert fill_facts(page, reports) == page.replace("4.99", "2.50")
    for spec, error in [
        ("round=9 | loss | 1", KeyError),
        ("middle | loss | 1", ValueError),
        ("first | acc | 1", KeyError),
    ]:
        with pytest.raises(error, match="rounds.tsv"):
            fill_facts(f"reads 0[^a].\n\n[^a]: file | {path} | {spec}\n", reports)


def test_a_fact_is_refilled_from_its_report_and_follows_it(tmp_path):
    report = tmp_path / "demo" / "report.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"rows": ROWS}))
    text = "B sits 2.0[^up] points up.\n\n[^up]: demo | gap | A | B | acc | 1\n"
    filled = fill_facts(text, tmp_path)
    assert filled == text.replace("2.0[", "5.5-9.0[")
    report.write_text(
        json.dumps({"rows": [{**r, "acc": 0.0} if r["row"] == "B" else r for r in ROWS]})
    )
    assert "-71.0--60.0[^up]" in fill_facts(filled, tmp_path)  # it moved with the file
    assert fill_facts(filled, tmp_path) != filled
    with pytest.raises(FileNotFoundError, match="pipeline 'other'"):
        fill_facts(text.replace("demo", "other"), tmp_path)


RESULTS_PAGES = sorted((REPO / "docs" / "results").glob("*.md"))


PAGES = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]

# Numbers in the pages' prose that equal a committed cell by coincidence: the words around
# each, which say where it comes from instead (the paper, a budget, another machine, several
# round logs at once); an entry whose words are gone from its page fails the test.
NOT_FROM_REPORTS = {
    "docs/results/mfcl.md": [
        "(paper 79.6 and 83.3 against 78.8)",
        "(paper: FedSimCLR 65.6 at ξ = 0.01 against 81.9 at ξ = 200)",
        "paper 65.4 against 70.8",
    ],
    "docs/results/mpfedcon.md": [
        "(49.7-56.0 % from round 3 on",
        "seed 20.0, 67.3 and 31.6 %",
        "the paper 82.3 against 42.7",
        "the paper 67.2 against 51.8",
    ],
    "docs/results/board.md": [
        "= 43.7 s",
        "equal share (43.7 s)",
        "the pilot's 37.6 min of pretraining",  # its run record (results/runs/board_pilot.tsv)
    ],
    "docs/how-to/reproduce-a-number.md": [
        "issue 36: 79.40 linear / 80.08 k-NN",
        "67.0 against",
    ],
}


def test_no_committed_figure_is_typed_by_hand():
    """Every score a page's prose quotes from a committed report is a fact."""
    typed = {}
    for page in PAGES:
        name = str(page.relative_to(REPO))
        text = page.read_text()
        for words in NOT_FROM_REPORTS.get(name, []):
            pattern = r"\s+".join(map(re.escape, words.split()))  # wherever the lines break
            assert re.search(pattern, text), f"{name}: no longer says {words!r}"
            text = re.sub(pattern, "", text)
        if found := typed_figures(text, REPO / "results" / "reports"):
            typed[name] = found
    assert not typed, f"typed by hand, make them facts (fedssl.reporting.readme_facts): {typed}"


def test_a_figure_typed_from_a_report_is_found(tmp_path):
    report = tmp_path / "demo" / "report.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"rows": [{"row": "A", "column": "x", "linear_top1": 79.4}]}))
    page = "<!-- results: demo linear -->\n| A | 79.40 |\n<!-- /results -->\n"
    assert typed_figures(page + "A probes at 79.40 (79.4), lr 0.01, 3.5 rounds.\n", tmp_path) == [
        "79.40",
        "79.4",
    ]
    fact = "A probes at 79.4[^a].\n\n[^a]: demo | value | A | x | linear_top1 | 1\n"
    assert typed_figures(page + fact, tmp_path) == []
    assert typed_figures(fact.replace("[^a].", "[^a], 79.4."), tmp_path) == ["79.4"]
    assert typed_figures("`demo` probes at 79.4.\n", tmp_path) == ["79.4"]  # named in backticks
    # a signed figure is a difference between cells, never a cell
    assert typed_figures("`demo` gains +79.4 [+78.1, +80.0], 79.4.\n", tmp_path) == ["79.4"]


def pages_text() -> str:
    return "".join(p.read_text() for p in RESULTS_PAGES)


def test_a_drifted_number_fails_the_pages_check(monkeypatch):
    monkeypatch.chdir(REPO)
    assert len(MARKER.findall(pages_text())) >= 8
    text = (REPO / "docs" / "results" / "mfcl.md").read_text()
    drifted = text.replace("79.40-79.88[^", "79.7-79.9[^", 1)
    assert drifted != text and fill_blocks(drifted) == text


def test_the_sentences_issue_39_found_untrue_are_generated_facts():
    text = pages_text()
    generated = {m.group(1) for m in MARKER.finditer(text)}
    for number in ("79.40-79.88", "0.935-0.947", "67.1", "69.1-70.1"):
        assert number in generated, number
    assert not re.search(r"about 2 points below FedSimCLR|below every SSL probe;", text)
    assert "0.94-0.97" not in text


def demo_report(tmp_path):
    report = tmp_path / "demo" / "report.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"rows": ROWS}))


@pytest.mark.parametrize(
    "page,error,words",
    [
        ("A reads 1[^a] and 2[^b].\n\n[^a]: demo | value | A | x | acc | 0\n", KeyError, "['b']"),
        ("A reads 1.\n\n[^a]: demo | value | A | x | acc | 0\n", KeyError, "not in the text"),
        ("A reads 1[^a].\n\n[^a]: demo | value | A | x | acc | 0\n[^a]: demo\n", KeyError, "twice"),
        ("A reads 1[^a].\n\n[^a]: demo | value | A | x | acc | 0\n\nMore prose.\n", ValueError,
         "end the page"),
        ("A reads <!-- fact: demo | value | A | x | acc | 0 -->1<!-- /fact -->.\n", ValueError,
         "inline"),
    ],
)  # fmt: skip
def test_a_page_whose_keys_and_definitions_differ_is_refused(tmp_path, page, error, words):
    demo_report(tmp_path)
    with pytest.raises(error, match=re.escape(words)):
        fill_facts(page, tmp_path)


def test_the_site_shows_the_numbers_alone():
    page = (
        "Signed +2.5[^d], lo-hi 60-71[^r],\n33[^a]-210[^b] s.\n\n[^d]: demo | diff |\n    A | B\n"
    )
    page += "[^r]: demo\n[^a]: demo\n[^b]: demo\n"
    assert strip_facts(page) == "Signed +2.5, lo-hi 60-71,\n33-210 s.\n"
    assert definitions(page)["d"] == "demo | diff | A | B"  # a continuation line joins


def test_inline_facts_become_keyed_and_render_the_same(tmp_path):
    """The former syntax (a definition inline in an HTML comment around its number) is
    rewritten as a number and a key, the definitions wrapped at the page's end; the page then
    fills and shows as before."""
    demo_report(tmp_path)
    spec = "demo | range | A,B | * | acc | 1"
    inline = f"<!-- fact: {spec} -->60.0-80.0<!-- /fact -->"
    sd = "<!-- fact: demo | sd | A | x | acc | 2 -->1.41<!-- /fact -->"
    new = keyed(f"Text\n{inline} and {inline}, sd {sd}.\n", width=40)
    prose, _, defs = new.partition("\n\n")
    assert prose == "Text\n60.0-80.0[^1] and 60.0-80.0[^1], sd 1.41[^2]."
    assert max(map(len, defs.splitlines())) <= 40 and definitions(new)["1"] == spec
    assert fill_facts(new, tmp_path) == new and strip_facts(new) == (
        "Text\n60.0-80.0 and 60.0-80.0, sd 1.41.\n"
    )
    again = keyed(new + f"More {inline}.\n".replace("\n", ""), width=40)  # keys after the page's
    assert "[^3]: demo | range" in again


def test_the_pages_prose_carries_keys_not_definitions():
    """What an editor reads: in each page with facts, the keys are under 10 % of the prose's
    characters (the inline tags were 38 %, up to 59 % on a page) and the definitions sit in
    lines of at most 100 characters at its end."""
    for page in PAGES:
        text = page.read_text()
        assert "<!-- fact:" not in text, f"{page}: an inline fact (`fedssl docs --key-facts`)"
        if not definitions(text):
            continue
        first = re.search(r"^\[\^", text, re.M).start()
        prose, defs = text[:first], text[first:]
        keys = sum(len(m.group(0)) - len(m.group(1)) for m in MARKER.finditer(prose))
        assert keys < 0.1 * len(prose), page
        assert max(map(len, defs.splitlines())) <= 100, page
