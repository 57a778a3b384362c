"""The leakage study's defining rules (MpFedcon §5.10, Eq. 8) at the level of one setting: with
the FC gradients shared the iDLG rule names every label; with every FC layer kept on the party
the attacker has no FC gradient and can only guess, a seeded uniform guess, flagged blind."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedssl.methods.gradient_leakage import LeakageParams
from fedssl.methods.gradient_leakage.run import run_setting

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_label_rule_reads_the_shared_fc_gradient_or_guesses_blind():
    p = LeakageParams(
        settings=[{"label": "full"}, {"label": "cl2", "hidden_fc": 2}],
        fc_hidden=[10],
        label_images=30,
        recon_images=0,
        recon_label_images=0,
    )
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(30, 3, 16, 16, generator=gen)
    y = np.arange(30) % 10
    full = run_setting(p, p.settings[0], x, y, 10)
    assert full["idlg_label_hits"] == [1] * 30 and not full["blind_guess"]
    hidden = run_setting(p, p.settings[1], x, y, 10)
    assert hidden["blind_guess"]
    assert sum(hidden["idlg_label_hits"]) <= 9  # chance: 3 of 30
    assert hidden == run_setting(p, p.settings[1], x, y, 10)  # seeded
