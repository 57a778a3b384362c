"""Images per second of one federated client round: the conventional loop against ours, side by
side in one process on the same clients, data and model; and the peak memory of our round.

Conventional: per client a deepcopy of the global model, a fresh optimizer, a CPU DataLoader
over PIL images with torchvision's per-image transforms, clients one after another, FedAvg over
state dicts, in fp32. Ours: the data set on the device as uint8, batched per-sample augmentation
there, the CohortTrainer (clients vectorised with torch.func where the model allows) and the
engine's FedAvg, under the precision policy (``--precision``, default auto).

    python benchmarks/federated_round.py [--device cuda] [--max-per-client 400]

prints per scenario (SimCLR's CNN and MFCL's autoencoder, 10 and 100 clients):
    <scenario>: conventional <N> img/s, ours <M> img/s, ratio <R>
      (model steps alone ...)
      peak memory of our round: <P> MB (<B> MB before it), in a process of its own
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms as T

from fedssl import precision
from fedssl.data.augment import BatchAugment, multi_view
from fedssl.data.catalog import load_dataset
from fedssl.data.partition import split_clients, stratified_subset
from fedssl.fl.cohort import CohortTrainer, LocalData, OptimizerConfig
from fedssl.fl.state import FederationConfig
from fedssl.losses import nt_xent
from fedssl.methods.federated import trainer_loss
from fedssl.methods.mfcl import run as mfcl
from fedssl.models.autoencoder import ClientAutoencoder, reconstruction_loss
from fedssl.models.encoders import seeded_contrastive_model
from fedssl.params import AugmentParams, DirichletScheme
from fedssl.presets import Presets
from fedssl.rounds.loop import Federation, LocalTraining
from fedssl.stage.base import bound_kernel_cache, set_threads
from fedssl.strategies.base import Strategy


# ----------------------------------------------------------------------------- conventional
def pil_transform(a: AugmentParams, size: int, channels: int):
    ops = [
        T.RandomResizedCrop(size, scale=a.crop_scale, ratio=a.crop_ratio),
        T.RandomHorizontalFlip(a.flip_p),
        T.RandomApply(
            [
                T.ColorJitter(
                    a.brightness,
                    a.contrast,
                    a.saturation if channels == 3 else 0,
                    a.hue if channels == 3 else 0,
                )
            ],
            p=a.jitter_p,
        ),
    ]
    if channels == 3:
        ops.append(T.RandomGrayscale(a.grayscale_p))
    return T.Compose(ops + [T.ToTensor()])


class TwoViews(Dataset):
    def __init__(self, images: np.ndarray, transform):
        self.images, self.transform = images, transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        img = self.images[i]
        pil = Image.fromarray(img[0] if img.shape[0] == 1 else img.transpose(1, 2, 0))
        return self.transform(pil), self.transform(pil)


def conventional_round(
    global_model, clients, images, transform, batch_size, lr, loss_fn, device, workers
):
    states, sizes = [], []
    for idx in clients:
        local = copy.deepcopy(global_model).to(device)
        opt = torch.optim.Adam(local.parameters(), lr=lr)
        loader = DataLoader(
            TwoViews(images[idx], transform),
            batch_size=batch_size,
            shuffle=True,
            num_workers=workers,
        )
        for v1, v2 in loader:
            loss = loss_fn(local, v1.to(device), v2.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        states.append({k: v.detach().clone() for k, v in local.state_dict().items()})
        sizes.append(len(idx))
    w = torch.tensor(sizes, dtype=torch.float32) / sum(sizes)
    avg = {
        k: sum(wi * s[k].float() for wi, s in zip(w, states)).to(states[0][k].dtype)
        for k in states[0]
    }
    global_model.load_state_dict(avg)


# ----------------------------------------------------------------------------- ours
def our_round(model, clients, images_dev, trainer, lr):
    with tempfile.TemporaryDirectory() as tmp:
        cfg = FederationConfig(rounds=1, client_fraction=1.0, lr=lr)
        labels = torch.zeros(len(images_dev), dtype=torch.int64, device=images_dev.device)
        fed = Federation(
            Strategy(cfg),
            LocalTraining(trainer),
            LocalData(images_dev, labels, clients),
            cfg,
            Path(tmp) / "ckpt.pt",
            "bench",
        )
        state = fed.start(model)
        fed.run_round(state)
    model.load_state_dict(state.server["global"])


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def simclr_loss_eager(temperature):
    def loss(model, v1, v2):
        z = model(torch.cat([v1, v2]))
        return nt_xent(*z.chunk(2), temperature)

    return loss


def ae_loss_eager(model, v1, v2):
    x = torch.cat([v1, v2])
    return reconstruction_loss(model(x), x)


# ----------------------------------------------------------------------------- scenarios
def fmnist(max_per_client: int, num_clients: int, subset: int, seed: int = 0):
    split = load_dataset("fashion_mnist")["train"]
    pool = stratified_subset(split.labels, subset, seed)
    local = split_clients(
        split.labels[pool], num_clients, DirichletScheme(alpha=0.1, min_per_client=10), seed
    )
    clients = [pool[ix][:max_per_client] for ix in local]
    return split.images, clients


def model_steps_alone(make_model, loss_eager, clients, batch_size, lr, image_shape, device):
    """Seconds for the round's optimizer steps on ready-made views: what the model costs with a
    free input pipeline, so conventional / this bounds any speed-up of the data path."""
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    views = torch.rand(batch_size, *image_shape, device=device)

    def run():
        for idx in clients:
            for start in range(0, len(idx), batch_size):
                n = min(batch_size, len(idx) - start)
                loss = loss_eager(model, views[:n], views[:n].flip(-1))
                opt.zero_grad()
                loss.backward()
                opt.step()

    loss_eager(model, views, views).backward()  # warm-up
    return timed(run, device)


def compare(sc: dict, device, workers) -> None:
    """Time the conventional round and ours on the scenario ``sc`` (see :func:`scenarios`)."""
    images, clients, batch_size, lr = sc["images"], sc["clients"], sc["batch_size"], sc["lr"]
    make_model, make_trainer, loss_eager = sc["make_model"], sc["make_trainer"], sc["loss_eager"]
    n_images = sum(len(c) for c in clients)
    transform = pil_transform(sc["augment"], images.shape[-1], images.shape[1])
    images_dev = torch.from_numpy(np.array(images)).to(device)
    # warm up both paths on one small client (allocations, vmap tracing, kernel selection)
    warm = [clients[0][:batch_size]]
    with precision.policy("fp32"):
        conventional_round(
            make_model(), warm, images, transform, batch_size, lr, loss_eager, device, workers
        )
    model = make_model()
    our_round(model, warm, images_dev, make_trainer(model), lr)
    with precision.policy("fp32"):
        conv = timed(
            lambda: conventional_round(
                make_model(),
                clients,
                images,
                transform,
                batch_size,
                lr,
                loss_eager,
                device,
                workers,
            ),
            device,
        )
    model = make_model()
    trainer = make_trainer(model)
    ours = timed(lambda: our_round(model, clients, images_dev, trainer, lr), device)
    with precision.policy("fp32"):
        alone = model_steps_alone(
            make_model, loss_eager, clients, batch_size, lr, images.shape[1:], device
        )
    print(
        f"{sc['name']}: conventional {n_images / conv:.0f} img/s, ours "
        f"({precision.resolved(device)}) {n_images / ours:.0f} img/s, ratio {conv / ours:.2f}",
        flush=True,
    )
    print(
        f"  (model steps alone on ready-made views, fp32: {n_images / alone:.0f} img/s, so a "
        f"faster input pipeline alone could reach at most ratio {conv / alone:.2f})",
        flush=True,
    )


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def our_memory(sc: dict, device) -> dict:
    """Our round alone (run in a process of its own): resident memory before it and at peak."""
    images_dev = torch.from_numpy(np.array(sc["images"])).to(device)
    model = sc["make_model"]()
    trainer = sc["make_trainer"](model)
    before = rss_mb()
    our_round(model, sc["clients"], images_dev, trainer, sc["lr"])
    return {"before_mb": before, "peak_mb": rss_mb()}


def scenarios(cap: int, device, vmap_clients: bool) -> dict:
    """Name -> a function building the scenario: its data, clients, models and losses."""
    p = Presets().load("experiment", "fmnist_fedsimclr").method

    def simclr(num_clients):
        def build():
            images, clients = fmnist(cap, num_clients, 20000)
            return dict(
                make_model=lambda: seeded_contrastive_model(
                    p.model, images.shape[1:], p.seed, device
                ),
                make_trainer=lambda m: CohortTrainer(
                    m,
                    multi_view(BatchAugment(p.augment, images.shape[-1]), views=2),
                    trainer_loss(p),
                    OptimizerConfig("adam"),
                    p.federation.batch_size,
                    1,
                    parallel=vmap_clients,
                ),
                loss_eager=simclr_loss_eager(p.temperature),
                augment=p.augment,
                batch_size=p.federation.batch_size,
                lr=p.federation.lr,
                images=images,
                clients=clients,
            )

        return build

    def mfcl_round(num_clients):
        def build():
            images, clients = fmnist(cap, num_clients, 20000)

            def make_model():
                torch.manual_seed(0)
                return ClientAutoencoder(
                    "resnet18", in_channels=1, width=32, norm="tn", channels_per_group=8
                ).to(device)

            return dict(
                make_model=make_model,
                make_trainer=lambda m: CohortTrainer(
                    m,
                    mfcl.twin_batch(BatchAugment(p.augment, images.shape[-1])),
                    mfcl.autoencoder_loss(),
                    OptimizerConfig("adam"),
                    32,
                    1,
                    parallel=vmap_clients,
                ),
                loss_eager=ae_loss_eager,
                augment=p.augment,
                batch_size=32,
                lr=1e-3,
                images=images,
                clients=clients,
            )

        return build

    out = {}
    for n in (10, 100):
        out[f"fedsimclr_round_{n}_clients"] = simclr(n)
        out[f"mfcl_phase1_round_{n}_clients"] = mfcl_round(n)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--max-per-client",
        type=int,
        default=None,
        help="cap each client's samples (default: 400 on CPU, all on CUDA)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="DataLoader workers of the conventional loop (default 0 CPU, 4 CUDA)",
    )
    ap.add_argument("--only", nargs="*", default=None, help="scenario names to run")
    ap.add_argument(
        "--parallel",
        choices=["auto", "on", "off"],
        default="auto",
        help="vectorise clients (models without BN stats): auto = on CUDA only, as in the pipeline",
    )
    ap.add_argument(
        "--precision", choices=precision.SETTINGS, default="auto", help="our round's precision"
    )
    ap.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)  # the child's scenario
    args = ap.parse_args()
    bound_kernel_cache()  # as every stage does: peak memory flat in the client count
    set_threads()  # as every stage does: FEDSSL_THREADS, one thread unless set
    device = torch.device(args.device)
    vmap_clients = args.parallel == "on" or (args.parallel == "auto" and device.type == "cuda")
    cap = args.max_per_client or (400 if device.type == "cpu" else 10**9)
    workers = args.workers if args.workers is not None else (0 if device.type == "cpu" else 4)
    built = scenarios(cap, device, vmap_clients)
    with precision.policy(args.precision):
        if args.memory_of:
            print(json.dumps(our_memory(built[args.memory_of](), device)))
            return
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(
            f"device {device} ({name}), {torch.get_num_threads()} threads, at most {cap} images "
            f"per client, clients vectorised: {vmap_clients}, our precision: {args.precision} "
            f"({precision.resolved(device)})",
            flush=True,
        )
        for scenario, build in built.items():
            if args.only is None or scenario in args.only:
                compare({"name": scenario, **build()}, device, workers)
                child = [*sys.argv[:1], "--memory-of", scenario, "--device", args.device]
                child += ["--max-per-client", str(cap), "--precision", args.precision]
                child += ["--parallel", args.parallel]
                run = subprocess.run(
                    [sys.executable, *child], check=True, capture_output=True, text=True
                )
                mem = json.loads(run.stdout.strip().splitlines()[-1])
                print(
                    f"  peak memory of our round: {mem['peak_mb']:.0f} MB "
                    f"({mem['before_mb']:.0f} MB before it), in a process of its own",
                    flush=True,
                )


if __name__ == "__main__":
    main()
