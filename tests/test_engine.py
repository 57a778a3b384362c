"""The federated engine: FedAvg, byte accounting, sampling, resume, vectorised clients."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedssl.data.augment import to_float
from fedssl.fl.cohort import CohortTrainer, OptimizerConfig
from fedssl.fl.engine import Federation, FederationConfig, fedavg, sample_clients, split_state
from fedssl.methods.fedsimclr import simclr_loss
from fedssl.models.encoders import ContrastiveModel
from fedssl.params import ModelParams

SHAPE = (1, 28, 28)


def tiny_model(norm: str = "gn", seed: int = 0) -> ContrastiveModel:
    torch.manual_seed(seed)
    return ContrastiveModel(ModelParams(arch="small_cnn", norm=norm, channels_per_group=4,
                                        width=4, proj_hidden=16, proj_dim=8), SHAPE)


def toy_data(n: int = 90, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, *SHAPE), dtype=torch.uint8, generator=g)
    clients = [np.arange(0, 20), np.arange(20, 50), np.arange(50, 90)]  # unequal sizes
    return images, clients


def noisy_views(batch, generator):
    """Two views that differ by seeded noise (cheap, deterministic given the generator)."""
    x = to_float(batch)
    return (x + 0.05 * torch.randn(x.shape, generator=generator),
            x + 0.05 * torch.randn(x.shape, generator=generator))


def identity_views(batch, generator):
    x = to_float(batch)
    return x, x.flip(-1)


def make_fed(model, images, clients, tmp_path, rounds=3, parallel=False, fraction=1.0,
             views=noisy_views):
    trainer = CohortTrainer(model, views, simclr_loss(0.5), OptimizerConfig("adam"),
                            batch_size=16, local_epochs=1, parallel=parallel)
    cfg = FederationConfig(rounds=rounds, client_fraction=fraction, lr=1e-3, seed=0)
    return Federation(trainer, clients, images, cfg, tmp_path / "ckpt.pt", "fp")


def test_fedavg_weights_by_data_size_and_keeps_integer_buffers():
    stacked = {"w": torch.tensor([[1.0, 2.0], [3.0, 6.0]]), "n": torch.tensor([4, 7])}
    avg = fedavg(stacked, torch.tensor([1.0, 3.0], dtype=torch.float64))
    assert torch.allclose(avg["w"], torch.tensor([2.5, 5.0]))
    assert avg["n"].item() == 7


def test_client_sampling_by_fraction_is_seeded():
    a = sample_clients(10, 0.3, seed=1, round_=5)
    assert len(a) == 3 and a == sample_clients(10, 0.3, seed=1, round_=5)
    assert len({tuple(sample_clients(10, 0.3, 1, r)) for r in range(10)}) > 1


def test_rounds_train_and_account_bytes(tmp_path):
    images, clients = toy_data()
    model = tiny_model()
    fed = make_fed(model, images, clients, tmp_path, rounds=3, fraction=2 / 3)
    state = fed.run(fed.start(model))
    params, buffers = split_state(model)
    state_bytes = sum(t.numel() * t.element_size() for t in {**params, **buffers}.values())
    assert state.round == 3 and len(state.log) == 3
    assert all(row["clients"] == 2 for row in state.log)
    assert sum(state.ledger.rounds) == 6
    for up, down, r in zip(state.ledger.bytes_up, state.ledger.bytes_down, state.ledger.rounds):
        assert up == down == r * state_bytes
    assert not torch.equal(state.params["backbone.0.0.weight"], params["backbone.0.0.weight"])


def test_killed_run_resumes_to_the_same_result(tmp_path):
    images, clients = toy_data()
    full_model = tiny_model()
    full = make_fed(full_model, images, clients, tmp_path / "a", rounds=3)
    (tmp_path / "a").mkdir()
    uninterrupted = full.run(full.start(full_model))

    (tmp_path / "b").mkdir()
    model = tiny_model()
    fed = make_fed(model, images, clients, tmp_path / "b", rounds=3)

    def kill_after_round_2(state):
        if state.round == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fed.run(fed.start(model), on_round=kill_after_round_2)
    fresh = tiny_model(seed=123)  # a new process would rebuild the model; the checkpoint wins
    again = make_fed(fresh, images, clients, tmp_path / "b", rounds=3)
    start = again.start(fresh)
    assert start.round == 2
    resumed = again.run(start)
    for k in uninterrupted.params:
        assert torch.equal(uninterrupted.params[k], resumed.params[k]), k
    assert uninterrupted.ledger == resumed.ledger


def test_checkpoint_of_other_params_is_ignored(tmp_path):
    images, clients = toy_data()
    model = tiny_model()
    fed = make_fed(model, images, clients, tmp_path, rounds=1)
    fed.run(fed.start(model))
    fed.fingerprint = "other params"
    assert fed.start(model).round == 0


def test_vectorised_clients_match_one_by_one():
    """Same batches, same result. SGD keeps float noise at float size (Adam's first steps move a
    near-zero-gradient weight by +-lr whatever the sign noise, so it cannot be compared tightly);
    clients of unequal sizes exercise the padded, partly-active steps."""
    images, clients = toy_data()
    model = tiny_model()
    params, buffers = split_state(model)
    results = {}
    for parallel in (True, False):
        trainer = CohortTrainer(model, identity_views, simclr_loss(0.5), OptimizerConfig("sgd"),
                                batch_size=16, local_epochs=2, parallel=parallel)
        assert trainer.parallel == parallel
        results[parallel] = trainer.train(params, buffers, clients, [0, 1, 2], images, 0.05,
                                          (0, "local", 0), torch.Generator().manual_seed(0))
    (p_par, _, loss_par), (p_seq, _, loss_seq) = results[True], results[False]
    assert torch.allclose(loss_par, loss_seq, atol=1e-5)
    for k in p_par:
        assert torch.allclose(p_par[k], p_seq[k], atol=2e-5), k
    # the clients really trained apart: their weights differ from each other
    assert not torch.allclose(p_par["head.2.weight"][0], p_par["head.2.weight"][2])


def test_batchnorm_models_train_one_by_one_and_average_running_stats(tmp_path):
    images, clients = toy_data()
    model = tiny_model(norm="bn")
    trainer = CohortTrainer(model, noisy_views, simclr_loss(0.5), OptimizerConfig("sgd"),
                            batch_size=16, local_epochs=1, parallel=True)
    assert not trainer.parallel  # BN running statistics rule out vmap
    params, buffers = split_state(model)
    p, b, _ = trainer.train(params, buffers, clients, [0, 1, 2], images, 0.1, (0,),
                            torch.Generator().manual_seed(0))
    key = "backbone.0.1.running_mean"
    assert not torch.allclose(b[key][0], b[key][1])  # each client saw its own batches
    sizes = torch.tensor([20.0, 30.0, 40.0], dtype=torch.float64)
    expected = (b[key] * (sizes / sizes.sum()).float()[:, None]).sum(0)
    assert torch.allclose(fedavg(b, sizes)[key], expected, atol=1e-6)


def test_twin_norm_autoencoder_clients_vectorise_like_one_by_one():
    """MFCL phase 1: Twin-Norm client modules train together under vmap, padded pairs and all."""
    from fedssl.methods.mfcl import autoencoder_loss
    from fedssl.models.autoencoder import ClientAutoencoder
    images, clients = toy_data()
    torch.manual_seed(0)
    model = ClientAutoencoder("resnet18", in_channels=1, width=8, norm="tn", channels_per_group=4)
    params, buffers = split_state(model)
    results = {}
    for parallel in (True, False):
        trainer = CohortTrainer(model, identity_views, autoencoder_loss(),
                                OptimizerConfig("sgd"), batch_size=16, local_epochs=1,
                                parallel=parallel)
        results[parallel] = trainer.train(params, buffers, clients, [0, 1, 2], images, 0.1,
                                          (0,), torch.Generator().manual_seed(0))
    for k in params:
        assert torch.allclose(results[True][0][k], results[False][0][k], atol=2e-5), k
    assert torch.allclose(results[True][2], results[False][2], atol=1e-5)
