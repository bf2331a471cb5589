"""Prometheus metrics of the agent, as :mod:`meshd.metrics.schema` names and documents them.

Counters live in the protocol core (``gossip.stats.Stats``) and are read at scrape time by a
custom collector, so the hot path only increments integers.  Probe RTTs go into a real histogram.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gossip.protocol import Swim
from gossip.state import Status
from meshd.control.plane import ControlPlane
from meshd.control.quarantine import AutoQuarantine
from meshd.coordinates import CoordinatePlane
from meshd.metrics.exposition import MetricsServer
from meshd.metrics.schema import family, histogram
from meshd.security.plane import Security
from meshd.signals.plane import SignalPlane
from topology.client import REJECT_REASONS
from topology.wire import DECODE_REASONS


def one(name: str, node: str, value: float) -> Metric:
    """A family with one series, labelled only with the node."""
    fam = family(name)
    fam.add_metric([node], value)
    return fam


def by(name: str, node: str, values: Iterable[tuple[str, float]]) -> Metric:
    """A family with one series per (label value, value), after the node."""
    fam = family(name)
    for key, value in values:
        fam.add_metric([node, key], value)
    return fam


class GossipCollector(Collector):
    """Reads a ``Swim`` core's counters and member table at scrape time."""

    def __init__(self, swim: Swim) -> None:
        self.swim = swim

    def collect(self) -> Iterator[Metric]:
        swim, st, node = self.swim, self.swim.stats, self.swim.name
        members = family("meshd_gossip_members")
        counts = dict.fromkeys(Status, 0)
        for m in swim.members():
            counts[m.status] += 1
        for status, n in counts.items():
            members.add_metric([node, status.label], n)
        yield members
        yield by("meshd_gossip_probes", node,
                 [("ok", st.probes_ok), ("failed", st.probes_failed)])
        yield one("meshd_gossip_indirect_probes", node, st.indirect_probes_sent)
        yield one("meshd_gossip_raised_suspicions", node, st.suspicions_raised)
        yield one("meshd_gossip_refuted_suspicions", node, st.suspicions_refuted)
        yield one("meshd_gossip_refutations", node, st.refutations)
        yield one("meshd_gossip_name_conflicts", node, st.conflicts)
        yield by("meshd_gossip_packets", node,
                 [("sent", st.packets_sent), ("received", st.packets_received)])
        yield by("meshd_gossip_packet_bytes", node,
                 [("sent", st.bytes_sent), ("received", st.bytes_received)])
        yield by("meshd_gossip_dropped_packets", node, sorted(st.dropped.items()))
        yield by("meshd_gossip_push_pull_exchanges", node,
                 [("completed", st.push_pull_completed), ("served", st.push_pull_received),
                  ("failed", st.push_pull_failed)])
        yield by("meshd_gossip_push_pull_bytes", node,
                 [("sent", st.push_pull_bytes_sent), ("received", st.push_pull_bytes_received)])
        yield one("meshd_gossip_broadcast_queue_messages", node, swim.broadcast_queue_depth())
        yield one("meshd_gossip_health_score", node, swim.awareness.score)
        yield one("meshd_gossip_incarnation", node, swim.incarnation)


class TopologyCollector(Collector):
    """The Vivaldi coordinate's state and counters, read at scrape time."""

    def __init__(self, node: str, plane: CoordinatePlane) -> None:
        self.node = node
        self.plane = plane

    def collect(self) -> Iterator[Metric]:
        node, plane = self.node, self.plane
        coord, stats = plane.client.coordinate, plane.client.stats
        yield one("meshd_topology_coordinate_error_ratio", node, coord.error)
        yield one("meshd_topology_coordinate_height_seconds", node, coord.height)
        yield one("meshd_topology_coordinate_adjustment_seconds", node, coord.adjustment)
        yield one("meshd_topology_known_coordinates", node, plane.known())
        yield one("meshd_topology_coordinate_updates", node, stats.updates)
        yield one("meshd_topology_coordinate_resets", node, stats.resets)
        rejected = family("meshd_topology_rejected_samples")
        counts = dict.fromkeys(REJECT_REASONS + DECODE_REASONS + ("missing",), 0)
        counts.update(stats.rejected)
        for reason, n in plane.rejected.items():
            counts[reason] = counts.get(reason, 0) + n
        for reason, n in sorted(counts.items()):
            rejected.add_metric([node, reason], n)
        yield rejected


class SecurityCollector(Collector):
    """Refused connections and calls by channel and reason, certificate expiry, renewals."""

    def __init__(self, node: str, security: Security,
                 more: Callable[[], Mapping[tuple[str, str], int]] | None = None) -> None:
        """``more``: refusals counted elsewhere (the router's processes), added in."""
        self.node = node
        self.security = security
        self.more = more

    def collect(self) -> Iterator[Metric]:
        node, sec = self.node, self.security
        refused = family("meshd_security_refusals")
        counts = Counter(dict.copy(sec.refusals))
        if self.more is not None:
            counts.update(self.more())
        for (channel, reason), n in sorted(counts.items()):
            refused.add_metric([node, channel, reason], n)
        yield refused
        yield by("meshd_security_renewals", node,
                 [(result, sec.renewals[result]) for result in ("ok", "failed")])
        yield by("meshd_security_issued_certificates", node,
                 [(op, sec.enrollments[op]) for op in ("enroll", "renew")])
        ident = sec._identity
        if ident is not None:
            yield one("meshd_security_certificate_expiry_timestamp_seconds", node,
                      ident.not_after.timestamp())
        yield one("meshd_security_revoked_identities", node,
                  len(sec.revocations.cutoffs) if sec.revocations else 0)
        yield one("meshd_gossip_keyring_keys", node,
                  len(sec.keyring.keys()) if sec.keyring else 0)


class ConsensusCollector(Collector):
    """Raft groups on this node (coordinators) and every node's read copies."""

    STATES = {"follower": 0, "candidate": 1, "leader": 2}

    def __init__(self, node: str, control: ControlPlane) -> None:
        self.node = node
        self.control = control

    def collect(self) -> Iterator[Metric]:
        n = self.node
        c = self.control
        version = family("meshd_policy_version")
        for group, view in c.views.items():
            version.add_metric([n, group], view.version)
        yield version
        gauges = [family(name) for name in RAFT_GAUGES]
        syncs = family("meshd_raft_journal_syncs")
        sync_time = family("meshd_raft_journal_sync_seconds")
        for group, grp in list(c.groups.items()):
            try:
                st = grp.status()
            except RuntimeError:  # pysyncobj mutated a dict under us; next scrape
                continue
            for gauge, value in zip(gauges, (
                    self.STATES.get(st.state, 0), st.term, st.commit_index, st.last_applied,
                    int(st.has_quorum), len(st.members), len(st.reachable)), strict=True):
                gauge.add_metric([n, group], value)
            syncs.add_metric([n, group], grp.durability.syncs)
            sync_time.add_metric([n, group], grp.durability.sync_seconds)
        yield from gauges
        yield syncs
        yield sync_time
        yield by("meshd_consensus_forwarded_writes", n,
                 [(group, c.forwarded.get(group, 0)) for group in c.views])
        yield by("meshd_consensus_follow_errors", n, c.follow_errors.items())


class SignalCollector(Collector):
    """Runtime replicas and GPUs on this node, and how the signal plane is doing."""

    def __init__(self, node: str, signals: SignalPlane) -> None:
        self.node = node
        self.signals = signals

    def collect(self) -> Iterator[Metric]:
        n, sp = self.node, self.signals
        now = sp.clock()
        ready, queue, spu, latency, age = (family(f"meshd_runtime_{name}") for name in (
            "replica_ready", "queue_requests", "spu_seconds", "latency_seconds",
            "queue_age_seconds"))
        for r in sp.current.replicas:
            labels = [n, r.model, r.version, r.runtime]
            ready.add_metric(labels, int(r.ready))
            if r.queue is not None:
                queue.add_metric(labels, r.queue)
            if r.spu is not None:
                spu.add_metric(labels, r.spu)
            if r.latency_ewma is not None:
                latency.add_metric(labels, r.latency_ewma)
            if "queue" in r.at:
                age.add_metric(labels, max(0.0, now - r.at["queue"]))
        yield from (ready, queue, spu, latency, age)
        polls = family("meshd_runtime_polls")
        errors = family("meshd_runtime_poll_errors")
        up = family("meshd_runtime_up")
        for a in sp.triton:
            ep = a.endpoint.grpc
            up.add_metric([n, "triton", ep], int(a.up))
            for kind, count in a.polls.items():
                polls.add_metric([n, "triton", ep, kind], count)
            for reason, count in a.errors.items():
                errors.add_metric([n, "triton", ep, reason], count)
        yield from (polls, errors, up)
        yield one("meshd_gpu_cpu_only", n, int(bool(sp.current.cpu_only)))
        gauges = {name: family(name) for name in GPU_GAUGES}
        for g in sp.current.gpus:
            labels = [n, g.uuid]
            for name, value in zip(GPU_GAUGES, (
                    g.memory_free, g.memory_total,
                    None if g.sm_util is None else g.sm_util / 100, g.temperature_c, g.power_w,
                    g.ecc_uncorrected, int(bool(g.throttle))), strict=True):
                if value is not None:
                    gauges[name].add_metric(labels, value)
        yield from gauges.values()
        yield by("meshd_signal_publications", n, sp.gate.reasons.items())
        yield by("meshd_signal_rejected_updates", n, sp.rejected.items())
        yield by("meshd_signal_patches", n,
                 [(outcome, sp.patch_outcomes.get(outcome, 0))
                  for outcome in ("applied", "no_base", "stale", "malformed")])
        yield by("meshd_signal_patch_rebases", n, sp.patches.rebases.items())
        yield one("meshd_signal_patch_deferred_rows", n, sp.patches.deferred)
        vias: dict[str, int] = {}
        stale = family("meshd_signal_staleness_seconds")
        for name, entry in list(sp.fused.nodes.items()):
            vias[entry.via] = vias.get(entry.via, 0) + 1
            ages = [now - r.at["queue"] for r in entry.signals.replicas if "queue" in r.at]
            if ages:
                stale.add_metric([n, name], max(0.0, *ages))
        yield by("meshd_signal_known_nodes", n, vias.items())
        yield stale


RAFT_GAUGES = ("meshd_raft_state", "meshd_raft_term", "meshd_raft_commit_index",
               "meshd_raft_last_applied", "meshd_raft_has_quorum", "meshd_raft_voters",
               "meshd_raft_reachable_voters")
GPU_GAUGES = ("meshd_gpu_memory_free_bytes", "meshd_gpu_memory_total_bytes",
              "meshd_gpu_sm_utilization_ratio", "meshd_gpu_temperature_celsius",
              "meshd_gpu_power_watts", "meshd_gpu_ecc_uncorrected_errors", "meshd_gpu_throttled")


class HealthCollector(Collector):
    """The node's own health checks (automatic quarantine)."""

    def __init__(self, node: str, health: AutoQuarantine) -> None:
        self.node = node
        self.health = health

    def collect(self) -> Iterator[Metric]:
        n, mon = self.node, self.health.monitor
        yield by("meshd_health_problems", n,
                 [(cause, sum(p.cause == cause for p in mon.current))
                  for cause in ("ecc", "thermal", "runtime")])
        yield by("meshd_health_actions", n,
                 [(action, self.health.actions[action])
                  for action in ("quarantine", "lift", "failed")])
        yield one("meshd_health_strikes", n, mon.strikes)


class AgentMetrics:
    """The agent's registry: gossip and topology collectors plus histograms."""

    def __init__(self, swim: Swim, coordinates: CoordinatePlane, security: Security,
                 control: ControlPlane | None = None,
                 signals: SignalPlane | None = None,
                 health: AutoQuarantine | None = None,
                 routing: Collector | None = None, train: Collector | None = None) -> None:
        self.registry = CollectorRegistry()
        if train is not None:
            self.registry.register(train)
        if routing is not None:
            self.registry.register(routing)
        if signals is not None:
            self.registry.register(SignalCollector(swim.name, signals))
        if health is not None:
            self.registry.register(HealthCollector(swim.name, health))
        self.write_seconds = histogram("meshd_consensus_write_seconds", self.registry)
        if control is not None:
            self.registry.register(ConsensusCollector(swim.name, control))
            control.on_write = lambda group, path, outcome, seconds: self.write_seconds.labels(
                swim.name, group, path, outcome).observe(seconds)
        self.registry.register(SecurityCollector(swim.name, security,
                                                 getattr(routing, "refusals", None)))
        self.registry.register(GossipCollector(swim))
        self.probe_rtt = histogram("meshd_gossip_probe_rtt_seconds", self.registry)
        self._rtt = self.probe_rtt.labels(swim.name)
        self.estimate_error = histogram("meshd_topology_rtt_estimate_error_ratio",
                                        self.registry)
        self._estimate_error = self.estimate_error.labels(swim.name)
        self.registry.register(TopologyCollector(swim.name, coordinates))
        self._server: MetricsServer | None = None

    def observe_estimate_errors(self, errors: Iterable[float]) -> None:
        for err in errors:
            self._estimate_error.observe(err)

    def observe_rtts(self, rtts: Iterable[float]) -> None:
        for rtt in rtts:
            self._rtt.observe(rtt)

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread."""
        self._server = MetricsServer(self.registry, host, port)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
