"""Progress lines: what they say, how often, and that they change nothing a stage computes."""

from __future__ import annotations

import io

import torch

from fedssl import progress
from fedssl.progress import Progress


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
