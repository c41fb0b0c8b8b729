"""run.json's `tensor` section: the plan, and what a step moved, measured beside predicted."""

from __future__ import annotations

import torch.distributed as dist


def tensor_section(exchange, summaries: list[dict | None]) -> dict:
    spec, plan = exchange.spec, exchange.plan
    own = summaries[exchange.rank] or {}
    steps = max(1, exchange.steps_run)
    measured = {
        kind: {"count": entry["count"] / steps, "payload_bytes": entry["payload_bytes"] / steps}
        for kind, entry in exchange.meter.counts.items()
    }
    # Every micro-batch of an accumulating step runs the plan's collectives (they carry its
    # activations); the replicas' gradient averaging runs once a step.
    micro = plan.comm_per_step(spec.batch_size)
    predicted = {
        kind: {key: value * spec.accumulate for key, value in entry.items()}
        for kind, entry in micro.items()
    }
    comm_s = exchange.meter.seconds / steps
    sync_s = exchange.sync_s / steps
    return {
        "degree": exchange.degree,
        "data_parallel": exchange.replicas,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "per_replica_batch_size": spec.batch_size,
        "accumulate": spec.accumulate,
        "global_batch_size": spec.batch_size * spec.accumulate * exchange.replicas,
        "plan_source": plan.source,
        "plan": plan.styles,
        "params": plan.params,
        "params_per_device": plan.params_per_device,
        "plan_check_relative_difference": exchange.plan_error,
        "collectives_per_step": measured,
        "predicted_collectives_per_step": predicted,
        "comm_payload_bytes_per_step": sum(e["payload_bytes"] for e in measured.values()),
        "predicted_comm_payload_bytes_per_step": sum(
            e["payload_bytes"] for e in predicted.values()
        ),
        "comm_s_per_step": comm_s,
        # Of this trainer's step time, the share in collectives and the replicas' averaging.
        "comm_share": own.get("comm_share", 0.0),
        "replica_sync_s_per_step": sync_s,
        "replica_sync_bytes_per_step": exchange.sync_bytes / steps,
    }
