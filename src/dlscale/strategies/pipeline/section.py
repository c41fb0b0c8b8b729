"""run.json's `pipeline` section: the planned stages beside what each measured, the bubble."""

from __future__ import annotations

from dlscale.jobspec import PipelineStrategy
from dlscale.strategies.pipeline.plan import predicted_bubble

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
            "bubble_predicted": predicted_bubble(strategy.stages, strategy.microbatches_run),
            "per_stage": per_stage,
            "replicas": [
                {key: s[key] for key in ("replica", "stage", "sync_s", "busy_s", "bubble")}
                for s in stages
            ],
        }
    }
