"""What the command hook's start gave up stays what it was (issue 29 item 1).

The private records on the hook's path are plain slotted classes (:mod:`otel_loopguard._record`)
instead of dataclasses; the public dataclasses on it keep the dataclass API without its
generated methods; the classifier matches tool names without compiling a regex; the package's
logger imports logging on the first message. Each is compared here with what it replaced, built
in the test (a dataclass with the same fields and defaults, the regex of ``wildcard_union``).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
import logging
import pickle
import random
from typing import Any

import pytest

from otel_loopguard._calls import ToolCall
from otel_loopguard._classifier import _names
from otel_loopguard._core_memory import MemoryWork
from otel_loopguard._core_records import Call, Ran, Rescue
from otel_loopguard._decision import Decision, Step
from otel_loopguard._early import Early
from otel_loopguard._engine import Pending
from otel_loopguard._lazy import logger
from otel_loopguard._record import FrozenRecord, Record
from otel_loopguard._rules import Overspent, Verdict
from otel_loopguard.config import PRESETS, Mode, Policy, policy_from_env, wildcard_union
from otel_loopguard.hooks._hosts import Answer, HookEvent
from otel_loopguard.hooks._store import Row
from otel_loopguard.hooks._transcript import Mark, Reading, Turn
from otel_loopguard.metrics import MetricSpec

#: Each record and the ``@dataclass`` arguments of the class it replaced.
RECORDS: list[tuple[type[Record], dict[str, bool]]] = [
    (Ran, {}),
    (Call, {}),
    (Rescue, {}),
    (MemoryWork, {}),
    (Pending, {}),
    (Early, {"eq": False}),
    (Row, {}),
    (Reading, {}),
    (Mark, {"frozen": True}),
    (Turn, {"frozen": True}),
    (Verdict, {"frozen": True}),
    (Overspent, {"frozen": True}),
    (Step, {"frozen": True}),
    (ToolCall, {"frozen": True}),
]


#: The fields whose default was a new container (``field(default_factory=...)``).
FACTORIES: dict[type[Record], dict[str, Any]] = {
    Row: {"notes": dict, "problems": list, "related": dict, "related_save": dict},
    Reading: {"skipped": dict},
}


def reference(cls: type[Record], options: dict[str, bool]) -> type[Any]:
    """The dataclass ``cls`` replaced: the same name, fields, defaults and options."""
    fields: list[Any] = []
    factories = FACTORIES.get(cls, {})
    for parameter in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if parameter.name in factories:
            factory = factories[parameter.name]
            fields.append((parameter.name, object, dataclasses.field(default_factory=factory)))
        elif parameter.default is inspect.Parameter.empty:
            fields.append((parameter.name, object))
        else:
            fields.append((parameter.name, object, dataclasses.field(default=parameter.default)))
    made = dataclasses.make_dataclass(
        cls.__name__,
        fields,
        slots=True,
        eq=options.get("eq", True),
        frozen=options.get("frozen", False),
    )
    made.__qualname__ = cls.__qualname__
    return made


def values(cls: type[Record], seed: int) -> list[object]:
    """One value for each field, hashable, different for each ``seed``."""
    return [f"{name}-{seed}" if seed % 2 else (seed, name) for name in cls.__match_args__]


@pytest.mark.parametrize(("cls", "options"), RECORDS, ids=lambda x: getattr(x, "__name__", ""))
def test_a_record_behaves_as_the_dataclass_it_replaced(
    cls: type[Record], options: dict[str, bool]
) -> None:
    old = reference(cls, options)
    assert cls.__match_args__ == old.__match_args__
    assert cls.__slots__ == tuple(f.name for f in dataclasses.fields(old))
    frozen = options.get("frozen", False)
    assert issubclass(cls, FrozenRecord) is frozen
    for first, second in itertools.product(range(3), repeat=2):
        a, b = cls(*values(cls, first)), cls(*values(cls, second))
        x, y = old(*values(cls, first)), old(*values(cls, second))
        assert repr(a) == repr(x)
        assert (a == b) is (x == y)
        assert (a != b) is (x != y)
        assert (a == a) is (x == x)
    a, x = cls(*values(cls, 1)), old(*values(cls, 1))
    assert (a == values(cls, 1)) is (x == values(cls, 1)) is False
    assert a.__eq__(object()) is NotImplemented or not options.get("eq", True)
    # The defaults: only the fields without one given.
    required = [n for n in cls.__match_args__ if n not in _defaults(cls)]
    assert repr(cls(*values(cls, 2)[: len(required)])) == repr(
        old(*values(cls, 2)[: len(required)])
    )
    if frozen:
        assert hash(a) == hash(x) == hash(cls(*values(cls, 1)))
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field"):
            a.__setattr__(cls.__match_args__[0], 1)
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field"):
            a.__delattr__(cls.__match_args__[0])
        for copied in (copy.copy(a), copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
            assert copied == a and copied is not a and repr(copied) == repr(a)
    elif options.get("eq", True):
        with pytest.raises(TypeError, match="unhashable"):
            hash(a)
        setattr(a, cls.__match_args__[0], "changed")
        assert getattr(a, cls.__match_args__[0]) == "changed"
        assert a != cls(*values(cls, 1))
    else:  # eq=False: identity, hashed by identity
        assert a != cls(*values(cls, 1)) and a == a
        assert hash(a) == object.__hash__(a)
    with pytest.raises(AttributeError):
        a.__setattr__("not_a_field", 1)


def _defaults(cls: type[Record]) -> set[str]:
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {p.name for p in parameters if p.default is not inspect.Parameter.empty}


def test_a_row_has_its_own_containers() -> None:
    first, second = Row(None), Row(None)
    first.notes["a"] = "b"
    first.problems.append("x")
    assert second.notes == {} and second.problems == [] and second.related == {}
    assert Row(b"s") == Row(b"s", {}, [], None, {}, {}, None, None)


PATTERNS = [
    (),
    ("bash",),
    ("Bash", "shell", "sh"),
    ("mcp__claude__*",),
    ("*",),
    ("a*b*c", "*_file", "read*"),
    ("ab*bc",),
    ("a.b", "x+y", "(z)", "[q]"),
    ("straße", "K"),  # non-ASCII patterns: the regex decides
    ("edit", "*edit*"),
]

NAMES = [
    "",
    "bash",
    "BASH",
    "Bash",
    "shell",
    "sh",
    "shx",
    "mcp__claude__x",
    "MCP__Claude__",
    "mcp__claude_",
    "abc",
    "abbc",
    "abc_file",
    "a_b_c",
    "acb",
    "read",
    "reader",
    "xread",
    "a.b",
    "axb",
    "x+y",
    "xxy",
    "(z)",
    "z",
    "[q]",
    "q",
    "multi_edit",
    "edit",
    "ed",
    "ba\nsh",
    "a\nb",
    "mcp__claude__\n",
    "STRASSE",
    "straße",
    "k",
    "\u212a",  # the Kelvin sign: case-insensitively a k to the regex
    "ſh",  # long s: case-insensitively an s to the regex
    "bash\u0131",
]


@pytest.mark.parametrize("patterns", PATTERNS, ids=repr)
def test_tool_names_match_as_the_wildcard_regex_matches(patterns: tuple[str, ...]) -> None:
    regex = wildcard_union(patterns)
    names = _names(patterns)
    assert (names is None) is (regex is None)
    for name in NAMES:
        expected = regex is not None and regex.fullmatch(name) is not None
        assert (names is not None and names.matches(name)) is expected, name


def test_tool_names_match_as_the_wildcard_regex_matches_on_random_names() -> None:
    rng = random.Random(29)
    alphabet = "abAB*_.\n\u212aſ"
    for _ in range(3000):
        patterns = tuple(
            "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 5)))
            for _ in range(rng.randrange(1, 4))
        )
        regex = wildcard_union(patterns)
        names = _names(patterns)
        assert regex is not None and names is not None
        for _ in range(8):
            name = "".join(rng.choice(alphabet.replace("*", "")) for _ in range(rng.randrange(6)))
            assert names.matches(name) is (regex.fullmatch(name) is not None), (patterns, name)


def test_the_package_logger_logs_as_before_from_the_line_that_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert logger() is logging.getLogger("otel_loopguard")
    with caplog.at_level(logging.WARNING, logger="otel_loopguard"):
        policy = policy_from_env(environ={"LOOPGUARD_DENY_THRESHOLD": "many"})
    assert policy.deny_threshold == Policy().deny_threshold
    [record] = caplog.records
    assert record.name == "otel_loopguard" and record.levelno == logging.WARNING
    assert record.getMessage().startswith("LOOPGUARD_DENY_THRESHOLD='many' ignored: ")
    assert record.pathname.endswith("_settings.py") and record.funcName == "policy_from_env"


#: The public dataclasses that keep the dataclass API without its generated methods.
DATACLASSES: list[type[Any]] = [Decision, HookEvent, Answer, MetricSpec]


def full_dataclass(cls: type[Any]) -> type[Any]:
    """``cls`` as ``@dataclass(frozen=True, slots=True)`` generates it, from its own fields."""
    fields = [
        (f.name, f.type, dataclasses.field(default=f.default)) for f in dataclasses.fields(cls)
    ]
    made = dataclasses.make_dataclass(cls.__name__, fields, frozen=True, slots=True)
    made.__qualname__ = cls.__qualname__
    return made


def samples(cls: type[Any]) -> list[dict[str, object]]:
    """Keyword arguments for a few instances: required fields only, then every field set."""
    names = [f.name for f in dataclasses.fields(cls)]
    required = [
        f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
    ] or names[:1]
    return [
        {name: f"{name}-a" for name in required},
        {name: f"{name}-b" for name in required},
        {name: (index, name) for index, name in enumerate(names)},
        {name: [index] if index % 2 else f"{name}-c" for index, name in enumerate(names)},
    ]


@pytest.mark.parametrize("cls", DATACLASSES, ids=lambda cls: cls.__name__)
def test_a_public_dataclass_behaves_as_it_did(cls: type[Any]) -> None:
    old = full_dataclass(cls)
    assert cls.__match_args__ == old.__match_args__
    assert cls.__slots__ == old.__slots__
    ours, theirs = inspect.signature(cls), inspect.signature(old)
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == [
        (p.name, p.kind, p.default) for p in theirs.parameters.values()
    ]
    for first, second in itertools.product(samples(cls), repeat=2):
        a, b, x, y = cls(**first), cls(**second), old(**first), old(**second)
        assert repr(a) == repr(x)
        assert (a == b) is (x == y) and (a != b) is (x != y)
        assert dataclasses.asdict(a) == dataclasses.asdict(x)
        assert dataclasses.astuple(a) == dataclasses.astuple(x)
    a, x = cls(**samples(cls)[0]), old(**samples(cls)[0])
    assert hash(a) == hash(x)
    assert (a == dataclasses.astuple(a)) is False and a.__eq__(x) is NotImplemented
    name = dataclasses.fields(cls)[-1].name
    changed = dataclasses.replace(a, **{name: "changed"})
    assert type(changed) is cls and getattr(changed, name) == "changed" and changed != a
    assert repr(changed) == repr(dataclasses.replace(x, **{name: "changed"}))
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field"):
        setattr(a, name, 1)
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field"):
        delattr(a, name)
    with pytest.raises(Exception) as raised:  # noqa: PT011 - the same as the dataclass's
        a.__setattr__("not_a_field", 1)
    with pytest.raises(raised.type):
        x.__setattr__("not_a_field", 1)
    for copied in (copy.copy(a), copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert copied == a and copied is not a and repr(copied) == repr(a)
    assert dataclasses.is_dataclass(cls) and dataclasses.is_dataclass(a)


def test_the_policy_compares_hashes_and_shows_as_the_generated_methods_did() -> None:
    old = full_dataclass(Policy)
    policies = [*PRESETS.values(), Policy(), Policy().replace(window_size=7)]
    for a, b in itertools.product(policies, repeat=2):
        x = old(**{f.name: getattr(a, f.name) for f in dataclasses.fields(Policy)})
        y = old(**{f.name: getattr(b, f.name) for f in dataclasses.fields(Policy)})
        assert repr(a) == repr(x)
        assert (a == b) is (x == y) and (a != b) is (x != y)
        assert hash(a) == hash(x)
    assert Policy.__match_args__ == old.__match_args__ and Policy.__slots__ == old.__slots__
    assert Policy().__eq__(old()) is NotImplemented
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field"):
        Policy().__setattr__("mode", Mode.OBSERVE)
    assert pickle.loads(pickle.dumps(Policy())) == Policy() == copy.deepcopy(Policy())
