"""``_struct.Struct`` behaves as the dataclass it replaces: fields, defaults, equality, hashing,
frozen fields, ``__post_init__``, ``replace`` and ``asdict``."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

import pytest

from mpswrap._struct import Struct, asdict, field, fields, replace
from mpswrap.entry.farm import FarmResult
from mpswrap.taskfarm.journal import TaskRecord
from mpswrap.taskfarm.tasks import Task


class Point(Struct, frozen=True):
    x: int
    y: int = 0
    _note: str = ""


class Point3(Point, frozen=True):
    z: int = 0


class Bag(Struct):
    items: list[int] = field(default_factory=list)
    count: int = 0

    def __post_init__(self) -> None:
        self.count = len(self.items)


@dataclasses.dataclass(frozen=True)
class DataPoint:
    x: int
    y: int = 0
    _note: str = ""


def test_fields_in_order_after_the_bases_and_set_by_position_or_name() -> None:
    assert fields(Point3) == ("x", "y", "_note", "z")
    p = Point3(1, 2, z=3)
    assert (p.x, p.y, p._note, p.z) == (1, 2, "", 3)


def test_repr_and_equality_are_a_dataclasss_less_private_fields() -> None:
    assert repr(Point(1, 2, "n")) == repr(DataPoint(1, 2)).replace("DataPoint", "Point").replace(
        ", _note=''", ""
    )
    assert Point(1, 2) == Point(1, 2) and Point(1, 2) != Point(2, 1)
    assert Point(1) != Point3(1)  # another class: never equal, as with dataclasses


def test_frozen_fields_are_set_once_and_the_record_hashes_by_value() -> None:
    p = Point(1)
    with pytest.raises(AttributeError, match="frozen Point"):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(AttributeError, match="frozen Point"):
        del p.x
    assert hash(p) == hash(Point(1)) and len({p, Point(1), Point(2)}) == 2


def test_a_mutable_record_is_unhashable_and_gets_its_own_default_list() -> None:
    a, b = Bag(), Bag([1, 2])
    a.items.append(5)
    assert Bag().items == [] and b.count == 2  # __post_init__ ran
    with pytest.raises(TypeError):
        hash(a)


def test_replace_remakes_through_init_and_asdict_is_shallow() -> None:
    p = Point(1, 2)
    assert replace(p, y=5) == Point(1, 5) and p.y == 2
    assert replace(Bag([1]), items=[1, 2, 3]).count == 3
    items = [1]
    assert asdict(Bag(items)) == {"items": [1], "count": 1}
    assert asdict(Bag(items))["items"] is items


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((), {}, "missing field 'x'"),
        ((1, 2, "", 4), {}, "takes 3 fields but 4 were given"),
        ((1,), {"x": 2}, "unexpected or repeated field 'x'"),
        ((1,), {"w": 2}, "unexpected or repeated field 'w'"),
    ],
)
def test_wrong_arguments_are_refused_as_a_dataclass_refuses_them(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: str
) -> None:
    with pytest.raises(TypeError, match=error):
        Point(*args, **kwargs)


def test_a_mutable_default_is_refused_as_a_dataclass_refuses_it() -> None:
    with pytest.raises(ValueError, match=r"Shared.items: use field\(default_factory"):

        class Shared(Struct):
            items: list[int] = []  # noqa: RUF012 - the mistake under test

    with pytest.raises(ValueError, match=r"SharedBag.bag: use field\(default_factory"):

        class SharedBag(Struct):
            bag: Bag = Bag()  # a mutable record: unhashable, shared all the same


def test_field_order_and_frozen_mixes_are_refused_as_a_dataclass_refuses_them() -> None:
    with pytest.raises(TypeError, match=r"Late\.y: no default, after a field with one"):

        class Late(Struct):
            x: int = 0
            y: int  # type: ignore[misc]

    with pytest.raises(TypeError, match="Thawed: frozen=False, its base's is True"):

        class Thawed(Point):  # type: ignore[misc]
            pass


def test_a_redeclared_field_without_a_default_needs_one_given() -> None:
    class Required(Point, frozen=True):
        y: int

    with pytest.raises(TypeError, match="missing field 'y'"):
        Required(1)  # type: ignore[call-arg]


def test_type_hints_of_a_record_resolve_at_run_time() -> None:
    assert typing.get_type_hints(Point) == {"x": int, "y": int, "_note": str}


def test_a_farms_result_is_plain_data_through_dataclasses_asdict() -> None:
    """``FarmResult`` and the ``Task``s and ``TaskRecord``s in it stay dataclasses: what the
    public API returns turns into JSON through ``dataclasses.asdict``."""
    task = Task(1, "true", "k1", 1)
    record = TaskRecord(
        1, "k1", "true", 1, "DONE", 0, "n1", "GPU-1", 0, 10.0, 11.5, "a.out", "a.err"
    )
    result = FarmResult(0, [record], [task])
    data = json.loads(json.dumps(dataclasses.asdict(result)))
    assert data["records"][0]["status"] == "DONE" and data["not_run"][0]["command"] == "true"
