"""The policy's fields: :class:`Policy`, one frozen, validated configuration object, each field
declared once with its default, its documentation and its kind (how its value is checked,
:mod:`._validation`), and the checks that span fields. :mod:`._settings` adds the presets and
reading a policy from a mapping (TOML) or the environment; :mod:`otel_loopguard.config` is the
public face.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from ._defaults import (
    DEFAULT_FINAL_ANSWER_TOOLS,
    DEFAULT_IGNORED_ARGS,
    DEFAULT_INTENT_PHRASES,
    DEFAULT_MUTATING_COMMANDS,
    DEFAULT_MUTATING_OPERATIONS,
    DEFAULT_MUTATING_TOOLS,
    DEFAULT_READ_OPERATIONS,
    DEFAULT_SHELL_TOOLS,
    DETECTION_RULES,
    AdvisorInput,
    CostUnit,
    MemoryScope,
    Mode,
    Rule,
    StoreFailure,
    unknown_message,
)
from ._prices import Price
from ._record import FrozenRecord
from ._validation import Kind, check_value

__all__ = ["FIELDS", "FIELD_NAMES", "SPECS", "Policy", "kind_of", "validate_field"]


def _doc(
    text: str, kind: Kind, minimum: int = 2, choices: type[Enum] | None = None
) -> dict[str, object]:
    return {"doc": text, "kind": kind, "minimum": minimum, "choices": choices}


# ``repr``, equality and hash come from FrozenRecord (as the dataclass would generate them, without
# compiling them at import: a command hook process pays for every module-level class it builds).
@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Policy(FrozenRecord):
    """Everything that decides what the guard detects and what it does about it.

    Counts are attempts of one signature (tool + canonical arguments) in the current progress
    epoch, including the attempt being decided, as measured by the strongest enabled rule.
    """

    mode: Mode = field(
        default=Mode.ENFORCE,
        metadata=_doc("observe, advise or enforce", Kind.CHOICE, choices=Mode),
    )
    rules: frozenset[Rule] = field(
        default=DETECTION_RULES,
        metadata=_doc("enabled rules: consecutive, window, no_progress, stall", Kind.RULES),
    )
    window_size: int = field(
        default=36, metadata=_doc("tracked calls the window rule looks back over", Kind.COUNT)
    )
    remind_thresholds: tuple[int, ...] = field(
        default=(3, 5),
        metadata=_doc(
            "counts at which to remind: gentle text at the first, detailed at later ones,"
            " and on every call past the last one (see remind_past_thresholds)",
            Kind.THRESHOLDS,
        ),
    )
    remind_past_thresholds: bool = field(
        default=True,
        metadata=_doc(
            "remind on every call past the last remind threshold too (false: only at the"
            " thresholds, as the reminder plugin)",
            Kind.FLAG,
        ),
    )
    deny_threshold: int | None = field(
        default=6,
        metadata=_doc(
            "count from which a call without progress is denied (none: never)",
            Kind.OPTIONAL_THRESHOLD,
        ),
    )
    no_progress_threshold: int | None = field(
        default=4,
        metadata=_doc(
            "count from which a call whose outcome came back the same each time is denied"
            " (no_progress rule; none: only deny_threshold blocks)",
            Kind.OPTIONAL_THRESHOLD,
        ),
    )
    rescue_threshold: int | None = field(
        default=8,
        metadata=_doc(
            "count from which a denial carries advice from the advisor; the last denial"
            " before a stop carries it too (none: never)",
            Kind.OPTIONAL_THRESHOLD,
        ),
    )
    poll_limit: int | None = field(
        default=12,
        metadata=_doc(
            "count from which a call whose outcome keeps changing is denied too"
            " (none: outcomes never spare a call)",
            Kind.OPTIONAL_THRESHOLD,
        ),
    )
    stop_after_denials: int | None = field(
        default=3,
        metadata=_doc(
            "denied attempts in an epoch after which the agent is stopped",
            Kind.OPTIONAL_THRESHOLD,
            minimum=1,
        ),
    )
    stall_threshold: int = field(
        default=40,
        metadata=_doc(
            "redundant calls in one epoch that stop the agent (stall rule)", Kind.THRESHOLD
        ),
    )
    rescue_on_stall: bool = field(
        default=False,
        metadata=_doc(
            "on stall, deny the redundant call with advice (a rescue) instead of stopping the"
            " run, as the rescue plugin",
            Kind.FLAG,
        ),
    )
    max_loop_cost_usd: float | None = field(
        default=None,
        metadata=_doc(
            "US dollars a loop may cost (its model turns that asked for a repeat without"
            " progress, since the first of them): the first call after it is passed stops the"
            " run, whatever its count (budget rule; none: no budget)",
            Kind.MONEY,
        ),
    )
    max_loop_tokens: int | None = field(
        default=None,
        metadata=_doc(
            "tokens a loop may use (input and output), as max_loop_cost_usd (none: no budget)",
            Kind.TOKENS,
        ),
    )
    max_run_cost_usd: float | None = field(
        default=None,
        metadata=_doc(
            "US dollars a run may cost: every model turn of the session, its agents' included;"
            " the first call after it is passed stops the run (none: no budget)",
            Kind.MONEY,
        ),
    )
    max_run_tokens: int | None = field(
        default=None,
        metadata=_doc(
            "tokens a run may use (input and output), as max_run_cost_usd (none: no budget)",
            Kind.TOKENS,
        ),
    )
    prices: tuple[tuple[str, Price], ...] = field(
        default=(),
        metadata=_doc(
            "the price of a model, by name or * pattern (the first match wins): USD per million"
            " input, output, cache_read and cache_write tokens (cache prices default to the"
            " input price); wins over genai-prices' snapshot, never over a cost the provider"
            " reported",
            Kind.PRICES,
        ),
    )
    cost_in: CostUnit = field(
        default=CostUnit.USD,
        metadata=_doc(
            "what texts and decisions give a loop's cost in: usd (tokens and dollars) or tokens"
            " (tokens only, for a subscription: a dollar budget is then an error)",
            Kind.CHOICE,
            choices=CostUnit,
        ),
    )
    arguments_preview_chars: int = field(
        default=200,
        metadata=_doc("characters of canonical arguments shown in detailed texts", Kind.COUNT),
    )
    intent_check: bool = field(
        default=True,
        metadata=_doc(
            "when the model's text in a response announces a change of approach (intent_phrases)"
            " while a call it requests repeats an earlier one, the reminder or refusal of that"
            " call says so (false: never)",
            Kind.FLAG,
        ),
    )
    intent_phrases: frozenset[str] = field(
        default=DEFAULT_INTENT_PHRASES,
        metadata=_doc(
            "phrases that announce a change of approach in a model's text, matched without case"
            " (default: English, and a few French, German and Spanish ones)",
            Kind.NAMES,
        ),
    )
    ignored_args: frozenset[str] = field(
        default=DEFAULT_IGNORED_ARGS,
        metadata=_doc("top-level argument fields ignored in keys", Kind.NAMES),
    )
    include: tuple[str, ...] = field(
        default=("*",),
        metadata=_doc(
            "tool-name patterns that are tracked (* wildcard; empty: every tool)", Kind.PATTERNS
        ),
    )
    exclude: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "tool-name patterns that are never tracked (* wildcard), besides final_answer_tools",
            Kind.PATTERNS,
        ),
    )
    final_answer_tools: tuple[str, ...] = field(
        default=DEFAULT_FINAL_ANSWER_TOOLS,
        metadata=_doc(
            "tool-name patterns of the tools that give the run's final answer (smolagents'"
            " final_answer, Pydantic AI's final_result): never tracked, whatever exclude says,"
            " so a stopped agent can still answer (empty: tracked like any tool)",
            Kind.PATTERNS,
        ),
    )
    count_calls_without_arguments: bool = field(
        default=False,
        metadata=_doc(
            "count a recognised tool span that carries no arguments (content capture off, or an"
            " instrumentation that publishes none: AutoGen, the MCP SDK's server spans) as a"
            " call of its tool without arguments, so repeats are counted by tool name (false:"
            " such spans are skipped)",
            Kind.FLAG,
        ),
    )
    exclude_commands: tuple[str, ...] = field(
        default=(),
        metadata=_doc("regexes over a shell command that make the call untracked", Kind.REGEXES),
    )
    shell_tools: tuple[str, ...] = field(
        default=DEFAULT_SHELL_TOOLS,
        metadata=_doc("tool-name patterns whose `command` is shell", Kind.PATTERNS),
    )
    mutating_tools: tuple[str, ...] = field(
        default=DEFAULT_MUTATING_TOOLS,
        metadata=_doc("tool-name patterns whose successful call starts a new epoch", Kind.PATTERNS),
    )
    mutating_commands: tuple[str, ...] = field(
        default=DEFAULT_MUTATING_COMMANDS,
        metadata=_doc(
            "regexes over a shell command whose successful run starts a new epoch", Kind.REGEXES
        ),
    )
    read_operations: tuple[str, ...] = field(
        default=DEFAULT_READ_OPERATIONS,
        metadata=_doc(
            "operation names (first word of a `command`/`action` argument) that only read",
            Kind.PATTERNS,
        ),
    )
    mutating_operations: tuple[str, ...] = field(
        default=DEFAULT_MUTATING_OPERATIONS,
        metadata=_doc(
            "operation names (first word of a `command`/`action` argument) that write",
            Kind.PATTERNS,
        ),
    )
    failure_stop_threshold: int | None = field(
        default=3,
        metadata=_doc(
            "identical failures of one call in an epoch after which the run is stopped, decided"
            " after the call ran (none: never)",
            Kind.OPTIONAL_THRESHOLD,
        ),
    )
    max_rescues: int = field(default=3, metadata=_doc("advisor asks per session", Kind.BUDGET))
    cooldown_seconds: float = field(
        default=60.0,
        metadata=_doc("minimum seconds between two advisor asks in one session", Kind.SECONDS),
    )
    advisor_timeout_seconds: float = field(
        default=30.0,
        metadata=_doc(
            "longest wait for advice; a command is killed after it", Kind.POSITIVE_SECONDS
        ),
    )
    advisor_command: str | None = field(
        default=None,
        metadata=_doc("advisor command line (advice on stdout, exit 0)", Kind.COMMAND),
    )
    advisor_input: AdvisorInput = field(
        default=AdvisorInput.ARGV,
        metadata=_doc(
            "how advisor_command gets the question: argv (one extra argument, nothing on stdin)"
            " or stdin_json (the request as JSON on stdin)",
            Kind.CHOICE,
            choices=AdvisorInput,
        ),
    )
    advisor_model: str | None = field(
        default=None,
        metadata=_doc(
            "model name handed to the advisor (AdviceRequest.model; a command gets it in"
            " LOOPGUARD_ADVISOR_MODEL)",
            Kind.TEXT,
        ),
    )
    trip_log_path: str | None = field(
        default=None,
        metadata=_doc("file to append one JSON line per non-allow decision to", Kind.PATH),
    )
    trip_log_arguments: bool = field(
        default=False,
        metadata=_doc("include the (cut) canonical arguments in trip lines", Kind.FLAG),
    )
    max_sessions: int = field(
        default=10_000, metadata=_doc("sessions kept (LRU eviction)", Kind.COUNT)
    )
    session_ttl_seconds: float = field(
        default=3600.0,
        metadata=_doc("idle seconds after which a session is forgotten", Kind.POSITIVE_SECONDS),
    )
    max_signatures_per_session: int = field(
        default=256,
        metadata=_doc("distinct signatures remembered per session and epoch", Kind.COUNT),
    )
    store: str | None = field(
        default=None,
        metadata=_doc(
            "where sessions are kept: none (this process's memory) or a Redis URL"
            " (redis://host:6379/0, rediss:// for TLS, unix:///path), shared by every process"
            " that uses it (needs otel-loopguard[redis])",
            Kind.URL,
        ),
    )
    store_prefix: str = field(
        default="loopguard:",
        metadata=_doc(
            "start of every Redis key of this deployment (several can share one Redis)",
            Kind.TEXT,
        ),
    )
    store_password_file: str | None = field(
        default=None,
        metadata=_doc(
            "file holding the Redis password (its first line), instead of one in the URL",
            Kind.PATH,
        ),
    )
    store_timeout_seconds: float = field(
        default=0.05,
        metadata=_doc(
            "longest wait for one Redis command (connecting included) before the store counts"
            " as failed",
            Kind.POSITIVE_SECONDS,
        ),
    )
    store_failure: StoreFailure = field(
        default=StoreFailure.OPEN,
        metadata=_doc(
            "what a call gets when the Redis store fails: open (allowed, not counted) or closed"
            " (denied)",
            Kind.CHOICE,
            choices=StoreFailure,
        ),
    )

    memory: bool | str = field(
        default=True,
        metadata=_doc(
            "dead ends remembered across runs: true (where runs follow each other: the command"
            " hooks' state file or their shared Redis store, serve's --state-dir; an in-process"
            " guard remembers nothing), false (nowhere), or where: a file (.sqlite3, .sqlite or"
            " .db: SQLite, else JSON) or a Redis URL",
            Kind.MEMORY,
        ),
    )
    memory_scope: MemoryScope = field(
        default=MemoryScope.REPOSITORY,
        metadata=_doc(
            "which later runs a dead end is remembered for: repository (the git root or"
            " working directory), agent (its name) or global",
            Kind.CHOICE,
            choices=MemoryScope,
        ),
    )
    memory_max_entries: int = field(
        default=200,
        metadata=_doc("dead ends remembered per scope (the oldest dropped first)", Kind.COUNT),
    )
    memory_max_age_seconds: float = field(
        default=30 * 86_400.0,
        metadata=_doc(
            "seconds after its last run that a dead end is forgotten", Kind.POSITIVE_SECONDS
        ),
    )
    memory_arguments: bool = field(
        default=False,
        metadata=_doc(
            "keep the cut canonical arguments in dead-end records (otherwise hashes only)",
            Kind.FLAG,
        ),
    )

    def __post_init__(self) -> None:
        """Normalise collections and validate; raises ``ValueError`` naming field and value."""
        for spec in SPECS:
            value = getattr(self, spec.name)
            if value is spec.default:
                continue  # valid and normal as declared (tests/test_policy_defaults.py)
            valid = check_value(spec.name, value, spec.metadata)
            if valid is not value:
                object.__setattr__(self, spec.name, valid)
        if not self.include:
            object.__setattr__(self, "include", ("*",))  # empty means every tool, as the plugins

        deny = self.deny_threshold
        if deny is not None and self.remind_thresholds and self.remind_thresholds[-1] >= deny:
            raise ValueError(
                f"remind_thresholds: every reminder must come before deny_threshold={deny},"
                f" got {list(self.remind_thresholds)!r}"
            )
        if self.rescue_threshold is not None:
            if deny is None:
                raise ValueError(
                    f"rescue_threshold: {self.rescue_threshold!r} needs a deny_threshold"
                    " (a rescue is a denial with advice)"
                )
            if self.rescue_threshold < deny:
                raise ValueError(
                    f"rescue_threshold: {self.rescue_threshold!r} must not be below"
                    f" deny_threshold={deny}"
                )
        if self.poll_limit is not None and deny is not None and self.poll_limit <= deny:
            raise ValueError(
                f"poll_limit: {self.poll_limit!r} must be above deny_threshold={deny}"
                " (polling is spared up to it)"
            )
        if self.max_signatures_per_session < 2 * self.window_size:
            # The rules rely on every key in the window being remembered as a signature, and
            # pruning drops a quarter of the signatures at once.
            raise ValueError(
                f"max_signatures_per_session: {self.max_signatures_per_session!r} must be at least"
                f" twice window_size={self.window_size}"
            )
        if self.cost_in is CostUnit.TOKENS:
            for name in ("max_loop_cost_usd", "max_run_cost_usd"):
                budget = getattr(self, name)
                if budget is not None:
                    raise ValueError(
                        f"{name}: {budget!r} is a dollar budget, and cost_in='tokens' gives no"
                        " dollar figures; give max_loop_tokens / max_run_tokens instead, or"
                        " cost_in='usd'"
                    )
        if Rule.WINDOW in self.rules and self.window_size < 2:
            raise ValueError(
                f"window_size: must be >= 2 for the window rule, got {self.window_size!r}"
            )

    def replace(self, **changes: Any) -> Policy:
        """Return a copy with ``changes`` applied (validated like a new policy)."""
        unknown = set(changes) - FIELD_NAMES
        if unknown:
            raise ValueError(unknown_message("policy field", unknown, FIELD_NAMES))
        return dataclasses.replace(self, **changes)


SPECS: Final = dataclasses.fields(Policy)
FIELDS: Final = {f.name: f for f in SPECS}
FIELD_NAMES: Final = frozenset(FIELDS)


def kind_of(name: str) -> Kind:
    kind: Kind = FIELDS[name].metadata["kind"]
    return kind


def validate_field(name: str, value: object, *, label: str | None = None) -> object:
    """Validate ``value`` for the policy field ``name`` by the field's kind and return it
    normalised (lists as tuples, sets as frozensets, sorted thresholds, enum members).

    Raises ``ValueError`` naming ``label`` (default: the field) and the value; for an unknown
    field, naming the field. Cross-field rules (deny before rescue, ...) are checked by
    :class:`Policy` itself.
    """
    spec = FIELDS.get(name)
    if spec is None:
        raise ValueError(unknown_message("policy field", [name], FIELD_NAMES))
    return check_value(label or name, value, spec.metadata)
