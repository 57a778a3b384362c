"""LW-FedSSL's calibration set D^g under a distribution shift (``calibration.shift``): the
default is the server holdout exactly as drawn (the clients' distribution, what the committed
results ran with); ``invert`` and ``rotate90`` are that holdout through one fixed transform,
and nothing else; the grow step calibrates on what the param names; and the Fig. 7 pipeline
runs the paper's variants (the one-mechanism ones without weight transfer) on shifted D^g."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedssl.fl.cohort import LocalData
from fedssl.methods import registry
from fedssl.methods.lwfedssl import run
from fedssl.presets import Presets
from tests.methods.lwfedssl.test_lwfedssl import stage_model, tiny_exp, toy_data

pytestmark = pytest.mark.usefixtures("one_thread")

HOLDOUT = np.array([7, 2, 11, 5])


def clients_tensor(height: int = 3, width: int = 3) -> LocalData:
    """12 one-channel images whose pixels are all different (the value says where it was)."""
    images = torch.arange(12 * height * width, dtype=torch.int64).reshape(12, 1, height, width)
    return LocalData((images % 256).to(torch.uint8), torch.arange(12) % 4, [np.arange(12)])


def with_shift(shift: str):
    return tiny_exp("lw_fedssl", f"  calibration: {{enabled: true, shift: {shift}}}\n").method


def test_the_default_calibration_set_is_the_holdout_on_the_clients_tensor():
    """shift none: D^g is today's set, the very image tensor the clients train from (no copy)
    with the holdout's indices, so runs made before the param exist read the same images."""
    data = clients_tensor()
    assert tiny_exp("lw_fedssl").method.calibration.shift == "none"
    got = run.calibration_set(data, HOLDOUT, "none")
    assert got.images is data.images and got.labels is data.labels
    assert len(got.clients) == 1 and np.array_equal(got.clients[0], HOLDOUT)


def test_invert_is_each_holdout_image_with_its_intensities_inverted():
    data = clients_tensor()
    got = run.calibration_set(data, HOLDOUT, "invert")
    assert got.images.dtype == torch.uint8 and got.images.shape == (4, 1, 3, 3)
    assert np.array_equal(got.clients[0], np.arange(4))  # all of it, in the holdout's order
    for i, j in enumerate(HOLDOUT):
        assert torch.equal(got.images[i].int(), 255 - data.images[j].int())
    assert torch.equal(got.labels, data.labels[torch.as_tensor(HOLDOUT)])
    assert torch.equal(data.images, clients_tensor().images)  # the clients' images untouched


def test_rotate90_turns_each_holdout_image_a_quarter_turn_counter_clockwise():
    """[[a b c], [d e f], [g h i]] -> [[c f i], [b e h], [a d g]]: the top row is the old right
    column, read top to bottom."""
    data = clients_tensor()
    got = run.calibration_set(data, HOLDOUT, "rotate90")
    for i, j in enumerate(HOLDOUT):
        old, new = data.images[j, 0], got.images[i, 0]
        for r in range(3):
            for c in range(3):
                assert new[r, c] == old[c, 2 - r], (i, r, c)


def test_rotate90_refuses_images_that_are_not_square():
    with pytest.raises(ValueError, match="calibration.shift rotate90 needs square images, not 3x5"):
        run.calibration_set(clients_tensor(3, 5), HOLDOUT, "rotate90")


def test_an_unknown_shift_is_an_error_naming_the_field():
    with pytest.raises(ValidationError, match="calibration.shift"):
        with_shift("blur")


@pytest.mark.parametrize("shift", ["none", "invert", "rotate90"])
def test_the_grow_step_calibrates_on_the_set_its_params_name(shift):
    """``server_data`` (what ``grow`` hands the calibrator) reads ``calibration.shift`` and the
    partition's holdout."""
    data = clients_tensor()
    ctx = SimpleNamespace(
        exp=SimpleNamespace(method=with_shift(shift)), server_indices=lambda: HOLDOUT
    )
    got, want = run.server_data(ctx, data), run.calibration_set(data, HOLDOUT, shift)
    assert torch.equal(got.images, want.images) and np.array_equal(got.clients[0], want.clients[0])


def calibrated(p, server: LocalData, tmp_path) -> dict:
    """The global model after stage 1's server step of ``p`` on ``server``."""
    data, _ = toy_data()
    fed, learner = run.make_federation(
        p,
        stage_model(p, 1),
        1,
        data,
        tmp_path / f"{len(list(tmp_path.iterdir()))}.pt",
        "fp",
        server,
    )
    return fed.strategy.init_server(learner)["global"]


def test_calibration_trains_on_the_shifted_images(tmp_path):
    """The server's first calibration on inverted D^g equals one on a hand-inverted copy of the
    holdout, and differs from one on the holdout as drawn."""
    data, server = toy_data()
    p = with_shift("invert")
    holdout = server.clients[0]
    by_hand = LocalData(255 - server.images[holdout], server.labels[holdout], [np.arange(20)])
    shifted = calibrated(p, run.calibration_set(data, holdout, "invert"), tmp_path)
    assert all(torch.equal(v, shifted[k]) for k, v in calibrated(p, by_hand, tmp_path).items())
    plain = calibrated(p, run.calibration_set(data, holdout, "none"), tmp_path)
    assert not torch.equal(
        shifted["encoder.blocks.0.mlp.0.weight"], plain["encoder.blocks.0.mlp.0.weight"]
    )


def test_the_fig7_pipeline_runs_the_papers_variants_on_shifted_calibration():
    """lw_fig7_paper: calibration-only and alignment-only without weight transfer (Fig. 7's
    caption), LW-FedSSL and FedMoCo-LW with and without it, two seeds each; every run that
    calibrates does so on inverted D^g; the rest is lw_smoke's setting."""
    presets = Presets()
    runs = {n: presets.load("experiment", n) for n in presets.pipeline_experiments("lw_fig7_paper")}
    rows: dict[str, list[int]] = {}
    for exp in runs.values():
        m = exp.method
        rows.setdefault(registry.get(m.name).row_label(m), []).append(m.seed)
        if m.name == "lw_fedssl" and m.calibration.enabled:
            assert m.calibration.shift == "invert"
    assert {k: sorted(v) for k, v in rows.items()} == {
        "LW-FedSSL, D^g inverted": [0, 1],
        "LW-FedSSL w/o WT, D^g inverted": [0, 1],
        "LW-FedSSL (calibration only) w/o WT, D^g inverted": [0, 1],
        "LW-FedSSL (alignment only) w/o WT": [0, 1],
        "FedMoCo-LW": [0, 1],
        "FedMoCo-LW w/o WT": [0, 1],
    }
    smoke = presets.load("experiment", "smoke_lw_fedssl").method
    for exp in runs.values():
        assert exp.partition == "fmnist_iid_m4_srv"
        assert exp.method.vit == smoke.vit and exp.method.federation == smoke.federation
