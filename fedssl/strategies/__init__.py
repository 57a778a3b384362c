"""Federated strategies as a library: one module per strategy, each a subclass or a wrapper of
the engine's :class:`~fedssl.fl.engine.Strategy` hooks, over the pure aggregation functions of
:mod:`fedssl.strategies.aggregation`. A method picks one (or composes one with its own
paper-specific hooks); nothing here knows about a method.

Importing this package imports nothing: the engine itself reads :mod:`.aggregation`.
"""
