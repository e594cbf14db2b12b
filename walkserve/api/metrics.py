"""Prometheus metrics of one app: its own registry, request histograms, engine stats at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from walkserve.api.graph_metrics import graph_families
from walkserve.api.stream_metrics import stream_families
from walkserve.entrypoint.interface import EngineClient

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.5)
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 4, 8)


class EngineStatsCollector:
    """Reads ``engine.stats()`` and ``engine.health()`` on every scrape."""

    def __init__(self, engine: EngineClient, draining: Callable[[], bool]):
        self.engine = engine
        self.draining = draining

    def describe(self) -> list[Metric]:
        return []  # collected lazily: the engine may not be ready when the registry is built

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.stats()
        for name, value, doc in (
            ("walkserve_requests_running", stats.running, "Requests the runtime is executing."),
            ("walkserve_requests_waiting", stats.waiting, "Requests admitted but waiting to run."),
            ("walkserve_requests_with_state", stats.requests_with_state, "Requests holding runtime state."),
            ("walkserve_kv_blocks_used", stats.kv_blocks_used, "KV-cache blocks in use."),
            ("walkserve_kv_blocks_total", stats.kv_blocks_total, "KV-cache blocks in the pool."),
            ("walkserve_kv_usage_ratio", stats.kv_blocks_used / max(1, stats.kv_blocks_total), "KV pool use, 0..1."),
            ("walkserve_healthy", float(self.engine.health().ok), "1 when the engine reports healthy."),
            ("walkserve_draining", float(self.draining()), "1 while the server drains for shutdown."),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
        outcomes = CounterMetricFamily("walkserve_engine_requests", "Requests by outcome.", labels=["outcome"])
        for outcome in ("finished", "failed", "aborted", "rejected"):
            outcomes.add_metric([outcome], getattr(stats, outcome))
        yield outcomes
        yield CounterMetricFamily("walkserve_preemptions", "Requests preempted for KV space.", value=stats.preemptions)
        yield from self._nodes(stats.nodes)
        yield from self._engines(stats.engines)
        yield from graph_families(stats)
        yield from stream_families(stats)

    def _nodes(self, nodes: dict[str, dict[str, float]]) -> Iterator[Metric]:
        size = GaugeMetricFamily("walkserve_node_batch_size_mean", "Mean items per batch.", labels=["node"])
        step = GaugeMetricFamily("walkserve_node_step_seconds_mean", "Mean busy time per batch.", labels=["node"])
        batches = CounterMetricFamily("walkserve_node_batches", "Batches run.", labels=["node"])
        for node, values in sorted(nodes.items()):
            n = values.get("batches", 0.0)
            size.add_metric([node], values.get("items", 0.0) / n if n else 0.0)
            step.add_metric([node], values.get("busy_s", 0.0) / n if n else 0.0)
            batches.add_metric([node], n)
        yield from (size, step, batches)

    def _engines(self, engines: dict[str, dict[str, float]]) -> Iterator[Metric]:
        gauge = GaugeMetricFamily("walkserve_engine_value", "Engine-specific gauges.", labels=["engine", "name"])
        for engine, values in sorted(engines.items()):
            for name, value in sorted(values.items()):
                gauge.add_metric([engine, name], float(value))
        yield gauge


class ApiMetrics:
    """Every metric the API records, registered in a registry private to one app."""

    def __init__(self, engine: EngineClient, draining: Callable[[], bool]):
        r = self.registry = CollectorRegistry()
        self.ttft = Histogram("walkserve_time_to_first_token_seconds", "Time to first text output.", ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("walkserve_inter_token_latency_seconds", "Gap between text outputs.", ["route"], buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("walkserve_e2e_request_latency_seconds", "Request latency, admission to finish.", ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("walkserve_request_queue_seconds", "Time waiting for admission to run.", ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttfa = Histogram("walkserve_time_to_first_audio_seconds", "Time to first audio output.", ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.rtf = Histogram("walkserve_speech_real_time_factor", "Processing time / audio duration.", ["route"], buckets=RTF_BUCKETS, registry=r)
        self.audio_seconds = Counter("walkserve_audio_output_seconds", "Audio seconds produced.", ["route"], registry=r)
        self.tokens = Counter("walkserve_generation_tokens", "Text tokens produced.", ["route"], registry=r)
        self.finished = Counter("walkserve_request_finish", "Finished requests by reason.", ["route", "reason"], registry=r)
        self.responses = Counter("walkserve_http_responses", "HTTP responses by route and status.", ["route", "status"], registry=r)
        self.rejected = Counter("walkserve_http_rejected", "Requests answered 429 (queue full).", ["route"], registry=r)
        self.client_errors = Counter("walkserve_http_client_errors", "Requests answered 4xx.", ["route", "status"], registry=r)
        self._stream_metrics(r)
        r.register(EngineStatsCollector(engine, draining))

    def _stream_metrics(self, r: CollectorRegistry) -> None:
        """Real-time audio streams per route, as the client hears them (walkserve/api/playback.py)."""
        self.streams_active = Gauge("walkserve_audio_streams_active", "Real-time audio streams open now.", ["route"], registry=r)
        self.streams_admitted = Counter("walkserve_audio_streams_admitted", "Real-time audio streams admitted.", ["route"], registry=r)
        self.streams_rejected = Counter("walkserve_audio_streams_rejected", "Real-time audio streams answered 429, by cause.",
                                        ["route", "reason"], registry=r)
        self.streams_ended = Counter("walkserve_audio_streams_ended", "Admitted real-time audio streams that ended.", ["route"], registry=r)
        self.streams_with_gaps = Counter("walkserve_audio_streams_with_gaps", "Streams with at least one gap (not viable).", ["route"], registry=r)
        self.stream_gaps = Counter("walkserve_audio_stream_gaps", "Chunks written after the listener ran out of audio.", ["route"], registry=r)
        self.stream_gap_seconds = Counter("walkserve_audio_stream_gap_seconds", "Seconds listeners waited in gaps.", ["route"], registry=r)

    def count_response(self, route: str, status: int) -> None:
        self.responses.labels(route, str(status)).inc()
        if status == 429:
            self.rejected.labels(route).inc()
        if 400 <= status < 500:
            self.client_errors.labels(route, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
