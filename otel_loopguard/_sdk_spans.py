"""A finished or open SDK span as the conventions read it: its attributes (the SDK's inner dict
on the hot path), its events and whether it failed. Shared by the span processor and the
exporter (both import these names from :mod:`otel_loopguard.processor` too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

__all__ = ["span_attributes", "span_events", "span_failed"]

_NO_ATTRIBUTES: Final[Mapping[str, Any]] = {}


def _sdk_attributes(attributes: Any) -> Mapping[str, Any]:
    """The SDK's ``BoundedAttributes`` as its inner dict (read only), or the mapping as it is.

    The SDK's ``attributes`` property wraps its ``BoundedAttributes`` (which wraps a dict) in a
    read-only proxy; every missing-key lookup through those layers raises and catches a
    KeyError. On the hot path we read the inner dict, and fall back to the mapping given when
    the SDK's internals differ.
    """
    inner = getattr(attributes, "_dict", None)
    if type(inner) is dict:
        return inner
    return attributes if attributes is not None else _NO_ATTRIBUTES


def span_attributes(span: ReadableSpan) -> Mapping[str, Any]:
    """A span's attributes (its inner dict, as :func:`_sdk_attributes`; else the public
    property). Shared with the exporter."""
    inner = getattr(getattr(span, "_attributes", None), "_dict", None)
    if type(inner) is dict:
        return inner
    return span.attributes or _NO_ATTRIBUTES


def span_events(span: ReadableSpan) -> tuple[tuple[str, Mapping[str, Any]], ...]:
    """A finished span's events as the conventions read them: (name, attributes) pairs."""
    events = span.events
    if not events:
        return ()
    return tuple((event.name, _sdk_attributes(event.attributes)) for event in events)


def span_failed(span: ReadableSpan) -> bool:
    """Whether a finished span's status is ERROR (the conventions read a call's failure from
    it, with the span's own attributes and events)."""
    status = span.status
    return status is not None and status.status_code is StatusCode.ERROR
