"""The strategies a params file can choose (``strategy: {kind: ..., ...}`` in a method's
federation block), one declaration file each, found like the methods and the evaluations:
every module of this package is imported when the choice is first built.

A declaration is a params model (:class:`StrategyParams`: its ``kind`` and settings) that
names the library strategy it stacks over the method's own (:meth:`StrategyParams.mixin`, a
lazy import: the declarations load no torch, so the front ends validate params before any
compute) and what that strategy is built with (:meth:`StrategyParams.options`). The
``strategy:`` field of every federation block is the discriminated union of the registered
models (:func:`federation_block`), so the JSON Schemas and the params docs list every choice,
and adding a strategy edits no file here: a file in this package and the strategy's own.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Annotated, Any, ClassVar, Union

from pydantic import BaseModel, Field, create_model

from fedssl.params import FederationSettings, Strict
from fedssl.params import federation_block as settings_block


class StrategyParams(Strict):
    """A choosable strategy's settings; ``kind`` names it in a params file."""

    kind: str
    title: ClassVar[str]  # its name in reports (FedProx, SCAFFOLD)
    # the federation block's settings it reads (SCAFFOLD: the local schedule); a block
    # without them is not offered this choice
    needs: ClassVar[tuple[str, ...]] = ()

    def mixin(self) -> type | None:
        """The library strategy (a mixin of :mod:`fedssl.strategies`) stacked over the
        method's own strategy; None: the method's own as it is (FedAvg)."""
        raise NotImplementedError

    def options(self, block: FederationSettings) -> dict[str, Any]:
        """The mixin's keyword arguments, from these settings and the federation ``block``
        they sit in (SCAFFOLD counts its local steps from the block's schedule)."""
        return {}

    def label(self) -> str:
        """The choice in a report row, its settings included."""
        return self.title

    @property
    def stacks(self) -> bool:
        """Whether this choice adds a strategy over the method's own (not the default)."""
        return self.kind != DEFAULT


DEFAULT = "fedavg"  # every block's choice unless its params say otherwise: the method's own
_CHOICES: dict[str, type[StrategyParams]] = {}
_discovered = False


def register(model: type[StrategyParams]) -> type[StrategyParams]:
    """Class decorator: offer the strategy whose params model this is in every federation
    block."""
    kind = model.model_fields["kind"].default
    if kind in _CHOICES and _CHOICES[kind] is not model:
        raise ValueError(f"strategy kind {kind!r} is registered twice")
    _CHOICES[kind] = model
    return model


def modules() -> list[str]:
    """The declaration files, as modules."""
    return [f"{__name__}.{info.name}" for info in pkgutil.iter_modules(__path__)]


def _discover() -> None:
    global _discovered
    if not _discovered:
        _discovered = True
        for module in modules():
            importlib.import_module(module)


def choices() -> dict[str, type[StrategyParams]]:
    """Every registered choice by kind, FedAvg (the default) first, then by name."""
    _discover()
    return dict(sorted(_CHOICES.items(), key=lambda item: (item[0] != DEFAULT, item[0])))


def offered(block: type[BaseModel], kinds: tuple[str, ...] | None = None) -> list[str]:
    """The kinds a federation ``block`` offers: ``kinds`` (default: every registered one)
    whose settings the block has."""
    known = choices()
    unknown = sorted(set(kinds or ()) - set(known))
    if unknown:
        raise KeyError(f"no strategy {unknown} (known: {', '.join(known)})")
    fields = block.model_fields
    return [
        k
        for k, model in known.items()
        if (kinds is None or k in kinds) and all(n in fields for n in model.needs)
    ]


def choice_type(kinds: list[str]) -> Any:
    """The ``strategy:`` field's type: the union of the choices ``kinds`` on ``kind``."""
    models = [choices()[k] for k in kinds]
    if len(models) == 1:
        return models[0]
    return Annotated[Union[tuple(models)], Field(discriminator="kind")]  # noqa: UP007


def federation_block(
    *, strategies: tuple[str, ...] | None = None, **settings: Any
) -> type[FederationSettings]:
    """A method's federation block: the common settings it reads at its defaults (see
    :func:`fedssl.params.federation_block`) and ``strategy``, the choice of a library
    strategy among every registered one (or ``strategies``, those that fit the method's
    exchange), FedAvg by default."""
    block = settings_block(**settings)
    kinds = offered(block, strategies)
    if DEFAULT not in kinds:
        raise ValueError(f"a federation block offers {DEFAULT!r} (its default), got {kinds}")
    field = Field(
        choices()[DEFAULT](),
        description="the library strategy stacked over the method's own: " + ", ".join(kinds),
    )
    return create_model("Federation", __base__=block, strategy=(choice_type(kinds), field))


def chosen(params: BaseModel) -> list[StrategyParams]:
    """The strategy choices in validated params (a method section, or an experiment): what
    stage code dependencies follow besides the method's own modules."""
    found: list[StrategyParams] = []
    for name in type(params).model_fields:
        value = getattr(params, name)
        if isinstance(value, StrategyParams):
            found.append(value)
        elif isinstance(value, BaseModel):
            found += chosen(value)
    return found
