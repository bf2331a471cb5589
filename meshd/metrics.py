"""Prometheus metrics of the agent, named ``meshd_<layer>_<what>_<unit>``.

Counters live in the protocol core (``gossip.stats.Stats``) and are read at scrape time by a
custom collector, so the hot path only increments integers.  Probe RTTs go into a real histogram.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gossip.protocol import Swim
from gossip.state import Status
from meshd.control import ControlPlane
from meshd.coordinates import CoordinatePlane
from meshd.quarantine import AutoQuarantine
from meshd.security import Security
from meshd.signals import SignalPlane
from topology.client import REJECT_REASONS
from topology.wire import DECODE_REASONS

RTT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RATIO_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)


WRITE_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5,
                 1.0, 2.5, 5.0)


class GossipCollector(Collector):
    """Reads a ``Swim`` core's counters and member table at scrape time."""

    def __init__(self, swim: Swim) -> None:
        self.swim = swim

    def collect(self) -> Iterator[Metric]:
        swim, st, node = self.swim, self.swim.stats, self.swim.name
        members = GaugeMetricFamily("meshd_gossip_members", "Members by status as seen here",
                                    labels=["node", "status"])
        counts = dict.fromkeys(Status, 0)
        for m in swim.members():
            counts[m.status] += 1
        for status, n in counts.items():
            members.add_metric([node, status.label], n)
        yield members

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["node"])
            c.add_metric([node], value)
            return c

        def by(name: str, doc: str, label: str,
               values: Iterable[tuple[str, float]]) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["node", label])
            for key, value in values:
                c.add_metric([node, key], value)
            return c

        yield by("meshd_gossip_probes", "Failure-detection probes by result", "result",
                 [("ok", st.probes_ok), ("failed", st.probes_failed)])
        yield counter("meshd_gossip_indirect_probes", "Indirect probes requested",
                      st.indirect_probes_sent)
        yield counter("meshd_gossip_suspicions_raised", "Suspicions raised after failed probes",
                      st.suspicions_raised)
        yield counter("meshd_gossip_suspicions_refuted",
                      "Suspected members that proved alive", st.suspicions_refuted)
        yield counter("meshd_gossip_refutations", "Suspicions of this node it refuted",
                      st.refutations)
        yield counter("meshd_gossip_name_conflicts", "Alive messages claiming a live name",
                      st.conflicts)
        yield by("meshd_gossip_packets", "UDP packets", "direction",
                 [("sent", st.packets_sent), ("received", st.packets_received)])
        yield by("meshd_gossip_packet_bytes", "UDP payload bytes", "direction",
                 [("sent", st.bytes_sent), ("received", st.bytes_received)])
        yield by("meshd_gossip_packets_dropped", "Packets and streams dropped, by reason",
                 "reason", sorted(st.dropped.items()))
        yield by("meshd_gossip_push_pull", "Push-pull exchanges by result", "result",
                 [("completed", st.push_pull_completed), ("served", st.push_pull_received),
                  ("failed", st.push_pull_failed)])
        yield by("meshd_gossip_push_pull_bytes", "Push-pull payload bytes", "direction",
                 [("sent", st.push_pull_bytes_sent), ("received", st.push_pull_bytes_received)])
        for name, doc, value in (
            ("meshd_gossip_broadcast_queue_depth", "Broadcasts waiting to be sent",
             swim.broadcast_queue_depth()),
            ("meshd_gossip_health_score", "Lifeguard local health score (0 is healthy)",
             swim.awareness.score),
            ("meshd_gossip_incarnation", "This node's incarnation", swim.incarnation),
        ):
            g = GaugeMetricFamily(name, doc, labels=["node"])
            g.add_metric([node], value)
            yield g


class TopologyCollector(Collector):
    """The Vivaldi coordinate's state and counters, read at scrape time."""

    def __init__(self, node: str, plane: CoordinatePlane) -> None:
        self.node = node
        self.plane = plane

    def collect(self) -> Iterator[Metric]:
        node, plane = self.node, self.plane
        coord, stats = plane.client.coordinate, plane.client.stats
        for name, doc, value in (
            ("meshd_topology_coordinate_error",
             "This node's Vivaldi error estimate (relative; 1.5 means not yet settled)",
             coord.error),
            ("meshd_topology_coordinate_height_seconds", "Height of this node's coordinate",
             coord.height),
            ("meshd_topology_coordinate_adjustment_seconds",
             "Adjustment term of this node's coordinate", coord.adjustment),
            ("meshd_topology_coordinates_known", "Members whose coordinate this node knows",
             plane.known()),
        ):
            g = GaugeMetricFamily(name, doc, labels=["node"])
            g.add_metric([node], value)
            yield g
        updates = CounterMetricFamily("meshd_topology_coordinate_updates",
                                      "RTT samples applied to this node's coordinate",
                                      labels=["node"])
        updates.add_metric([node], stats.updates)
        yield updates
        resets = CounterMetricFamily("meshd_topology_coordinate_resets",
                                     "Times the coordinate became invalid and was reset",
                                     labels=["node"])
        resets.add_metric([node], stats.resets)
        yield resets
        rejected = CounterMetricFamily(
            "meshd_topology_samples_rejected",
            "RTT samples and peer coordinates refused, by reason", labels=["node", "reason"])
        counts = dict.fromkeys(REJECT_REASONS + DECODE_REASONS + ("missing",), 0)
        counts.update(stats.rejected)
        for reason, n in plane.rejected.items():
            counts[reason] = counts.get(reason, 0) + n
        for reason, n in sorted(counts.items()):
            rejected.add_metric([node, reason], n)
        yield rejected


class SecurityCollector(Collector):
    """Refused connections and calls by channel and reason, certificate expiry, renewals."""

    def __init__(self, node: str, security: Security) -> None:
        self.node = node
        self.security = security

    def collect(self) -> Iterator[Metric]:
        node, sec = self.node, self.security
        refused = CounterMetricFamily(
            "meshd_security_refusals", "Connections, calls and messages refused, by channel "
            "(admin, gossip_stream, enrollment, ...) and reason", labels=["node", "channel",
                                                                          "reason"])
        for (channel, reason), n in sorted(sec.refusals.items()):
            refused.add_metric([node, channel, reason], n)
        yield refused
        renewals = CounterMetricFamily("meshd_security_renewals",
                                       "Certificate renewals of this node, by result",
                                       labels=["node", "result"])
        for result in ("ok", "failed"):
            renewals.add_metric([node, result], sec.renewals[result])
        yield renewals
        issued = CounterMetricFamily("meshd_security_certificates_issued",
                                     "Certificates this CA holder issued, by kind",
                                     labels=["node", "op"])
        for op in ("enroll", "renew"):
            issued.add_metric([node, op], sec.enrollments[op])
        yield issued
        ident = sec._identity
        if ident is not None:
            g = GaugeMetricFamily("meshd_security_certificate_expiry_timestamp_seconds",
                                  "When this node's certificate expires", labels=["node"])
            g.add_metric([node], ident.not_after.timestamp())
            yield g
        revoked = GaugeMetricFamily("meshd_security_revoked_identities",
                                    "Identities this node refuses as revoked", labels=["node"])
        revoked.add_metric([node], len(sec.revocations.cutoffs) if sec.revocations else 0)
        yield revoked
        keys = GaugeMetricFamily("meshd_gossip_keys_installed",
                                 "Gossip encryption keys in this node's keyring",
                                 labels=["node"])
        keys.add_metric([node], len(sec.keyring.keys()) if sec.keyring else 0)
        yield keys


class ConsensusCollector(Collector):
    """Raft groups on this node (coordinators) and every node's read copies."""

    STATES = {"follower": 0, "candidate": 1, "leader": 2}

    def __init__(self, node: str, control: ControlPlane) -> None:
        self.node = node
        self.control = control

    def collect(self) -> Iterator[Metric]:
        n = self.node
        c = self.control
        version = GaugeMetricFamily("meshd_policy_version",
                                    "Version of this node's read copy of each group",
                                    labels=["node", "group"])
        for group, view in c.views.items():
            version.add_metric([n, group], view.version)
        yield version
        gauges = {name: GaugeMetricFamily(name, doc, labels=["node", "group"]) for name, doc in (
            ("meshd_raft_state", "0 follower, 1 candidate, 2 leader"),
            ("meshd_raft_term", "Current Raft term"),
            ("meshd_raft_commit_index", "Raft commit index"),
            ("meshd_raft_last_applied", "Last log index applied to the store"),
            ("meshd_raft_has_quorum", "1 when a write could commit now, as far as this node knows"),
            ("meshd_raft_voters", "Voters in the group's configuration"),
            ("meshd_raft_reachable_voters", "Voters heard from within the quorum window"))}
        syncs = CounterMetricFamily("meshd_raft_journal_syncs", "Journal msync/fsync calls",
                                    labels=["node", "group"])
        sync_time = CounterMetricFamily("meshd_raft_journal_sync_seconds",
                                        "Time spent making the journal durable",
                                        labels=["node", "group"])
        for group, grp in list(c.groups.items()):
            try:
                st = grp.status()
            except RuntimeError:  # pysyncobj mutated a dict under us; next scrape
                continue
            for name, value in (("meshd_raft_state", self.STATES.get(st.state, 0)),
                                ("meshd_raft_term", st.term),
                                ("meshd_raft_commit_index", st.commit_index),
                                ("meshd_raft_last_applied", st.last_applied),
                                ("meshd_raft_has_quorum", int(st.has_quorum)),
                                ("meshd_raft_voters", len(st.members)),
                                ("meshd_raft_reachable_voters", len(st.reachable))):
                gauges[name].add_metric([n, group], value)
            syncs.add_metric([n, group], grp.durability.syncs)
            sync_time.add_metric([n, group], grp.durability.sync_seconds)
        yield from gauges.values()
        yield syncs
        yield sync_time
        fwd = CounterMetricFamily("meshd_consensus_forwarded_writes",
                                  "Writes this node forwarded to a coordinator",
                                  labels=["node", "group"])
        for group, count in c.forwarded.items():
            fwd.add_metric([n, group], count)
        yield fwd
        errors = CounterMetricFamily("meshd_consensus_follow_errors",
                                     "Ends of this node's log-following streams, by reason",
                                     labels=["node", "reason"])
        for reason, count in c.follow_errors.items():
            errors.add_metric([n, reason], count)
        yield errors


class SignalCollector(Collector):
    """Runtime replicas and GPUs on this node, and how the signal plane is doing."""

    def __init__(self, node: str, signals: SignalPlane) -> None:
        self.node = node
        self.signals = signals

    def collect(self) -> Iterator[Metric]:
        n, sp = self.node, self.signals
        now = sp.clock()
        rl = ["node", "model", "revision", "runtime"]
        ready = GaugeMetricFamily("meshd_runtime_replica_ready", "1 when the replica is ready",
                                  labels=rl)
        queue = GaugeMetricFamily("meshd_runtime_queue_requests",
                                  "Requests waiting in the runtime's queue", labels=rl)
        spu = GaugeMetricFamily("meshd_runtime_spu_seconds",
                                "Seconds of compute per 32 KiB work unit (EWMA)", labels=rl)
        latency = GaugeMetricFamily("meshd_runtime_latency_seconds",
                                    "Mean server-side latency per request (EWMA)", labels=rl)
        age = GaugeMetricFamily("meshd_runtime_queue_age_seconds",
                                "Age of the queue figure this node holds", labels=rl)
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
        polls = CounterMetricFamily("meshd_runtime_polls", "Successful runtime polls",
                                    labels=["node", "runtime", "endpoint", "kind"])
        errors = CounterMetricFamily("meshd_runtime_poll_errors", "Failed runtime polls",
                                     labels=["node", "runtime", "endpoint", "reason"])
        up = GaugeMetricFamily("meshd_runtime_up", "1 when the runtime answers",
                               labels=["node", "runtime", "endpoint"])
        for a in sp.triton:
            ep = a.endpoint.grpc
            up.add_metric([n, "triton", ep], int(a.up))
            for kind, count in a.polls.items():
                polls.add_metric([n, "triton", ep, kind], count)
            for reason, count in a.errors.items():
                errors.add_metric([n, "triton", ep, reason], count)
        yield from (polls, errors, up)
        cpu_only = GaugeMetricFamily("meshd_gpu_cpu_only",
                                     "1 when this node has no GPU telemetry (no NVML driver)",
                                     labels=["node"])
        cpu_only.add_metric([n], int(bool(sp.current.cpu_only)))
        yield cpu_only
        gl = ["node", "gpu_uuid"]
        gauges = {name: GaugeMetricFamily(name, doc, labels=gl) for name, doc in (
            ("meshd_gpu_memory_free_bytes", "Free GPU memory"),
            ("meshd_gpu_memory_total_bytes", "Total GPU memory"),
            ("meshd_gpu_sm_utilization_ratio", "Fraction of time a kernel ran (0-1)"),
            ("meshd_gpu_temperature_celsius", "GPU temperature"),
            ("meshd_gpu_power_watts", "GPU power draw"),
            ("meshd_gpu_ecc_uncorrected_errors", "Volatile uncorrected ECC errors"),
            ("meshd_gpu_throttled", "1 when a clock-throttle reason worth acting on is active"))}
        for g in sp.current.gpus:
            labels = [n, g.uuid]
            for name, value in (("meshd_gpu_memory_free_bytes", g.memory_free),
                                ("meshd_gpu_memory_total_bytes", g.memory_total),
                                ("meshd_gpu_sm_utilization_ratio",
                                 None if g.sm_util is None else g.sm_util / 100),
                                ("meshd_gpu_temperature_celsius", g.temperature_c),
                                ("meshd_gpu_power_watts", g.power_w),
                                ("meshd_gpu_ecc_uncorrected_errors", g.ecc_uncorrected),
                                ("meshd_gpu_throttled", int(bool(g.throttle)))):
                if value is not None:
                    gauges[name].add_metric(labels, value)
        yield from gauges.values()
        pubs = CounterMetricFamily("meshd_signal_publications",
                                   "Telemetry published through gossip, by why",
                                   labels=["node", "reason"])
        for reason, count in sp.gate.reasons.items():
            pubs.add_metric([n, reason], count)
        rejected = CounterMetricFamily("meshd_signal_rejected",
                                       "Telemetry from peers or runtimes dropped, by reason",
                                       labels=["node", "reason"])
        for reason, count in sp.rejected.items():
            rejected.add_metric([n, reason], count)
        patches = CounterMetricFamily(
            "meshd_signal_patches", "Telemetry patches gossiped by peers, by what became of them",
            labels=["node", "outcome"])
        for outcome in ("applied", "no_base", "stale", "malformed"):
            patches.add_metric([n, outcome], sp.patch_outcomes.get(outcome, 0))
        rebases = CounterMetricFamily(
            "meshd_signal_patch_rebases", "Times this node's patches moved their base (start: "
            "a new run; moved: the rows changed since it outgrew a patch)", labels=["node", "why"])
        for why, count in sp.patches.rebases.items():
            rebases.add_metric([n, why], count)
        deferred = CounterMetricFamily(
            "meshd_signal_patch_deferred_rows", "Row changes a patch held back to the next "
            "publication, as one publication's changes did not fit", labels=["node"])
        deferred.add_metric([n], sp.patches.deferred)
        known = GaugeMetricFamily("meshd_signal_nodes_known",
                                  "Nodes whose telemetry this node holds, by path",
                                  labels=["node", "via"])
        vias: dict[str, int] = {}
        for entry in sp.fused.nodes.values():
            vias[entry.via] = vias.get(entry.via, 0) + 1
        for via, count in vias.items():
            known.add_metric([n, via], count)
        yield from (pubs, rejected, patches, rebases, deferred, known)


class HealthCollector(Collector):
    """The node's own health checks (automatic quarantine)."""

    def __init__(self, node: str, health: AutoQuarantine) -> None:
        self.node = node
        self.health = health

    def collect(self) -> Iterator[Metric]:
        n, mon = self.node, self.health.monitor
        problems = GaugeMetricFamily("meshd_health_problems",
                                     "Health problems this node sees in itself, by cause",
                                     labels=["node", "cause"])
        for cause in ("ecc", "thermal", "runtime"):
            problems.add_metric([n, cause], sum(p.cause == cause for p in mon.current))
        actions = CounterMetricFamily("meshd_health_actions",
                                      "Automatic quarantines written, lifted, or failed",
                                      labels=["node", "action"])
        for action in ("quarantine", "lift", "failed"):
            actions.add_metric([n, action], self.health.actions[action])
        strikes = GaugeMetricFamily("meshd_health_strikes",
                                    "Automatic quarantines in a row (each doubles the hold)",
                                    labels=["node"])
        strikes.add_metric([n], mon.strikes)
        yield from (problems, actions, strikes)


class AgentMetrics:
    """The agent's registry: gossip and topology collectors plus histograms."""

    def __init__(self, swim: Swim, coordinates: CoordinatePlane, security: Security,
                 control: ControlPlane | None = None,
                 signals: SignalPlane | None = None,
                 health: AutoQuarantine | None = None,
                 routing: Collector | None = None) -> None:
        self.registry = CollectorRegistry()
        if routing is not None:
            self.registry.register(routing)
        if signals is not None:
            self.registry.register(SignalCollector(swim.name, signals))
        if health is not None:
            self.registry.register(HealthCollector(swim.name, health))
        self.write_seconds = Histogram(
            "meshd_consensus_write_seconds",
            "Time from a write entering this node to its commit (path: local or forwarded)",
            ["node", "group", "path", "outcome"], buckets=WRITE_BUCKETS, registry=self.registry)
        if control is not None:
            self.registry.register(ConsensusCollector(swim.name, control))
            control.on_write = lambda group, path, outcome, seconds: self.write_seconds.labels(
                swim.name, group, path, outcome).observe(seconds)
        self.registry.register(SecurityCollector(swim.name, security))
        self.registry.register(GossipCollector(swim))
        self.probe_rtt = Histogram("meshd_gossip_probe_rtt_seconds",
                                   "Round-trip time of direct probes", ["node"],
                                   buckets=RTT_BUCKETS, registry=self.registry)
        self._rtt = self.probe_rtt.labels(swim.name)
        self.estimate_error = Histogram(
            "meshd_topology_rtt_estimate_error_ratio",
            "Relative error of the coordinate RTT estimate against each measured probe RTT",
            ["node"], buckets=RATIO_BUCKETS, registry=self.registry)
        self._estimate_error = self.estimate_error.labels(swim.name)
        self.registry.register(TopologyCollector(swim.name, coordinates))
        self._server: object | None = None

    def observe_estimate_errors(self, errors: Iterable[float]) -> None:
        for err in errors:
            self._estimate_error.observe(err)

    def observe_rtts(self, rtts: Iterable[float]) -> None:
        for rtt in rtts:
            self._rtt.observe(rtt)

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread."""
        self._server, _thread = start_http_server(port, host, registry=self.registry)

    def close(self) -> None:
        server = self._server
        if server is not None:
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]
