"""The mutation check's data (``benchmarks/mutants.yaml``, run by ``make mutants``): every
mutant applies to exactly one line of the real code, changes it, and names killing tests that
exist, so the list cannot silently rot as the code moves."""

from __future__ import annotations

import importlib.util
import re
import sys

from tests.fixtures import REPO

spec = importlib.util.spec_from_file_location("mutants", REPO / "benchmarks" / "mutants.py")
mutants = sys.modules["mutants"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutants)


def test_every_mutant_changes_one_line_of_the_real_code_and_names_existing_tests():
    found = mutants.load()
    assert len(found) >= 6
    for m in found:
        text = (REPO / m.file).read_text()
        changed = m.apply(text)  # raises unless the original is on exactly one line
        assert changed != text and len(changed.splitlines()) == len(text.splitlines()), m.rule
        assert m.tests, m.rule
        for test in m.tests:
            module, _, name = test.partition("::")
            source = (REPO / module).read_text()
            found = not name or re.search(rf"^def {re.escape(name.split('[')[0])}\(", source, re.M)
            assert found, test


def test_a_mutant_must_name_a_line_found_once():
    m = mutants.Mutant("r", "f.py", "x = 1", "x = 2", ("t",))
    assert m.apply("a\nx = 1\n") == "a\nx = 2\n"
    for text in ("a\n", "x = 1\nx = 1\n"):
        try:
            m.apply(text)
        except ValueError as e:
            assert "f.py" in str(e)
        else:
            raise AssertionError(text)


def test_the_committed_table_and_run_cover_the_current_list(capsys):
    """results/mutants/table.md is `mutants.py --list` of the list as it is, and the committed
    run (results/mutants/run.txt) judged every one of its rules, none surviving: a mutant added
    or changed without a new run fails here."""
    assert mutants.main(["--list"]) == 0
    assert (REPO / "results/mutants/table.md").read_text() == capsys.readouterr().out
    run = (REPO / "results/mutants/run.txt").read_text()
    judged = re.findall(r"^\[\d+/\d+\] (killed|SURVIVED)\s+[\d.]+ s  (.+)$", run, re.M)
    rules = [m.rule for m in mutants.load()]
    assert sorted(rule for _, rule in judged) == sorted(rules)
    assert {verdict for verdict, _ in judged} == {"killed"}
    assert f"{len(rules)} mutants, 0 survivors" in run
