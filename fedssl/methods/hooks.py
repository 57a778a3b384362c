"""Typed, lazy references from a method's declaration to the code that does its work.

A declaration must not import its code: the front ends import every method's declaration to
validate params and build the DAG, and each stage's code dependencies are the imports of what it
runs (:mod:`fedssl.plan.codegraph`), so an import here would put a method's training into its
report's dependencies. A :class:`Hook` names the code instead, by module and attribute, and is
typed by what it must be: the field that holds it says so (``report_tables:
ClassVar[Hook[ReportTables] | None]``), so a type checker sees what :func:`resolve_hook` returns
and an editor can follow the protocol.

When a plugin registers, :func:`check_hook` reads the named module's source (without importing
it) and fails, naming the plugin's field, unless the module defines the attribute and, where the
source says so (a ``def``, a class's ``__init__`` or a dataclass's fields), it takes the
positional arguments the field's protocol passes. A typo or a wrong signature thus fails at
import, not when a stage reaches the hook hours later.

A field holds a :class:`Hook`, never a plain ``"module:function"`` string: a string would
escape the type checker and the editor, so registering refuses one.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import UnionType
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Generic,
    Protocol,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    overload,
)

if TYPE_CHECKING:
    from torch import nn

    from fedssl.rounds.loop import Federation
    from fedssl.rounds.recipe import Recipe
    from fedssl.stage.contract import StepContext
    from fedssl.strategies.base import Strategy

F = TypeVar("F", bound=Callable[..., Any])
F_co = TypeVar("F_co", bound=Callable[..., Any], covariant=True)


@dataclass(frozen=True)
class Hook(Generic[F_co]):
    """The attribute ``name`` of project module ``module``: a function (or class) of type ``F``,
    imported only when a stage resolves it. ``str(hook)`` is ``"module:name"`` (what plan
    records and export cards write)."""

    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}:{self.name}"

    def resolve(self) -> F_co:
        """The attribute, its module imported (the one place a hook is imported)."""
        return getattr(importlib.import_module(self.module), self.name)


def as_hook(ref: Hook | str) -> Hook:
    """``ref`` as a :class:`Hook` (a ``"module:name"`` string parsed)."""
    if isinstance(ref, Hook):
        return ref
    module, sep, name = ref.partition(":")
    if not (sep and module and name):
        raise TypeError(f"{ref!r}: expected a Hook or 'module:function'")
    return Hook(module, name)


@overload
def resolve_hook(ref: Hook[F]) -> F: ...
@overload
def resolve_hook(ref: str) -> Callable[..., Any]: ...
def resolve_hook(ref):
    """The function (or class) a hook names, its module imported."""
    return as_hook(ref).resolve()


def call_hook(ref: Hook | str, *args):
    """Resolve a hook and call it with ``args``."""
    return resolve_hook(ref)(*args)


def hook_module(ref: Hook | str) -> str:
    """The module a hook names (its code is a dependency of the stage that calls it)."""
    return as_hook(ref).module


# ---------------------------------------------------------------------------- the protocols
# What each hook is called with, positionally (parameter names are the implementer's).
class StepRunner(Protocol):
    """A step's runner: the stage context, then the step's ``args``."""

    def __call__(self, ctx: StepContext, /, *args: Any) -> None: ...


class RecipeOf(Protocol):
    def __call__(self, params: Any, /) -> Recipe: ...


class EncoderBuilder(Protocol):
    """The untrained encoder an export loads into: (method params, image shape, projection)."""

    def __call__(self, params: Any, image_shape: Any, projection: bool, /) -> nn.Module: ...


class EncoderLoader(Protocol):
    """The trained frozen encoder the probes read, from the stage context."""

    def __call__(self, ctx: StepContext, /) -> nn.Module: ...


class ClientCosts(Protocol):
    def __call__(self, ctx: StepContext, /) -> list[dict]: ...


class ProjectedCosts(Protocol):
    def __call__(self, exp: Any, partition: Any, dataset: str, /) -> dict: ...


class ReportTables(Protocol):
    def __call__(self, rows: list[dict], /) -> dict[str, str]: ...


class ReportFigures(Protocol):
    def __call__(self, rows: list[dict], out_dir: Path, /) -> dict[str, str]: ...


class FlowerFederation(Protocol):
    """(model, its Federation) of a step, built from the stage context."""

    def __call__(self, ctx: StepContext, /) -> tuple[nn.Module, Federation]: ...


class NetworkOf(Protocol):
    def __call__(self, params: Any, image_shape: Any, classes: int, /) -> nn.Module: ...


class OutputsLoss(Protocol):
    def __call__(self, outputs: Any, batch: Any, params: Any, /) -> Any: ...


class StepLossOf(Protocol):
    def __call__(self, params: Any, /) -> Callable[..., Any]: ...


class EncoderOf(Protocol):
    def __call__(self, network: nn.Module, projection: bool, /) -> nn.Module: ...


class WrapperOf(Protocol):
    def __call__(self, params: Any, network: nn.Module, /) -> nn.Module: ...


class StrategyOf(Protocol):
    def __call__(
        self, cfg: Any, params: Any, model: nn.Module, data: Any, tests: Any, /
    ) -> Strategy: ...


class Describe(Protocol):
    def __call__(self, federation: Federation, params: Any, /) -> dict: ...


def arity(spec: type) -> int:
    """How many positional arguments a protocol's ``__call__`` passes (besides ``*args``)."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = list(inspect.signature(spec.__call__).parameters.values())[1:]  # not self
    return sum(p.kind in kinds for p in params)


# ---------------------------------------------------------------------------- the check
ROOT = Path(__file__).resolve().parents[2]  # the project's root, where module paths start


@cache
def _source(module: str) -> tuple[ast.Module, bool] | None:
    """A project module's parsed source and whether it is a package; None: no such file."""
    base = ROOT.joinpath(*module.split("."))
    for path, package in ((base.with_suffix(".py"), False), (base / "__init__.py", True)):
        if path.is_file():
            return ast.parse(path.read_text(), str(path)), package
    return None


def _imported_from(module: str, package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` of ``module`` reads."""
    base = module if package else module.rpartition(".")[0]
    for _ in range(max(node.level - 1, 0)):
        base = base.rpartition(".")[0]
    if not node.level:
        return node.module or ""
    return f"{base}.{node.module}" if node.module else base


def _binds(node: ast.stmt, name: str) -> bool:
    """Whether a top-level statement binds ``name`` (an assignment or a plain import)."""
    if isinstance(node, ast.Import):
        return any((a.asname or a.name).split(".")[0] == name for a in node.names)
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return any(isinstance(t, ast.Name) and t.id == name for t in targets)


def definition(module: str, name: str) -> ast.FunctionDef | ast.ClassDef | None:
    """The ``def`` or ``class`` that defines ``name`` at the top of project module ``module``
    (a ``from`` import followed to its module); None where something else binds it (an
    assignment, a module, a name from outside the project). LookupError: nothing does."""
    found = _source(module)
    if found is None:
        raise LookupError(f"{module} is not a project module")
    tree, package = found
    for node in reversed(tree.body):  # the last binding wins
        defines = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if defines and node.name == name:
            return node
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    try:
                        return definition(_imported_from(module, package, node), alias.name)
                    except LookupError:
                        return None
        elif _binds(node, name):
            return None
    raise LookupError(f"module {module} defines no {name!r}")


@dataclass(frozen=True)
class Signature:
    """The positional parameters a definition takes, read from its source."""

    positional: tuple[str, ...]
    required: int  # how many of them have no default
    varargs: bool = False
    keyword_only: tuple[str, ...] = ()  # the required ones (a positional call cannot pass them)

    @classmethod
    def of_arguments(cls, args: ast.arguments, bound: int = 0) -> Signature:
        positional = tuple(a.arg for a in [*args.posonlyargs, *args.args][bound:])
        keyword_only = tuple(
            a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None
        )
        required = len(positional) - len(args.defaults)
        return cls(positional, required, args.vararg is not None, keyword_only)

    def refuses(self, n: int) -> str | None:
        """Why a call with ``n`` positional arguments fails, or None if it does not."""
        names = f"({', '.join(self.positional)}{', *args' if self.varargs else ''})"
        if self.keyword_only:
            return f"it also requires keyword-only {', '.join(self.keyword_only)}"
        if n < self.required:
            return f"it requires {self.required} {names}"
        if n > len(self.positional) and not self.varargs:
            return f"it takes {len(self.positional)} {names}"
        return None


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any(
        "dataclass" in ast.unparse(d.func if isinstance(d, ast.Call) else d)
        for d in node.decorator_list
    )


def signature(node: ast.FunctionDef | ast.ClassDef | None) -> Signature | None:
    """What a ``def``, or a class's own ``__init__`` or dataclass fields, takes; None: the
    source does not say (an assignment, an inherited constructor)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return Signature.of_arguments(node.args)
    if not isinstance(node, ast.ClassDef):
        return None
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            return Signature.of_arguments(item.args, bound=1)
    if not _is_dataclass(node):
        return None
    fields = [
        s
        for s in node.body
        if isinstance(s, ast.AnnAssign)
        and isinstance(s.target, ast.Name)
        and "ClassVar" not in ast.unparse(s.annotation)
    ]
    names = tuple(s.target.id for s in fields)
    return Signature(names, sum(s.value is None for s in fields))


def check_hook(where: str, ref: object, spec: type, extra: int = 0) -> None:
    """Fail, naming ``where`` (the plugin's field), unless ``ref`` is a :class:`Hook` whose
    module's source defines the name and, where it says how, accepts the positional arguments
    ``spec`` passes (plus ``extra``)."""
    if not isinstance(ref, Hook):
        raise TypeError(f"{where} = {ref!r}: expected a Hook(module, name), a {spec.__name__}")
    hook = ref
    try:
        sig = signature(definition(hook.module, hook.name))
    except (LookupError, TypeError) as e:
        raise TypeError(f"{where} = {ref}: {e}") from None
    n = arity(spec) + extra
    problem = sig.refuses(n) if sig else None
    if problem:
        raise TypeError(
            f"{where} = {hook}: called as a {spec.__name__}, with {n} positional "
            f"argument{'s' * (n != 1)}, but {problem}"
        )


def field_type(hint: object) -> type | None:
    """The protocol of a field typed ``Hook[P]`` (within ``ClassVar``, ``| None``); None for
    any other field."""
    if get_origin(hint) is Hook:
        return get_args(hint)[0]
    if get_origin(hint) not in (ClassVar, Union, UnionType):
        return None
    for arg in get_args(hint):
        found = field_type(arg)
        if found:
            return found
    return None


def hook_fields(cls: type) -> dict[str, type]:
    """The attributes of ``cls`` typed as hooks: name -> protocol."""
    hints = get_type_hints(cls)
    return {name: found for name, hint in hints.items() if (found := field_type(hint))}
