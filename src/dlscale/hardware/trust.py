"""How far a measured hardware entry (`dlscale bench machine`'s `local`) can be trusted: the
reasons a calibration is unreliable, and the line every prediction on it prints."""

from __future__ import annotations

# A training step's cost per op includes autograd and the optimizer: a few times the bare
# dispatch of one op. Far above that, the machine was busy while it was timed.
OVERHEAD_MARGIN = 30.0
# A probe's rounds are retried until they agree within calibrate.STABLE_SPREAD; when even the
# median probe still disagreed by more after the last round, the machine was busy throughout.
UNSETTLED_SPREAD = 0.10


def unreliable(measured: dict) -> list[str]:
    """Why a machine measurement cannot be the calibration predictions use (empty: it can), one
    line each. It reads the figures a bench result and a saved entry's tables both hold, so an
    entry saved before this check is judged the same way."""
    reasons = []
    bare = min((measured.get("op_overhead_s") or {}).values(), default=None)
    training = measured.get("training_op_overhead_s")
    # The per-op term multiplies every op of a step: inflated, it alone made a 3 ms LeNet step
    # predict 234 ms.
    if bare and training and training > OVERHEAD_MARGIN * bare:
        reasons.append(
            f"per-op cost in a training step {training * 1e6:.0f} µs is {training / bare:.0f}× "
            f"a bare op's (above {OVERHEAD_MARGIN:.0f}×: timed while the machine was busy)"
        )
    spread = (measured.get("spread") or {}).get("median")
    if spread is not None and spread > UNSETTLED_SPREAD:
        reasons.append(
            f"its probes never settled: median spread {spread:.0%} between rounds (a stable "
            f"probe is within {UNSETTLED_SPREAD:.0%})"
        )
    return reasons


def calibration(hardware) -> dict | None:
    """Which measurement a prediction on `hardware` rests on and how far to trust it: None for
    a datasheet entry (nothing measured)."""
    measured = hardware.measured if isinstance(hardware.measured, dict) else {}
    if "measured_at" not in measured:
        return None
    reasons = unreliable(measured)
    return {
        "entry": hardware.name,
        "measured_at": measured["measured_at"],
        "quick": bool(measured.get("quick")),
        "spread_median": (measured.get("spread") or {}).get("median"),
        "reliable": not reasons,
        "reasons": reasons,
    }


def calibration_line(found: dict) -> str:
    """The one line a prediction prints about its calibration."""
    head = f"calibration '{found['entry']}' (measured {found['measured_at'][:16]}"
    head += ", --quick)" if found["quick"] else ")"
    if not found["reliable"]:
        return (
            f"{head}: UNRELIABLE, {'; '.join(found['reasons'])}: predictions on it are not to "
            "be trusted; run 'dlscale bench machine' again when the machine is idle"
        )
    spread = found["spread_median"]
    return f"{head}: trusted" + (f", probes spread {spread:.0%}" if spread is not None else "")
