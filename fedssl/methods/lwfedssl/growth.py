"""What a client of the LW-FedSSL family trains and exchanges at each growth stage: a training
plan, read by the training and by the cost formulas alike."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GrowthPlan:
    """What a client of a layer-wise family method trains and exchanges at stage s (Tab. 2):
    ``grows`` (False: all S blocks from the first round, end-to-end), which blocks it
    ``trains`` / ``downloads`` / ``uploads`` ("all" existing blocks, or the newest "last"),
    and whether it runs the received encoder for an alignment term (``global_forward``). The
    patch embedding trains with the first block (and with every block when ``trains`` is all)."""

    grows: bool
    trains: str
    downloads: str
    uploads: str
    global_forward: bool = False

    def blocks(self, which: str, s: int, depth: int) -> int:
        """How many blocks ``which`` ("all" / "last") covers at stage s."""
        present = s if self.grows else depth
        return present if which == "all" else 1

    def embedding_moves(self, which: str, s: int) -> bool:
        return which == "all" or (self.grows and s == 1)
