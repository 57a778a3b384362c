"""Split ResNet-18 / MobileNetV2 (spec monacosfl.md §2): cuts, shapes, layer counts, WS, GN."""

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from fedssl.models.norms import has_running_stats
from fedssl.models.split import (
    SplitMobileNetV2,
    SplitResNet,
    WSConv2d,
    round_channels,
    split_resnet18,
)


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def main_path_convs(module: nn.Module) -> int:
    """Convs that are weighted layers in the paper's count (projection shortcuts excluded)."""
    return sum(
        isinstance(m, nn.Conv2d) and "shortcut" not in name for name, m in module.named_modules()
    )


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return split_resnet18(width=8).eval()


@pytest.fixture(scope="module")
def mobilenet():
    torch.manual_seed(0)
    return SplitMobileNetV2(width_mult=0.25).eval()


def test_full_size_parameter_counts():
    with torch.device("meta"):
        # GN has BN's 2 affine parameters per channel: the usual CIFAR ResNet-18 without its
        # 10-class fc (11,173,962 - 5,130) and torchvision's MobileNetV2 features
        # (3,504,872 - 1,281,000 for the 1000-class classifier).
        assert n_params(split_resnet18()) == 11_168_832
        assert n_params(SplitMobileNetV2()) == 2_223_872
    assert split_resnet18().out_dim == 512 and SplitMobileNetV2().out_dim == 1280


def test_no_batchnorm_only_groupnorm_and_ws_convs(resnet, mobilenet):
    for model in (resnet, mobilenet):
        assert not has_running_stats(model)
        assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
        convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
        assert convs and all(isinstance(m, WSConv2d) for m in convs)
        norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
        assert len(norms) == len(convs)
        assert all(m.num_channels // m.num_groups == 4 for m in norms)  # [code] 4 channels/group


def test_resnet_cut_k_holds_2k_minus_1_weighted_layers(resnet):
    assert resnet.num_cuts == 9
    assert main_path_convs(resnet) == 17  # + 3 projection shortcuts
    for k in range(1, 10):
        client, server = resnet.split(k)
        assert main_path_convs(client) == 2 * k - 1 == resnet.paper_layer_index(k)
        assert main_path_convs(client) + main_path_convs(server) == 17
        assert resnet.cut_for_paper_layer(2 * k - 1) == k
    with pytest.raises(ValueError):
        resnet.paper_layer_index(10)
    with pytest.raises(ValueError):
        resnet.cut_for_paper_layer(10)


@pytest.mark.parametrize("arch", ["resnet", "mobilenet"])
def test_client_then_server_equals_full_forward(arch, resnet, mobilenet):
    model = resnet if arch == "resnet" else mobilenet
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        full = model(x)
        assert full.shape == (2, model.out_dim)
        for cut in range(model.num_cuts + 1):
            client, server = model.split(cut)
            assert server.out_dim == model.out_dim
            torch.testing.assert_close(server(client(x)), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "arch,stem,image_shape",
    [
        ("resnet", "cifar", (3, 16, 16)),
        ("resnet", "imagenet", (3, 33, 30)),
        ("mobilenet", "cifar", (3, 16, 16)),
        ("mobilenet", "imagenet", (3, 35, 29)),
    ],
)
def test_cut_activation_shape_matches_client_output(arch, stem, image_shape):
    torch.manual_seed(0)
    if arch == "resnet":
        model = SplitResNet(width=4, blocks_per_stage=(1, 1, 1, 1), stem=stem)
    else:
        model = SplitMobileNetV2(width_mult=0.25, stem=stem)
    x = torch.randn(1, *image_shape)
    with torch.no_grad():
        for cut in range(model.num_cuts + 1):
            client, _ = model.split(cut)
            assert client(x).shape[1:] == model.cut_activation_shape(cut, image_shape)


def test_known_cut_shapes_at_32px(resnet, mobilenet):
    # ResNet-18 width 8: stem 8x32x32; blocks 2-3 halve to 16x16, 4-5 to 8x8, 6-7 to 4x4
    assert resnet.cut_activation_shape(1, (3, 32, 32)) == (8, 32, 32)
    assert resnet.cut_activation_shape(6, (3, 32, 32)) == (32, 8, 8)  # the paper's L = 11
    assert resnet.cut_activation_shape(9, (3, 32, 32)) == (64, 4, 4)
    # MobileNetV2 CIFAR variant: strides 1 (stem), 1, 1, 2, 2, 1, 2, 1 -> 4x4 at the end
    full = SplitMobileNetV2()
    expected_channels = [32, 16, 24, 32, 64, 96, 160, 320, 1280]
    expected_side = [32, 32, 32, 16, 8, 8, 4, 4, 4]
    for k in range(1, 10):
        c, h, w = full.cut_activation_shape(k, (3, 32, 32))
        assert (c, h, w) == (expected_channels[k - 1], expected_side[k - 1], expected_side[k - 1])


def test_weight_standardisation_zero_mean_unit_variance():
    torch.manual_seed(0)
    for conv in (WSConv2d(16, 32, 3), WSConv2d(512, 8, 3), WSConv2d(12, 12, 3, groups=12)):
        with torch.no_grad():  # arbitrary per-channel offsets and scales on the raw weights
            conv.weight.mul_(torch.rand(conv.out_channels, 1, 1, 1) * 10).add_(
                torch.randn(conv.out_channels, 1, 1, 1)
            )
        w = conv.standardized_weight().flatten(1)
        torch.testing.assert_close(w.mean(1), torch.zeros(conv.out_channels), atol=1e-5, rtol=0)
        torch.testing.assert_close(
            w.var(1, correction=0), torch.ones(conv.out_channels), atol=1e-4, rtol=0
        )


def test_ws_conv_ignores_per_channel_affine_changes_of_raw_weights():
    torch.manual_seed(0)
    conv = WSConv2d(4, 6, 3, padding=1, bias=False)
    x = torch.randn(2, 4, 8, 8)
    before = conv(x)
    with torch.no_grad():
        conv.weight.mul_(3.0).add_(torch.randn(6, 1, 1, 1))
    torch.testing.assert_close(conv(x), before, atol=1e-4, rtol=1e-4)
    plain = nn.Conv2d(4, 6, 3, padding=1, bias=False)
    with torch.no_grad():
        plain.weight.copy_(conv.standardized_weight())
    torch.testing.assert_close(plain(x), conv(x))


def test_split_shares_parameters_and_trains_both_sides(resnet):
    client, server = resnet.split(4)
    shared = {id(p) for p in resnet.parameters()}
    assert {id(p) for p in client.parameters()} | {id(p) for p in server.parameters()} == shared
    assert not {id(p) for p in client.parameters()} & {id(p) for p in server.parameters()}
    model = SplitResNet(width=4, blocks_per_stage=(1, 1, 1, 1))
    client, server = model.split(3)
    smashed = client(torch.randn(2, 3, 8, 8))
    sent = smashed.detach().requires_grad_(True)  # what crosses the network
    server(sent).sum().backward()
    smashed.backward(sent.grad)  # the gradient sent back to the client
    assert all(p.grad is not None for p in client.parameters())
    assert all(p.grad is not None for p in server.parameters())


def test_bad_arguments(resnet):
    with pytest.raises(ValueError, match="cut"):
        resnet.split(10)
    with pytest.raises(ValueError, match="stem"):
        SplitResNet(width=4, stem="tiny")
    assert [round_channels(c) for c in (32 * 0.25, 16 * 0.25, 1280 * 0.5, 20)] == [8, 8, 640, 24]


def test_client_parts_vmap_over_stacked_parameters():
    # GN + WS, no running stats: many clients' bottom parts can run at once with torch.func.
    torch.manual_seed(0)
    clients = [SplitResNet(width=4, blocks_per_stage=(1, 1, 1, 1)).split(3)[0] for _ in range(3)]
    params, buffers = stack_module_state(clients)
    skeleton = copy.deepcopy(clients[0]).to("meta")
    x = torch.randn(3, 2, 3, 8, 8)
    out = vmap(lambda p, b, xi: functional_call(skeleton, (p, b), (xi,)))(params, buffers, x)
    expected = torch.stack([c(xi) for c, xi in zip(clients, x)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
