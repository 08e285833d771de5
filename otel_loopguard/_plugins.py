"""The configuration of the three plugins this project replaces, read as is.

:func:`read_plugin_config` maps one plugin's ``config`` (a mapping, as its YAML entry has it) to
policy fields over that plugin's preset; :func:`load_plugin_config` reads it from a file (YAML,
JSON or TOML: the plugin's entry with ``id``/``name`` and ``config``, a list of entries such as a
``cordis.patch.yml``, or a bare ``config`` with ``NAME=FILE``). Pure apart from the file and the
one environment variable the brake plugin reads (:data:`DSH_LOOP_BRAKE_MAX_REPEATS`).

Plugin key -> policy field (README "Migrating from the plugins" has the same table):

- reminder ``thresholds`` -> ``remind_thresholds`` (non-empty, integers >= 2, no duplicates),
  reminding only at them (``remind_past_thresholds`` false); ``argumentsPreviewChars`` ->
  ``arguments_preview_chars`` (integer >= 1); ``include``/``exclude`` -> the same (an empty
  ``include`` is every tool).
- brake ``maxRepeats`` -> ``deny_threshold`` = maxRepeats + 1 (integer >= 1; when absent,
  :data:`DSH_LOOP_BRAKE_MAX_REPEATS`, else 3).
- rescue ``window`` -> ``window_size`` (integer >= 2; ``max_signatures_per_session`` raised to
  twice it when needed); ``nudgeAt`` -> ``deny_threshold`` (integer >= 2); ``rescueAt`` ->
  ``rescue_threshold`` (integer >= 2, not below nudgeAt); ``stallAt`` -> ``stall_threshold``
  (integer >= 2; 0: the stall rule is off); ``maxRescues`` -> ``max_rescues`` (integer >= 0);
  ``cooldownMs`` -> ``cooldown_seconds`` (/ 1000, >= 0); ``include``/``exclude`` -> the same;
  ``excludeCommands`` -> ``exclude_commands`` (Python regular expressions); ``ignoredArgs`` ->
  ``ignored_args``; ``mutatingTools`` -> ``mutating_tools``; ``askCommand`` ->
  ``advisor_command``, one executable (quoted; ``~`` expanded when run) with ``advisor_input``
  ``argv`` ('' : no advisor); ``askModel`` -> ``advisor_model`` ('' : none); ``askTimeoutMs`` ->
  ``advisor_timeout_seconds`` (/ 1000, > 0); ``logFile`` -> ``trip_log_path`` ('' : none).

Keys a configuration leaves out take the plugin's defaults: its preset's values, and for the
rescue plugin ``askCommand`` ``~/.local/bin/ask-claude``, ``askModel`` ``opus`` and ``logFile``
``~/.llmbox/loop-rescue.jsonl`` (the preset itself runs no command and writes no file). A bad
value raises ``ValueError`` naming the plugin's key and the value; an unknown key raises too,
naming the closest known keys (``'nudgeat' (did you mean 'nudgeAt'?)``).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import os
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ._lazy import LOGGER_NAME
from ._settings import PRESETS, AdvisorInput, Policy, Rule, close_names, validate_field

__all__ = [
    "DSH_LOOP_BRAKE_MAX_REPEATS",
    "PLUGIN_NAMES",
    "RESCUE_PLUGIN_DEFAULTS",
    "PluginConfig",
    "load_plugin_config",
    "plugin_preset",
    "read_plugin_config",
]

_log = logging.getLogger(LOGGER_NAME)

DSH_LOOP_BRAKE_MAX_REPEATS: Final = "DSH_LOOP_BRAKE_MAX_REPEATS"
"""The brake plugin's ``maxRepeats`` when its configuration has none (the configuration wins);
an integer >= 1. A bad value logs a warning naming the variable and keeps the default, 3."""

#: Each plugin's names (its id, package name, and this project's preset name) -> the preset.
PLUGIN_NAMES: Final[Mapping[str, str]] = {
    "reminder": "reminder",
    "repeat-tool-reminder": "reminder",
    "dsh-repeat-tool-reminder": "reminder",
    "@deepseek-ai/dsh-repeat-tool-reminder": "reminder",
    "brake": "brake",
    "loop-brake": "brake",
    "dsh-loop-brake": "brake",
    "rescue": "rescue",
    "loop-rescue": "rescue",
    "dsh-loop-rescue": "rescue",
}

#: How each plugin names itself in messages (its id).
_DISPLAY: Final = {
    "reminder": "repeat-tool-reminder",
    "brake": "loop-brake",
    "rescue": "loop-rescue",
}

#: The rescue plugin's defaults for the keys its preset leaves unset (see the module docstring).
RESCUE_PLUGIN_DEFAULTS: Final[Mapping[str, str]] = {
    "askCommand": "~/.local/bin/ask-claude",
    "askModel": "opus",
    "logFile": "~/.llmbox/loop-rescue.jsonl",
}

_BRAKE_DEFAULT_MAX_REPEATS: Final = 3
_ENTRY_KEYS: Final = frozenset({"id", "name", "config"})


def plugin_preset(name: str) -> str:
    """The preset of the plugin called ``name`` (its id, package name or preset name; a
    ``github:owner/`` or ``@scope/`` prefix is ignored); ``ValueError`` naming it otherwise."""
    if isinstance(name, str):
        preset = PLUGIN_NAMES.get(name) or PLUGIN_NAMES.get(name.rsplit("/", 1)[-1])
        if preset is not None:
            return preset
    raise ValueError(f"plugin: {name!r} is not one of {', '.join(PLUGIN_NAMES)}")


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """One plugin's configuration as policy fields: ``preset`` (``reminder``, ``brake`` or
    ``rescue``) and ``changes`` (policy field -> value) over it."""

    preset: str
    changes: Mapping[str, object]

    def policy(self, base: Policy | None = None) -> Policy:
        """The changes applied to ``base`` (default: the plugin's preset). Raises
        ``ValueError`` when they do not fit ``base`` (e.g. an environment override)."""
        base = base if base is not None else PRESETS[self.preset]
        changes = dict(self.changes)
        window = changes.get("window_size")
        if isinstance(window, int) and base.max_signatures_per_session < 2 * window:
            changes["max_signatures_per_session"] = 2 * window
        try:
            return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ValueError(f"{_DISPLAY[self.preset]} config: {exc}") from None


def read_plugin_config(
    plugin: str, config: Mapping[str, object] | None, environ: Mapping[str, str] | None = None
) -> PluginConfig:
    """Map the ``config`` of ``plugin`` (its name as :func:`plugin_preset` reads it) to policy
    fields, every key as the plugin reads it (see the module docstring). ``config`` may also be
    the plugin's whole entry (``id``/``name`` and ``config``). Raises ``ValueError`` naming the
    plugin's key and the value."""
    preset = plugin_preset(plugin)
    display = _DISPLAY[preset]
    config = _unwrap(preset, config)
    readers = _READERS[preset]
    unknown = sorted(set(config) - set(readers))
    if unknown:
        listed = []
        for key in unknown:
            close = close_names(key, readers)
            hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
            listed.append(repr(key) + hint)
        raise ValueError(
            f"{display} config: unknown key{'s' if len(unknown) > 1 else ''}"
            f" {', '.join(listed)}; known: {', '.join(readers)}"
        )
    changes: dict[str, object] = {}
    try:
        for key, value in config.items():
            changes.update(readers[key](key, value))
        _DEFAULTS[preset](config, changes, os.environ if environ is None else environ)
    except ValueError as exc:
        raise ValueError(f"{display} config: {exc}") from None
    return PluginConfig(preset, changes)


def _unwrap(preset: str, config: object) -> Mapping[str, object]:
    if config is None:
        return {}
    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        raise ValueError(
            f"{_DISPLAY[preset]} config: expected a mapping of keys to values, got {config!r}"
        )
    if "config" in config and set(config) <= _ENTRY_KEYS:
        for key in ("id", "name"):
            name = config.get(key)
            if name is not None and _known(name) not in (None, preset):
                raise ValueError(
                    f"{_DISPLAY[preset]} config: the entry's {key} {name!r} names another plugin"
                )
        return _unwrap(preset, config["config"])
    return config


def _known(name: object) -> str | None:
    try:
        return plugin_preset(name)  # type: ignore[arg-type]
    except ValueError:
        return None


# -- values, in the project's wording, naming the plugin's key -------------------------------


def _integer(key: str, value: object, minimum: int) -> int:
    """An integer (an integral JSON number such as 3.0 too: the plugins read numbers)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _milliseconds(key: str, value: object, *, positive: bool) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{key}: expected a number of milliseconds {bound}, got {value!r}")
    return value / 1000


def _string(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {value!r}")
    return value


def _field(name: str) -> Callable[[str, object], dict[str, object]]:
    """A key read as the policy field ``name`` is (lists, patterns, regexes, names)."""

    def read(key: str, value: object) -> dict[str, object]:
        return {name: validate_field(name, value, label=key)}

    return read


def _thresholds(key: str, value: object) -> dict[str, object]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{key}: expected a non-empty list of integers >= 2, got {value!r}")
    items = [_integer(key, item, 2) for item in value]
    return {
        "remind_thresholds": validate_field("remind_thresholds", items, label=key),
        "remind_past_thresholds": False,
    }


def _preview(key: str, value: object) -> dict[str, object]:
    return {"arguments_preview_chars": _integer(key, value, 1)}


def _max_repeats(key: str, value: object) -> dict[str, object]:
    return {"deny_threshold": _integer(key, value, 1) + 1}


def _window(key: str, value: object) -> dict[str, object]:
    return {"window_size": _integer(key, value, 2)}


def _nudge_at(key: str, value: object) -> dict[str, object]:
    return {"deny_threshold": _integer(key, value, 2)}


def _rescue_at(key: str, value: object) -> dict[str, object]:
    return {"rescue_threshold": _integer(key, value, 2)}


def _stall_at(key: str, value: object) -> dict[str, object]:
    if value == 0 and not isinstance(value, bool):
        return {"rules": PRESETS["rescue"].rules - {Rule.STALL}}  # the plugin: 0 disables
    try:
        return {"stall_threshold": _integer(key, value, 2)}
    except ValueError:
        raise ValueError(f"{key}: expected 0 (off) or an integer >= 2, got {value!r}") from None


def _max_rescues(key: str, value: object) -> dict[str, object]:
    return {"max_rescues": _integer(key, value, 0)}


def _cooldown(key: str, value: object) -> dict[str, object]:
    return {"cooldown_seconds": _milliseconds(key, value, positive=False)}


def _ask_timeout(key: str, value: object) -> dict[str, object]:
    return {"advisor_timeout_seconds": _milliseconds(key, value, positive=True)}


def _ask_command(key: str, value: object) -> dict[str, object]:
    command = _string(key, value).strip()
    if not command:
        return {"advisor_command": None}
    # The plugin runs askCommand as one executable, without a shell: quoted, it stays one word
    # (a leading ~ is expanded when it is run, as the plugin's own example needs).
    return {"advisor_command": shlex.quote(command), "advisor_input": AdvisorInput.ARGV}


def _ask_model(key: str, value: object) -> dict[str, object]:
    return {"advisor_model": _string(key, value).strip() or None}


def _log_file(key: str, value: object) -> dict[str, object]:
    return {"trip_log_path": _string(key, value) or None}  # '' disables, as in the plugin


Reader = Callable[[str, object], dict[str, object]]

_READERS: Final[Mapping[str, Mapping[str, Reader]]] = {
    "reminder": {
        "thresholds": _thresholds,
        "include": _field("include"),
        "exclude": _field("exclude"),
        "argumentsPreviewChars": _preview,
    },
    "brake": {
        "maxRepeats": _max_repeats,
    },
    "rescue": {
        "window": _window,
        "nudgeAt": _nudge_at,
        "rescueAt": _rescue_at,
        "stallAt": _stall_at,
        "maxRescues": _max_rescues,
        "cooldownMs": _cooldown,
        "include": _field("include"),
        "exclude": _field("exclude"),
        "excludeCommands": _field("exclude_commands"),
        "ignoredArgs": _field("ignored_args"),
        "mutatingTools": _field("mutating_tools"),
        "askCommand": _ask_command,
        "askModel": _ask_model,
        "askTimeoutMs": _ask_timeout,
        "logFile": _log_file,
    },
}


def _reminder_defaults(
    config: Mapping[str, object], changes: dict[str, object], environ: Mapping[str, str]
) -> None:
    pass  # the preset holds every default of the reminder plugin


def _brake_defaults(
    config: Mapping[str, object], changes: dict[str, object], environ: Mapping[str, str]
) -> None:
    if "maxRepeats" in config:
        return  # the configuration wins over the environment, as in the plugin
    text = environ.get(DSH_LOOP_BRAKE_MAX_REPEATS)
    if text is None:
        return
    try:
        changes.update(_max_repeats(DSH_LOOP_BRAKE_MAX_REPEATS, int(text.strip())))
    except ValueError:
        _log.warning(
            "%s=%r ignored: expected an integer >= 1; maxRepeats stays %d",
            DSH_LOOP_BRAKE_MAX_REPEATS,
            text,
            _BRAKE_DEFAULT_MAX_REPEATS,
        )


def _rescue_defaults(
    config: Mapping[str, object], changes: dict[str, object], environ: Mapping[str, str]
) -> None:
    for key, value in RESCUE_PLUGIN_DEFAULTS.items():
        if key not in config:
            changes.update(_READERS["rescue"][key](key, value))
    deny = changes.get("deny_threshold", PRESETS["rescue"].deny_threshold)
    rescue = changes.get("rescue_threshold", PRESETS["rescue"].rescue_threshold)
    if isinstance(deny, int) and isinstance(rescue, int) and rescue < deny:
        raise ValueError(f"rescueAt: {rescue!r} must not be below nudgeAt={deny}")


_DEFAULTS: Final[
    Mapping[str, Callable[[Mapping[str, object], dict[str, object], Mapping[str, str]], None]]
] = {
    "reminder": _reminder_defaults,
    "brake": _brake_defaults,
    "rescue": _rescue_defaults,
}


# -- files -------------------------------------------------------------------------------------


def load_plugin_config(
    spec: str | os.PathLike[str], environ: Mapping[str, str] | None = None
) -> PluginConfig:
    """Read a plugin's configuration from the file ``spec`` names: ``FILE`` holding the
    plugin's entry (``id`` or ``name``, and ``config``) alone or among others (a list such as a
    ``cordis.patch.yml``; exactly one of the three plugins), or ``NAME=FILE`` where NAME is a
    plugin name (then FILE may hold only the ``config`` mapping). YAML (needs PyYAML), JSON or
    TOML, by the file's suffix. Raises ``ValueError`` naming the file and what is wrong."""
    text = os.fspath(spec)
    plugin: str | None = None
    name, equals, rest = text.partition("=")
    if equals and _known(name) is not None:
        plugin, text = name, rest
    path = Path(text).expanduser()
    where = f"plugin config file {str(path)!r}"
    try:
        data = _read(path)
    except OSError as exc:
        raise ValueError(f"{where}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    entries = list(_entries(data))
    if plugin is not None:
        preset = plugin_preset(plugin)
        mine = [entry for entry in entries if _entry_preset(entry) == preset]
        if len(mine) > 1:
            raise ValueError(f"{where}: holds {len(mine)} entries of {_DISPLAY[preset]}")
        config = mine[0] if mine else data
    else:
        presets = sorted({p for p in map(_entry_preset, entries) if p is not None})
        if not presets:
            raise ValueError(
                f"{where}: no entry of a plugin (id or name {', '.join(_DISPLAY.values())},"
                " with its config) found; for a file holding only the config, give"
                " NAME=FILE (e.g. loop-rescue=FILE)"
            )
        if len(presets) > 1:
            names = ", ".join(_DISPLAY[p] for p in presets)
            raise ValueError(
                f"{where}: holds the configs of several plugins ({names}); pick"
                f" one with NAME=FILE, e.g. {_DISPLAY[presets[-1]]}={text}"
            )
        if len(entries) > 1:
            raise ValueError(f"{where}: holds {len(entries)} entries of {_DISPLAY[presets[0]]}")
        plugin, config = presets[0], entries[0]
    if not isinstance(config, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(config).__name__}")
    try:
        return read_plugin_config(plugin, config, environ)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _read(path: Path) -> object:
    suffix = path.suffix.lower()
    raw = path.read_bytes()
    if suffix == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - exercised on Python 3.10 only
            import tomli as tomllib
        try:
            return tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"not valid TOML: {exc}") from None
    if suffix == ".json" or (suffix not in (".yml", ".yaml") and raw.lstrip()[:1] in (b"{", b"[")):
        import json

        try:
            return json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            if suffix == ".json":
                raise ValueError(f"not valid JSON: {exc}") from None
    try:
        # By name: PyYAML is optional here, and ships no type information.
        yaml: Any = importlib.import_module("yaml")
    except ImportError:
        raise ValueError(
            "reading YAML needs PyYAML (the yaml extra: pip install '.[yaml]' in a checkout,"
            " or pip install pyyaml); or give the plugin's"
            " entry as JSON (.json) or TOML (.toml)"
        ) from None
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML: {exc}") from None


def _entry_preset(entry: object) -> str | None:
    if not isinstance(entry, Mapping):
        return None
    for key in ("id", "name"):
        preset = _known(entry.get(key))
        if preset is not None:
            return preset
    return None


def _entries(data: object) -> Iterator[Mapping[str, Any]]:
    """Mappings that are plugin entries (a known id or name, and a config key), anywhere."""
    if isinstance(data, Mapping):
        if "config" in data and _entry_preset(data) is not None:
            yield data
            return
        for value in data.values():
            yield from _entries(value)
    elif isinstance(data, list):
        for item in data:
            yield from _entries(item)
