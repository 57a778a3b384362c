"""Orchestra's balanced clustering (spec §4.3, the authors' ``models.py``): Sinkhorn-Knopp
equal-size soft assignments, the clients' local clustering of their memory and the server's
global clustering of the local centroids. Pure functions of tensors; rows are unit vectors."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

SHARPNESS = 25.0  # λ: softmax(λ·scores) before the balancing sweeps
LOCAL_SWEEPS, GLOBAL_SWEEPS = 10, 100
LOCAL_ITERATIONS = 5
GLOBAL_STEPS, GLOBAL_LR, GLOBAL_MOMENTUM, GLOBAL_WEIGHT_DECAY = 500, 0.01, 0.9, 1e-4


@torch.no_grad()
def sinkhorn_knopp(scores: torch.Tensor, sharpness: float = SHARPNESS, sweeps: int = 100):
    """Balanced soft assignments of N rows to K clusters from ``scores`` [N, K]: rows sum to 1
    and every column to about N/K. Alternating row / column rescaling of softmax(λ·scores),
    stopping early (checked every 10 sweeps) once the column scaling has settled."""
    n, k = scores.shape
    probs = F.softmax(scores.float() * sharpness, dim=1).T  # [K, N]
    c = torch.full((n, 1), 1.0 / n, device=scores.device)
    r = torch.full((k, 1), 1.0 / k, device=scores.device)
    for sweep in range(sweeps):
        r = (1.0 / k) / (probs @ c)
        c_new = (1.0 / n) / (r.T @ probs).T
        settled = sweep % 10 == 0 and torch.nansum((c / c_new - 1).abs()) < 1e-2
        c = c_new
        if settled:
            break
    return (probs * c.T * r).T * n


@torch.no_grad()
def local_clustering(memory: torch.Tensor, clusters: int, rng: np.random.Generator):
    """A client's ``clusters`` equal-size centroids of its memory [m, d] (unit rows): start at
    distinct random rows, then 5 rounds of balanced hard assignment and normalised means; an
    empty cluster takes a random row."""
    centroids = memory[torch.from_numpy(rng.choice(len(memory), clusters, replace=False))]
    for _ in range(LOCAL_ITERATIONS):
        assigned = sinkhorn_knopp(memory @ centroids.T, sweeps=LOCAL_SWEEPS).argmax(1)
        for j in range(clusters):
            members = memory[assigned == j]
            if len(members) == 0:
                members = memory[int(rng.integers(len(memory)))][None]
            centroids[j] = F.normalize(members.mean(0), dim=0)
    return centroids


def global_clustering(
    local_centroids: torch.Tensor, centroids: torch.Tensor, temperature: float, steps=GLOBAL_STEPS
) -> torch.Tensor:
    """The server's global centroids, warm-started from ``centroids`` [K, d]: SGD on the cosine
    between each local centroid's softmax assignment and its Sinkhorn-Knopp target, the rows
    renormalised after every step."""
    z = local_centroids.float()
    weight = centroids.detach().float().clone().requires_grad_(True)
    opt = torch.optim.SGD(
        [weight], lr=GLOBAL_LR, momentum=GLOBAL_MOMENTUM, weight_decay=GLOBAL_WEIGHT_DECAY
    )
    for _ in range(steps):
        target = sinkhorn_knopp(z @ weight.detach().T, sweeps=GLOBAL_SWEEPS)
        probs = F.softmax(F.normalize(z, dim=1) @ weight.T / temperature, dim=1)
        loss = -F.cosine_similarity(target, probs, dim=-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            weight.copy_(F.normalize(weight, dim=1))
    return weight.detach().to(centroids.dtype)
