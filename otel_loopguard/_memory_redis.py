"""Dead ends in Redis (:class:`RedisMemory`), shared by every process that uses it; the
client is imported when one is built. Imported when such a memory is opened."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ._defaults import redact_url
from ._memory_records import DeadEnd, Notes, bounded, merge
from .config import Policy

__all__ = ["RedisMemory"]


class RedisMemory:
    """Dead ends in Redis, shared by every process that uses it: one hash per scope
    (``<store_prefix>memory:<scope>``, field ``<args key>|<outcome key>``, each write renewing
    its TTL to ``memory_max_age_seconds``) and a set of the scopes. A Redis that fails is
    logged once and answered as "nothing remembered"."""

    def __init__(self, url: str, policy: Policy) -> None:
        try:
            import redis
        except ImportError:
            raise ValueError(
                f"memory: {redact_url(url)!r} needs the Redis client:"
                " pip install 'otel-loopguard[redis]'"
            ) from None
        timeout = policy.store_timeout_seconds
        options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
        if url == policy.store and policy.store_password_file:
            try:
                lines = Path(policy.store_password_file).expanduser().read_text().splitlines()
            except OSError as exc:
                raise ValueError(f"store_password_file: cannot read it: {exc}") from None
            if lines and lines[0]:
                options["password"] = lines[0]
        try:
            self.client: Any = redis.Redis.from_url(url, **options)
        except ValueError as exc:
            raise ValueError(f"memory: {redact_url(url)!r} is not a Redis URL: {exc}") from None
        self.where = redact_url(url)
        self.policy = policy
        self.prefix = f"{policy.store_prefix}memory:"
        self._notes = Notes()

    def _hash(self, scope: str) -> str:
        return f"{self.prefix}{scope}"

    def _read(self, scope: str) -> list[DeadEnd]:
        found = []
        for blob in self.client.hvals(self._hash(scope)):
            try:
                found.append(DeadEnd.from_plain(json.loads(blob)))
            except ValueError as exc:
                self._notes.once("entry", "%s: an entry is skipped (%s)", self.where, exc)
        return found

    def recall(self, scope: str, key: str) -> list[DeadEnd]:
        try:
            return [e for e in self._read(scope) if e.key == key]
        except Exception as exc:
            self._notes.once("redis", "%s: %r: going on without memory", self.where, exc)
            return []

    def record(self, entry: DeadEnd) -> None:
        try:
            name = self._hash(entry.scope)
            field = f"{entry.key}|{entry.outcome or ''}"
            old_blob = self.client.hget(name, field)
            old = None
            if old_blob is not None:
                try:
                    old = DeadEnd.from_plain(json.loads(old_blob))
                except ValueError:
                    old = None
            merged = merge(old, entry)
            ttl = max(1, int(self.policy.memory_max_age_seconds))
            pipe = self.client.pipeline()
            pipe.hset(name, field, json.dumps(merged.to_plain()))
            pipe.expire(name, ttl)
            pipe.sadd(f"{self.prefix}scopes", entry.scope)
            pipe.expire(f"{self.prefix}scopes", ttl)
            pipe.execute()
            if self.client.hlen(name) > self.policy.memory_max_entries:
                kept = {
                    f"{e.key}|{e.outcome or ''}"
                    for e in bounded(self._read(entry.scope), self.policy, time.time())
                }
                stale = [f.decode() if isinstance(f, bytes) else f for f in self.client.hkeys(name)]
                drop = [f for f in stale if f not in kept]
                if drop:
                    self.client.hdel(name, *drop)
        except Exception as exc:
            self._notes.once("redis", "%s: %r: going on without memory", self.where, exc)

    def _scopes(self) -> list[str]:
        members = self.client.smembers(f"{self.prefix}scopes")
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)

    def entries(self, scope: str | None = None) -> list[DeadEnd]:
        scopes = [scope] if scope is not None else self._scopes()
        found = [entry for name in scopes for entry in self._read(name)]
        oldest = time.time() - self.policy.memory_max_age_seconds
        return sorted((e for e in found if e.last > oldest), key=lambda e: e.last, reverse=True)

    def forget(self, scope: str | None, key_prefix: str) -> int:
        dropped = 0
        for entry in self.entries(scope):
            if entry.key.startswith(key_prefix):
                dropped += int(
                    self.client.hdel(self._hash(entry.scope), f"{entry.key}|{entry.outcome or ''}")
                )
        return dropped

    def clear(self, scope: str | None = None) -> int:
        scopes = [scope] if scope is not None else self._scopes()
        dropped = 0
        for name in scopes:
            dropped += int(self.client.hlen(self._hash(name)))
            self.client.delete(self._hash(name))
        if scope is None:
            self.client.delete(f"{self.prefix}scopes")
        return dropped

    def count(self) -> int:
        try:
            return sum(int(self.client.hlen(self._hash(name))) for name in self._scopes())
        except Exception:
            return 0

    def flush(self) -> None:
        return None
