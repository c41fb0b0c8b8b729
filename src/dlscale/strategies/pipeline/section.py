"""run.json's `pipeline` section: the planned stages beside what each measured, the bubble
(timed, and counted in idle slots), the staleness of the updates."""

from __future__ import annotations

from collections import Counter

from dlscale.jobspec import PipelineStrategy
from dlscale.strategies.pipeline.plan import predicted_bubble
from dlscale.strategies.pipeline.slots import count_slots

SLOT_MODEL_STEPS = 1000  # the slot count's clock runs in Python: a long run is counted this far

MEASURED = ("forward_s", "backward_s", "busy_s", "schedule_s", "sync_s", "sent_bytes", "bubble")


def pipeline_sections(strategy: PipelineStrategy, split: dict, summaries: list) -> dict:
    """{'pipeline': ...} once every stage has reported (at the end of training), else {}."""
    stages = [s for s in summaries if s is not None and s.get("role") == "stage"]
    if len(stages) != strategy.stages * strategy.replicas:
        return {}
    replica0 = sorted((s for s in stages if s["replica"] == 0), key=lambda s: s["stage"])
    per_stage = [
        {**planned, **{key: measured[key] for key in MEASURED}}
        for planned, measured in zip(split["stages"], replica0, strict=True)
    ]
    main = next(s for s in replica0 if s["stage"] == strategy.stages - 1)
    if not main["steps_run"]:  # the record written as training starts: no step to report yet
        return {}
    steps = min(main["steps_run"], SLOT_MODEL_STEPS)
    slots = count_slots(strategy.schedule, strategy.stages, strategy.microbatches_run, steps)
    staleness = Counter({int(k): v for k, v in main["staleness"].items()})
    updates = sum(staleness.values())
    return {
        "pipeline": {
            "strategy": strategy.name,
            "stages": strategy.stages,
            "data_parallel": strategy.replicas,
            "schedule": strategy.schedule,
            "microbatches": strategy.microbatches_run,
            "split": split["boundaries"],
            "balanced_by": split["balanced_by"],
            "bubble_measured": sum(s["bubble"] for s in per_stage) / len(per_stage),
            "bubble_predicted": predicted_bubble(
                strategy.stages, strategy.microbatches_run, strategy.schedule
            ),
            # One slot per forward or backward of a microbatch on a stage (slots.py).
            "bubble_slots": {"steps": steps, **slots.to_dict()},
            # Updates behind the weights a gradient was computed on, as the parameter servers'.
            "staleness_histogram": {str(k): v for k, v in sorted(staleness.items())},
            "mean_staleness": sum(k * v for k, v in staleness.items()) / updates
            if updates
            else 0.0,
            "max_staleness": max(staleness) if staleness else 0,
            "per_stage": per_stage,
            "replicas": [
                {key: s[key] for key in ("replica", "stage", "sync_s", "busy_s", "bubble")}
                for s in stages
            ],
        }
    }
