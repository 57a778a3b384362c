"""Progress lines: what they say, how often, and that they change nothing a stage computes."""

from __future__ import annotations

import io
import re

import torch

from fedssl.stage import progress
from fedssl.stage.progress import Progress


def test_lines_say_share_rate_and_eta_and_only_every_so_often(monkeypatch):
    clock = iter([0.0, 0.0, 5.0, 10.0, 15.0])  # start, then one reading per advance
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    with Progress("rounds", 1000, every=10, stream=out):
        progress.advance(100)  # 0 s: too soon
        progress.advance(100)  # 5 s: too soon
        progress.advance(300)  # 10 s: a line
        progress.advance(500)  # 15 s: too soon since the last line
    assert out.getvalue() == "rounds: 50% of 1.00k img, 50.0 img/s, 00:10 elapsed, ETA 00:10\n"
    progress.advance(100)  # no loop open: nothing happens
    assert out.getvalue().count("\n") == 1


def test_retotal_corrects_an_estimate_and_what_is_done():
    bar = Progress("x", 100, every=1e9, stream=io.StringIO())
    bar.advance(10)
    bar.retotal(400, done=120)
    assert (bar.n, bar.total) == (120, 400)
    bar.retotal(50)  # never below what is done
    assert bar.total == 120


def test_advance_goes_to_the_innermost_loop_and_draws_no_random_number():
    before = torch.get_rng_state()
    outer = Progress("outer", 10, every=1e9, stream=io.StringIO())
    inner = Progress("inner", 10, every=1e9, stream=io.StringIO())
    with outer, inner:
        progress.advance(3)
    assert (outer.n, inner.n) == (0, 3)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_federation_with_progress_lines_computes_what_one_without_does(tmp_path, monkeypatch):
    """Every round's lines say how far the run is, and the rounds are the same to the bit
    with a line every few milliseconds and with none."""
    from fedssl.rounds.runner import run_rounds
    from tests.fl.test_engine import make_fed, tiny_model, toy_data

    def rounds(seconds: str, folder: str):
        monkeypatch.setenv(progress.EVERY_ENV, seconds)
        (tmp_path / folder).mkdir()
        fed = make_fed(tiny_model(), toy_data(), tmp_path / folder, rounds=2)
        state = run_rounds(fed, fed.start(tiny_model()), None, "toy")
        return state, fed.strategy.final_model(state)

    quiet, quiet_model = rounds("1e9", "quiet")
    clock = iter(range(1000))  # every reading of the clock is a second later
    monkeypatch.setattr(progress.time, "monotonic", lambda: float(next(clock)))
    loud, loud_model = rounds("0", "loud")
    assert [r["loss"] for r in loud.log] == [r["loss"] for r in quiet.log]
    assert all(torch.equal(loud_model[k], quiet_model[k]) for k in quiet_model)


def test_round_lines_say_the_share_the_rate_and_the_time_left(tmp_path, monkeypatch, capsys):
    from fedssl.rounds.runner import run_rounds
    from tests.fl.test_engine import make_fed, tiny_model, toy_data

    monkeypatch.setenv(progress.EVERY_ENV, "0")
    fed = make_fed(tiny_model(), toy_data(), tmp_path, rounds=2)
    run_rounds(fed, fed.start(tiny_model()), None, "toy")
    lines = capsys.readouterr().out.splitlines()
    timed = [x for x in lines if x.startswith("toy rounds: ")]
    # about 90 images a round (the sampled clients' shards differ), 2 rounds: one line per
    # client batch, then the round's own line; the total is re-estimated after round 1
    shares = [
        re.search(r"(\d+)% of (\d+) img, .* img/s, .* elapsed, ETA (\d\d:\d\d|\?)$", x)
        for x in timed
    ]
    assert timed and all(shares), timed
    assert all(0 <= int(m[1]) <= 100 for m in shares) and 150 <= int(shares[-1][2]) <= 210
    assert [x.split(":")[0] for x in lines if not x.startswith("toy rounds")] == [
        "toy round 1/2",
        "toy round 2/2",
    ]
