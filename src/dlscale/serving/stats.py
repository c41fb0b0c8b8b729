"""What a model server counts: requests by status, samples, batches by size, and latency
quantiles over the most recent requests; shown as JSON or Prometheus text. Pure bookkeeping."""

from __future__ import annotations

import math
from collections import Counter, deque

LATENCY_WINDOW = 4096  # the quantiles describe the most recent requests, not the whole uptime
QUANTILES = (0.5, 0.9, 0.99)


def quantile(values: list[float], q: float) -> float | None:
    """The nearest-rank quantile: the smallest value with at least q of all values at or below
    it (q = 0.5 of [1, 2, 3, 4] is 2). None for no values (JSON has no NaN)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


class ServingStats:
    """Counters one server (or every replica of one deployment, reporting to one place) keeps."""

    def __init__(self) -> None:
        self.requests_by_status: Counter[int] = Counter()
        self.samples = 0
        self.batch_sizes: Counter[int] = Counter()  # requests per model call -> calls
        self.latencies_s: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def record_batch(self, num_samples: int, latencies_s: list[float]) -> None:
        """One model call that answered len(latencies_s) requests, num_samples samples in all."""
        self.batch_sizes[len(latencies_s)] += 1
        self.requests_by_status[200] += len(latencies_s)
        self.samples += num_samples
        self.latencies_s.extend(latencies_s)

    def record_refusal(self, status: int) -> None:
        """A request answered with an error status before it reached the model."""
        self.requests_by_status[status] += 1

    def snapshot(self) -> dict:
        """Everything counted so far, as plain JSON-ready data."""
        latencies = list(self.latencies_s)
        return {
            "requests": sum(self.requests_by_status.values()),
            "requests_by_status": {str(k): v for k, v in sorted(self.requests_by_status.items())},
            "samples": self.samples,
            "batches": sum(self.batch_sizes.values()),
            "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
            "latency_window": len(latencies),
            "latency_s": {f"p{round(q * 100)}": quantile(latencies, q) for q in QUANTILES},
        }


def prometheus_text(snapshot: dict, prefix: str = "dlscale_serve") -> str:
    """A snapshot in Prometheus's text exposition format (version 0.0.4)."""
    lines = [
        f"# HELP {prefix}_requests_total Requests answered, by HTTP status.",
        f"# TYPE {prefix}_requests_total counter",
    ]
    for status, count in snapshot["requests_by_status"].items():
        lines.append(f'{prefix}_requests_total{{status="{status}"}} {count}')
    lines += [
        f"# HELP {prefix}_samples_total Samples the model predicted.",
        f"# TYPE {prefix}_samples_total counter",
        f"{prefix}_samples_total {snapshot['samples']}",
        f"# HELP {prefix}_batches_total Model calls, by the number of requests batched in one.",
        f"# TYPE {prefix}_batches_total counter",
    ]
    for size, count in snapshot["batch_sizes"].items():
        lines.append(f'{prefix}_batches_total{{requests="{size}"}} {count}')
    lines += [
        f"# HELP {prefix}_latency_seconds Request latency over the last "
        f"{LATENCY_WINDOW} requests answered.",
        f"# TYPE {prefix}_latency_seconds summary",
    ]
    for name, value in snapshot["latency_s"].items():
        q = int(name[1:]) / 100
        shown = "NaN" if value is None else value
        lines.append(f'{prefix}_latency_seconds{{quantile="{q}"}} {shown}')
    lines.append(f"{prefix}_latency_seconds_count {snapshot['latency_window']}")
    return "\n".join(lines) + "\n"
