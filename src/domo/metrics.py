"""Prometheus metrics for a broker, built from its events (``pip install 'domo[metrics]'``).

``BrokerMetrics.on_event`` takes every event of the core (pass it as ``serve_broker``'s
``on_event``, or call it from yours) and keeps, in a ``prometheus_client`` registry of its own:

- ``domo_requests_received_total{service}``; ``domo_requests_total{service,outcome}`` with
  outcome ``completed``, ``expired`` or ``dropped``;
  ``domo_requests_dropped_total{service,reason}``;
- ``domo_request_latency_seconds{service}`` (received to FINAL forwarded) and
  ``domo_queue_wait_seconds{service}`` (queued to dispatched), histograms;
- ``domo_redispatches_total{service}``, ``domo_partials_total{service}``;
- ``domo_workers{service,state}`` (state ``idle`` or ``busy``) and
  ``domo_queued_requests{service}``, gauges that follow the events (registered, dispatched,
  completed, lost);
- ``domo_worker_losses_total{reason}`` and ``domo_violations_total{rule}``;
- ``domo_connections_closed_total``: connections the broker lost, by the peer's doing or
  ZeroMQ's (a frame over ``max_message_bytes``, MDP-D-31).

Label values are bounded, so a peer cannot grow the registry without limit, and cannot squat
them either (issue 27): a service becomes a label only when a worker registers for it (requests
for services nobody serves count under ``service="(none)"``; under CURVE or NNG TLS only an
authenticated peer can register), and at most ``MAX_SERVICES`` are labels at once. When all are
taken, a newly registered service takes the slot of the longest-labelled service with no worker
left, else of the longest-labelled one that has never completed a request: names registered in
bulk by a peer nobody calls cannot keep a real service out, and a service that has served keeps
its label while it has a worker. A service that loses its label has its series removed and its
gauges counted under ``(none)`` from then on. Rules and reasons are the spec's fixed sets.

``serve_metrics(address, metrics)`` starts prometheus_client's HTTP server on a thread (what
``domo broker --metrics HOST:PORT`` does); ``read_status(url)`` reads such an endpoint back
into a ``Status`` for ``domo status``.
"""

from __future__ import annotations

import contextlib
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Final

from domo.protocol.broker import REQUEST_OVERHEAD, BrokerConfig
from domo.protocol.events import (
    BrokerEvent,
    ConnectionClosed,
    MessageDropped,
    PartialForwarded,
    ProtocolViolation,
    RequestCompleted,
    RequestDispatched,
    RequestDropped,
    RequestExpired,
    RequestQueued,
    RequestRedispatched,
    RequestRefused,
    WorkerDisconnected,
    WorkerExpired,
    WorkerRegistered,
)

__all__ = ["NO_SERVICE", "BrokerMetrics", "ServiceStatus", "Status", "read_status", "serve_metrics"]

NO_SERVICE: Final = "(none)"  # the label of requests for a service no worker ever served
LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                          2.5, 5.0, 10.0, 30.0, 60.0)  # fmt: skip
# A request dropped for these reasons stays with its worker until the worker's FINAL comes
# (dropped then, MessageDropped) or the worker is lost: the worker is busy meanwhile.
WORKER_CARRIES_ON: Final = frozenset(
    {"client-unreachable", "client-congested", "pending-full", "partial-too-large"}
)
MAX_SERVICES: Final = 1000  # service labels at once; the others count under NO_SERVICE


def _text(name: bytes) -> str:
    return name.decode("utf-8", "replace")


class BrokerMetrics:
    """The broker's metrics, fed by its events; ``registry`` is what an exporter serves."""

    def __init__(self, config: BrokerConfig | None = None) -> None:
        """``config``: the broker's, whose byte bounds ``domo_bytes_limit`` shows (MDP-D-25 to
        MDP-D-27, MDP-D-30); the defaults if not given."""
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.received = Counter(
            "domo_requests_received", "Requests accepted", ["service"], registry=r
        )
        self.outcomes = Counter(
            "domo_requests", "Requests ended, by outcome", ["service", "outcome"], registry=r
        )
        self.dropped = Counter(
            "domo_requests_dropped", "Requests dropped, by reason", ["service", "reason"],
            registry=r,
        )  # fmt: skip
        self.latency = Histogram(
            "domo_request_latency_seconds", "From request received to FINAL forwarded",
            ["service"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "domo_queue_wait_seconds", "From request queued to dispatched to a worker",
            ["service"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.redispatches = Counter(
            "domo_redispatches", "Requests sent back to their queue after their worker was lost",
            ["service"], registry=r,
        )  # fmt: skip
        self.partials = Counter(
            "domo_partials", "PARTIAL replies forwarded", ["service"], registry=r
        )
        self.workers = Gauge(
            "domo_workers", "Registered workers, by state", ["service", "state"], registry=r
        )
        self.queued = Gauge(
            "domo_queued_requests", "Requests waiting for a worker", ["service"], registry=r
        )
        self.worker_losses = Counter(
            "domo_worker_losses", "Workers gone, by reason", ["reason"], registry=r
        )
        self.violations = Counter(
            "domo_violations", "Protocol violations by peers, by rule", ["rule"], registry=r
        )
        self.refused = Counter(
            "domo_requests_refused", "Requests refused at a memory bound, by reason and rule",
            ["reason", "rule"], registry=r,
        )  # fmt: skip
        self.closed = Counter(
            "domo_connections_closed", "Connections closed, by the peer or by ZeroMQ for a "
            "frame over max_message_bytes (MDP-D-31, MDP-D-25)", registry=r,
        )  # fmt: skip
        self.held = Gauge(
            "domo_held_bytes", "Request bytes the broker holds: bodies plus a per-request "
            "overhead (MDP-D-26)", registry=r,
        )  # fmt: skip
        limits = Gauge("domo_bytes_limit", "The broker's byte bounds", ["bound"], registry=r)
        config = config if config is not None else BrokerConfig()
        limits.labels("held").set(config.max_held_bytes)  # MDP-D-26
        limits.labels("message").set(config.max_message_bytes)  # MDP-D-25
        limits.labels("peer").set(config.max_peer_bytes)  # MDP-D-27, each way
        limits.labels("pending").set(config.max_pending_bytes)  # MDP-D-30, all peers
        # Outstanding request id -> what it counts against max_held_bytes: its body's bytes plus
        # REQUEST_OVERHEAD, as the core counts it (Broker.held_bytes).
        self._sizes: dict[int, int] = {}
        # The services that are labels now, oldest first (value: whether one of its requests
        # has completed since), and every registered service's worker count: who may keep or
        # take a label slot (see the module's docstring).
        self._services: dict[bytes, bool] = {}
        self._registered: dict[bytes, int] = {}
        self._series: dict[bytes, set[tuple[Any, tuple[str, ...]]]] = {}  # label -> its series
        # The gauges' values per service (not per label), so that a service that loses its
        # label moves exactly its own share to NO_SERVICE.
        self._gauged: dict[tuple[bytes, str], int] = {}
        # Busy worker -> the request it holds (id, service), as the events tell it. A FINAL is
        # reported completed once it was sent (MDP-D-24), which can be after the worker's next
        # dispatch: a completion frees the worker only if that request is still the one it holds.
        self._holding: dict[bytes, tuple[int, bytes]] = {}
        self._waiting: dict[int, bytes] = {}  # queued request id -> its service

    def _service(self, name: bytes) -> str:
        return _text(name) if name in self._services else NO_SERVICE

    def _of(self, metric: Any, name: bytes, *rest: str) -> Any:
        """``metric``'s series for service ``name`` (its label, or NO_SERVICE), remembered so
        that it can be removed with the label."""
        if name in self._services:
            self._series.setdefault(name, set()).add((metric, rest))
            return metric.labels(_text(name), *rest)
        return metric.labels(NO_SERVICE, *rest)

    def _gauge(self, metric: Any, name: bytes, state: str, delta: int) -> None:
        """Move one of the per-service gauges (``workers`` by state, ``queued``: state "")."""
        key = (name, state)
        value = self._gauged.get(key, 0) + delta
        if value:
            self._gauged[key] = value
        else:
            self._gauged.pop(key, None)
        series = self._of(metric, name, state) if state else self._of(metric, name)
        series.inc(delta)

    def _label(self, name: bytes) -> None:
        """A worker registered for ``name``: make it a label if a slot is free or can be freed."""
        if name in self._services:
            return
        if len(self._services) >= MAX_SERVICES:
            unserved = (s for s, served in self._services.items() if not served)
            unworked = (s for s in self._services if not self._registered.get(s))
            evicted = next(unworked, None) or next(unserved, None)
            if evicted is None:
                return  # every label has a worker that has served: this one counts as (none)
            self._unlabel(evicted)
        moved = [(state, n) for (s, state), n in self._gauged.items() if s == name]
        for state, count in moved:  # from NO_SERVICE to its own label
            self._gauge(self._gauge_metric(state), name, state, -count)
        self._services[name] = False
        for state, count in moved:
            self._gauge(self._gauge_metric(state), name, state, count)

    def _unlabel(self, name: bytes) -> None:
        """``name`` is a label no more: its series go, its gauges count under NO_SERVICE."""
        moved = [(state, n) for (s, state), n in self._gauged.items() if s == name]
        for state, count in moved:
            self._gauge(self._gauge_metric(state), name, state, -count)
        for metric, rest in self._series.pop(name, ()):
            with contextlib.suppress(KeyError):
                metric.remove(_text(name), *rest)
        del self._services[name]
        for state, count in moved:
            self._gauge(self._gauge_metric(state), name, state, count)

    def _gauge_metric(self, state: str) -> Any:
        return self.workers if state else self.queued

    def on_event(self, event: BrokerEvent) -> None:
        """Count one event of the core (call it for every event, in order)."""
        if isinstance(event, RequestQueued):
            self._of(self.received, event.service).inc()
            self._waiting[event.request_id] = event.service
            self._gauge(self.queued, event.service, "", 1)
            held = event.size + REQUEST_OVERHEAD
            self._sizes[event.request_id] = held
            self.held.inc(held)
        elif isinstance(event, RequestDispatched):
            self._leave_queue(event.request_id)
            self._of(self.queue_wait, event.service).observe(event.waited)
            if self._holding.get(event.worker) is None:
                self._gauge(self.workers, event.service, "idle", -1)
                self._gauge(self.workers, event.service, "busy", 1)
            self._holding[event.worker] = (event.request_id, event.service)
        elif isinstance(event, RequestCompleted):
            if event.service in self._services:
                self._services[event.service] = True  # it has served: it keeps its label
            self._of(self.outcomes, event.service, "completed").inc()
            self._of(self.latency, event.service).observe(event.elapsed)
            self._release(event.worker, event.request_id)
            self._unhold(event.request_id)
        elif isinstance(event, PartialForwarded):
            self._of(self.partials, event.service).inc()
        elif isinstance(event, RequestRedispatched):
            self._of(self.redispatches, event.service).inc()
            self._waiting[event.request_id] = event.service
            self._gauge(self.queued, event.service, "", 1)
        elif isinstance(event, RequestExpired):
            self._leave_queue(event.request_id)
            self._of(self.outcomes, event.service, "expired").inc()
            self._unhold(event.request_id)
        elif isinstance(event, RequestDropped):
            self._leave_queue(event.request_id)
            self._of(self.outcomes, event.service, "dropped").inc()
            self._of(self.dropped, event.service, event.reason).inc()
            self._unhold(event.request_id)
            if event.worker is not None and event.reason not in WORKER_CARRIES_ON:
                self._release(event.worker, event.request_id)
        elif isinstance(event, MessageDropped):
            if event.peer is not None and event.reason.startswith("FINAL"):
                self._release(event.peer, None)  # the FINAL of a request whose client left
        elif isinstance(event, WorkerRegistered):
            self._registered[event.service] = self._registered.get(event.service, 0) + 1
            self._label(event.service)
            self._gauge(self.workers, event.service, "idle", 1)
        elif isinstance(event, WorkerExpired | WorkerDisconnected):
            if isinstance(event, WorkerExpired):  # FAM-09: a busy worker's own timeout
                reason = "busy-timeout" if event.busy else "expired"
            else:
                reason = event.reason
            self.worker_losses.labels(reason).inc()
            state = "busy" if self._holding.pop(event.worker, None) is not None else "idle"
            self._gauge(self.workers, event.service, state, -1)
            left = self._registered.get(event.service, 0) - 1
            if left > 0:
                self._registered[event.service] = left
            else:
                self._registered.pop(event.service, None)
        elif isinstance(event, ProtocolViolation):
            self.violations.labels(event.rule).inc()
        elif isinstance(event, RequestRefused):
            self.refused.labels(event.reason, event.rule).inc()
        elif isinstance(event, ConnectionClosed):
            self.closed.inc()

    def _unhold(self, request_id: int) -> None:
        size = self._sizes.pop(request_id, None)
        if size is not None:
            self.held.dec(size)

    def _leave_queue(self, request_id: int) -> None:
        service = self._waiting.pop(request_id, None)
        if service is not None:
            self._gauge(self.queued, service, "", -1)

    def _release(self, worker: bytes, request_id: int | None) -> None:
        """``worker`` is done with ``request_id`` (None: whatever it held): idle again."""
        held = self._holding.get(worker)
        if held is None or (request_id is not None and held[0] != request_id):
            return
        del self._holding[worker]
        self._gauge(self.workers, held[1], "busy", -1)
        self._gauge(self.workers, held[1], "idle", 1)


def serve_metrics(address: str, metrics: BrokerMetrics) -> tuple[str, int]:
    """Serve ``metrics`` over HTTP at ``address`` (``HOST:PORT``; port 0 picks a free one) on a
    daemon thread; returns the host and port bound. Raises ``OSError`` if it cannot bind."""
    from prometheus_client import start_http_server

    host, _, port = address.rpartition(":")
    server, _thread = start_http_server(
        int(port), addr=host or "127.0.0.1", registry=metrics.registry
    )
    bound_host, bound_port = server.server_address[:2]
    return str(bound_host), int(bound_port)


@dataclass
class ServiceStatus:
    """One service's line of ``domo status``."""

    name: str
    idle: int = 0
    busy: int = 0
    queued: int = 0
    completed: int = 0
    expired: int = 0
    dropped: int = 0


@dataclass
class Status:
    """What ``domo status`` shows, read from a broker's metrics endpoint."""

    services: dict[str, ServiceStatus] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=dict)
    worker_losses: dict[str, int] = field(default_factory=dict)
    held_bytes: int = 0  # request bytes held: bodies plus a per-request overhead (MDP-D-26)
    limits: dict[str, int] = field(default_factory=dict)  # the byte bounds, by name
    refused: dict[str, int] = field(default_factory=dict)  # requests refused, by rule
    pair: dict[str, str] = field(default_factory=dict)  # Binary Star: role, state, serving

    def service(self, name: str) -> ServiceStatus:
        return self.services.setdefault(name, ServiceStatus(name))


def read_status(url: str, timeout: float = 5.0) -> Status:
    """Fetch ``url`` (a broker's ``--metrics`` endpoint) and sum it up; raises ``OSError`` if
    it cannot be read, ``ValueError`` if it is not a domo broker's metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode("utf-8")
    status = Status()
    seen = False
    for family in text_string_to_metric_families(text):
        seen = seen or family.name.startswith("domo_")
        for sample in family.samples:
            labels: dict[str, Any] = sample.labels
            value = int(sample.value)
            if sample.name == "domo_workers":
                line = status.service(labels["service"])
                if labels["state"] == "busy":
                    line.busy = value
                else:
                    line.idle = value
            elif sample.name == "domo_queued_requests":
                status.service(labels["service"]).queued = value
            elif sample.name == "domo_requests_total":
                line = status.service(labels["service"])
                setattr(line, labels["outcome"], value)
            elif sample.name == "domo_violations_total":
                status.violations[labels["rule"]] = value
            elif sample.name == "domo_worker_losses_total":
                status.worker_losses[labels["reason"]] = value
            elif sample.name == "domo_held_bytes":
                status.held_bytes = value
            elif sample.name == "domo_bytes_limit":
                status.limits[labels["bound"]] = value
            elif sample.name == "domo_pair_state" and value == 1:  # domo.cli._pair
                status.pair.update(role=labels["role"], state=labels["state"])
            elif sample.name == "domo_pair_serving":
                status.pair["serving"] = "serving" if value else "not serving"
            elif sample.name == "domo_requests_refused_total":
                rule = labels["rule"]
                status.refused[rule] = status.refused.get(rule, 0) + value
    if not seen:
        raise ValueError(f"{url} serves no domo broker metrics")
    return status
