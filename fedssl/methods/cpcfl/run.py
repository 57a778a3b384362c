"""CP-CFL step ``cfl``: clustered FL with a pool of N models (Alg. 2) on the engine's hooks (its
per-client costs: :mod:`fedssl.methods.cpcfl.costs`).

* ``download``: the whole pool (N models; bytes counted from those tensors);
* ``local_start``: the client's choice n_u: at random while t < T_c, afterwards the model with
  the lowest cross-entropy on its own training data (eval mode, ties to the lowest index);
* ``trainable``: the heads only while t < T_c (the encoder stays bit-identical);
* ``upload``: the trained model, plus n_u (a ledger kind of its own);
* ``aggregate``: size-weighted FedAvg within each cluster of what trained this round; an empty
  cluster keeps its model; optionally the encoder averaged over every client (global encoder);
* ``evaluate``: each client's accuracy on its own test split with its cluster's new model
  (:class:`fedssl.eval.personal.PersonalLog`), ARI of the choices, IFCA's failure rule.

FedAvg is the pool of one; IFCA (None) a pool of fully random models with restarts on failure;
IFCA (FedAvg) first runs FedAvg (None) on the same clients (the same seeded code path as that
experiment, so the same model) and takes its encoder.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedssl.data.augment import to_float
from fedssl.data.store import to_device
from fedssl.eval.metrics import adjusted_rand_index, relevance_score
from fedssl.eval.personal import PersonalLog, client_outputs
from fedssl.fl import runner
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig, vectorise_clients
from fedssl.fl.engine import (
    Federation,
    FederationConfig,
    FedState,
    LocalTraining,
    Phase,
    Strategy,
    fedavg,
    federation_config,
    model_state,
    nbytes,
    stacked,
    write_round_log,
)
from fedssl.fl.runner import train_data
from fedssl.losses import masked_cross_entropy
from fedssl.methods.cpcfl import SSL_KINDS
from fedssl.methods.cpcfl.models import PoolModel, seeded
from fedssl.methods.cpcfl.pretrain import ENCODER_FILE, PUBLIC_FILE
from fedssl.precision import autocast
from fedssl.runtime import StageFailed, numpy_rng, write_json, write_tsv

Tensors = dict[str, torch.Tensor]


# ============================================================================ local training
def cross_entropy(model, params, buffers, batch):
    """Mean CE over the real rows of a (padded) batch; views[0] are the plain images."""
    x = batch.views[0]
    with autocast(x):
        logits = functional_call(model, (params, buffers), (x,))
    return masked_cross_entropy(logits, batch.labels, batch.valid)


def plain_views(batch: torch.Tensor, generator: torch.Generator):
    """No augmentation in the CFL stage (spec §3)."""
    return (to_float(batch),)


# ============================================================================ the pool
class PoolStrategy(Strategy):
    """Alg. 2 on the engine's hooks (see the module docstring). ``pool``: the N initial model
    states; ``tests``: (test images on the device, labels, each client's test indices) for the
    evaluate hook, or None (the FedAvg warm-up is not evaluated)."""

    def __init__(
        self,
        cfg: FederationConfig,
        c,
        pool: list[Tensors],
        net: PoolModel,
        attempt: int = 0,
        tests=None,
        true_groups: list[int] | None = None,
    ):
        super().__init__(cfg)
        self.c, self.pool0, self.net, self.attempt = c, pool, net, attempt
        self.tests, self.true_groups = tests, true_groups
        self.n = len(pool)
        self.heads = [k for k, _ in net.named_parameters() if k.startswith("head.")]
        self.encoder = [k for k in pool[0] if k.startswith("encoder.")]
        self._choice: dict[int, int] = {}
        self._losses: tuple[int, np.ndarray] | None = None

    # ---------------------------------------------------------------- server state
    def init_server(self, model) -> dict[str, Tensors]:
        return {f"pool{n}": {k: v.clone() for k, v in s.items()} for n, s in enumerate(self.pool0)}

    def model(self, state: FedState, n: int) -> Tensors:
        return state.server[f"pool{n}"]

    def final_model(self, state: FedState) -> Tensors:
        return self.model(state, 0)

    # ---------------------------------------------------------------- client side
    def download(self, state, client) -> Tensors:
        return {f"{n}.{k}": v for n in range(self.n) for k, v in self.model(state, n).items()}

    def exploring(self, state) -> bool:
        return state.round < self.c.explore_rounds

    def local_start(self, state, client, received) -> Tensors:
        if self.n == 1:
            n = 0
        elif self.exploring(state):
            n = int(
                numpy_rng(self.cfg.seed, "explore", self.attempt, state.round, client).integers(
                    self.n
                )
            )
        else:
            n = int(np.argmin(self.train_losses(state, received)[client]))  # ties: lowest n
        self._choice[client] = n
        prefix = f"{n}."
        return {k[len(prefix) :]: v for k, v in received.items() if k.startswith(prefix)}

    @torch.no_grad()
    def train_losses(self, state, received: Tensors) -> np.ndarray:
        """[clients, N] mean CE of every pool model on every client's training data (what each
        client computes on its own from the models it received), once per round."""
        if self._losses is None or self._losses[0] != state.round:
            data = self.fed.data
            idx = torch.as_tensor(np.concatenate(data.clients), device=data.device)
            owner = torch.as_tensor(
                np.repeat(np.arange(len(data.clients)), data.sizes()), device=data.device
            )
            x, y = to_float(data.images[idx]), data.labels[idx]
            sizes = torch.as_tensor(data.sizes(), device=data.device, dtype=torch.float64)
            out = np.zeros((len(data.clients), self.n))
            self.net.eval()
            for n in range(self.n):
                params = {
                    k[len(f"{n}.") :]: v for k, v in received.items() if k.startswith(f"{n}.")
                }
                per = torch.cat(
                    [
                        F.cross_entropy(
                            functional_call(self.net, params, (xb,)).float(), yb, reduction="none"
                        )
                        for xb, yb in zip(x.split(1024), y.split(1024))
                    ]
                )
                total = torch.zeros(len(data.clients), dtype=torch.float64, device=data.device)
                total.index_add_(0, owner, per.double())
                out[:, n] = (total / sizes).cpu().numpy()
            self._losses = (state.round, out)
        return self._losses[1]

    def group(self, state, client) -> int:
        return self._choice[client]

    def trainable(self, state) -> set[str] | None:
        return set(self.heads) if self.exploring(state) else None

    def upload(self, state, client, trained) -> Tensors:
        n_u = torch.tensor([self._choice[client]], dtype=torch.int64)
        state.ledger.sent(client, {"n_u": n_u}, "cluster_id")
        return trained

    # ---------------------------------------------------------------- server side
    def encoder_frozen(self, state) -> bool:
        """While exploring, and throughout with E_l,f = 0 (Tab. 7's frozen encoder)."""
        return self.exploring(state) or self.c.encoder_epochs == 0

    def aggregate(self, state, updates) -> None:
        # only what trained is averaged: a frozen encoder stays bit-identical (an average of
        # equal float tensors need not be exactly that tensor)
        keys = self.heads if self.encoder_frozen(state) else list(updates.uploads[0])
        for n in sorted(set(updates.groups)):  # an empty cluster keeps its model
            rows = [i for i, g in enumerate(updates.groups) if g == n]
            avg = fedavg(stacked([updates.uploads[i] for i in rows], keys), updates.weights[rows])
            state.server[f"pool{n}"] = {**self.model(state, n), **avg}
        if self.c.global_encoder and not self.encoder_frozen(state):
            shared = fedavg(stacked(updates.uploads, self.encoder), updates.weights)
            for n in range(self.n):
                state.server[f"pool{n}"] = {**self.model(state, n), **shared}
        memo = state.memo
        choice = memo.setdefault("last_choice", [-1] * len(self.fed.data.clients))
        phase = "explore_rounds" if self.exploring(state) else "exploit_rounds"
        counts = memo.setdefault(phase, [0] * len(self.fed.data.clients))
        for c, n in zip(updates.clients, updates.groups):
            choice[c] = int(n)
            counts[c] += 1

    def evaluate(self, state, round_) -> dict | None:
        choice = list(state.memo["last_choice"])
        out = {"clusters_used": len({n for n in choice if n >= 0})}
        if self.true_groups is not None and min(choice) >= 0:
            out["ari"] = round(adjusted_rand_index(choice, self.true_groups), 4)
        self._failure_rule(state, out["clusters_used"])
        if self.tests is None:
            return out
        accs, _, _ = self.outputs(state)
        return {**PersonalLog(state.memo).record(accs, choice), **out}

    def outputs(self, state):
        """Every client's cluster model on its own test split: (accuracy %, labels, probs)."""
        images, labels, tests = self.tests
        choice = state.memo["last_choice"]
        self.net.eval()
        return client_outputs(
            lambda c, x: functional_call(self.net, self.model(state, max(choice[c], 0)), (x,)),
            images,
            labels,
            tests,
        )

    def _failure_rule(self, state, used: int) -> None:
        """IFCA's clustering failure (spec §8.8): after T_c, every client on one model for
        ``patience`` rounds in a row, or in the last round."""
        if self.n == 1 or self.exploring(state):
            return
        memo = state.memo
        memo["streak"] = memo.get("streak", 0) + 1 if used == 1 else 0
        last = state.round + 1 == self.cfg.rounds
        if memo["streak"] >= self.c.patience or (last and used == 1):
            memo.setdefault("failed_at", state.round + 1)


# ============================================================================ the step
class ClusteringFailed(Exception):
    """IFCA's failure rule fired; ``state`` is the run at that round."""

    def __init__(self, state: FedState):
        super().__init__(f"every client on one model (round {state.memo.get('failed_at')})")
        self.state = state


def build_net(p, image_shape, num_classes: int, device) -> PoolModel:
    return PoolModel(p.encoder, p.cfl.head, image_shape, num_classes).to(device)


def initial_pool(
    p, image_shape, num_classes: int, device, attempt: int, encoder: Tensors | None
) -> list[Tensors]:
    """N seeded models: fully random (no encoder given: IFCA (None), FedAvg (None)), or the
    given encoder with a random head each."""
    pool = []
    for n in range(p.cfl.clusters):
        what = "model" if encoder is None else "head"
        net = seeded(
            lambda: build_net(p, image_shape, num_classes, device), p.seed, what, attempt, n
        )
        state = model_state(net)
        if encoder is not None:
            state.update({k: v.clone().to(device) for k, v in encoder.items()})
        pool.append(state)
    return pool


def make_federation(
    p,
    data: LocalData,
    image_shape,
    num_classes,
    pool,
    ckpt,
    fingerprint,
    attempt=0,
    tests=None,
    true_groups=None,
    device=None,
):
    c = p.cfl
    device = device or data.device
    train_net = build_net(p, image_shape, num_classes, device).train()
    eval_net = build_net(p, image_shape, num_classes, device).eval()
    heads = [k for k, _ in train_net.named_parameters() if k.startswith("head.")]

    def cohort(epochs):
        return CohortTrainer(
            train_net,
            plain_views,
            cross_entropy,
            OptimizerConfig("adam", eps=c.adam_eps),
            batch_size=c.batch_size,
            local_epochs=epochs,
            parallel=vectorise_clients(p.parallel_clients, device),
        )

    # E_l,f (Tab. 7): the first E_l,f local epochs train the whole model, the others the heads
    # only (a fresh Adam state); the round's loss is the mean over all E_l epochs. While the
    # strategy restricts training (t < T_c), every epoch trains that subset in one pass.
    e = c.local_epochs
    ef = e if c.encoder_epochs is None else c.encoder_epochs
    whole = [Phase(cohort(e))]
    split = []
    for n, names in ((ef, None), (e - ef, set(heads))):
        if n:
            only = None if names is None else (lambda s, names=names: names)
            split.append(Phase(cohort(n), only, seed_tag=("phase", len(split)), loss_weight=n))
    cfg = federation_config(c, p.seed)
    strategy = PoolStrategy(cfg, c, pool, eval_net, attempt, tests, true_groups)

    def schedule(state: FedState) -> list[Phase]:
        return whole if ef == e or strategy.trainable(state) is not None else split

    return Federation(strategy, LocalTraining(phases=schedule), data, cfg, ckpt, fingerprint)


def run_rounds(fed: Federation, log_path: Path | None, name: str) -> FedState:
    """Run ``fed`` from its checkpoint; raises ClusteringFailed when the failure rule fires."""
    state = fed.start(None)
    if state.round:
        print(f"{name}: resuming from round {state.round}", flush=True)
    if state.memo.get("failed_at") is not None:
        raise ClusteringFailed(state)

    def stop_on_failure(s: FedState):
        if s.memo.get("failed_at") is not None:
            raise ClusteringFailed(s)

    return runner.run_rounds(fed, state, log_path, name, stop_on_failure)


def warmup_params(p):
    """FedAvg (None) with this experiment's local settings and seed: the same settings (and so
    the same model) as the FedAvg (None) experiment of the trial."""
    cfl = p.cfl.model_copy(
        update={
            "clusters": 1,
            "explore_rounds": 0,
            "encoder_epochs": None,
            "global_encoder": False,
            "restarts": 0,
            "rounds": p.warmup_rounds or p.cfl.rounds,
        }
    )
    return p.model_copy(update={"pretrain": "none", "cfl": cfl})


def _ledger_rows(state: FedState, prefix: str) -> list[dict]:
    return [
        {
            "up": {prefix + k: v for k, v in up.items()},
            "down": {prefix + k: v for k, v in down.items()},
        }
        for up, down in zip(state.ledger.up, state.ledger.down)
    ]


def communication(parts: list[tuple[str, int, FedState]], sizes: list[int]) -> dict:
    """One communication.json for every federation the step ran: per client the bytes by kind
    (the final run's kinds unprefixed, earlier runs' prefixed ``warmup/`` / ``failedA/``) and
    per federation the rounds each client spent exploring and exploiting."""
    clients = [
        {"client": i, "up_by_kind": {}, "down_by_kind": {}, "samples": s}
        for i, s in enumerate(sizes)
    ]
    feds = []
    for prefix, clusters, state in parts:
        for row, led in zip(clients, _ledger_rows(state, prefix)):
            row["up_by_kind"].update(led["up"])
            row["down_by_kind"].update(led["down"])
        zero = [0] * len(sizes)
        feds.append(
            {
                "name": prefix.rstrip("/") or "final",
                "clusters": clusters,
                "explore_rounds": state.memo.get("explore_rounds", zero),
                "exploit_rounds": state.memo.get("exploit_rounds", zero),
            }
        )
    for row in clients:
        row["bytes_up"] = sum(row["up_by_kind"].values())
        row["bytes_down"] = sum(row["down_by_kind"].values())
        row["rounds"] = sum(
            f["explore_rounds"][row["client"]] + f["exploit_rounds"][row["client"]] for f in feds
        )
    return {
        "per_client": clients,
        "federations": feds,
        "total_bytes_up": sum(r["bytes_up"] for r in clients),
        "total_bytes_down": sum(r["bytes_down"] for r in clients),
    }


def check_disjoint(ctx, public: np.ndarray, clients: list[np.ndarray]) -> None:
    held = np.intersect1d(public, np.concatenate(clients))
    if held.size:
        raise StageFailed(
            f"{ctx.name}: {held.size} images of the public pretraining slice are also client "
            f"data: give partition '{ctx.exp.partition}' server_holdout = ssl.public.size and "
            f"server_holdout_seed = ssl.public.seed"
        )


def relevance(
    ctx, encoder_net, public: np.ndarray, clients: list[np.ndarray], n: int, device
) -> float:
    """§4.9's relevance score: n public images and n client images through the pretrained
    encoder, mean cosine similarity over all n x n cross pairs."""
    rng = numpy_rng(ctx.exp.method.seed, "relevance")
    pub_images, _ = ctx.split(ctx.exp.method.ssl.public.split)
    train_images, _ = ctx.split("train")
    pool = np.unique(np.concatenate(clients))
    a = np.sort(rng.choice(public, min(n, len(public)), replace=False))
    b = np.sort(rng.choice(pool, min(n, len(pool)), replace=False))
    encoder_net.eval()
    with torch.no_grad():
        fa = encoder_net(to_float(torch.from_numpy(np.asarray(pub_images[a])).to(device)))
        fb = encoder_net(to_float(torch.from_numpy(np.asarray(train_images[b])).to(device)))
    return relevance_score(fa, fb)


def write_choices(choices: np.ndarray, groups, explore: int, results: Path) -> None:
    """The per-round choice trace (Fig. 5): a TSV and a picture (clients x rounds)."""
    k = choices.shape[1] if choices.size else 0
    rows = [
        {"round": r + 1, **{f"client_{c}": int(v) for c, v in enumerate(row)}}
        for r, row in enumerate(choices)
    ]
    write_tsv(rows, results / "choices.tsv", ["round"] + [f"client_{c}" for c in range(k)])
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    fig = Figure(figsize=(min(12, 3 + 0.15 * len(choices)), min(10, 2 + 0.2 * k)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    n = int(choices.max()) + 1 if choices.size else 1
    cmap = ListedColormap(
        ["#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb"][: max(n, 1)]
    )
    if choices.size:
        im = ax.imshow(
            choices.T,
            aspect="auto",
            cmap=cmap,
            interpolation="nearest",
            vmin=-0.5,
            vmax=n - 0.5,
            extent=(0.5, len(choices) + 0.5, k - 0.5, -0.5),
        )
        fig.colorbar(im, ax=ax, ticks=range(n), label="model chosen (n_u)")
    if explore:
        ax.axvline(explore + 0.5, color="black", lw=1, ls="--")
    if groups is not None:
        for c in range(1, k):
            if groups[c] != groups[c - 1]:
                ax.axhline(c - 0.5, color="white", lw=2)
    ax.set_xlabel("round")
    ax.set_ylabel("client (white lines: true groups)")
    ax.set_title("cluster choice per round (dashed: end of T_c)")
    fig.tight_layout()
    fig.savefig(results / "choice_trace.png", format="png", dpi=90, metadata={"Software": None})


def run(ctx) -> None:
    p, c = ctx.exp.method, ctx.exp.method.cfl
    device = ctx.device
    data = train_data(ctx)
    shape = tuple(data.images.shape[1:])
    num_classes = int(data.labels.max()) + 1
    test_images, test_labels = ctx.split("test")
    tests = (
        to_device(test_images, device),
        torch.as_tensor(np.asarray(test_labels), dtype=torch.int64, device=device),
        ctx.client_tests(),
    )
    groups = ctx.true_groups()
    extra: dict = {"explore_rounds": c.explore_rounds, "clusters": c.clusters}
    parts: list[tuple[str, int, FedState]] = []

    encoder = None
    if p.pretrain in SSL_KINDS:
        saved = torch.load(
            ctx.input("pretrain") / ENCODER_FILE, map_location=device, weights_only=True
        )
        encoder = {f"encoder.{k}": v for k, v in saved["encoder"].items()}
        public = np.load(ctx.input("pretrain") / PUBLIC_FILE)
        if p.ssl.public.split == "train":
            check_disjoint(ctx, public, data.clients)
        net = build_net(p, shape, num_classes, device)
        net.load_state_dict({**model_state(net), **encoder})
        extra["relevance"] = round(
            relevance(ctx, net.encoder, public, data.clients, p.relevance_samples, device), 4
        )
        selection = json.loads((ctx.input("pretrain") / "selection.json").read_text())
        extra["encoder_linear_top1"] = selection["chosen"]["linear_top1"]
    elif p.pretrain == "fedavg":
        w = warmup_params(p)
        pool = initial_pool(w, shape, num_classes, device, 0, None)
        fed = make_federation(
            w,
            data,
            shape,
            num_classes,
            pool,
            ctx.resume_path.with_suffix(".warmup.pt"),
            ctx.fingerprint + "/warmup",
        )
        state = run_rounds(fed, ctx.out / "warmup_rounds.tsv", "FedAvg warm-up")
        write_round_log(state.log, ctx.out / "warmup_rounds.tsv")
        encoder = {
            k: v for k, v in fed.strategy.final_model(state).items() if k.startswith("encoder.")
        }
        torch.save(encoder, ctx.out / "warmup_encoder.pt")
        parts.append(("warmup/", 1, state))

    restarts = 0
    for attempt in range(c.restarts + 1):
        pool = initial_pool(p, shape, num_classes, device, attempt, encoder)
        ckpt = ctx.resume_path.with_suffix(f".attempt{attempt}.pt")
        fed = make_federation(
            p,
            data,
            shape,
            num_classes,
            pool,
            ckpt,
            f"{ctx.fingerprint}/attempt{attempt}",
            attempt,
            tests,
            groups,
        )
        try:
            log = ctx.results_dir / "rounds.tsv"
            state = run_rounds(fed, log, f"attempt {attempt}" if c.restarts else "cfl")
            break
        except ClusteringFailed as failed:
            state = failed.state
            if attempt == c.restarts:  # no restart left: this run stands, failure and all
                state = fed.run(state)
                break
            print(
                f"attempt {attempt}: every client on one model since round "
                f"{state.memo['failed_at'] - c.patience + 1}: restarting",
                flush=True,
            )
            write_round_log(state.log, ctx.out / f"failed{attempt}_rounds.tsv")
            parts.append((f"failed{attempt}/", c.clusters, state))
            restarts += 1
    write_round_log(state.log, ctx.results_dir / "rounds.tsv")
    parts.append(("", c.clusters, state))
    extra.update(
        restarts=restarts,
        first_attempt_failed=restarts > 0 or state.memo.get("failed_at") is not None,
    )

    accs, labels, probs = fed.strategy.outputs(state)
    PersonalLog(state.memo).save(ctx.out / "personal.npz", labels, probs)
    choices = np.asarray(state.memo["personal"]["choice"], dtype=np.int64)
    write_choices(choices, groups, c.explore_rounds, ctx.results_dir)
    torch.save(
        {f"pool{n}": fed.strategy.model(state, n) for n in range(c.clusters)}, ctx.out / "pool.pt"
    )
    write_json(ctx.out / "communication.json", communication(parts, data.sizes()))
    write_json(ctx.out / "extra_metrics.json", extra)
    model_bytes = nbytes(fed.strategy.model(state, 0))
    ctx.info.update(
        rounds=len(state.log),
        final_loss=state.log[-1]["loss"],
        restarts=restarts,
        parameters=sum(
            v.numel() for k, v in fed.strategy.model(state, 0).items() if v.is_floating_point()
        ),
        model_bytes=model_bytes,
        final_personal_acc=round(float(np.mean(accs)), 2),
    )
    for path in ctx.resume_path.parent.glob(ctx.resume_path.stem + ".*.pt"):
        path.unlink(missing_ok=True)
