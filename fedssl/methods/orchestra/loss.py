"""Orchestra's local objective (spec §4.3): the clustering loss (teacher: the target's
assignment of view 1; student: the online assignment of view 2) plus rotation prediction; the
batch's teacher projections go into the client's memory."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedssl.losses import masked_cross_entropy, masked_mean
from fedssl.methods.orchestra.model import CENTROIDS, MEMORY


def clustering_loss(student: torch.Tensor, teacher: torch.Tensor, centroids, temperature, valid):
    """-Σ_j q_j log p_j, batch mean: q = softmax(teacher·Cᵀ/T) (no gradient), p the same of
    the normalised student projection; one direction only, as the authors' code."""
    q = F.softmax(teacher.detach().float() @ centroids.T / temperature, dim=1)
    log_p = F.log_softmax(F.normalize(student.float(), dim=1) @ centroids.T / temperature, dim=1)
    return masked_mean(-(q * log_p).sum(1), valid)


def orchestra_forward(model, state, batch):
    """The student's projection of x2, the rotation head's logits on x3 and the teacher's
    projection of x1 (no gradient, fp32), which the runtime runs in one precision region (the
    online weights' bf16 casts shared by the student and rotation branches); and the client's
    buffers (centroids, memory) the loss reads and writes."""
    x1, x2, x3, _ = batch.views
    student = functional_call(model, state, (x2,))
    rotation = functional_call(model, state, (x3,), {"branch": "rotation"})
    with torch.no_grad():
        teacher = functional_call(model, state, (x1,), {"branch": "target"}).float()
    return student, rotation, teacher, state[1]


def orchestra_loss(p):
    """The local objective L_clu + L_deg of :func:`orchestra_forward`'s outputs. Side effect,
    like BatchNorm's running statistics: the batch's teacher projections are pushed into the
    client's memory buffer (FIFO)."""
    temperature = p.temperature

    def loss(outputs, batch):
        student, rotation, teacher, buffers = outputs
        turns = batch.views[3]
        centroids = buffers[CENTROIDS].float()
        l_clu = clustering_loss(student, teacher, centroids, temperature, batch.valid)
        l_deg = masked_cross_entropy(rotation, turns, batch.valid)
        with torch.no_grad():
            memory = buffers[MEMORY]
            memory.copy_(torch.cat([memory, teacher[batch.valid].to(memory.dtype)])[-len(memory) :])
        return l_clu + l_deg

    return loss
