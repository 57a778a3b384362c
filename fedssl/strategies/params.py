"""The ``strategy:`` params field: which library strategy a method's federation runs, with its
own settings (a discriminated union on ``kind``). Pydantic models only, so a method's params
can name it without importing the engine; :func:`fedssl.strategies.choose.strategy` builds it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PositiveFloat

from fedssl.params import Strict


class FedAvgChoice(Strict):
    """FedAvg: the data-size weighted mean of the clients' models."""

    kind: Literal["fedavg"] = "fedavg"


class FedProxChoice(Strict):
    """FedProx: the local objective plus (mu / 2) ||w - w^t||^2, then FedAvg."""

    kind: Literal["fedprox"] = "fedprox"
    mu: PositiveFloat = Field(description="weight of the proximal term")


StrategyChoice = Annotated[FedAvgChoice | FedProxChoice, Field(discriminator="kind")]
