"""Records without generated code: the classes a rank's and a hook's start load.

``dataclasses`` writes each class's ``__init__``, ``__repr__``, ``__eq__`` (a frozen one's
``__setattr__``, ``__delattr__`` and ``__hash__`` too) as source and compiles it while the
module loads: some tenths of a millisecond a class, for some thirty records before a rank's
program starts (docs/concepts.md, What a start imports). A ``Struct`` is written as a
dataclass is, and behaves as one: fields are its annotations, in order, after its bases'
fields; a default is a value or ``field(default_factory=...)``; ``__post_init__`` runs after
the fields are set; ``frozen=True`` sets each field once and makes the record hashable (a
subclass is frozen as its base is). What a dataclass refuses, a Struct refuses too: a default
every record would share (a list, a dict), a field without a default after one with one. Its
methods are shared and read the class's field table, so defining one costs what a plain
class costs. mypy checks a Struct's constructor calls as a dataclass's
(``dataclass_transform``, PEP 681).

    class Share(Struct, frozen=True):
        index: int = 0
        count: int = 1

Fields whose names start with ``_`` stay out of the repr. ``asdict`` is shallow: a record's
values are taken as they are.
"""

from __future__ import annotations

from collections.abc import Callable

TYPE_CHECKING = False  # as typing's is at run time, without importing it (docs/concepts.md)
if TYPE_CHECKING:  # pragma: no cover - typing only
    from typing import Any, ClassVar, TypeVar

    from typing_extensions import dataclass_transform

    T = TypeVar("T")
    S = TypeVar("S", bound="Struct")
else:

    def dataclass_transform(**_: object) -> Callable[[type], type]:
        return lambda cls: cls


__all__ = ["Struct", "asdict", "field", "fields", "replace"]

_MISSING = object()


class _Factory:
    __slots__ = ("make",)

    def __init__(self, make: Callable[[], object]) -> None:
        self.make = make


def field(*, default_factory: Callable[[], T]) -> T:
    """A default made anew for each record: a list, a dict, the time it was made."""
    return _Factory(default_factory)  # type: ignore[return-value]


@dataclass_transform(field_specifiers=(field,))
class Struct:
    """A record: fields from the annotations, set by one shared ``__init__``."""

    #: The fields' names, in order (bases' first), the defaults of those that have one, and
    #: whether they are set once. Plain at run time, so that ``typing.get_type_hints`` of a
    #: record never evaluates ``ClassVar``, which only mypy imports.
    if TYPE_CHECKING:
        _fields: ClassVar[tuple[str, ...]]
        _defaults: ClassVar[dict[str, object]]
        _frozen: ClassVar[bool | None]
    _fields = ()
    _defaults = {}  # noqa: RUF012 - each class gets its own copy
    _frozen = None  # Struct itself: either

    def __init_subclass__(cls, frozen: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls._frozen is not None and frozen != cls._frozen:
            raise TypeError(f"{cls.__name__}: frozen={frozen}, its base's is {cls._frozen}")
        cls._frozen = frozen
        own = [
            name
            for name, kind in cls.__annotations__.items()  # its own only (3.10 on)
            if not str(kind).startswith(("ClassVar", "typing.ClassVar"))
        ]
        cls._fields = tuple(dict.fromkeys((*cls._fields, *own)))
        cls._defaults = {name: d for name, d in cls._defaults.items() if name not in own}
        for name in own:
            if name in cls.__dict__:
                cls._defaults[name] = _default(cls, name, cls.__dict__[name])
        required = [name for name in cls._fields if name not in cls._defaults]
        if required and cls._fields.index(required[-1]) >= len(required):
            raise TypeError(f"{cls.__name__}.{required[-1]}: no default, after a field with one")
        if frozen:
            cls.__setattr__ = _refuse_set  # type: ignore[assignment,method-assign]
            cls.__delattr__ = _refuse_delete  # type: ignore[assignment,method-assign]
            if "__hash__" not in cls.__dict__:  # its own stays, as a dataclass's does
                cls.__hash__ = _hash  # type: ignore[assignment,method-assign]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls, names = type(self), self._fields
        if len(args) > len(names):
            raise TypeError(
                f"{cls.__name__}() takes {len(names)} fields but {len(args)} were given"
            )
        values = dict(zip(names, args, strict=False))
        for name, value in kwargs.items():
            if name not in names or name in values:
                raise TypeError(f"{cls.__name__}() got an unexpected or repeated field {name!r}")
            values[name] = value
        for name in names:
            if name not in values:
                default = self._defaults.get(name, _MISSING)
                if default is _MISSING:
                    raise TypeError(f"{cls.__name__}() missing field {name!r}")
                values[name] = default.make() if isinstance(default, _Factory) else default
            object.__setattr__(self, name, values[name])
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    def __repr__(self) -> str:
        shown = (f"{name}={getattr(self, name)!r}" for name in self._fields if name[0] != "_")
        return f"{type(self).__qualname__}({', '.join(shown)})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return _values(self) == _values(other)

    __hash__ = None  # type: ignore[assignment]  # mutable: as a dataclass, unless frozen


def _default(cls: type, name: str, default: object) -> object:
    """A field's default; one that every record would share and could change is refused."""
    if isinstance(default, _Factory):
        delattr(cls, name)  # made anew for each record: no class attribute
    elif type(default).__hash__ is None:  # a list, dict, set or mutable record
        raise ValueError(f"{cls.__name__}.{name}: use field(default_factory=...)")
    return default


def _values(record: Struct) -> tuple[object, ...]:
    return tuple(getattr(record, name) for name in record._fields)


def _refuse_set(record: Struct, name: str, value: object) -> None:
    raise AttributeError(f"cannot assign to field {name!r} of frozen {type(record).__name__}")


def _refuse_delete(record: Struct, name: str) -> None:
    raise AttributeError(f"cannot delete field {name!r} of frozen {type(record).__name__}")


def _hash(record: Struct) -> int:
    return hash(_values(record))


def fields(record: Struct | type[Struct]) -> tuple[str, ...]:
    """The fields' names, in order."""
    return record._fields


def asdict(record: Struct) -> dict[str, Any]:
    """Each field by name (shallow: values as they are)."""
    return {name: getattr(record, name) for name in record._fields}


def replace(record: S, **changes: Any) -> S:
    """A copy with some fields changed, made (and checked) by the class's ``__init__``."""
    return type(record)(**{**asdict(record), **changes})
