"""A pydantic ``ValidationError`` of the trainer's config said as one line per wrong dotted key: the
expected type or range, the allowed values with a did-you-mean, the valid keys at an unknown key's
level (:func:`describe_errors`; :mod:`rlf_trainer.config` raises it as a ``ConfigError``).
"""

from __future__ import annotations

import difflib
import re
import typing
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

_KIND = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "string": "a string",
    "list": "a list",
    "dict": "a mapping",
    "model": "a mapping",
    "model_attributes": "a mapping",
}
_MEMBER = {"str": "a string", "int": "an integer", "float": "a number", "list[str]": "a list of strings"}


def describe_errors(error: ValidationError, root: type[BaseModel]) -> str:
    """One line per wrong key (pydantic reports every one), each naming the dotted key of ``root``.

    Example:
        >>> from pydantic import ConfigDict, Field
        >>> class Optim(BaseModel):
        ...     model_config = ConfigDict(extra="forbid")
        ...     lr: float = Field(1e-5, gt=0)
        >>> class Root(BaseModel):
        ...     model_config = ConfigDict(extra="forbid")
        ...     optim: Optim = Optim()
        >>> try:
        ...     Root.model_validate({"optim": {"lr": 0, "lrr": 1}})
        ... except ValidationError as exc:
        ...     print(describe_errors(exc, Root))
        2 problems in the config:
          optim.lr must be > 0
          unknown key 'optim.lrr' (did you mean 'optim.lr'?); valid keys in 'optim': lr
    """
    by_key: dict[str, list[dict[str, Any]]] = {}
    for item in error.errors():
        loc = list(item["loc"])
        union_at = next((i for i, part in enumerate(loc) if _is_union_tag(part)), None)
        if union_at is not None:  # one error per union member: say them in one line
            item = dict(item, type="union_member", member=loc[union_at], depth=len(loc))
            loc = loc[:union_at]
        by_key.setdefault(_dotted(loc), []).append(item)
    lines = [_describe(key, items, root) for key, items in by_key.items()]
    if len(lines) == 1:
        return lines[0]
    return f"{len(lines)} problems in the config:\n  " + "\n  ".join(lines)


def _is_union_tag(part: str | int) -> bool:
    """pydantic puts the member type (``'list[str]'``, ``'str'``) in the location of a union's errors."""
    if isinstance(part, int):
        return False
    return not part.isidentifier() or part in ("str", "int", "float", "bool")


def _expected_kind(error_type: str) -> str | None:
    """``'int_parsing'`` -> ``'an integer'``; None for errors that are not about the type."""
    return _KIND.get(re.sub(r"_(type|parsing|from_float)$", "", error_type))


def _dotted(parts: list[str | int]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _describe(key: str, items: list[dict[str, Any]], root: type[BaseModel]) -> str:
    first = items[0]
    kind, value = first["type"], first["input"]
    if kind == "extra_forbidden":
        return _unknown_key(key, root)
    field = _field(key, root)
    if kind == "union_member":
        members = [_MEMBER.get(it["member"], it["member"]) for it in items]
        value = min(items, key=lambda it: it["depth"])["input"]  # the whole value, not an item of it
        return f"{key} must be {' or '.join(dict.fromkeys(members))}, got {value!r}"
    if kind == "literal_error":
        allowed = _literal_values(field)
        null = " or null" if field is not None and _nullable(field) else ""
        return f"{key} must be one of {allowed}{null}, got {value!r}{_did_you_mean(value, allowed)}"
    if kind.startswith(("greater_than", "less_than")) and field is not None:
        return f"{key} must be {_range(field)}"
    kinds = [k for k in (_expected_kind(it["type"]) for it in items) if k]
    if kinds:
        if field is not None and _nullable(field):
            kinds.append("null")
        got = f"{type(value).__name__}: {value!r}" if "a mapping" in kinds else repr(value)
        return f"{key} must be {' or '.join(dict.fromkeys(kinds))}, got {got}"
    return f"{key or 'config'}: {first['msg']} (got {value!r})"


# Keys that were replaced: an old config is told what to write instead.
_REPLACED_KEYS = {"logging.tensorboard": "logging.report_to: [tensorboard] (or [] for none)"}


def _unknown_key(key: str, root: type[BaseModel]) -> str:
    if key in _REPLACED_KEYS:
        return f"{key} was replaced by {_REPLACED_KEYS[key]}"
    parent, _, name = key.rpartition(".")
    model = _section(parent, root)
    valid = sorted(model.model_fields) if model is not None else []
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" (did you mean {'.'.join(filter(None, [parent, close[0]]))!r}?)" if close else ""
    scope = f"in {parent!r}" if parent else "at the top level"
    return f"unknown key {key!r}{hint}; valid keys {scope}: {', '.join(valid)}"


def _section(dotted: str, root: type[BaseModel]) -> type[BaseModel] | None:
    """The section model at ``dotted`` ('' is the root), or None when it is not a section."""
    model = root
    for part in filter(None, dotted.split(".")):
        field = model.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _field(dotted: str, root: type[BaseModel]) -> FieldInfo | None:
    parent, _, name = re.sub(r"(\[\d+\])+$", "", dotted).rpartition(".")  # an item: its list's field
    model = _section(parent, root)
    return model.model_fields.get(name) if model is not None else None


def _nullable(field: FieldInfo) -> bool:
    return type(None) in typing.get_args(field.annotation)


def _literal_values(field: FieldInfo | None) -> list[Any]:
    if field is None:
        return []
    options = [field.annotation, *typing.get_args(field.annotation)]
    return next((list(typing.get_args(o)) for o in options if typing.get_origin(o) is Literal), [])


def _did_you_mean(value: Any, allowed: list[Any]) -> str:
    if not isinstance(value, str):  # a number, bool or list is never a typo of a name
        return ""
    close = difflib.get_close_matches(value, [a for a in allowed if isinstance(a, str)], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _range(field: FieldInfo) -> str:
    """``Field(gt=0, le=1)`` -> ``'in (0, 1]'``; ``Field(ge=1)`` -> ``'>= 1'``."""
    bounds = {
        name: getattr(m, name)
        for m in field.metadata
        for name in ("gt", "ge", "lt", "le")
        if hasattr(m, name)
    }
    low = next(((name, bounds[name]) for name in ("gt", "ge") if name in bounds), None)
    high = next(((name, bounds[name]) for name in ("lt", "le") if name in bounds), None)
    text = lambda x: f"{x:g}" if isinstance(x, float) else str(x)  # noqa: E731
    if low and high:
        return f"in {'(' if low[0] == 'gt' else '['}{text(low[1])}, {text(high[1])}{')' if high[0] == 'lt' else ']'}"
    name, bound = low or high  # type: ignore[misc]
    symbol = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}[name]
    return f"{symbol} {text(bound)}" + (" (or null)" if _nullable(field) else "")
