"""The method registry: every module or package under ``fedssl/methods`` is a method plugin
that registers itself when imported. Discovery imports only the declarations (no torch)."""

from __future__ import annotations

import importlib
import pkgutil

from fedssl.methods.base import Method, check_hooks
from fedssl.stage.record import did_you_mean

_METHODS: dict[str, Method] = {}
_NOT_PLUGINS = {
    "base",
    "hooks",
    "registry",
    "federated",
    "federated_supervised",
}  # contract, runtimes
_discovered = False


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: make a :class:`Method` subclass known to the pipeline, once every code
    reference it declares names a function of a project module (:func:`check_hooks`)."""
    name = cls.params.model_fields["name"].default
    if name != cls.name:
        raise TypeError(f"{cls.__name__}: params `name` defaults to {name!r}, not {cls.name!r}")
    check_hooks(cls)
    _METHODS[cls.name] = cls()
    return cls


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    import fedssl.methods as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.name not in _NOT_PLUGINS and not info.name.startswith("_"):
            importlib.import_module(f"fedssl.methods.{info.name}")


def all() -> list[Method]:  # noqa: A001 - registry.all() reads well at call sites
    _discover()
    return sorted(_METHODS.values(), key=lambda m: m.name)


def get(name: str) -> Method:
    _discover()
    if name not in _METHODS:
        near = did_you_mean(name, _METHODS)
        raise KeyError(f"no method '{name}'{near} (known: {', '.join(sorted(_METHODS))})")
    return _METHODS[name]


def module_of(name: str) -> str:
    """The importable module that declares method ``name`` (its code is a stage dependency)."""
    return type(get(name)).__module__
