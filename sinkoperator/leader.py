"""Leader election through a coordination.k8s.io/v1 Lease: of several operator replicas exactly one acts.

The rules are client-go's. The holder renews every `retry` seconds. A standby takes the Lease once it has
seen the same record unchanged for `duration` seconds, timed by its own monotonic clock (never the
holder's timestamps, so clock skew between nodes does not matter). A holder that could not renew for
`renew_deadline` (< duration) seconds stops at once, before a standby may take over. Every action of the
operator first checks `fence()`, so a holder paused past its deadline (a stopped process, a stalled node)
exits when it wakes instead of acting next to the new holder.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("sinkoperator.leader")


@dataclass(frozen=True)
class Timing:
    duration: float = 15.0  # a standby waits this long on an unchanged record
    renew_deadline: float = 10.0  # a holder that has not renewed for this long stops
    retry: float = 2.0  # how often the holder renews and a standby looks

    def __post_init__(self) -> None:
        if not 0 < self.retry < self.renew_deadline < self.duration:
            raise ValueError(f"leader election needs 0 < retry < renewDeadline < duration, got {self}")

    @property
    def takeover_bound(self) -> float:
        """The longest a dead holder keeps its Lease from a live standby."""
        return self.duration + self.retry


class Lease:
    """One replica's view of the Lease `namespace/name`, as `identity`."""

    def __init__(self, namespace: str, name: str, identity: str, timing: Timing = Timing()) -> None:
        self.namespace, self.name, self.identity, self.timing = namespace, name, identity, timing
        self._seen: tuple[str, str, str] | None = None  # (holder, renewTime, resourceVersion) last read
        self._seen_at = 0.0  # monotonic time it was first read
        self._renewed_at: float | None = None  # monotonic time of our last successful write
        self.holder = ""  # who holds it, as last read
        self.transitions = 0

    def _api(self) -> client.CoordinationV1Api:
        return client.CoordinationV1Api()

    def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this replica holds the Lease now."""
        now = time.monotonic()
        try:
            lease = self._api().read_namespaced_lease(self.name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            return self._create(now)
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or ""
        record = (holder, str(spec.renew_time), str(lease.metadata and lease.metadata.resource_version))
        if record != self._seen:
            self._seen, self._seen_at = record, now
        self.holder, self.transitions = holder, spec.lease_transitions or 0
        if holder and holder != self.identity and now - self._seen_at < (spec.lease_duration_seconds or 0):
            return False
        stamp = _now()
        if holder != self.identity:
            spec.acquire_time, spec.lease_transitions = stamp, self.transitions + (1 if holder else 0)
        spec.holder_identity, spec.renew_time = self.identity, stamp
        spec.lease_duration_seconds = int(self.timing.duration)
        lease.spec = spec
        try:
            self._api().replace_namespaced_lease(self.name, self.namespace, lease)  # fails on a concurrent write
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        self.holder, self.transitions, self._renewed_at = self.identity, spec.lease_transitions or 0, now
        return True

    def _create(self, now: float) -> bool:
        stamp = _now()
        body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                              spec=client.V1LeaseSpec(holder_identity=self.identity, acquire_time=stamp,
                                                      renew_time=stamp, lease_transitions=0,
                                                      lease_duration_seconds=int(self.timing.duration)))
        try:
            self._api().create_namespaced_lease(self.namespace, body)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        self.holder, self.transitions, self._renewed_at = self.identity, 0, now
        return True

    def valid(self) -> bool:
        """Whether this replica may still act: it renewed within the renew deadline."""
        return self._renewed_at is not None and time.monotonic() - self._renewed_at < self.timing.renew_deadline

    def release(self) -> None:
        """On a clean stop: a standby takes over at its next look instead of after `duration`."""
        try:
            lease = self._api().read_namespaced_lease(self.name, self.namespace)
            if lease.spec and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity, lease.spec.lease_duration_seconds = None, 1
                self._api().replace_namespaced_lease(self.name, self.namespace, lease)
                log.info("released the Lease %s/%s", self.namespace, self.name)
        except ApiException as e:
            log.warning("could not release the Lease %s/%s: %s", self.namespace, self.name, e.reason)
        self._renewed_at = None


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


_held: Lease | None = None


def fence() -> None:
    """Called before every action: a replica whose Lease may have passed to another exits now."""
    if _held is not None and not _held.valid():
        _stop(f"the Lease {_held.namespace}/{_held.name} was not renewed within "
              f"{_held.timing.renew_deadline:g} s; stopping before another replica acts")


def _stop(why: str) -> None:
    log.error("%s", why)
    logging.shutdown()
    os._exit(1)  # the Deployment restarts this replica as a standby; no handler may run on after this


def acquire(lease: Lease) -> None:
    """Blocks until this replica holds the Lease, then keeps renewing it in a thread until the process ends."""
    global _held
    announced = ""
    while True:
        try:
            if lease.try_acquire_or_renew():
                break
        except ApiException as e:
            log.warning("the Lease %s/%s cannot be read: %s %s", lease.namespace, lease.name, e.status, e.reason)
        if lease.holder != announced:
            announced = lease.holder
            log.info("standby: the Lease %s/%s is held by %s", lease.namespace, lease.name, announced or "nobody")
        time.sleep(lease.timing.retry)
    _held = lease
    log.info("acquired the Lease %s/%s as %s (transition %d)", lease.namespace, lease.name, lease.identity,
             lease.transitions)
    threading.Thread(target=_renew, args=(lease,), name="lease-renewer", daemon=True).start()


def _renew(lease: Lease) -> None:
    while True:
        time.sleep(lease.timing.retry)
        try:
            if lease.try_acquire_or_renew():
                continue
            if lease.holder != lease.identity:
                _stop(f"the Lease {lease.namespace}/{lease.name} is now held by {lease.holder}; stopping")
        except Exception as e:  # the API server unreachable: keep trying until the deadline
            log.warning("renewing the Lease %s/%s failed: %s", lease.namespace, lease.name, e)
        fence()
