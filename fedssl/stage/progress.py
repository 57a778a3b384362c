"""Progress of a stage's long loops (rounds, local training, feature extraction, probe epochs):
a tqdm bar on a terminal, else one line every ``FEDSSL_PROGRESS_SECONDS`` (default 30) into
the stage's log, each with images/s and an ETA.

It counts and reads the clock, nothing else: it reads no tensor (no device sync) and draws no
random number, so a run with it computes what a run without it does. Inner loops call
:func:`advance` with the images they just used; it goes to the innermost open
:class:`Progress` and costs nothing when none is open.
"""

from __future__ import annotations

import os
import sys
import time

from tqdm import tqdm

EVERY_ENV = "FEDSSL_PROGRESS_SECONDS"
_open: list[Progress] = []


def advance(images: int) -> None:
    """``images`` more images went through the innermost loop that shows progress."""
    if _open:
        _open[-1].advance(images)


def say(line: str) -> None:
    """A line of the log that does not tear a bar drawn on the terminal."""
    if _open and _open[-1].bar is not None:
        tqdm.write(line, file=sys.stdout)
    else:
        print(line, flush=True)


def clock(seconds: float) -> str:
    return tqdm.format_interval(seconds)


class Progress:
    """``total`` images to go through (an estimate may be corrected with :meth:`retotal`).
    ``every``: seconds between lines when the output is not a terminal."""

    def __init__(self, desc: str, total: int, every: float | None = None, stream=None):
        self.desc, self.total, self.n = desc, max(int(total), 1), 0
        self.stream = stream or sys.stdout
        self.every = float(os.environ.get(EVERY_ENV, 30)) if every is None else every
        self.start = self.last = time.monotonic()
        self.bar = None
        if self.stream.isatty():
            self.bar = tqdm(
                total=self.total, desc=desc, unit="img", unit_scale=True, file=self.stream
            )

    def __enter__(self) -> Progress:
        _open.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _open.remove(self)
        if self.bar is not None:
            self.bar.close()

    def advance(self, images: int) -> None:
        self.n += images
        # the total is an estimate (clients' shards differ in size): never report past 100%
        if self.n > self.total:
            self.total = self.n
            if self.bar is not None:
                self.bar.total = self.total
        if self.bar is not None:
            self.bar.update(images)
            return
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            print(self.line(now), file=self.stream, flush=True)

    def retotal(self, total: int, done: int | None = None) -> None:
        """A better estimate of the total (and of what is done, e.g. after a round whose
        inner loop counts nothing)."""
        if done is not None:
            if self.bar is not None:
                self.bar.update(done - self.n)
            self.n = done
        self.total = max(int(total), self.n, 1)
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()

    def line(self, now: float | None = None) -> str:
        """``desc: 45% of 24.0k img, 1.9k img/s, 01:02 elapsed, ETA 01:16``."""
        elapsed = (now or time.monotonic()) - self.start
        rate = self.n / elapsed if elapsed > 0 else 0.0
        eta = clock((self.total - self.n) / rate) if rate > 0 else "?"
        return (
            f"{self.desc}: {100 * self.n / self.total:.0f}% of "
            f"{tqdm.format_sizeof(self.total)} img, {tqdm.format_sizeof(rate)} img/s, "
            f"{clock(elapsed)} elapsed, ETA {eta}"
        )
