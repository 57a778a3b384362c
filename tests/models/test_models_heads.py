"""Projectors, predictors and classifier heads: layer order, sizes, output shapes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from fedssl.models.encoders import ProjectionHead as EncodersProjectionHead
from fedssl.models.heads import (
    ClassifierHead,
    ProjectionHead,
    byol_predictor,
    byol_projector,
    cpcfl_classifier,
    moco_v3_predictor,
    moco_v3_projector,
    simclr_projector,
    simsiam_predictor,
    simsiam_projector,
)


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def layer_kinds(module: nn.Sequential) -> list[str]:
    return [type(m).__name__ for m in module]


def test_simclr_head_is_shared_with_encoders():
    assert EncodersProjectionHead is ProjectionHead
    head = simclr_projector(256)
    assert layer_kinds(head) == ["Linear", "ReLU", "Linear"]
    assert n_params(head) == 2 * (256 * 256 + 256) and head.out_dim == 256


def test_moco_v3_projector_and_predictor_layout():
    h = moco_v3_projector(192)
    assert layer_kinds(h) == ["Linear", "BatchNorm1d", "ReLU"] * 2 + ["Linear", "BatchNorm1d"]
    assert all(m.bias is None for m in h if isinstance(m, nn.Linear))
    assert not h[-1].affine  # MoCo v3's last BN has no scale / shift
    assert [m.out_features for m in h if isinstance(m, nn.Linear)] == [4096, 4096, 256]
    with torch.device("meta"):  # full size, no memory
        assert (
            n_params(moco_v3_projector(192))
            == (192 * 4096 + 4096 * 4096 + 4096 * 256 + 2 * 2 * 4096)
            == 18_628_608
        )
        assert n_params(moco_v3_predictor()) == 2 * 256 * 4096 + 2 * 4096 == 2_105_344
    p = moco_v3_predictor(256, hidden=32, out_dim=16)
    assert layer_kinds(p) == ["Linear", "BatchNorm1d", "ReLU", "Linear"]
    assert p(torch.randn(4, 256)).shape == (4, 16)


def test_byol_and_simsiam_heads_follow_cpcfl():
    proj, pred = byol_projector(256), byol_predictor()
    assert layer_kinds(proj) == ["Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d"]
    assert layer_kinds(pred) == ["Linear", "BatchNorm1d", "ReLU", "Linear"]
    assert [m.out_features for m in pred if isinstance(m, nn.Linear)] == [64, 512]  # bottleneck
    assert n_params(proj) == (256 * 512 + 512) + (512 * 512 + 512) + 2 * 2 * 512
    z = proj(torch.randn(8, 256))
    assert z.shape == (8, 512) and pred(z).shape == (8, 512)
    assert simsiam_projector is byol_projector and simsiam_predictor is byol_predictor


@pytest.mark.parametrize(
    "name,hidden,size",
    [
        ("c", [], 2_570),
        ("c-1", [256], 68_362),
        ("c-2", [256, 128], 99_978),
        ("c-3", [256, 128, 64], 107_594),  # the paper's θ_{c-3} ≈ 0.1M
    ],
)
def test_cpcfl_classifier_heads(name, hidden, size):
    head = cpcfl_classifier(name, in_dim=256, num_classes=10)
    linears = [m for m in head if isinstance(m, nn.Linear)]
    assert [m.out_features for m in linears] == hidden + [10]
    assert sum(isinstance(m, nn.ReLU) for m in head) == len(hidden)
    assert n_params(head) == size
    assert head(torch.randn(3, 256)).shape == (3, 10)


def test_classifier_head_rejects_unknown_name():
    with pytest.raises(ValueError, match="c-3"):
        cpcfl_classifier("c-4")
    assert isinstance(ClassifierHead(512, 10, [256]), nn.Sequential)


def test_model_modules_do_not_need_the_params_layer():
    # A fresh interpreter, so modules other tests imported do not hide a dependency.
    code = (
        "import sys, fedssl.models.vit, fedssl.models.heads, fedssl.models.cnn, "
        "fedssl.models.split; sys.exit('fedssl.params' in sys.modules or "
        "'pydantic' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
