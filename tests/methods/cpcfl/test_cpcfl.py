"""CP-CFL: the paper's encoder, server-side SSL (SimCLR / BYOL / SimSiam), the model pool on the
engine's hooks (selection, per-cluster FedAvg, frozen encoder until T_c, empty clusters,
global encoder, E_l,f), N = 1 against an independent FedAvg, IFCA's failure rule and
restarts, bytes T (N+1) S, costs, params validation, and the whole chain on a tiny project."""

from __future__ import annotations

import csv
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from fedssl.experiment import experiment_model
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig
from fedssl.fl.state import FederationConfig, model_state, nbytes
from fedssl.methods.cpcfl import costs as cfl_costs
from fedssl.methods.cpcfl import federation as cfl
from fedssl.methods.cpcfl.models import Encoder, PoolModel, SSLNet, seeded
from fedssl.methods.cpcfl.pool import PoolStrategy
from fedssl.models.cnn import CPCFLEncoder
from fedssl.rounds.loop import Federation, LocalTraining
from fedssl.strategies.aggregation import fedavg, stacked
from fedssl.strategies.base import Strategy
from tests.fixtures import make_tiny_project, toy_images

SHAPE = (1, 28, 28)

TINY_CPCFL = """\
title: {title}
partition: tiny_groups
method:
  name: cpcfl
  seed: 0
  encoder: {{arch: cnn4, padding: valid, input_size: 32, channels: [8, 8, 16, 16],
            feature_dim: 16}}
  pretrain: {pretrain}
  ssl:
    public: {{split: train, size: 80, seed: 100}}
    epochs: 2
    batch_size: 32
    proj_widths: {widths}
    predictor_hidden: 8
    augment: {{crop_scale: [0.5, 1.0], crop_ratio: [0.75, 1.3333], flip_p: 0.5, jitter_p: 0.8,
              brightness: 0.4, contrast: 0.4, saturation: 0.0, hue: 0.0, grayscale_p: 0.0,
              blur_p: 0.0, blur_sigma: [0.1, 2.0], solarize_p: 0.0}}
    linear_eval: {{proxy: public, train_size: null, test_size: null,
                  probe: {{epochs: 5, lr: 0.01, batch_size: 64}}}}
  federation: {{clusters: {clusters}, rounds: 3, explore_rounds: {explore}, local_epochs: 1,
         batch_size: 8, lr: 0.001, restarts: 0}}
  relevance_samples: 20
personal: {{last_rounds: 2, checkpoints: [0.25, 0.5, 0.75, 1.0]}}
"""
TINY_ROWS = {  # name: (title, pretrain, clusters, T_c, projector widths)
    "tiny_cpcfl": ("CP-CFL (SimCLR)", "simclr", 2, 2, "[16]"),
    "tiny_simsiam": ("CP-CFL (SimSiam)", "simsiam", 2, 2, "[16, 32]"),
    "tiny_fedavg": ("FedAvg (None)", "none", 1, 0, "null"),
    "tiny_ifca_fedavg": ("IFCA (FedAvg)", "fedavg", 2, 2, "null"),
}


def tiny_yaml(
    title="CP-CFL (SimCLR)", pretrain="simclr", clusters=2, explore=2, widths="[16]"
) -> str:
    return TINY_CPCFL.format(
        title=title, pretrain=pretrain, clusters=clusters, explore=explore, widths=widths
    )


def tiny_exp(**method):
    raw = yaml.safe_load(tiny_yaml())
    for key, value in method.items():
        if isinstance(value, dict):
            raw["method"][key] = {**raw["method"].get(key, {}), **value}
        else:
            raw["method"][key] = value
    return experiment_model().model_validate(raw).method


# ============================================================================ networks
def test_the_papers_encoder_has_2378304_parameters_at_96px():
    """Spec §2/§8.1: stride 2, 'valid' padding, no pooling: maps 47, 23, 11, 5, flatten 6400."""
    enc = CPCFLEncoder((3, 96, 96))
    assert enc.flat_dim == 6400
    assert sum(q.numel() for q in enc.parameters()) == 2_378_304
    e = tiny_exp(
        encoder={"feature_dim": 256, "input_size": None, "channels": (64, 128, 192, 256)}
    ).encoder
    assert sum(q.numel() for q in Encoder(e, (3, 96, 96)).parameters()) == 2_378_304


def test_fashion_mnist_is_resized_to_32px_so_the_valid_convs_end_at_1x1():
    e = tiny_exp(encoder={"feature_dim": 256, "channels": (64, 128, 192, 256)}).encoder
    enc = Encoder(e, SHAPE)
    assert enc.net.flat_dim == 256  # 32 -> 15 -> 7 -> 3 -> 1, times 256 channels
    assert enc(torch.rand(2, *SHAPE)).shape == (2, 256)
    with pytest.raises(ValueError, match="padding='same'"):
        Encoder(tiny_exp(encoder={"input_size": None}).encoder, SHAPE)


def test_byol_target_is_an_ema_of_the_online_branch_with_beta_09():
    torch.manual_seed(0)
    net = SSLNet("byol", Encoder(tiny_exp().encoder, SHAPE), 16, 8, ema=0.9)
    before = {k: v.clone() for k, v in net.target["encoder"].state_dict().items()}
    opt = torch.optim.Adam([q for m in net.online() for q in m.parameters()], lr=0.01)
    x = torch.rand(8, *SHAPE)
    loss = net.loss(x, x.flip(-1))
    loss.backward()
    opt.step()
    net.after_step()
    online = net.encoder.state_dict()
    for k, t in net.target["encoder"].state_dict().items():
        assert torch.allclose(t, 0.9 * before[k] + 0.1 * online[k], atol=1e-7), k
    assert not any(q.requires_grad for q in net.target.parameters())


@pytest.mark.parametrize("kind", ["simclr", "byol", "simsiam"])
def test_each_ssl_loss_falls_on_toy_images(kind):
    from fedssl.data.augment import BatchAugment

    images, _ = toy_images(64, 0)
    x = torch.from_numpy(images[:, None])
    p = tiny_exp()
    net = seeded(lambda: SSLNet(kind, Encoder(p.encoder, SHAPE), 16, 8, 0.1, 0.9), 0)
    opt = torch.optim.Adam([q for m in net.online() for q in m.parameters()], lr=1e-3)
    aug = BatchAugment(p.ssl.augment, 28)
    gen = torch.Generator().manual_seed(0)
    views = [(aug(x, gen), aug(x, gen)) for _ in range(3)]
    losses = []
    for step in range(30):
        v1, v2 = views[step % 3]
        loss = net.loss(v1, v2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        net.after_step()
        losses.append(loss.item())
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.05, losses


# ============================================================================ the pool
def grouped_data(n_clients: int = 6, per: int = 12, seed: int = 0) -> LocalData:
    """Two groups of clients on disjoint classes of the toy images (0-1 and 2-3)."""
    images, labels = toy_images(400, seed)
    rng = np.random.default_rng(seed)
    clients = []
    for c in range(n_clients):
        classes = (0, 1) if c < n_clients // 2 else (2, 3)
        pool = np.flatnonzero(np.isin(labels, classes))
        clients.append(np.sort(rng.choice(pool, per, replace=False)))
    return LocalData(torch.from_numpy(images[:, None]), torch.from_numpy(labels), clients)


def pool_fed(
    tmp_path,
    p,
    data=None,
    encoder=None,
    attempt=0,
    tests=None,
    groups=None,
    pool=None,
    name="ck.pt",
):
    data = data or grouped_data()
    pool = pool or cfl.initial_pool(p, SHAPE, 4, torch.device("cpu"), attempt, encoder)
    return cfl.make_federation(
        p, data, SHAPE, 4, pool, tmp_path / name, "fp", attempt, tests, groups
    )


def pretrained_encoder(p) -> dict:
    net = seeded(lambda: PoolModel(p.encoder, "c", SHAPE, 4), "some pretrained encoder")
    return {k: v for k, v in model_state(net).items() if k.startswith("encoder.")}


def snapshots(fed):
    """Run ``fed`` and keep every round's pool."""
    seen = []
    state = fed.run(
        fed.start(None),
        on_round=lambda s: seen.append(
            {n: {k: v.clone() for k, v in s.server[n].items()} for n in s.server}
        ),
    )
    return state, seen


def test_the_encoder_is_bit_identical_to_the_pretrained_one_until_t_c(tmp_path):
    p = tiny_exp(federation={"clusters": 3, "rounds": 4, "explore_rounds": 2})
    enc = pretrained_encoder(p)
    state, seen = snapshots(pool_fed(tmp_path, p, encoder=enc))
    for t, pool in enumerate(seen):
        for n, model in pool.items():
            same = all(torch.equal(model[k], v) for k, v in enc.items())
            assert same == (t < 2), (t, n)  # exploring rounds 0, 1: frozen; then it trains
    heads = [seen[0][f"pool{n}"]["head.0.weight"] for n in range(3)]
    assert not torch.equal(heads[0], heads[1])  # independent random heads
    assert all(
        not torch.equal(seen[1][n]["head.0.weight"], seen[0][n]["head.0.weight"])
        for n in seen[0]
        if n in {f"pool{g}" for g in state.memo["last_choice"]}
    )


def test_after_t_c_each_client_takes_the_model_with_the_lowest_loss_on_its_data(tmp_path):
    p = tiny_exp(federation={"clusters": 3, "rounds": 3, "explore_rounds": 1})
    fed = pool_fed(tmp_path, p, encoder=pretrained_encoder(p))
    state = fed.start(None)
    fed.run_round(state)  # exploration: random choices
    pool = [{k: v.clone() for k, v in state.server[f"pool{n}"].items()} for n in range(3)]
    fed.run_round(state)
    net = PoolModel(p.encoder, "c", SHAPE, 4).eval()
    for c, idx in enumerate(fed.data.clients):
        x = fed.data.images[torch.as_tensor(idx)].float() / 255
        losses = []
        for model in pool:
            net.load_state_dict(model)
            with torch.no_grad():
                losses.append(
                    torch.nn.functional.cross_entropy(
                        net(x), fed.data.labels[torch.as_tensor(idx)]
                    ).item()
                )
        assert state.memo["last_choice"][c] == int(np.argmin(losses)), (c, losses)


def test_ties_go_to_the_lowest_index_and_an_empty_cluster_keeps_its_model(tmp_path):
    p = tiny_exp(federation={"clusters": 3, "rounds": 2, "explore_rounds": 0})
    one = cfl.initial_pool(p, SHAPE, 4, torch.device("cpu"), 0, None)[0]
    same = [{k: v.clone() for k, v in one.items()} for _ in range(3)]
    state, seen = snapshots(pool_fed(tmp_path, p, pool=same))
    # round 0: three equal models, every client takes model 0; models 1 and 2 stay as they are
    for n in (1, 2):
        assert all(torch.equal(seen[0][f"pool{n}"][k], v) for k, v in one.items())
    assert not torch.equal(seen[0]["pool0"]["head.0.weight"], one["head.0.weight"])
    # round 1: a client that prefers the untrained model ties between 1 and 2: it takes 1
    assert set(state.memo["last_choice"]) <= {0, 1} and 2 not in state.memo["last_choice"]
    assert all(torch.equal(state.server["pool2"][k], v) for k, v in one.items())
    assert state.memo["exploit_rounds"] == [2] * 6


def test_each_cluster_model_is_the_size_weighted_mean_of_its_clients(tmp_path):
    p = tiny_exp(federation={"clusters": 2, "rounds": 1, "explore_rounds": 0})
    data = grouped_data()
    data.clients[0] = data.clients[0][:5]  # unequal sizes
    fed = pool_fed(tmp_path, p, data=data)
    state = fed.start(None)
    start = {n: {k: v.clone() for k, v in state.server[n].items()} for n in state.server}
    captured = {}
    aggregate = fed.strategy.aggregate

    def spy(state_, updates):
        captured["u"] = updates
        aggregate(state_, updates)

    fed.strategy.aggregate = spy
    fed.run_round(state)
    u = captured["u"]
    for n in set(u.groups):
        rows = [i for i, g in enumerate(u.groups) if g == n]
        w = torch.tensor([len(data.clients[u.clients[i]]) for i in rows], dtype=torch.float64)
        expect = fedavg(stacked([u.uploads[i] for i in rows]), w)
        for k, v in expect.items():
            assert torch.equal(state.server[f"pool{n}"][k], v), k
    assert set(u.groups) <= {0, 1}
    # the sizes matter: client 0's cluster is not the plain mean of its clients
    n = u.groups[u.clients.index(0)]
    rows = [i for i, g in enumerate(u.groups) if g == n]
    plain = fedavg(
        stacked([u.uploads[i] for i in rows]), torch.ones(len(rows), dtype=torch.float64)
    )
    assert not torch.allclose(plain["head.0.weight"], state.server[f"pool{n}"]["head.0.weight"])
    assert not torch.equal(
        start[f"pool{n}"]["head.0.weight"], state.server[f"pool{n}"]["head.0.weight"]
    )


def test_a_global_encoder_is_shared_by_every_cluster_and_heads_stay_apart(tmp_path):
    p = tiny_exp(
        federation={"clusters": 2, "rounds": 2, "explore_rounds": 1, "global_encoder": True}
    )
    state, _ = snapshots(pool_fed(tmp_path, p, encoder=pretrained_encoder(p)))
    for k in state.server["pool0"]:
        if k.startswith("encoder."):
            assert torch.equal(state.server["pool0"][k], state.server["pool1"][k]), k
    assert not torch.equal(
        state.server["pool0"]["head.0.weight"], state.server["pool1"]["head.0.weight"]
    )


def test_encoder_local_epochs_zero_freezes_the_encoder_one_trains_it_less(tmp_path):
    enc = None
    results = {}
    for ef in (0, 1, None):
        p = tiny_exp(
            federation={
                "clusters": 2,
                "rounds": 2,
                "explore_rounds": 0,
                "local_epochs": 2,
                "encoder_epochs": ef,
            }
        )
        enc = enc or pretrained_encoder(p)
        state, _ = snapshots(pool_fed(tmp_path, p, encoder=enc, name=f"ef{ef}.pt"))
        results[ef] = state.server["pool0"]
    frozen = all(torch.equal(results[0][k], v) for k, v in enc.items())
    assert frozen, "E_l,f = 0: the encoder never changes"
    key = "encoder.net.features.0.weight"
    assert not torch.equal(results[1][key], enc[key])
    assert not torch.equal(results[1][key], results[None][key])


class HeadWarmupFedAvg(Strategy):
    """An independent FedAvg: one global model; for the first T_c rounds only the head trains
    (and only the head is averaged)."""

    def __init__(self, cfg, explore, heads):
        super().__init__(cfg)
        self.explore, self.heads = explore, heads

    def trainable(self, state):
        return set(self.heads) if state.round < self.explore else None

    def aggregate(self, state, updates):
        keys = self.heads if state.round < self.explore else None
        state.server["global"] = {
            **state.server["global"],
            **fedavg(stacked(updates.uploads, keys), updates.weights),
        }


def test_a_pool_of_one_is_fedavg_bit_for_bit(tmp_path):
    """N = 1 (CP-CFL's Tab. 9 row) equals FedAvg (SimCLR) at the same seed (Tab. 3), against a
    FedAvg written with the engine's default hooks; the traffic is 2 S per round both ways."""
    p = tiny_exp(federation={"clusters": 1, "rounds": 3, "explore_rounds": 1})
    enc = pretrained_encoder(p)
    data = grouped_data()
    pool_state, _ = snapshots(pool_fed(tmp_path, p, data=data, encoder=enc))

    start = cfl.initial_pool(p, SHAPE, 4, torch.device("cpu"), 0, enc)[0]
    model = PoolModel(p.encoder, "c", SHAPE, 4)
    model.load_state_dict(start)
    heads = [k for k, _ in model.named_parameters() if k.startswith("head.")]
    cohort = CohortTrainer(
        model.train(),
        cfl.plain_views,
        cfl.cross_entropy,
        OptimizerConfig("adam", eps=p.federation.adam_eps),
        p.federation.batch_size,
        p.federation.local_epochs,
        parallel=False,
    )
    cfg = FederationConfig(rounds=3, client_fraction=1.0, lr=p.federation.lr, seed=p.seed)
    ref = Federation(
        HeadWarmupFedAvg(cfg, 1, heads), LocalTraining(cohort), data, cfg, tmp_path / "ref.pt", "fp"
    )
    ref_state = ref.run(ref.start(model))
    for k, v in ref_state.server["global"].items():
        assert torch.equal(pool_state.server["pool0"][k], v), k
    s = nbytes(start)
    for pool_row, ref_row in zip(
        pool_state.ledger.summary()["per_client"], ref_state.ledger.summary()["per_client"]
    ):
        assert pool_row["down_by_kind"]["model"] == ref_row["bytes_down"] == 3 * s
        assert pool_row["up_by_kind"]["model"] == ref_row["bytes_up"] == 3 * s


def test_each_client_downloads_the_pool_and_uploads_one_model_and_its_choice(tmp_path):
    """Eq. 15: T (N + 1) S per client, counted from the tensors exchanged."""
    p = tiny_exp(federation={"clusters": 3, "rounds": 2, "explore_rounds": 1})
    state, _ = snapshots(pool_fed(tmp_path, p, encoder=pretrained_encoder(p)))
    s = nbytes(state.server["pool0"])
    for row in state.ledger.summary()["per_client"]:
        assert row["down_by_kind"] == {"model": 2 * 3 * s}
        assert row["up_by_kind"] == {"model": 2 * s, "cluster_id": 2 * 8}
        assert row["down_by_kind"]["model"] + row["up_by_kind"]["model"] == 2 * (3 + 1) * s


def test_the_failure_rule_waits_patience_rounds_after_t_c_or_fires_at_the_end():
    p = tiny_exp(federation={"clusters": 2, "rounds": 10, "explore_rounds": 2, "patience": 3})
    strategy = PoolStrategy(
        FederationConfig(10, 1.0, 0.1),
        None,
        p.federation,
        [{}, {}],
        PoolModel(p.encoder, "c", SHAPE, 4),
    )

    def play(used_per_round):
        state = SimpleNamespace(round=0, memo={})
        for r, used in enumerate(used_per_round):
            state.round = r
            strategy._failure_rule(state, used)
        return state.memo.get("failed_at")

    assert play([1, 1, 1, 1]) is None  # rounds 0-1 explore; 2-3 is a streak of 2
    assert play([1, 1, 1, 1, 1]) == 5
    assert play([2, 2, 1, 1, 2, 1, 1, 2]) is None
    assert play([2] * 9 + [1]) == 10  # collapsed in the last round


def test_pool_runs_resume_exactly_after_a_kill(tmp_path):
    p = tiny_exp(federation={"clusters": 2, "rounds": 3, "explore_rounds": 1})
    enc = pretrained_encoder(p)
    full, _ = snapshots(pool_fed(tmp_path, p, encoder=enc, name="a.pt"))
    fed = pool_fed(tmp_path, p, encoder=enc, name="b.pt")

    def kill(state):
        if state.round == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fed.run(fed.start(None), on_round=kill)
    again = pool_fed(tmp_path, p, encoder=enc, name="b.pt")
    resumed = again.run(again.start(None))
    for n in full.server:
        for k, v in full.server[n].items():
            assert torch.equal(resumed.server[n][k], v), (n, k)
    assert resumed.memo["last_choice"] == full.memo["last_choice"]


# ============================================================================ params
def test_params_are_checked_before_any_compute():
    with pytest.raises(ValueError, match="needs an `ssl` section"):
        tiny_exp(ssl=None)
    with pytest.raises(ValueError, match="explore_rounds"):
        tiny_exp(federation={"explore_rounds": 9})
    with pytest.raises(ValueError, match="encoder_epochs"):
        tiny_exp(federation={"encoder_epochs": 2})
    with pytest.raises(ValueError, match="linear_eval.proxy: train"):
        tiny_exp(ssl={"public": {"split": "unlabeled", "size": None}})
    with pytest.raises(ValueError, match="needs a `size`"):
        tiny_exp(ssl={"public": {"split": "train", "size": None}})
    with pytest.raises(ValueError, match="head"):
        tiny_exp(federation={"head": "c-4"})
    assert tiny_exp(pretrain="none", ssl=None).pretrain == "none"


def test_row_labels_name_the_papers_rows():
    from fedssl.methods.cpcfl import Cpcfl

    m = Cpcfl()
    assert m.row_label(tiny_exp()) == "CP-CFL (SimCLR)"
    assert m.row_label(tiny_exp(federation={"clusters": 1})) == "FedAvg (SimCLR)"
    assert m.row_label(tiny_exp(pretrain="none", federation={"restarts": 3})) == "IFCA (None)"
    assert m.row_label(tiny_exp(pretrain="fedavg")) == "IFCA (FedAvg), no restarts"


# ============================================================================ costs
def test_costs_count_eq15_bits_and_cheaper_head_only_rounds():
    p = tiny_exp(federation={"clusters": 3, "rounds": 4, "explore_rounds": 2})
    full, head, fwd, peak, n_params, model_bytes = cfl_costs._step_costs(p, SHAPE, 4)
    assert head < full / 2 and 0 < fwd < full  # no encoder backward while frozen
    feds = [{"name": "final", "clusters": 3, "explore_rounds": [2], "exploit_rounds": [2]}]
    row = cfl_costs._rows(p, SHAPE, 4, [50], feds, [123])[0]
    assert row["paper_bits"] == 4 * (3 + 1) * n_params * 32
    assert row["flops"] == pytest.approx(50 * (2 * head + 2 * full + 2 * 3 * fwd))
    assert row["peak_step_bytes"] == peak + 2 * model_bytes and row["bytes_exchanged"] == 123
    one = tiny_exp(federation={"clusters": 1, "rounds": 4, "explore_rounds": 0})
    feds1 = [{"name": "final", "clusters": 1, "explore_rounds": [0], "exploit_rounds": [4]}]
    assert (
        cfl_costs._rows(one, SHAPE, 4, [50], feds1, [0])[0]["paper_bits"] == 2 * 4 * n_params * 32
    )  # FedAvg: 2 S T (Eq. 14)


# ============================================================================ the chain
def add_tiny_cpcfl(root) -> list[str]:
    params = root / "params"
    (params / "partitions" / "tiny_groups.yaml").write_text(
        "dataset: tiny\nnum_clients: 4\nseed: 0\nscheme: {kind: class_groups, groups: "
        "[[0, 1, 2], [1, 2, 3]], major_classes: 1, major_count: 8, minor_count: 2}\n"
        "client_tests: {per_client: null}\nserver_holdout: 80\nserver_holdout_seed: 100\n"
    )
    for name, (title, pretrain, clusters, explore, widths) in TINY_ROWS.items():
        (params / "experiments" / f"{name}.yaml").write_text(
            tiny_yaml(title, pretrain, clusters, explore, widths)
        )
    with open(params / "pipelines.yaml", "a") as f:
        f.write(f"  cpcfl: [{', '.join(TINY_ROWS)}]\n")
    return list(TINY_ROWS)


def test_the_cpcfl_chain_runs_end_to_end_on_a_tiny_project(tmp_path, monkeypatch):
    from fedssl.plan.dag import Dag
    from tests.methods.mfcl.test_mfcl import run_in_process

    root = make_tiny_project(tmp_path, git=False)
    names = add_tiny_cpcfl(root)
    monkeypatch.chdir(root)
    monkeypatch.setenv("FEDSSL_DEVICE", "cpu")
    dag = Dag("cpcfl")
    kinds = [s.kind for s in dag.stages.values() if s.name.endswith("tiny_cpcfl")]
    assert kinds == ["pretrain", "cfl", "personal", "costs"]
    # pretraining is a server stage: it does not depend on the clients
    assert all(
        s.upstream == ["prepare_data__tiny"] for s in dag.stages.values() if s.kind == "pretrain"
    )
    run_in_process(dag)
    exp = root / "artifacts" / "experiments"
    with open(root / "results" / "reports" / "cpcfl" / "report.csv") as f:
        rows = {r["experiment"]: r for r in csv.DictReader(f)}
    assert set(rows) == set(names)
    for r in rows.values():
        assert 0 <= float(r["personal_top1"]) <= 100 and r["personal_at_1"] != ""
        assert float(r["client_MB_exchanged"]) > 0 and float(r["client_GFLOPs"]) > 0
        assert r["ari"] != "" and r["clusters_used"] != ""
    assert rows["tiny_cpcfl"]["row"] == "CP-CFL (SimCLR)"
    assert float(rows["tiny_cpcfl"]["relevance"]) > 0 and rows["tiny_fedavg"]["relevance"] == ""
    # the pool traffic: T (N + 1) S of model bytes per client (+ the choices)
    pool = torch.load(exp / "tiny_cpcfl" / "cfl" / "pool.pt", weights_only=True)
    s = nbytes(pool["pool0"])
    comm = json.loads((exp / "tiny_cpcfl" / "cfl" / "communication.json").read_text())
    for c in comm["per_client"]:
        assert c["up_by_kind"]["model"] + c["down_by_kind"]["model"] == 3 * (2 + 1) * s
    # IFCA (FedAvg)'s encoder is the FedAvg (None) experiment's model, bit for bit
    warm = torch.load(exp / "tiny_ifca_fedavg" / "cfl" / "warmup_encoder.pt", weights_only=True)
    fedavg_model = torch.load(exp / "tiny_fedavg" / "cfl" / "pool.pt", weights_only=True)["pool0"]
    assert warm and all(torch.equal(v, fedavg_model[k]) for k, v in warm.items())
    warm_comm = json.loads((exp / "tiny_ifca_fedavg" / "cfl" / "communication.json").read_text())
    assert "warmup/model" in warm_comm["per_client"][0]["up_by_kind"]
    # the encoder was chosen among the candidates by the linear probe; the public slice is the
    # partition's server slice
    sel = json.loads((exp / "tiny_simsiam" / "pretrain" / "selection.json").read_text())
    assert [c["width"] for c in sel["candidates"]] == [16, 32]
    assert sel["chosen"]["linear_top1"] == max(c["linear_top1"] for c in sel["candidates"])
    public = np.load(exp / "tiny_cpcfl" / "pretrain" / "public.npy")
    assert np.array_equal(public, np.load(root / "artifacts/partitions/tiny_groups/server.npy"))
    trace = (root / "results/experiments/tiny_cpcfl/choices.tsv").read_text().splitlines()
    assert trace[0].split("\t") == ["round"] + [f"client_{c}" for c in range(4)]
    assert len(trace) == 4 and (root / "results/experiments/tiny_cpcfl/choice_trace.png").exists()
    report = (root / "results/reports/cpcfl/report.md").read_text()
    assert "cpcfl_tab3" in report and "| CP-CFL (SimCLR) |" in report
    assert "IFCA (FedAvg), no restarts" in report
