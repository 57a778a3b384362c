"""Fixtures shared by several test modules."""

import os
import sys
from pathlib import Path

import pytest
import torch

# The project's tools (python, snakemake, dvc) come from the environment running the tests,
# whatever PATH the shell had: `.venv/bin/pytest` works without activating the environment.
TOOLS = str(Path(sys.executable).parent)
os.environ["PATH"] = os.pathsep.join([TOOLS, os.environ.get("PATH", "")])
# No timed progress lines in the tests' stage output (on a loaded machine a toy round may last
# long enough for one); tests/fl/test_progress.py sets its own interval.
os.environ.setdefault("FEDSSL_PROGRESS_SECONDS", "1e9")


@pytest.fixture(autouse=True)
def fp32_library_calls():
    """Library code called by a test computes in fp32 (tests compare code paths exactly) unless
    the test or a stage's experiment sets another precision: auto would pick bf16 on a CPU that
    computes it natively."""
    from fedssl import precision

    with precision.policy("fp32"):
        yield


@pytest.fixture
def one_thread():
    """Torch on one thread: tiny models (double backward, many small convs) run far slower when
    two threads fight the other jobs of a 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(items):
    """Modules whose tests share a module-scoped fixture (a tiny project built and run once)
    come first. `make test` keeps each module on one worker (`--dist loadscope`), so such a
    fixture is built once, not once per worker; started first, the long modules do not leave
    one worker busy at the end while the other idles."""

    def shares_a_project(item) -> bool:
        defs = getattr(item, "_fixtureinfo", None)
        return bool(defs) and any(
            d[-1].scope == "module" for d in defs.name2fixturedefs.values() if d
        )

    heavy = {item.path for item in items if shares_a_project(item)}
    items.sort(key=lambda item: item.path not in heavy)
