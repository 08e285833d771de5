"""The policy: one frozen, validated configuration object, its presets, TOML and environment.

Three error zones (STYLE.md): a bad value given in code or in a config file raises ``ValueError``
naming the field and the value; a bad ``LOOPGUARD_*`` environment value logs a warning naming the
variable and keeps the value it would have replaced. A name nothing reads (a typo: a field name,
a ``LOOPGUARD_*`` variable, a plugin key) is refused, or for a variable warned about, with the
closest known names ("did you mean ...?").

Every field is declared once, on :class:`Policy`; its environment variable is
``LOOPGUARD_`` + the field name in upper case (see :func:`env_var`), and its TOML key is the field
name. :class:`Policy`, the presets and the environment are declared in a private module below
:mod:`otel_loopguard._plugins`; this one adds :func:`load_policy`, which may read a plugin's
configuration, so that imports point one way.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from ._settings import (
    DEFAULT_FINAL_ANSWER_TOOLS,
    DEFAULT_IGNORED_ARGS,
    DEFAULT_MUTATING_COMMANDS,
    DEFAULT_MUTATING_OPERATIONS,
    DEFAULT_MUTATING_TOOLS,
    DEFAULT_READ_OPERATIONS,
    DEFAULT_SHELL_TOOLS,
    ENV_PREFIX,
    FIELD_NAMES,
    KNOWN_VARIABLES,
    PRESETS,
    RESCUE_PLUGIN_EXCLUDE,
    RESCUE_PLUGIN_IGNORED_ARGS,
    RESCUE_PLUGIN_MUTATING_TOOLS,
    AdvisorInput,
    CostUnit,
    MemoryScope,
    Mode,
    Policy,
    Rule,
    StoreFailure,
    close_names,
    env_var,
    policy_from_env,
    policy_from_mapping,
    unknown_message,
    unknown_variables,
    validate_field,
    wildcard_regex,
    wildcard_union,
)

__all__ = [
    "AdvisorInput",
    "CostUnit",
    "DEFAULT_FINAL_ANSWER_TOOLS",
    "DEFAULT_IGNORED_ARGS",
    "DEFAULT_MUTATING_COMMANDS",
    "DEFAULT_MUTATING_OPERATIONS",
    "DEFAULT_MUTATING_TOOLS",
    "DEFAULT_READ_OPERATIONS",
    "DEFAULT_SHELL_TOOLS",
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
    "StoreFailure",
    "close_names",
    "env_var",
    "load_policy",
    "policy_from_env",
    "policy_from_mapping",
    "unknown_variables",
    "validate_field",
    "wildcard_regex",
    "wildcard_union",
]


def load_policy(
    preset: str | None = None,
    config_path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    plugin_config: str | Path | None = None,
) -> Policy:
    """Build the policy a command-line entrance uses.

    Order, later wins: the preset (``preset``, else ``LOOPGUARD_PRESET``, else ``default``), then
    ``LOOPGUARD_*`` environment overrides, then the plugin configuration file at
    ``plugin_config`` (read as :func:`otel_loopguard._plugins.load_plugin_config` does: its
    plugin's preset is the base instead of ``preset``), then the TOML file at ``config_path``
    (top-level keys or a ``[loopguard]`` table; not both, and no other table but the price
    table, ``[prices]`` or ``[loopguard.prices]``). A bad preset
    name or file raises ``ValueError`` naming it (an unknown key or table with the closest
    known names).
    """
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"preset: {preset!r} is not one of {', '.join(PRESETS)}")
    if plugin_config is not None:
        if preset is not None:
            raise ValueError(
                "a preset and a plugin config both choose the base policy; give one of them"
            )
        from ._plugins import load_plugin_config  # only a plugin config needs it

        plugin = load_plugin_config(plugin_config, environ)
        policy = plugin.policy(policy_from_env(PRESETS[plugin.preset], environ))
    else:
        policy = policy_from_env(PRESETS[preset] if preset else None, environ)
    if config_path is None:
        return policy
    # Imported here: only a config file needs it, and hook processes start per tool call.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib
    path = Path(config_path).expanduser()
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ValueError(f"config file {str(path)!r}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {str(path)!r}: not valid TOML: {exc}") from None
    table = data.get("loopguard", data)
    if not isinstance(table, dict):
        raise ValueError(f"config file {str(path)!r}: [loopguard] must be a table")
    if table is data:
        # Only the price table is a table: any other one here is a misspelt [loopguard].
        tables = sorted(
            key for key, value in data.items() if isinstance(value, dict) and key != "prices"
        )
        if tables:
            raise ValueError(
                f"config file {str(path)!r}: "
                + unknown_message("table", tables, ["loopguard"])
                + "; policy fields go at the top level or in [loopguard]"
            )
    else:
        # Beside a [loopguard] table, top-level fields would be ignored without a word.
        stray = sorted(set(data) & (FIELD_NAMES | {"preset"}))
        if stray:
            raise ValueError(
                f"config file {str(path)!r}: {', '.join(stray)} outside the [loopguard] table"
                f" would be ignored; put {'it' if len(stray) == 1 else 'them'} in the table"
            )
    try:
        return policy_from_mapping(table, policy)
    except ValueError as exc:
        raise ValueError(f"config file {str(path)!r}: {exc}") from None
