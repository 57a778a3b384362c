"""Federated strategies as a library, in Flower's order: the hooks' base
(:class:`~fedssl.strategies.base.Strategy`, FedAvg by default) in :mod:`.base`, one module per
strategy, each a subclass or a wrapper of it, over the pure aggregation functions of
:mod:`.aggregation`. A method picks one (or composes one with its own paper-specific hooks);
nothing here knows about a method, nor about the round loop (:mod:`fedssl.rounds`) that drives
them: a strategy reads the federation's state it is handed (:mod:`fedssl.fl.state`).

Importing this package imports nothing.
"""
