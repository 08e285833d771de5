"""The policy's presets and its sources: a mapping (a TOML file's table) and the ``LOOPGUARD_*``
environment; :class:`Policy` itself, its fields and their checks, is :mod:`._policy_fields`
(re-exported here), its vocabulary (the enums and default lists) :mod:`._defaults`, how a value
is checked by its field's kind :mod:`._validation`.

Three error zones (STYLE.md): a bad value given in code or in a config file raises ``ValueError``
naming the field and the value; a bad ``LOOPGUARD_*`` environment value logs a warning naming the
variable and keeps the value it would have replaced. A name nothing reads (a typo: a field name,
a ``LOOPGUARD_*`` variable, a plugin key) is refused, or for a variable warned about, with the
closest known names ("did you mean ...?").

Every field is declared once, on :class:`Policy`; its environment variable is
``LOOPGUARD_`` + the field name in upper case (see :func:`env_var`), and its TOML key is the field
name. Private: :mod:`otel_loopguard.config` is the public face, and it adds the loading of a
command-line entrance's policy (:func:`~otel_loopguard.config.load_policy`), which reads plugin
configurations (:mod:`otel_loopguard._plugins`, which builds on this module).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Any, Final

from ._defaults import (  # the policy's vocabulary, re-exported with it
    DEFAULT_FINAL_ANSWER_TOOLS,
    DEFAULT_IGNORED_ARGS,
    DEFAULT_INTENT_PHRASES,
    DEFAULT_MUTATING_COMMANDS,
    DEFAULT_MUTATING_OPERATIONS,
    DEFAULT_MUTATING_TOOLS,
    DEFAULT_READ_OPERATIONS,
    DEFAULT_SHELL_TOOLS,
    DETECTION_RULES,
    ENV_PREFIX,
    RESCUE_PLUGIN_EXCLUDE,
    RESCUE_PLUGIN_IGNORED_ARGS,
    RESCUE_PLUGIN_MUTATING_TOOLS,
    STORE_SCHEMES,
    AdvisorInput,
    CostUnit,
    MemoryScope,
    Mode,
    Rule,
    StoreFailure,
    close_names,
    env_var,
    redact_url,
    unknown_message,
    wildcard_regex,
    wildcard_union,
)
from ._env import DECLARED, LOOPGUARD_PRESET
from ._lazy import logger
from ._policy_fields import FIELD_NAMES, FIELDS, Policy, kind_of, validate_field
from ._validation import (
    LIST_KINDS,
    OPTIONAL_KINDS,
    SET_KINDS,
    Kind,
    as_tuple,
)

__all__ = [
    "FIELD_NAMES",
    "AdvisorInput",
    "CostUnit",
    "DEFAULT_FINAL_ANSWER_TOOLS",
    "DEFAULT_IGNORED_ARGS",
    "DEFAULT_INTENT_PHRASES",
    "DEFAULT_MUTATING_COMMANDS",
    "DEFAULT_MUTATING_OPERATIONS",
    "DEFAULT_MUTATING_TOOLS",
    "DEFAULT_READ_OPERATIONS",
    "DEFAULT_SHELL_TOOLS",
    "DETECTION_RULES",
    "ENV_PREFIX",
    "KNOWN_VARIABLES",
    "MemoryScope",
    "Mode",
    "PRESETS",
    "Policy",
    "RESCUE_PLUGIN_EXCLUDE",
    "RESCUE_PLUGIN_IGNORED_ARGS",
    "RESCUE_PLUGIN_MUTATING_TOOLS",
    "Rule",
    "STORE_SCHEMES",
    "StoreFailure",
    "close_names",
    "redact_url",
    "env_var",
    "unknown_message",
    "policy_from_env",
    "policy_from_mapping",
    "unknown_variables",
    "validate_field",
    "wildcard_regex",
    "wildcard_union",
]


#: Every ``LOOPGUARD_*`` variable something reads: one per policy field (:func:`env_var`) and
#: those :mod:`otel_loopguard._env` declares. Any other is a typo (:func:`unknown_variables`).
KNOWN_VARIABLES: Final = frozenset(map(env_var, FIELDS)) | DECLARED
_KNOWN_SUFFIXES: Final = {name[len(ENV_PREFIX) :]: name for name in KNOWN_VARIABLES}
#: Unknown variables already warned about in this process (each is warned about once).
_WARNED_VARIABLES: set[str] = set()


#: What the seed presets keep from their plugins: no operation table, no stop after identical
#: failures (each preset names its plugin's own mutating tools).
_SEED_PROGRESS: Final[Mapping[str, Any]] = {
    "read_operations": (),
    "mutating_operations": (),
    "failure_stop_threshold": None,
}

#: Each preset's fields that differ from :class:`Policy`'s defaults.
_PRESET_CHANGES: Final[Mapping[str, Mapping[str, Any]]] = {
    # Ours: window + outcome awareness; see README "Choosing thresholds" for the scenarios.
    "default": {},
    # The repeat-tool-reminder plugin: consecutive identical calls (arguments compared whole,
    # no epochs), advisory reminders at exactly 3, 5 and 8, arguments quoted up to 500 chars.
    "reminder": dict(
        mode=Mode.ADVISE,
        rules=frozenset({Rule.CONSECUTIVE}),
        remind_thresholds=(3, 5, 8),
        remind_past_thresholds=False,
        deny_threshold=None,
        rescue_threshold=None,
        poll_limit=None,
        stop_after_denials=None,
        arguments_preview_chars=500,
        ignored_args=frozenset(),
        mutating_tools=(),
        mutating_commands=(),
        **_SEED_PROGRESS,
    ),
    # The loop-brake plugin (maxRepeats 3): deny the 4th consecutive identical call, whatever
    # its outcome, arguments compared whole; never reminds, never stops.
    "brake": dict(
        rules=frozenset({Rule.CONSECUTIVE}),
        remind_thresholds=(),
        deny_threshold=4,
        rescue_threshold=None,
        poll_limit=None,
        stop_after_denials=None,
        ignored_args=frozenset(),
        mutating_tools=(),
        mutating_commands=(),
        **_SEED_PROGRESS,
    ),
    # The loop-rescue plugin: 12-call window, deny the 3rd occurrence (nudgeAt), rescue from the
    # 5th (rescueAt), a rescue at 40 redundant calls in an epoch (stallAt); never stops. Its
    # advisor command and trip log are not set here (a preset runs no program and writes no
    # file): LoopGuard.from_plugin_config fills the plugin's own defaults for those.
    "rescue": dict(
        rules=frozenset({Rule.WINDOW, Rule.STALL}),
        window_size=12,
        remind_thresholds=(),
        deny_threshold=3,
        rescue_threshold=5,
        poll_limit=None,
        stop_after_denials=None,
        stall_threshold=40,
        rescue_on_stall=True,
        exclude=RESCUE_PLUGIN_EXCLUDE,
        ignored_args=RESCUE_PLUGIN_IGNORED_ARGS,
        mutating_tools=RESCUE_PLUGIN_MUTATING_TOOLS,
        mutating_commands=(),
        max_rescues=3,
        cooldown_seconds=45.0,
        advisor_timeout_seconds=90.0,
        **_SEED_PROGRESS,
    ),
}


class _Presets(Mapping[str, Policy]):
    """The presets by name, each built when first asked for: building a policy checks every
    field, and a hook process (one per tool call) uses one preset."""

    __slots__ = ("_built",)

    def __init__(self) -> None:
        self._built: dict[str, Policy] = {}

    def __getitem__(self, name: str) -> Policy:
        policy = self._built.get(name)
        if policy is None:
            policy = self._built.setdefault(name, Policy(**_PRESET_CHANGES[name]))
        return policy

    def __iter__(self) -> Iterator[str]:
        return iter(_PRESET_CHANGES)

    def __len__(self) -> int:
        return len(_PRESET_CHANGES)

    def __repr__(self) -> str:
        return repr(dict(self))


#: The presets by name (``default``, ``reminder``, ``brake``, ``rescue``).
PRESETS: Final[Mapping[str, Policy]] = _Presets()


def _coerce(name: str, value: object) -> object:
    """Bring a TOML or environment value into the field's type (validation happens in Policy)."""
    kind = kind_of(name)
    if kind in LIST_KINDS:
        return tuple(as_tuple(name, value))
    if kind in SET_KINDS:
        return frozenset(as_tuple(name, value))
    return value


def policy_from_mapping(values: Mapping[str, object], base: Policy | None = None) -> Policy:
    """Apply ``values`` (field name -> value, as in a TOML file) to ``base``.

    ``preset`` selects the base when given. Unknown keys raise ``ValueError`` naming them.
    ``false`` turns off an optional threshold (deny, rescue, poll limit, stop after denials).
    """
    values = dict(values)
    preset = values.pop("preset", None)
    if preset is not None:
        if not isinstance(preset, str) or preset not in PRESETS:
            raise ValueError(f"preset: {preset!r} is not one of {', '.join(PRESETS)}")
        base = PRESETS[preset]
    base = base if base is not None else PRESETS["default"]
    unknown = set(values) - FIELD_NAMES
    if unknown:
        raise ValueError(unknown_message("policy field", unknown, FIELD_NAMES | {"preset"}))
    changes: dict[str, object] = {}
    for name, value in values.items():
        if value is False and kind_of(name) in OPTIONAL_KINDS:
            value = None  # TOML has no null
        changes[name] = _coerce(name, value)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _parse_env(name: str, text: str) -> object:
    """Parse one environment value for field ``name``; raises ``ValueError`` when unparsable."""
    text = text.strip()
    kind = kind_of(name)
    if kind in OPTIONAL_KINDS and text.lower() in ("", "none", "off", "false"):
        return None
    if kind is Kind.THRESHOLDS:
        return tuple(int(part) for part in text.split(",") if part.strip())
    if kind is Kind.PRICES:
        import json  # here: only a price table in the environment needs it

        return json.loads(text)
    if kind is Kind.MONEY:
        return float(text.removeprefix("$"))
    if kind in SET_KINDS:
        return frozenset(part.strip() for part in text.split(",") if part.strip())
    if kind in LIST_KINDS:
        # Regexes may contain commas; they are separated by newlines or ';;'.
        separator = "\n" if "\n" in text else ";;" if kind is Kind.REGEXES else ","
        return tuple(part.strip() for part in text.split(separator) if part.strip())
    if kind is Kind.CHOICE:
        return text.lower()
    if kind in (Kind.COMMAND, Kind.PATH, Kind.TEXT, Kind.URL):
        return text
    if kind is Kind.MEMORY:
        lowered = text.lower()
        if not lowered:
            raise ValueError("expected true, false, a file path or a Redis URL")
        if lowered in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return lowered in ("1", "true", "yes", "on")
        return text
    if kind is Kind.FLAG:
        lowered = text.lower()
        if lowered not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ValueError(f"expected true or false, got {text!r}")
        return lowered in ("1", "true", "yes", "on")
    if kind in (Kind.SECONDS, Kind.POSITIVE_SECONDS):
        return float(text)
    return int(text)


def unknown_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``LOOPGUARD_*`` variables in ``environ`` (default: ``os.environ``) that nothing reads
    (not in :data:`KNOWN_VARIABLES`), sorted, each with its warning: the name (never the value,
    which may be a secret) and the closest known names, ``<name> ignored: no such variable
    (did you mean LOOPGUARD_DENY_THRESHOLD?)`` for a misspelt ``deny_threshold``."""
    env = os.environ if environ is None else environ
    found: dict[str, str] = {}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in KNOWN_VARIABLES:
            continue
        # Compared without the prefix every name shares (it would make every name look close).
        close = close_names(name[len(ENV_PREFIX) :].upper(), _KNOWN_SUFFIXES)
        hint = f" (did you mean {' or '.join(_KNOWN_SUFFIXES[c] for c in close)}?)" if close else ""
        found[name] = f"{name} ignored: no such variable{hint}"
    return found


def policy_from_env(base: Policy | None = None, environ: Mapping[str, str] | None = None) -> Policy:
    """Apply ``LOOPGUARD_*`` overrides to ``base`` (default: the ``LOOPGUARD_PRESET`` preset).

    A bad value (unparsable, or one the policy rejects) logs a warning naming the variable and the
    value, and keeps the value it would have replaced. A variable nothing reads (a typo) logs a
    warning naming it and the closest known names, once per name per process. Never raises.
    """
    env = os.environ if environ is None else environ
    for name, warning in unknown_variables(env).items():
        if name not in _WARNED_VARIABLES:
            _WARNED_VARIABLES.add(name)
            logger().warning("%s", warning)
    if base is None:
        preset = env.get(LOOPGUARD_PRESET, "default").strip() or "default"
        if preset not in PRESETS:
            logger().warning(
                "%s=%r is not one of %s; using the default preset",
                LOOPGUARD_PRESET,
                preset,
                ", ".join(PRESETS),
            )
            preset = "default"
        base = PRESETS[preset]
    changes: dict[str, object] = {}
    for name in FIELDS:
        variable = env_var(name)
        text = env.get(variable)
        if text is None:
            continue
        try:
            changes[name] = _parse_env(name, text)
        except (ValueError, TypeError) as exc:
            logger().warning("%s=%r ignored: %s", variable, text, exc)
    if not changes:
        return base
    try:
        # All together first: overrides that only make sense jointly (deny and rescue) apply.
        return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
    except (ValueError, TypeError):
        pass
    policy = base
    for name, value in changes.items():
        try:
            policy = dataclasses.replace(policy, **{name: value})  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            shown = env[env_var(name)]
            if kind_of(name) is Kind.URL:
                shown = redact_url(shown)  # a URL may carry a password
            logger().warning("%s=%r ignored: %s", env_var(name), shown, exc)
    return policy
