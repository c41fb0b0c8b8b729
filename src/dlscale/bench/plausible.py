"""A machine measurement checked before it is trusted: values outside physical bounds are
rejected (and replaced by a bound), values pinned at a clamp are flagged, and the measurement's
quality is summed up so a worse one never silently replaces a better saved `local` entry, and
an unreliable one (hardware/trust.py) never becomes the entry predictions use."""

from __future__ import annotations

import statistics

from dlscale.hardware.trust import OVERHEAD_MARGIN

# A convolution or attention kernel cannot beat the fastest matrix product by much: both run
# on the same units. 1.5× leaves room for a product size the sweep did not try.
RATE_MARGIN = 1.5
# A memory-bound op (ReLU, pooling, ...) on tensors larger than the caches moves at most the
# stream bandwidth; 2× leaves room for what the caches still hold.
BANDWIDTH_MARGIN = 2.0
# calibrate._clamp's bounds. A memory-bound op at the stream bandwidth (1.0) is the common case,
# capped on purpose; at the floor, or the optimizer at either of its bounds, it is doubtful.
OP_CLAMPS = (0.01,)
OPTIMIZER_CLAMPS = (0.01, 20.0)
# The matmul sweep must reach products this large for its best rate to stand for the peak.
PEAK_SIZE = 512
# A grid point (a convolution's weights and positions, an attention's sequence) whose work is
# smaller than another's of the same kind cannot take this many times longer: its round stalled
# (a busy machine), it measured no rate.
STALL_MARGIN = 4.0


def check(result: dict) -> list[str]:
    """Reject implausible values in `result` in place; the warnings, one line each. The lists
    `result["rejected"]` and `result["suspect"]` name what was replaced and what is doubtful."""
    warnings: list[str] = []
    rejected: list[str] = result.setdefault("rejected", [])
    suspect: list[str] = result.setdefault("suspect", [])
    peak = max(result["peak_flops"].values())
    limit = RATE_MARGIN * peak
    swept = max((row["size"] for row in result.get("matmul", [])), default=PEAK_SIZE)
    rated = ("conv_flops_per_s", "attention_flops_per_s") if swept >= PEAK_SIZE else ()
    for table in rated:
        for path, points in _point_lists(result.get(table)):
            stalled = [
                (point, replaced, f"took over {STALL_MARGIN:g}× as long as a larger size: a stall")
                for point, replaced in _stalls(points)
            ]
            for point, replaced, why in stalled:  # first: a stall's place is then checked too
                warnings.append(_rejected(f"{table}.{path}", point, why, f"{replaced:.3g}"))
                rejected.append(f"{table}.{path} at {point[:-1]}")
                point[-1] = replaced
            for point in points:
                if point[-1] > limit:
                    why = f"is above {RATE_MARGIN}× the measured matmul peak ({peak:.3g})"
                    warnings.append(_rejected(f"{table}.{path}", point, why, "the peak"))
                    rejected.append(f"{table}.{path} at {point[:-1]}")
                    point[-1] = peak
    for op, efficiency in dict(result.get("op_efficiency", {})).items():
        if efficiency > BANDWIDTH_MARGIN:
            warnings.append(
                f"rejected op_efficiency.{op}: {efficiency:.2f}× the stream bandwidth is above "
                f"{BANDWIDTH_MARGIN}×; replaced by 1.0"
            )
            rejected.append(f"op_efficiency.{op}")
            result["op_efficiency"][op] = 1.0
        elif efficiency in OP_CLAMPS:
            suspect.append(f"op_efficiency.{op}")
    for size, share in result.get("optimizer_efficiency") or []:
        if share in OPTIMIZER_CLAMPS:
            suspect.append(f"optimizer_efficiency at {size:.0f} bytes")
    if suspect:
        warnings.append(f"pinned at a clamp (timing noise?): {', '.join(suspect)}")
    bare = min(result.get("op_overhead_s", {}).values(), default=None)
    training = result.get("training_op_overhead_s")
    if bare and training and training > OVERHEAD_MARGIN * bare:
        suspect.append("training_op_overhead_s")
        warnings.append(
            f"per-op cost in a training step {training * 1e6:.0f} µs is over {OVERHEAD_MARGIN:.0f}"
            f"× a bare op's ({bare * 1e6:.1f} µs): was the machine busy?"
        )
    return warnings


def _rejected(table: str, point: list, why: str, by: str) -> str:
    """The warning for a grid point replaced: where, its rate, why, and by what."""
    return f"rejected {table} at {point[:-1]}: {point[-1]:.3g} FLOP/s {why}; replaced by {by}"


def _stalls(points: list[list]) -> list[tuple[list, float]]:
    """(point, the rate to put in its place) for each grid point [*kind, size, rate] whose time,
    size / rate (its work grows at least as its size, at a kind held fixed), is over
    STALL_MARGIN × the time of a larger size of the same kind: in its place, the rate at which
    it would take as long as the quickest of those."""
    found = []
    for point in points:
        *kind, size, rate = point
        larger = [p for p in points if p[:-2] == kind and p[-2] > size and p[-1] > 0]
        if not larger or rate <= 0:
            continue
        quickest = min(p[-2] / p[-1] for p in larger)
        if size / rate > STALL_MARGIN * quickest:
            found.append((point, size / quickest))
    return found


def _point_lists(table, path: str = ""):
    """(path, list of [..., rate] points) in a nested measured table."""
    if isinstance(table, dict):
        for key, value in table.items():
            yield from _point_lists(value, f"{path}.{key}" if path else str(key))
    elif isinstance(table, list) and table and isinstance(table[0], list):
        yield path, table


def summarize_spread(spreads: list[float]) -> dict:
    """The probes' relative spreads (max / min − 1 of their final rounds) in a few figures."""
    if not spreads:
        return {"median": 0.0, "worst": 0.0, "probes": 0}
    return {
        "median": statistics.median(spreads),
        "worst": max(spreads),
        "probes": len(spreads),
    }


def quality(measured: dict) -> tuple[int, float]:
    """Lower is better: (values rejected or doubtful, median spread of the probes)."""
    doubtful = len(measured.get("rejected", [])) + len(measured.get("suspect", []))
    return doubtful, float(measured.get("spread", {}).get("median", 0.0))


def worse(new: dict, old: dict) -> str | None:
    """Why the `new` measurement is worse than the saved `old` one, or None if it is not.
    An old entry without a spread (saved before spreads were kept) is never preferred."""
    if "spread" not in old:
        return None
    (new_doubtful, new_spread), (old_doubtful, old_spread) = quality(new), quality(old)
    if new_doubtful > old_doubtful:
        return f"{new_doubtful} values rejected or doubtful against {old_doubtful}"
    if new_spread > 1.5 * old_spread + 0.02:
        return f"its probes spread {new_spread:.0%} (median) against {old_spread:.0%}"
    return None
