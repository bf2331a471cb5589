"""Admission: tenant quotas and priority.  Whether a request may go at all, before any target
is asked to take it (targets' and models' own limits are adaptive; see ``limiter``).

A shed request always gets a reason and a retry-after, never a silent drop or a place in an
unbounded queue: the caller answers RESOURCE_EXHAUSTED at once, and the client knows when
trying again is worth it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshd.score.budget import RateBucket

DEFAULT_PRIORITY = 5


@dataclass(frozen=True, slots=True)
class Verdict:
    admit: bool
    reason: str = ""
    retry_after: float = 0.0


ADMIT = Verdict(True)


def priority_share(priority: int) -> float:
    """The share of a limit a request of this priority (0..9) may fill.

    Priority 9 may use all of it, 0 only half: as a target or model fills up, low-priority
    requests are shed first and the remaining headroom is left for the important ones,
    without any queue that could grow.
    """
    p = min(9, max(0, priority))
    return 0.5 + p / 18


@dataclass(slots=True)
class ModelGate:
    """A model's requests in flight from this agent, against the sum of its targets' adaptive
    limits (at the request's priority share) and the policy's cap.

    The model's limit adapts to measured latency through its targets' limits, not through
    an estimator of its own: one latency average over every target mixes a stalled replica's
    samples with the healthy ones', and cut the whole model's admission on each stall (the
    routing simulation showed it shedding a sixth of the traffic at 80% load).
    """

    inflight: int = 0

    def try_acquire(self, capacity: float, cap: int | None) -> bool:
        if self.inflight >= capacity or (cap is not None and self.inflight >= cap):
            return False
        self.inflight += 1
        return True

    def release(self) -> None:
        if self.inflight > 0:
            self.inflight -= 1


@dataclass(slots=True)
class TenantState:
    rate: float | None
    burst: float
    concurrency: int | None
    priority: int
    bucket: RateBucket | None
    inflight: int = 0
    version: int = -1


class TenantGate:
    """Per-tenant request rate and concurrency, from ``TenantQuota`` policy documents.

    ``quota_of(tenant)`` returns the tenant's spec (None: no quota), ``share()`` this agent's
    share of each quota (1 / the number of routing agents): a quota is for the tenant's whole
    traffic, and each agent enforces its part of it without coordinating per request.
    ``version()`` moves whenever policy may have changed.
    """

    def __init__(self, quota_of: Callable[[str], dict[str, Any] | None],
                 version: Callable[[], int], share: Callable[[], float] = lambda: 1.0) -> None:
        self.quota_of = quota_of
        self.version = version
        self.share = share
        self._tenants: dict[str, TenantState] = {}
        self._unlimited = TenantState(None, 1.0, None, DEFAULT_PRIORITY, None)
        self._no_quota: dict[str, int] = {}
        """Tenants with no quota -> the policy version that said so."""

    def state(self, tenant: str, now: float, version: int | None = None) -> TenantState:
        """The tenant's state at policy ``version`` (None: ``version()``, asked now)."""
        st = self._tenants.get(tenant)
        if version is None:
            version = self.version()
        if st is not None and st.version == version:
            return st
        if self._no_quota.get(tenant) == version:
            return self._unlimited  # known to have none at this policy version
        spec = self.quota_of(tenant)
        if spec is None:
            # Tenants without a quota share one unlimited state, so request metadata cannot
            # grow this table; which have none is remembered in a bounded one.
            self._tenants.pop(tenant, None)
            if len(self._no_quota) >= 4096:
                self._no_quota.clear()
            self._no_quota[tenant] = version
            return self._unlimited
        share = max(1e-6, min(1.0, self.share()))
        rate = spec["requests_per_second"]
        burst = 1.0
        if rate is not None:
            burst = max(1.0, (spec["burst"] or rate) * share)
            rate *= share
        conc = spec["concurrency"]
        if conc is not None:
            conc = max(1, round(conc * share))
        prio = spec["priority"]
        if st is None:
            st = self._tenants[tenant] = TenantState(rate, burst, conc, prio, None)
        if rate is None:
            st.bucket = None
        elif st.bucket is None:
            st.bucket = RateBucket(rate, burst, now)
        else:
            st.bucket.reconfigure(rate, burst, now)
        # Updated in place: open decisions hold this object and release into it.
        st.rate, st.burst, st.concurrency, st.priority = rate, burst, conc, prio
        st.version = version
        return st

    def check(self, st: TenantState, now: float) -> Verdict:
        """Take one request from the tenant's quota, or say why not."""
        if st.concurrency is not None and st.inflight >= st.concurrency:
            return Verdict(False, "tenant_concurrency", 0.0)
        if st.bucket is not None and not st.bucket.try_take(now):
            return Verdict(False, "tenant_rate", st.bucket.retry_after(now))
        st.inflight += 1
        return ADMIT

    def release(self, st: TenantState) -> None:
        if st.inflight > 0:
            st.inflight -= 1
