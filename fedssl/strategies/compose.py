"""A chosen strategy over a method's own: the params' ``strategy:`` choice
(:mod:`fedssl.strategies.choices`) stacked on whatever strategy the method built.

The library's strategies are mixins whose hooks end in ``super()`` (FedProx adds its anchors to
a client's start and strips them from what it uploads, SCAFFOLD its control variates).
:class:`Over` is the base they stack on here: every hook forwards to the method's strategy
``inner``, so ``FedProx`` over MFCL's secure aggregation, LW-FedSSL's growth or the BYOL
family's client starts is a params choice, not a class written for the pair."""

from __future__ import annotations

from functools import cache

from fedssl.strategies.base import Strategy


class Over(Strategy):
    """Every hook of the strategy ``inner``; attributes it lacks are ``inner``'s (what a
    method reads of its strategy after the run)."""

    def __init__(self, inner: Strategy):
        super().__init__(inner.cfg, inner.data)
        self.inner = inner

    def __getattr__(self, name: str):
        if name == "inner":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def init_server(self, model):
        return self.inner.init_server(model)

    def local_objective(self, loss, model):
        return self.inner.local_objective(loss, model)

    def sample(self, state, round_):
        return self.inner.sample(state, round_)

    def lr(self, round_):
        return self.inner.lr(round_)

    def download(self, state, client):
        return self.inner.download(state, client)

    def local_start(self, state, client, received):
        return self.inner.local_start(state, client, received)

    def group(self, state, client):
        return self.inner.group(state, client)

    def trainable(self, state):
        return self.inner.trainable(state)

    def upload(self, state, client, trained):
        return self.inner.upload(state, client, trained)

    def traffic(self, tensors):
        return self.inner.traffic(tensors)

    def keep(self, state, client, trained):
        return self.inner.keep(state, client, trained)

    def needs_uploads(self) -> bool:
        """``inner``'s answer, unless the mixin replaces the aggregation (SCAFFOLD)."""
        if type(self).aggregate is Over.aggregate:
            return self.inner.needs_uploads()
        return True

    def aggregate(self, state, updates):
        self.inner.aggregate(state, updates)

    def server_step(self, state, round_):
        self.inner.server_step(state, round_)

    def evaluate(self, state, round_):
        return self.inner.evaluate(state, round_)

    def final_model(self, state):
        return self.inner.final_model(state)

    def load_final(self, model, state):
        self.inner.load_final(model, state)


@cache
def stacked(mixin: type[Strategy]) -> type[Strategy]:
    """``mixin`` over :class:`Over` (one class per mixin)."""
    return type(f"{mixin.__name__}Over", (mixin, Over), {})


def chosen_over(inner: Strategy, block) -> Strategy:
    """The strategy the federation ``block``'s ``strategy`` choice stacks over ``inner``
    (``inner`` itself for FedAvg)."""
    choice = block.strategy
    mixin = choice.mixin()
    if mixin is None:
        return inner
    return stacked(mixin)(inner, **choice.options(block))
