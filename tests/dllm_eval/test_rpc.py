"""The plain-data codec between the test runner and the solution (dllm_eval._rpc), in process."""

from __future__ import annotations

import math
from collections import Counter, OrderedDict, namedtuple
from typing import Any

import pytest

from dllm_eval._rpc import ProtocolError, decode, encode


def _no_handles(value: Any) -> int:
    raise AssertionError(f"unexpected handle for {value!r}")


def _roundtrip(value: Any) -> Any:
    return decode(encode(value, _no_handles), lambda h: ("handle", h))


VALUES = [
    None, True, False, 0, -7, 2**4000 + 1, 1.5, -0.0, 1e308, float("inf"), 1 + 2j, "héllo\n",
    "\udc80", b"\x00\xff", bytearray(b"ab"), [1, [2, (3,)]], (1, [2]), (), {"a": 1, (1, 2): [3]},
    {1, 2}, frozenset({"x"}), range(1, 10, 3), {frozenset({1}): {None: (True, 0.1)}},
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_plain_values_round_trip_exactly(value: Any) -> None:
    got = _roundtrip(value)
    assert type(got) is type(value) and got == value
    assert repr(got) == repr(value)  # -0.0 stays -0.0, tuples stay tuples, order kept


def test_nan_round_trips() -> None:
    assert math.isnan(_roundtrip(float("nan")))


def test_subclasses_arrive_as_their_builtin_base() -> None:
    class Liar(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    point = namedtuple("point", "x y")
    assert type(_roundtrip(Liar(3))) is int and _roundtrip(Liar(3)) != 4
    assert type(_roundtrip(point(1, 2))) is tuple and _roundtrip(point(1, 2)) == (1, 2)
    assert type(_roundtrip(Counter("aab"))) is dict and _roundtrip(Counter("aab")) == {"a": 2, "b": 1}
    assert type(_roundtrip(OrderedDict(a=1))) is dict


def test_other_objects_become_handles() -> None:
    seen: list[Any] = []

    def handle(value: Any) -> int:
        seen.append(value)
        return len(seen) - 1

    gen = (i for i in range(3))
    assert decode(encode([gen, 1], handle), lambda h: ("handle", h)) == [("handle", 0), 1]
    assert seen == [gen]


@pytest.mark.parametrize("bad", [
    "x", 3, 1.5, {"a": 1}, [], [1], ["i", 5], ["i", "zz"], ["q", 1], ["l", "ab"],
    ["d", [[["i", "0x1"]]]], ["d", [[["l", []], ["i", "0x1"]]]], ["h", "0"], ["r", 1, 2],
    ["s", ["s", "x"]],
])
def test_malformed_values_are_protocol_errors(bad: Any) -> None:
    with pytest.raises((ProtocolError, TypeError)):
        decode(bad, lambda h: h)


def test_nesting_is_bounded() -> None:
    deep: Any = None
    for _ in range(300):
        deep = ["l", [deep]]
    with pytest.raises(ProtocolError, match="nested"):
        decode(deep, lambda h: h)


def test_long_flat_sequences_take_the_raw_json_path() -> None:
    nums = [1, 2.5, -0.0, float("inf"), 2**62, 7, 8, 9, 10, 11]
    for value in (nums, tuple(nums), [str(i) for i in range(20)], list(range(100))):
        wire = encode(value, _no_handles)
        assert wire[0] in ("ln", "tn", "ls", "ts")
        got = _roundtrip(value)
        assert type(got) is type(value) and repr(got) == repr(value)
        assert [type(x) for x in got] == [type(x) for x in value]  # 2 stays int, 2.0 float
    big = [2**70] + list(range(10))
    assert encode(big, _no_handles)[0] == "l" and _roundtrip(big) == big
    with pytest.raises(ProtocolError):
        decode(["ln", [1, "2"]], lambda h: h)
    with pytest.raises(ProtocolError):
        decode(["ls", ["a", True]], lambda h: h)
