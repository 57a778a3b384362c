"""ViT for LW-FedSSL (spec lw-fedssl.md §2, §5, §8.1-8.2): sizes, shapes, growth, freezing."""

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from fedssl.models.vit import TransformerBlock, VisionTransformer, sincos_2d, vit_tiny


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def tiny(**kw) -> VisionTransformer:
    """Width 32, 2 heads, patch 4 on 16x16: 16 patches; enough to exercise every path fast."""
    settings = dict(image_size=16, patch_size=4, width=32, depth=2, heads=2, mlp_ratio=2.0)
    settings.update(kw)
    return VisionTransformer(**settings)


def test_one_vit_tiny_block_has_444864_parameters():
    # 2 LayerNorms (2*384) + qkv (192*576+576) + proj (192*192+192)
    # + MLP (192*768+768 + 768*192+192)
    assert n_params(TransformerBlock(192, 3, 4.0)) == 444_864


def test_vit_tiny_parameter_count_and_fp32_size():
    with torch.device("meta"):
        model = vit_tiny()
        mean_pooled = vit_tiny(pool="mean")
    # 12 blocks + patch conv (3*4*4*192 + 192) + final LayerNorm (384) + CLS token (192)
    assert n_params(model) == 12 * 444_864 + 9_408 + 384 + 192 == 5_348_352
    assert n_params(mean_pooled) == 5_348_352 - 192
    assert round(n_params(model) * 4 / 2**20, 1) == 20.4  # the spec's "~20.4 MiB" (fp32)
    assert len(model.blocks) == model.depth == 12
    assert model.num_patches == 64 and model.out_dim == 192


def test_position_embedding_is_fixed_2d_sincos_buffer():
    model = tiny()
    assert all("pos" not in name for name, _ in model.named_parameters())
    assert "pos_embed" not in model.state_dict()
    emb = sincos_2d(3, 5, 16)  # row-major grid: token r*5 + c
    assert emb.shape == (15, 16)
    grid = emb.reshape(3, 5, 16)
    # the first half depends on the row only, the second half on the column only
    torch.testing.assert_close(grid[:, :, :8], grid[:, :1, :8].expand(3, 5, 8))
    torch.testing.assert_close(grid[:, :, 8:], grid[:1, :, 8:].expand(3, 5, 8))
    # position 0: sin(0) = 0 and cos(0) = 1 at every frequency
    torch.testing.assert_close(emb[0], torch.tensor([0.0] * 4 + [1.0] * 4 + [0.0] * 4 + [1.0] * 4))
    assert torch.unique(emb, dim=0).shape[0] == 15


@pytest.mark.parametrize("pool,tokens", [("cls", 17), ("mean", 16)])
def test_forward_shapes(pool, tokens):
    model = tiny(pool=pool)
    x = torch.randn(3, 3, 16, 16)
    assert model.tokens(x).shape == (3, tokens, 32)
    assert model(x).shape == (3, model.out_dim) == (3, 32)
    assert (model.cls_token is None) == (pool == "mean")


def test_mean_pool_is_mean_of_tokens_and_cls_pool_is_first_token():
    x = torch.randn(2, 3, 16, 16)
    mean_model, cls_model = tiny(pool="mean"), tiny(pool="cls")
    torch.testing.assert_close(mean_model(x), mean_model.tokens(x).mean(1))
    torch.testing.assert_close(cls_model(x), cls_model.tokens(x)[:, 0])


def test_forward_runs_only_the_first_depth_blocks():
    torch.manual_seed(0)
    model = tiny(depth=3)
    x = torch.randn(2, 3, 16, 16)
    model.depth = 1
    expected = model.norm(model.blocks[0](model.embed(x)))[:, 0]
    torch.testing.assert_close(model(x), expected)
    with torch.no_grad():  # blocks beyond depth must not matter
        for p in model.blocks[1].parameters():
            p.add_(1.0)
    torch.testing.assert_close(model(x), expected)
    model.depth = 0  # patch embedding + final LayerNorm only
    torch.testing.assert_close(model(x), model.norm(model.embed(x))[:, 0])
    with pytest.raises(ValueError):
        model.depth = 4


def test_add_block_copies_the_previous_block():
    torch.manual_seed(0)
    model = tiny(depth=2)
    with torch.no_grad():  # make the last block distinct from a fresh one
        for p in model.blocks[1].parameters():
            p.add_(torch.randn_like(p))
    model.freeze(blocks=[0, 1])
    new = model.add_block()
    assert len(model.blocks) == model.depth == 3 and model.blocks[2] is new
    old_state, new_state = model.blocks[1].state_dict(), new.state_dict()
    for name in old_state:
        torch.testing.assert_close(new_state[name], old_state[name])
        assert new_state[name].data_ptr() != old_state[name].data_ptr()  # a copy, not shared
    assert all(p.requires_grad for p in new.parameters())  # copied from a frozen block
    assert not any(p.requires_grad for p in model.blocks[1].parameters())
    model(torch.randn(1, 3, 16, 16)).sum().backward()
    assert all(p.grad is not None for p in new.parameters())


def test_growing_from_no_blocks_starts_fresh_then_transfers():
    model = tiny(depth=0)
    x = torch.randn(2, 3, 16, 16)
    assert model(x).shape == (2, 32)
    first = model.add_block()
    ref = TransformerBlock(32, 2, 2.0)
    assert n_params(first) == n_params(ref)
    second = model.add_block()
    for a, b in zip(first.parameters(), second.parameters()):
        torch.testing.assert_close(a, b)
    assert model.depth == 2 and model(x).shape == (2, 32)


def test_frozen_blocks_and_patch_embedding_get_no_grad():
    model = tiny(depth=3)
    model.freeze(patch_embed=True)
    model.freeze_blocks_before(2)
    model(torch.randn(2, 3, 16, 16)).pow(2).sum().backward()
    for module in (model.patch_embed, model.blocks[0], model.blocks[1]):
        assert all(p.grad is None for p in module.parameters())
    assert model.cls_token.grad is None
    for module in (model.blocks[2], model.norm):
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())
    model.unfreeze()
    assert all(p.requires_grad for p in model.parameters())


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match="patches"):
        tiny(image_size=18)
    with pytest.raises(ValueError, match="heads"):
        tiny(width=32, heads=3)
    with pytest.raises(ValueError, match="% 4"):
        tiny(width=30, heads=2)
    with pytest.raises(ValueError, match="pool"):
        tiny(pool="max")


def test_non_square_images():
    model = tiny(image_size=(16, 8), pool="mean")
    assert model.num_patches == 8
    assert model(torch.randn(2, 3, 16, 8)).shape == (2, 32)


def test_skipped_blocks_are_passed_over():
    torch.manual_seed(0)
    model = tiny(depth=3)
    x = torch.randn(2, 3, 16, 16)
    expected = model.norm(model.blocks[2](model.blocks[0](model.embed(x))))[:, 0]
    torch.testing.assert_close(model(x, skip={1}), expected)
    assert not torch.allclose(model(x), expected)


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # SDPA's vmap fallback
def test_clients_vmap_over_stacked_vit_parameters():
    # No BatchNorm: several client models can run at once with torch.func (DESIGN: speed).
    torch.manual_seed(0)
    models = [tiny(pool="mean") for _ in range(3)]
    params, buffers = stack_module_state(models)
    skeleton = copy.deepcopy(models[0]).to("meta")
    x = torch.randn(3, 2, 3, 16, 16)
    out = vmap(lambda p, b, xi: functional_call(skeleton, (p, b), (xi,)))(params, buffers, x)
    expected = torch.stack([m(xi) for m, xi in zip(models, x)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
