"""CP-CFL encoder, MpFedcon's layered networks and the iDLG LeNet: sizes, shapes, structure."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedssl.models.cnn import (
    CNNCifarBase,
    CPCFLEncoder,
    LeNet,
    MLPBase,
    layered_net,
    mpfedcon_cifar_net,
    mpfedcon_femnist_net,
)


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_cpcfl_encoder_at_96px_has_2378304_parameters():
    enc = CPCFLEncoder((3, 96, 96))
    assert enc.flat_dim == 256 * 5 * 5  # maps 47 -> 23 -> 11 -> 5
    assert n_params(enc) == 2_378_304  # spec §2: paper's θ_f ≈ 2.4M
    assert enc(torch.rand(2, 3, 96, 96)).shape == (2, enc.out_dim) == (2, 256)


def test_cpcfl_same_padding_is_the_3_1M_alternative():
    enc = CPCFLEncoder((3, 96, 96), padding="same")
    assert enc.flat_dim == 256 * 6 * 6  # 48 -> 24 -> 12 -> 6
    assert n_params(enc) == 3_099_200


def test_cpcfl_encoder_at_32px():
    enc = CPCFLEncoder((3, 32, 32))
    assert enc.flat_dim == 256  # 15 -> 7 -> 3 -> 1 (spec §10 smoke scale)
    assert n_params(enc) == 2_378_304 - 6400 * 256 + 256 * 256 == 805_440
    out = enc(torch.rand(4, 3, 32, 32))
    assert out.shape == (4, 256) and (out >= 0).all()  # ends with ReLU


def test_cpcfl_encoder_28px_grayscale_needs_same_padding():
    with pytest.raises(ValueError, match="same"):
        CPCFLEncoder((1, 28, 28))  # 13 -> 6 -> 2 -> 0 with 'valid'
    enc = CPCFLEncoder((1, 28, 28), padding="same")
    assert enc.flat_dim == 256 * 2 * 2  # 14 -> 7 -> 4 -> 2
    assert enc(torch.rand(3, 1, 28, 28)).shape == (3, 256)


def test_cnncifar_base_and_fedrep_network_sizes():
    base = CNNCifarBase((3, 32, 32))
    assert base.flat_dim == 1600 and base.out_dim == 64
    assert n_params(base) == 307_192  # D alone: 1.23 MB in fp32, the 1.2 MB MpFedcon sends
    fedrep = layered_net(CNNCifarBase((3, 32, 32)), 10, projection=None)
    assert n_params(fedrep) == 307_842  # FedRep's CNNCifar (spec §2)


def test_mpfedcon_cifar_net_d_p_o_sizes_and_shapes():
    net = mpfedcon_cifar_net(10)
    sizes = {part: n_params(getattr(net, part)) for part in ("base", "projector", "output")}
    assert sizes == {
        "base": 307_192,
        "projector": 64 * 128 + 128 + 128 * 128 + 128,
        "output": 128 * 10 + 10,
    }
    assert n_params(net) == 333_314
    x = torch.rand(5, 3, 32, 32)
    assert net.project(x).shape == (5, 128)
    assert net(x).shape == (5, 10)
    torch.testing.assert_close(net(x), net.output(net.projector(net.base(x))))
    prefixes = {name.split(".")[0] for name, _ in net.named_parameters()}
    assert prefixes == {"base", "projector", "output"}


def test_cnncifar_base_follows_the_input_shape():
    base = CNNCifarBase((1, 28, 28))
    assert base.flat_dim == 64 * 4 * 4  # 24 -> 12 -> 8 -> 4
    assert base(torch.rand(2, 1, 28, 28)).shape == (2, 64)
    small = CNNCifarBase((3, 32, 32), conv_channels=(16, 32), hidden=(64,))
    assert small.flat_dim == 32 * 25 and small.out_dim == 64


def test_femnist_mlp_base():
    base = MLPBase((1, 28, 28))
    assert n_params(base) == 784 * 512 + 512 + 512 * 256 + 256 == 533_248
    assert base.out_dim == 256
    net = mpfedcon_femnist_net(10)
    assert net.project(torch.rand(3, 1, 28, 28)).shape == (3, 128)
    assert net(torch.rand(3, 1, 28, 28)).shape == (3, 10)


def test_lenet_sizes():
    net = LeNet(10, (3, 32, 32))
    assert net.flat_dim == 768  # 12 channels at 8x8: 32 -> 16 -> 8 -> 8
    assert n_params(net) == 912 + 3612 + 3612 + 7690 == 15_826
    assert net(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    gray = LeNet(10, (1, 28, 28))
    assert gray.flat_dim == 12 * 7 * 7
    deeper = LeNet(10, (3, 32, 32), hidden=(256, 128))
    assert [m.out_features for m in deeper.classifier if isinstance(m, nn.Linear)] == [256, 128, 10]
    assert sum(isinstance(m, nn.Sigmoid) for m in deeper.modules()) == 5


def test_lenet_uniform_init_and_idlg_label_signal():
    torch.manual_seed(0)
    net = LeNet(10, (3, 32, 32))
    assert all(p.abs().max() <= 0.5 for p in net.parameters())
    # Sigmoid features are positive, so the last layer's weight gradient of CE on one image is
    # negative exactly in the true label's row: the signal iDLG reads (MpFedcon §4.4).
    x, label = torch.rand(1, 3, 32, 32), torch.tensor([7])
    F.cross_entropy(net(x), label).backward()
    grad = net.classifier[-1].weight.grad
    assert (grad[7] < 0).all()
    assert (torch.cat([grad[:7], grad[8:]]) > 0).all()
