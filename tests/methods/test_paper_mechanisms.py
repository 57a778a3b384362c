"""The papers' defining mechanisms that their value tests leave open (each kills a one-line
mutant of ``benchmarks/mutants.yaml``): MpFedcon's positive is the centre of each sample's own
class; MFCL exports each sample's twin views, in order, encoded together; a split-learning
client that missed a sync starts from the synced model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedssl.data.augment import BatchAugment
from fedssl.fl.cohort import Batch
from fedssl.methods.mfcl import run as mfcl
from fedssl.methods.mocosfl.sync import prefixed
from fedssl.methods.mpfedcon import run as R
from fedssl.methods.mpfedcon import train as T
from fedssl.stage.runtime import torch_generator
from tests.fixtures import toy_images
from tests.methods.mfcl import test_mfcl as mfcl_tests
from tests.methods.mocosfl import test_mocosfl as mocosfl_tests
from tests.methods.mpfedcon.test_mpfedcon import CPU, params


def test_mpfedcons_positive_is_the_global_centre_of_each_samples_own_class():
    p = params("mpfedcon", mu=2.0)
    model = R.seeded_model(p, (1, 28, 28), 4, CPU)
    images, labels = toy_images(12, 0)
    assert len(set(labels.tolist())) > 1
    state = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    for k in [k for k in state if k.startswith("anchor.")]:
        state[k] = state[k] + 0.1 * torch.randn(state[k].shape, generator=g)
    weights = {k: v for k, v in state.items() if k not in ("centres", "has_centre")}
    buffers = {"centres": torch.randn(4, 8, generator=g), "has_centre": torch.ones(4)}
    x, y = torch.from_numpy(images[:, None]).float() / 255, torch.from_numpy(labels)
    batch = Batch((x,), y, torch.ones(12, dtype=torch.bool))
    logits, z, z_con = torch.func.functional_call(model, (weights, buffers), (x, True))
    pos = F.cosine_similarity(z, buffers["centres"][y]) / 0.5
    neg = F.cosine_similarity(z, z_con) / 0.5
    l_con = (torch.logsumexp(torch.stack([pos, neg]), 0) - pos).mean()
    expected = F.cross_entropy(logits, y) + 2.0 * l_con
    got = T.contrast_loss(2.0, 0.5)(model, weights, buffers, batch)
    assert torch.allclose(got, expected, atol=1e-5)


def test_mfcl_exports_each_samples_twin_views_in_order_through_the_frozen_client_module():
    """Pair r of sample i holds [view 1, view 2] of that sample, encoded together (Twin Norm
    pairs rows k and k + K), from the generator of (seed, client, pair, chunk)."""
    exp = mfcl_tests.tiny_exp()
    images, clients, _ = mfcl_tests.toy_clients()
    model = mfcl.build_client_module(exp.method, (1, 28, 28), torch.device("cpu"))
    augment = BatchAugment(exp.method.augment, 28)
    idx = clients[0][:16]
    reps = mfcl.export_client(model, images, idx, augment, pairs=2, batch=16, seed=3, client=5)
    model.eval()
    for r in range(2):
        gen = torch_generator(images.device, 3, "export", 5, r, 0)
        v1, v2 = mfcl.twin_batch(augment)(images[torch.as_tensor(idx)], gen)
        with torch.no_grad():
            z = model.encode(torch.cat([v1, v2])).to(torch.float16)
        assert torch.equal(reps[:, r, 0], z[:16]) and torch.equal(reps[:, r, 1], z[16:])


@pytest.mark.parametrize("variant", ["mocosfl", "monacosfl"])
def test_a_trained_sfl_client_that_missed_a_sync_starts_from_the_synced_model(tmp_path, variant):
    fed = mocosfl_tests.federation(mocosfl_tests.params(variant), tmp_path)
    state = fed.start(None)
    s = fed.strategy
    init = state.server["client_init"]
    own = {k: v + 1 for k, v in init.items()}  # what client 0 trained, before the last sync
    state.clients[0] = {
        **prefixed(own, "online"),
        **prefixed({k: v + 2 for k, v in init.items()}, "momentum"),
        **prefixed({k: torch.zeros_like(v) for k, v in init.items()}, "opt"),
        "sync_id": torch.tensor(0),
    }
    synced = {k: v - 1 for k, v in init.items()}
    state.server["sync"].update(prefixed(synced, "online"))
    state.server["sync"].update(prefixed({k: v - 3 for k, v in init.items()}, "momentum"))
    state.server["sync"]["count"] = torch.tensor(1)
    start = s.client_start(state, 0)
    assert all(torch.equal(start["online"][k], v) for k, v in synced.items())
    momentum = {k: v - 3 if variant == "monacosfl" else v + 2 for k, v in init.items()}
    assert all(torch.equal(start["momentum"][k], v) for k, v in momentum.items())
    state.clients[0]["sync_id"] = torch.tensor(1)  # it saw that sync: it keeps its own
    assert all(torch.equal(s.client_start(state, 0)["online"][k], v) for k, v in own.items())
