"""A griffe extension for the API reference (mkdocs.yaml): a parameter whose default names a
module constant (`k: int = field(default=DEFAULT_K)`) shows the constant's value (`50`),
which is what a user wants to read, not the name of a constant they never import.

Only a name that resolves, inside the loaded package, to a module-level attribute whose
value is a literal (a number, a string, True, False, None, a tuple of them) is replaced; any other default
(a call, an expression) is left as written.
"""

from __future__ import annotations

import ast
from typing import Any

import griffe


def _literal(value: Any) -> str | None:
    """`value`'s source if it is a Python literal (a tuple of strings too), else None."""
    if isinstance(value, griffe.Expr):
        value = str(value)
    if not isinstance(value, str):
        return None
    try:
        ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return None
    return value


def constant_value(default: Any, package: griffe.Module) -> str | None:
    """The literal value of the module constant `default` names, or None."""
    if not isinstance(default, griffe.ExprName):
        return None
    try:
        target = package.modules_collection.get_member(default.canonical_path)
        if isinstance(target, griffe.Alias):  # imported from the module that defines it
            target = target.final_target
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
    if not isinstance(target, griffe.Attribute) or not isinstance(target.parent, griffe.Module):
        return None
    return _literal(target.value)


def _functions(obj: griffe.Object) -> list[griffe.Function | griffe.Class]:
    found: list[griffe.Function | griffe.Class] = []
    for member in obj.members.values():
        if member.is_alias:
            continue
        if isinstance(member, griffe.Class):
            found.append(member)  # a dataclass's parameters live on the class too
            found += _functions(member)
        elif isinstance(member, griffe.Function):
            found.append(member)
        elif isinstance(member, griffe.Module):
            found += _functions(member)
    return found


class ConstantDefaults(griffe.Extension):
    """Defaults that name a module constant shown as its value."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for function in _functions(pkg):
            for parameter in function.parameters:
                value = constant_value(parameter.default, pkg)
                if value is not None:
                    parameter.default = value
