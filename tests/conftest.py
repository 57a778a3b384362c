"""Fixtures shared by several test modules."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Torch on one thread: tiny models (double backward, many small convs) run far slower when
    two threads fight the other jobs of a 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
