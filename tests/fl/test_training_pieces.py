"""The shared training pieces: the precision policy, multi-view batches, masked cross-entropy,
the resumable epoch loop (exact resume, checkpoints of other params ignored, crafted pickles
refused, divergence stops) and the fine-tune on top of it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedssl.data.augment import BatchAugment, multi_view
from fedssl.losses import masked_cross_entropy
from fedssl.params import AugmentParams, FinetuneParams
from fedssl.precision import autocast_dtype, channels_last, policy, under_policy
from fedssl.stage.runtime import StageFailed, derive_seed, load_checkpoint
from fedssl.training.epochs import run_epochs, train_mode_batches


# ------------------------------------------------------------------ precision policy
def test_auto_keeps_a_cpu_without_native_bf16_in_fp32_and_puts_cuda_in_bf16(monkeypatch):
    from fedssl import precision

    monkeypatch.setattr(precision, "native_bf16", lambda device_type: device_type == "cuda")
    with precision.policy("auto"):
        assert autocast_dtype("cpu") is None and channels_last()  # fp32, channels-last
        assert autocast_dtype(torch.device("cuda")) is torch.bfloat16
    assert autocast_dtype("cuda", "fp32") is None and not channels_last("fp32")
    assert autocast_dtype("cpu", "bf16") is torch.bfloat16
    with pytest.raises(ValueError, match="precision 'fp16'"):
        autocast_dtype("cpu", "fp16")


def test_fp32_under_the_policy_changes_nothing_and_bf16_is_honoured():
    torch.manual_seed(0)
    layer, x = nn.Linear(8, 4), torch.randn(5, 8)
    out = under_policy(x, layer, x)
    assert out.dtype == torch.float32 and torch.equal(out, layer(x))
    with policy("bf16"):
        assert under_policy(x, layer, x).dtype == torch.bfloat16
        assert layer(x).dtype == torch.float32  # only what runs under the policy


# ------------------------------------------------------------------ multi-view batches
def test_views_are_drawn_in_order_from_one_generator():
    images = torch.randint(0, 256, (6, 3, 16, 16), dtype=torch.uint8)
    weak = BatchAugment(AugmentParams(), 12)
    strong = BatchAugment(AugmentParams(blur_p=1.0, solarize_p=0.5), 12)
    gen = torch.Generator().manual_seed(3)
    expected = (weak(images, gen), strong(images, gen))
    got = multi_view(weak, strong)(images, torch.Generator().manual_seed(3))
    assert len(got) == 2 and all(torch.equal(a, b) for a, b in zip(got, expected))
    twins = multi_view(weak, views=3)(images, torch.Generator().manual_seed(3))
    assert len(twins) == 3 and torch.equal(twins[0], expected[0])
    assert not torch.equal(twins[0], twins[1])  # each view draws its own parameters
    with pytest.raises(ValueError):
        multi_view(weak, strong, views=2)


# ------------------------------------------------------------------ masked cross-entropy
def test_masked_cross_entropy_is_the_mean_over_real_rows_only():
    torch.manual_seed(1)
    logits, labels = torch.randn(6, 5), torch.tensor([0, 4, 2, -1, 1, -1])
    valid = labels >= 0
    reference = F.cross_entropy(logits[valid], labels[valid])
    assert torch.allclose(masked_cross_entropy(logits, labels, valid), reference)
    poisoned = logits.clone()
    poisoned[~valid] = float("nan")  # a padded row cannot leak into the value
    assert torch.allclose(masked_cross_entropy(poisoned, labels, valid), reference)
    assert masked_cross_entropy(logits, labels, torch.zeros(6, dtype=torch.bool)) == 0
    assert torch.allclose(
        masked_cross_entropy(logits, labels.clamp(min=0)),
        F.cross_entropy(logits, labels.clamp(min=0)),
    )


# ------------------------------------------------------------------ the epoch loop
class Toy:
    """A seeded regression trained with Adam, its batches drawn from seeds named by epoch."""

    def __init__(self, epochs: int = 5, stop_at: int | None = None, nan_at: int | None = None):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.opt = torch.optim.Adam(self.model.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(64, 4, generator=g)
        self.y = self.x.sum(1, keepdim=True) ** 2
        self.epochs, self.stop_at, self.nan_at = epochs, stop_at, nan_at
        self.ran: list[int] = []

    def one_epoch(self, epoch: int) -> dict:
        if epoch == self.stop_at:
            raise KeyboardInterrupt  # a kill between two epochs
        self.ran.append(epoch)
        order = torch.randperm(
            64, generator=torch.Generator().manual_seed(derive_seed("toy", epoch))
        )
        total = 0.0
        for idx in order.split(16):
            loss = F.mse_loss(self.model(self.x[idx]), self.y[idx])
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            total += loss.item()
        return {"epoch": epoch + 1, "loss": float("nan") if epoch == self.nan_at else total}

    def run(self, ckpt, fingerprint="fp"):
        return run_epochs(
            self.epochs,
            self.one_epoch,
            {"model": self.model, "opt": self.opt},
            ckpt,
            fingerprint,
            name="toy",
        )


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_an_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path):
    whole = Toy()
    whole_log = whole.run(None)
    killed = Toy(stop_at=3)
    with pytest.raises(KeyboardInterrupt):
        killed.run(tmp_path / "ck.pt")
    resumed = Toy()
    log = resumed.run(tmp_path / "ck.pt")
    assert resumed.ran == [3, 4]  # only the epochs not yet done
    assert log == whole_log and same_weights(resumed.model, whole.model)
    assert (
        resumed.opt.state_dict()["state"][0]["step"] == whole.opt.state_dict()["state"][0]["step"]
    )


def test_a_checkpoint_of_other_params_is_ignored(tmp_path):
    Toy().run(tmp_path / "ck.pt", fingerprint="other params")
    again = Toy()
    log = again.run(tmp_path / "ck.pt", fingerprint="fp")
    fresh = Toy()
    assert again.ran == [0, 1, 2, 3, 4] and log == fresh.run(None)
    assert same_weights(again.model, fresh.model)
    assert load_checkpoint(tmp_path / "ck.pt", "fp")["epoch"] == 5


class Payload:
    """Unpickling this runs code: it would create ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_pickle_is_refused_unread(tmp_path):
    ckpt, marker = tmp_path / "ck.pt", tmp_path / "ran"
    torch.save({"fingerprint": "fp", "epoch": 1, "log": [], "model": Payload(marker)}, ckpt)
    with pytest.raises(StageFailed, match="ck.pt: not a checkpoint of plain tensors"):
        Toy().run(ckpt)
    assert not marker.exists()


def test_a_diverged_epoch_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    toy = Toy(nan_at=2)
    with pytest.raises(StageFailed, match="toy epoch 3"):
        toy.run(tmp_path / "ck.pt")
    assert load_checkpoint(tmp_path / "ck.pt", "fp")["epoch"] == 2


# ------------------------------------------------------------------ the fine-tune on it
def tiny_finetune(resume, on_epoch=None):
    from fedssl.eval.finetune import finetune

    rng = np.random.default_rng(0)
    train = (rng.integers(0, 256, (40, 1, 12, 12), dtype=np.uint8), rng.integers(0, 3, 40))
    test = (rng.integers(0, 256, (20, 1, 12, 12), dtype=np.uint8), rng.integers(0, 3, 20))
    torch.manual_seed(5)
    encoder = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    p = FinetuneParams(epochs=3, warmup_epochs=1, lr=0.01, batch_size=16, train_size=None)
    return finetune(encoder, train, test, p, torch.device("cpu"), resume, "fp", on_epoch), encoder


def test_the_finetune_resumes_exactly_and_refuses_a_crafted_checkpoint(tmp_path):
    whole, whole_encoder = tiny_finetune(None)
    ckpt = tmp_path / "finetune.pt"

    def killed_after_epoch_1(log):
        if len(log) == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tiny_finetune(ckpt, killed_after_epoch_1)
    assert load_checkpoint(ckpt, "fp")["epoch"] == 1
    resumed, encoder = tiny_finetune(ckpt)
    assert resumed == whole and same_weights(encoder, whole_encoder)
    torch.save(
        {"fingerprint": "fp", "epoch": 1, "log": [], "model": Payload(tmp_path / "x"), "opt": {}},
        ckpt,
    )
    with pytest.raises(StageFailed, match="finetune.pt"):
        tiny_finetune(ckpt)
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------ momentum pairs
def test_momentum_pairs_name_the_twins_and_move_them_by_ema():
    from fedssl.models.momentum import ema_update_pairs, momentum_pairs

    state = {
        "encoder.w": torch.ones(3),
        "predictor.w": torch.ones(2),
        "target.encoder.w": torch.zeros(3),
    }
    pairs = momentum_pairs(
        [k for k in state if not k.startswith("target.")], "target.", ("encoder.",)
    )
    assert pairs == {"target.encoder.w": "encoder.w"}
    ema_update_pairs(state, state, pairs, 0.9)  # one state dict holds both branches
    assert torch.allclose(state["target.encoder.w"], torch.full((3,), 0.1))
    assert torch.equal(state["encoder.w"], torch.ones(3))


# ------------------------------------------------------------------ federation settings
def test_every_federation_block_is_one_settings_class_and_builds_one_config():
    from fedssl.fl.state import federation_config
    from fedssl.methods.cpcfl import CflParams
    from fedssl.methods.fedsimclr import FedSimCLRParams
    from fedssl.methods.lwfedssl import Schedule
    from fedssl.methods.mfcl import MfclPhase1
    from fedssl.methods.mocosfl import SflTraining
    from fedssl.methods.mpfedcon import MpFedconParams
    from fedssl.params import FederationSettings

    flat = [m.model_fields["federation"].annotation for m in (FedSimCLRParams, MpFedconParams)]
    for block in (CflParams, Schedule, MfclPhase1, SflTraining, *flat):
        assert issubclass(block, FederationSettings), block
        assert {"rounds", "client_fraction", "lr"} <= set(block.model_fields)
    s = Schedule(rounds=4, lr=0.5, client_fraction=0.25)
    cfg = federation_config(s, seed=9, lr_schedule="cosine")
    assert (cfg.rounds, cfg.client_fraction, cfg.lr, cfg.lr_schedule, cfg.seed) == (
        4,
        0.25,
        0.5,
        "cosine",
        9,
    )
    # a method may restate a field with its paper's bound: CP-CFL's T is positive
    with pytest.raises(ValueError, match="rounds"):
        CflParams(rounds=0)
    assert FederationSettings(rounds=1, lr=1.0).client_fraction == 1.0
    with pytest.raises(ValueError, match="rounds"):  # training is meant: at least one round
        FederationSettings(rounds=0, lr=1.0)


# ------------------------------------------------------------------ the round runner
def test_the_round_runner_logs_every_round_resumes_and_stops_on_its_hook(tmp_path, capsys):
    from fedssl.rounds.runner import run_rounds
    from tests.fl.test_engine import make_fed, tiny_model, toy_data

    class Stop(Exception):
        pass

    def stop_after_round_2(state):
        if state.round == 2:
            raise Stop

    fed = make_fed(tiny_model(), toy_data(), tmp_path, rounds=3)
    with pytest.raises(Stop):
        run_rounds(fed, fed.start(tiny_model()), tmp_path / "rounds.tsv", "toy", stop_after_round_2)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["toy round 1/3", "toy round 2/3"]
    assert len((tmp_path / "rounds.tsv").read_text().splitlines()) == 3  # header + 2 rounds
    state = run_rounds(fed, fed.start(tiny_model()), tmp_path / "rounds.tsv", "toy")
    assert state.round == 3 and "toy resuming from round 2" in capsys.readouterr().out
    torch.save({"fingerprint": "fp", "state": Payload(tmp_path / "ran")}, tmp_path / "ckpt.pt")
    with pytest.raises(StageFailed, match="ckpt.pt"):  # the engine's checkpoint, crafted
        fed.start(tiny_model())
    assert not (tmp_path / "ran").exists()


# ------------------------------------------------------------------ CP-CFL's server pretraining
def test_server_pretraining_killed_after_an_epoch_resumes_to_the_same_encoder(
    tmp_path, monkeypatch
):
    from fedssl.methods.cpcfl import pretrain
    from tests.fixtures import toy_images
    from tests.methods.cpcfl.test_cpcfl import SHAPE, tiny_exp

    p = tiny_exp(pretrain="byol", ssl={"epochs": 3, "batch_size": 16})
    images = torch.from_numpy(toy_images(48, 0)[0][:, None])
    cpu = torch.device("cpu")
    whole_log: list[dict] = []
    whole = pretrain.train_candidate(p, 16, images, SHAPE, cpu, tmp_path / "a.pt", "fp", whole_log)
    run_epochs_ = pretrain.run_epochs

    def killed_after_epoch_1(*args):
        def stop(log):
            if len(log) == 1:
                raise KeyboardInterrupt

        return run_epochs_(*args[:-1], stop)  # in place of the progress line

    monkeypatch.setattr(pretrain, "run_epochs", killed_after_epoch_1)
    with pytest.raises(KeyboardInterrupt):
        pretrain.train_candidate(p, 16, images, SHAPE, cpu, tmp_path / "b.pt", "fp", [])
    monkeypatch.undo()
    log: list[dict] = []
    resumed = pretrain.train_candidate(p, 16, images, SHAPE, cpu, tmp_path / "b.pt", "fp", log)
    assert same_weights(resumed, whole)  # online, predictor and BYOL's EMA target
    assert [r["loss"] for r in log] == [r["loss"] for r in whole_log] and len(log) == 3


# ------------------------------------------------------------------ CP-CFL's E_l,f phases
def test_cpcfl_encoder_epochs_are_two_passes_with_their_own_seeds_and_an_epoch_mean_loss(tmp_path):
    """E_l = 3, E_l,f = 1 on a pool of one: the round equals, bit for bit, one epoch of the
    whole model (batches seeded (seed, local, round, phase, 0)) then two of the heads (phase 1,
    a fresh Adam), FedAvg by size, and a loss that is the epoch-weighted mean of the passes."""
    from fedssl.fl.cohort import CohortTrainer, OptimizerConfig, vectorise_clients
    from fedssl.methods.cpcfl import federation as cfl
    from fedssl.methods.cpcfl.models import PoolModel
    from fedssl.stage.runtime import torch_generator
    from fedssl.strategies.aggregation import fedavg, stacked
    from tests.methods.cpcfl.test_cpcfl import (
        SHAPE,
        grouped_data,
        pool_fed,
        pretrained_encoder,
        tiny_exp,
    )

    p = tiny_exp(
        federation={
            "clusters": 1,
            "rounds": 1,
            "explore_rounds": 0,
            "local_epochs": 3,
            "encoder_epochs": 1,
        }
    )
    data, cpu = grouped_data(), torch.device("cpu")
    enc = pretrained_encoder(p)
    fed = pool_fed(tmp_path, p, data=data, encoder=enc)
    state = fed.run(fed.start(None))

    start = cfl.initial_pool(p, SHAPE, 4, cpu, 0, enc)[0]
    model = PoolModel(p.encoder, "c", SHAPE, 4).train()
    heads = {k for k, _ in model.named_parameters() if k.startswith("head.")}

    def cohort(epochs):
        return CohortTrainer(
            model,
            cfl.plain_views,
            cfl.cross_entropy,
            OptimizerConfig("adam", eps=p.federation.adam_eps),
            p.federation.batch_size,
            epochs,
            parallel=vectorise_clients(p.parallel_clients, cpu),
        )

    clients = list(range(len(data.clients)))
    gen = torch_generator(cpu, p.seed, "augment", 0)
    body, l0 = cohort(1).train(
        [start] * len(clients),
        data,
        clients,
        p.federation.lr,
        (p.seed, "local", 0, "phase", 0),
        gen,
        None,
    )
    starts = [{k: v[j] for k, v in body.items()} for j in clients]
    trained, l1 = cohort(2).train(
        starts, data, clients, p.federation.lr, (p.seed, "local", 0, "phase", 1), gen, heads
    )
    sizes = torch.tensor(data.sizes(), dtype=torch.float64)
    expected = fedavg(stacked([{k: v[j] for k, v in trained.items()} for j in clients]), sizes)
    assert all(torch.equal(state.server["pool0"][k], v) for k, v in expected.items())
    losses = (0.0 + l0 * 1 + l1 * 2) / 3
    assert state.log[0]["loss"] == float((losses.double() * sizes).sum() / sizes.sum())


def test_train_mode_batches_cut_as_split_does_but_never_leave_one_sample_alone():
    """A last batch of one sample (which training-mode batch norm refuses) joins the batch
    before it; every other cut is ``Tensor.split``'s, so what was trained with it stays."""
    sizes = {
        n: [len(b) for b in train_mode_batches(torch.arange(n), 16)] for n in (1, 16, 17, 33, 40)
    }
    assert sizes == {1: [1], 16: [16], 17: [17], 33: [16, 17], 40: [16, 16, 8]}
    rows = torch.randperm(33)
    assert torch.equal(torch.cat(train_mode_batches(rows, 16)), rows)  # order kept
    bn = nn.BatchNorm1d(3).train()
    for batch in train_mode_batches(torch.randn(17, 3), 16):
        bn(batch)  # one sample alone would raise
