"""Plain-data calls from the test runner into the sandboxed solution (standard library only).

The solution runs in its own process (``serve``); the tests run in another one (``run_tests``)
where every name the tests use and do not define resolves to the solution's global of that
name. Values cross the pipe as tagged JSON that the test side decodes into **exact builtin
types** (``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``bytearray``,
``list``, ``tuple``, ``dict``, ``set``, ``frozenset``, ``range``); a subclass (a named tuple, a
``Counter``, a lying ``int``) arrives as its builtin base value, so its ``__eq__`` never runs in
the tests. Any other object stays in the solution's process and the tests get a handle that
can be called, iterated (items come back as plain data), indexed, measured with ``len``,
tested for truth and printed, but not compared or hashed: comparing it would ask the
solution's code whether it equals the expected value. Such a comparison, and any malformed
reply, taints the run, which then fails however the tests handle the exception.
"""

import builtins
import json
import os
import sys
import traceback
from typing import Any, Callable

_MAX_LINE = 64 << 20


class ProtocolError(Exception):
    """The solution's process broke the protocol (or a handle was compared)."""


# ---- codec --------------------------------------------------------------------------------


def encode(value: Any, handle: Callable[[Any], int], depth: int = 0) -> Any:
    """Tagged-JSON form of ``value``; objects that are not plain data become ``["h", id]``."""
    if depth > 200:
        raise ValueError("value nested more than 200 levels")
    d = depth + 1
    if value is None:
        return None
    if value is True or value is False:
        return value
    if isinstance(value, int):
        return ["i", hex(int.__int__(value))]
    if isinstance(value, float):
        return ["f", float.__repr__(value)]
    if isinstance(value, complex):
        return ["c", float.__repr__(value.real), float.__repr__(value.imag)]
    if isinstance(value, str):
        return ["s", str.__str__(value)]
    if isinstance(value, bytearray):
        return ["Y", bytes(value).hex()]
    if isinstance(value, bytes):
        return ["y", bytes.hex(value)]
    if type(value) in (list, tuple) and len(value) > 8:
        kind = _flat_kind(value)
        if kind is not None:
            return [("l" if type(value) is list else "t") + kind, list(value)]
    if isinstance(value, tuple):
        return ["t", [encode(x, handle, d) for x in tuple.__iter__(value)]]
    if isinstance(value, list):
        return ["l", [encode(x, handle, d) for x in list.__iter__(value)]]
    if isinstance(value, dict):
        return ["d", [[encode(k, handle, d), encode(v, handle, d)] for k, v in dict.items(value)]]
    if isinstance(value, frozenset):
        return ["F", [encode(x, handle, d) for x in frozenset.__iter__(value)]]
    if isinstance(value, set):
        return ["S", [encode(x, handle, d) for x in set.__iter__(value)]]
    if type(value) is range:
        return ["r", value.start, value.stop, value.step]
    return ["h", handle(value)]


_NUMBER = (int, float)


def _flat_kind(value: "list[Any] | tuple[Any, ...]") -> str | None:
    """``n`` for exact ints (64-bit) and floats, ``s`` for exact strings, sent as raw JSON."""
    if all(type(x) is str for x in value):
        return "s"
    if all(type(x) is float or (type(x) is int and -(1 << 63) <= x < (1 << 63))
           for x in value):
        return "n"
    return None


def _items(payload: Any, resolve: Callable[[int], Any], depth: int) -> list[Any]:
    if type(payload) is not list:
        raise ProtocolError(f"expected a list, got {type(payload).__name__}")
    return [decode(x, resolve, depth + 1) for x in payload]


def _text(payload: Any) -> str:
    if type(payload) is not str:
        raise ProtocolError(f"expected a string, got {type(payload).__name__}")
    return payload


def decode(obj: Any, resolve: Callable[[int], Any], depth: int = 0) -> Any:
    """Inverse of :func:`encode`; builds exact builtin types only, handles via ``resolve``."""
    if depth > 200:
        raise ProtocolError("value nested more than 200 levels")
    if obj is None or obj is True or obj is False:
        return obj
    if type(obj) is not list or not obj or type(obj[0]) is not str:
        raise ProtocolError(f"not a tagged value: {str(obj)[:80]!r}")
    tag, rest = obj[0], obj[1:]
    try:
        if tag == "i" and len(rest) == 1:
            return int(_text(rest[0]), 16)
        if tag == "f" and len(rest) == 1:
            return float(_text(rest[0]))
        if tag == "c" and len(rest) == 2:
            return complex(float(_text(rest[0])), float(_text(rest[1])))
        if tag == "s" and len(rest) == 1:
            return _text(rest[0])
        if tag == "y" and len(rest) == 1:
            return bytes.fromhex(_text(rest[0]))
        if tag == "Y" and len(rest) == 1:
            return bytearray.fromhex(_text(rest[0]))
        if tag == "t" and len(rest) == 1:
            return tuple(_items(rest[0], resolve, depth))
        if tag == "l" and len(rest) == 1:
            return _items(rest[0], resolve, depth)
        if tag in ("ln", "tn", "ls", "ts") and len(rest) == 1 and type(rest[0]) is list:
            items = rest[0]
            if tag[1] == "s" and not all(type(x) is str for x in items):
                raise ProtocolError(f"{tag!r} items must all be str")
            if tag[1] == "n" and not all(type(x) in _NUMBER for x in items):
                raise ProtocolError(f"{tag!r} items must all be int or float")
            return items if tag[0] == "l" else tuple(items)
        if tag == "S" and len(rest) == 1:
            return set(_items(rest[0], resolve, depth))
        if tag == "F" and len(rest) == 1:
            return frozenset(_items(rest[0], resolve, depth))
        if tag == "d" and len(rest) == 1 and type(rest[0]) is list:
            if not all(type(p) is list and len(p) == 2 for p in rest[0]):
                raise ProtocolError("dict items must be [key, value] pairs")
            return {decode(k, resolve, depth + 1): decode(v, resolve, depth + 1)
                    for k, v in rest[0]}
        if tag == "r" and len(rest) == 3 and all(type(x) is int for x in rest):
            return range(rest[0], rest[1], rest[2])
        if tag == "h" and len(rest) == 1 and type(rest[0]) is int:
            return resolve(rest[0])
    except (TypeError, ValueError, OverflowError) as e:
        raise ProtocolError(f"bad {tag!r} value: {e}") from None
    raise ProtocolError(f"unknown tag {tag!r} with {len(rest)} fields")


# ---- solution side ------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def serve(solution_path: str, rfd: int, wfd: int) -> None:
    """Run the solution as ``__main__``, then answer the test runner's requests until EOF."""
    objects: dict[int, Any] = {}

    def handle(value: Any) -> int:
        objects[len(objects)] = value
        return len(objects) - 1

    def resolve(i: int) -> Any:
        return objects[i]

    def reply(msg: Any) -> None:
        _write_all(wfd, json.dumps(msg).encode() + b"\n")

    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": "solution.py",
                                 "__builtins__": builtins}
    try:
        with open(solution_path, encoding="utf-8") as f:
            code = compile(f.read(), "solution.py", "exec")
        exec(code, namespace)
    except BaseException as e:  # noqa: BLE001 - the solution failed to load; tell the tests
        traceback.print_exc()
        reply({"e": [type(e).__name__, str(e)[:1000]]})
        return
    sys.stdout.flush()
    reply({"ready": True})
    reader = os.fdopen(rfd, "rb", buffering=1 << 20)
    for line in reader:
        req = json.loads(line)
        op, target = req["op"], req["t"]
        try:
            obj = namespace[target] if isinstance(target, str) else objects[target]
            args = [decode(a, resolve) for a in req.get("a", [])]
            kwargs = {k: decode(v, resolve) for k, v in req.get("k", [])}
            result = _apply(op, obj, args, kwargs)
            out = encode(result, handle)
        except BaseException as e:  # noqa: BLE001 - reported to the tests as the call's error
            if isinstance(e, KeyError) and op == "get":
                reply({"absent": True})
                continue
            reply({"e": [type(e).__name__, str(e)[:1000]]})
            continue
        sys.stdout.flush()
        reply({"v": out})


def _apply(op: str, obj: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if op == "get":
        return obj
    if op == "call":
        return obj(*args, **kwargs)
    if op == "getattr":
        return getattr(obj, args[0])
    if op == "getitem":
        return obj[args[0]]
    if op == "iter":
        return list(obj)
    if op == "len":
        return len(obj)
    if op == "bool":
        return bool(obj)
    if op == "str":
        return str(obj)
    if op == "repr":
        return repr(obj)
    raise ValueError(f"unknown op {op!r}")


# ---- test side ----------------------------------------------------------------------------


class _Client:
    """The test runner's end of the pipes."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self._reader = os.fdopen(rfd, "rb", buffering=1 << 20)
        self._wfd = wfd
        self.tainted: str | None = None

    def taint(self, why: str) -> ProtocolError:
        if self.tainted is None:
            self.tainted = why
        return ProtocolError(why)

    def receive(self) -> dict[str, Any]:
        line = self._reader.readline(_MAX_LINE)
        if not line.endswith(b"\n"):
            raise self.taint("the solution's process ended or sent an unterminated reply"
                             if not line else "reply longer than 64 MiB")
        try:
            msg = json.loads(line)
        except ValueError:
            raise self.taint("malformed reply") from None
        if type(msg) is not dict:
            raise self.taint("malformed reply")
        return msg

    def request(self, op: str, target: "int | str", args: tuple[Any, ...] = (),
                kwargs: "dict[str, Any] | None" = None) -> Any:
        if self.tainted is not None:
            raise ProtocolError(self.tainted)
        try:
            req = {"op": op, "t": target, "a": [encode(a, _refuse) for a in args],
                   "k": [[k, encode(v, _refuse)] for k, v in (kwargs or {}).items()]}
        except _NotPlain as e:
            raise TypeError(f"the tests passed a {e} to the solution; only plain data and "
                            "handles can cross into the sandbox") from None
        _write_all(self._wfd, json.dumps(req).encode() + b"\n")
        msg = self.receive()
        if "v" in msg:
            try:
                return decode(msg["v"], lambda h: Handle(self, h))
            except ProtocolError as e:
                raise self.taint(str(e)) from None
        if msg.get("absent") is True and op == "get":
            return _ABSENT
        err = msg.get("e")
        if type(err) is list and len(err) == 2 and all(type(x) is str for x in err):
            raise _exception(err[0], err[1])
        raise self.taint("malformed reply")


class _NotPlain(Exception):
    pass


def _refuse(value: Any) -> int:
    if isinstance(value, Handle):
        return object.__getattribute__(value, "_h")  # type: ignore[no-any-return]
    raise _NotPlain(type(value).__name__)


_ABSENT = object()


def _exception(name: str, message: str) -> Exception:
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and cls is not ProtocolError:
        try:
            return cls(message)
        except Exception:  # noqa: BLE001 - an exception type with a special constructor
            pass
    return RuntimeError(f"{name}: {message}")


class Handle:
    """An object that lives in the solution's process (see the module docstring)."""

    __slots__ = ("_c", "_h")

    def __init__(self, client: _Client, h: int) -> None:
        object.__setattr__(self, "_c", client)
        object.__setattr__(self, "_h", h)

    def _req(self, op: str, *args: Any, **kwargs: Any) -> Any:
        c = object.__getattribute__(self, "_c")
        return c.request(op, object.__getattribute__(self, "_h"), args, kwargs)

    def _typed(self, op: str, kind: type) -> Any:
        value = self._req(op)
        if type(value) is not kind:
            raise object.__getattribute__(self, "_c").taint(f"{op} returned {type(value)}")
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._req("call", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._req("getattr", name)

    def __getitem__(self, key: Any) -> Any:
        return self._req("getitem", key)

    def __iter__(self) -> Any:
        return iter(self._typed("iter", list))

    def __len__(self) -> int:
        return self._typed("len", int)  # type: ignore[no-any-return]

    def __bool__(self) -> bool:
        return self._typed("bool", bool)  # type: ignore[no-any-return]

    def __str__(self) -> str:
        return self._typed("str", str)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return self._typed("repr", str)  # type: ignore[no-any-return]

    def _compared(self, *_: Any) -> Any:
        raise object.__getattribute__(self, "_c").taint(
            "the tests compared or hashed an object of the solution's own type; return plain "
            "data (numbers, strings, lists, tuples, dicts, sets)")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _compared


class _Globals(dict):  # type: ignore[type-arg]
    """The tests' globals: a name the tests do not define is looked up in the solution.

    Builtin names stay the runner's own (HumanEval/151's tests compute their expected value with
    ``sum``; a solution defining ``sum`` must not change it), except ``solution_names``: the
    function under test where it is named like a builtin (MBPP's ``sum(10, 15) == 6``).
    """

    def __init__(self, client: _Client, solution_names: frozenset[str] = frozenset()) -> None:
        super().__init__(__name__="__main__", __builtins__=builtins)
        self._client = client
        self._solution_names = solution_names
        self._absent: set[str] = set()

    def __missing__(self, name: str) -> Any:
        if name.startswith("__") or name in self._absent:
            raise KeyError(name)
        if hasattr(builtins, name) and name not in self._solution_names:
            raise KeyError(name)  # falls through to the runner's builtins
        value = self._client.request("get", name)
        if value is _ABSENT:
            self._absent.add(name)
            raise KeyError(name)
        self[name] = value
        return value


def run_tests(tests: str, rfd: int, wfd: int,
              solution_names: frozenset[str] = frozenset()) -> int:
    """Run ``tests`` against the solution behind the pipes; the exit code is the verdict.

    Args:
        tests: the test source.
        rfd / wfd: the pipes from and to the solution's process.
        solution_names: builtin names the tests take from the solution (see :class:`_Globals`).

    Returns:
        0 when the solution loaded and every statement of ``tests`` ran without an exception
        and without tainting the run; 1 otherwise (the reason goes to stderr).
    """
    client = _Client(rfd, wfd)
    try:
        hello = client.receive()
        if hello.get("ready") is not True:
            err = hello.get("e")
            raise RuntimeError(f"the solution failed to load: {err}")
        exec(compile(tests, "tests.py", "exec"), _Globals(client, solution_names))
    except BaseException:  # noqa: BLE001 - every failure of the tests is a verdict of 1
        sys.stderr.write("[dllm-eval tests] " + traceback.format_exc(limit=4))
        return 1
    if client.tainted is not None:
        sys.stderr.write(f"[dllm-eval tests] run tainted: {client.tainted}\n")
        return 1
    return 0
