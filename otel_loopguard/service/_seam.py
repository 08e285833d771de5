"""What the HTTP and gRPC receivers need of the service: :class:`ServiceSeam`.

The receivers are started by :class:`~otel_loopguard.service.Service` and type against this
protocol, not against the service's class, so that imports point one way (``_service`` imports
``_http`` and ``_grpc``; they import this module only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from otel_loopguard._guard import LoopGuard
    from otel_loopguard._otlp_json import OtlpSpans

    from ._budget import ByteBudget
    from ._metrics import ServiceMetrics
    from ._options import ServeOptions

__all__ = ["ServiceSeam"]


class ServiceSeam(Protocol):
    """The part of the service a receiver calls: its options, guard, metrics and request budget,
    and the request handling both transports share."""

    @property
    def options(self) -> ServeOptions: ...

    @property
    def guard(self) -> LoopGuard: ...

    @property
    def metrics(self) -> ServiceMetrics: ...

    @property
    def budget(self) -> ByteBudget: ...

    @property
    def closing(self) -> bool:
        """Whether the service is draining (health answers 503)."""
        ...

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` value carries the token (always, without a token)."""
        ...

    def accept(self, read: OtlpSpans, transport: str) -> tuple[str, str]:
        """Queue the spans of one request: ``(outcome, message)``."""
        ...

    def decide(
        self, endpoint: str, payload: object, traceparent: str | None = None
    ) -> dict[str, object]:
        """One decision API call (``traceparent``: the request's W3C header); raises
        ``ValueError`` naming a bad field."""
        ...

    def enter_request(self) -> None:
        """A request is being handled (a drain waits for it)."""
        ...

    def leave_request(self) -> None:
        """The request :meth:`enter_request` announced is done."""
        ...

    def metrics_page(self, accept: str | None = None) -> tuple[bytes, str]:
        """What ``/metrics`` answers to a scraper whose ``Accept`` is ``accept``, and its
        content type."""
        ...
