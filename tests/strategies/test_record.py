"""One run record for every strategy: the same schema, checked on a few steps of each."""

import itertools
import json
from pathlib import Path

import pytest

from dlscale import api
from dlscale.jobspec import parse_spec
from dlscale.train.record import RunRecord
from tests.conftest import RecordingReporter
from tests.small_runs import SGD, base_spec, synthetic_images

BASE = base_spec(
    "record", synthetic_images(600), batch_size=8, steps=12, optimizer=SGD, device="cpu"
)
STRATEGIES = {
    "single": ({"name": "single"}, None),
    "ddp": ({"name": "ddp", "workers": 2}, "distributed"),
    "ps-async": ({"name": "ps", "mode": "async", "workers": 2}, "ps"),
    "ps-averaging": ({"name": "ps", "mode": "averaging", "workers": 2, "servers": 2}, "ps"),
    "pipeline": ({"name": "pipeline", "stages": 2, "microbatches": 2}, "pipeline"),
    "hybrid": ({"name": "hybrid", "stages": 2, "data_parallel": 2, "microbatches": 2}, "pipeline"),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(STRATEGIES))
def test_every_strategy_writes_the_one_schema(tmp_path: Path, kind: str):
    strategy, section = STRATEGIES[kind]
    said = RecordingReporter()
    returned = api.train(
        parse_spec({**BASE, "strategy": strategy}), out_dir=tmp_path, reporter=said
    )
    on_disk = json.loads((tmp_path / "run.json").read_text())
    assert on_disk == json.loads(json.dumps(returned))
    record = RunRecord.model_validate(on_disk)  # every key of final, timing, epochs, steps, ...
    assert record.status == "completed" and record.strategy == strategy["name"]
    # Nothing in BASE is ignored: a worker must not warn about defaults it never was given. What
    # the machine check said before the run (more processes than cores, a busy machine) is all
    # the record may hold, first.
    early = list(itertools.takewhile(lambda event: event[0] == "warn", said.events))
    assert record.warnings == [message for _, message in early]
    sections = {key for key in ("distributed", "ps", "pipeline") if key in on_disk}
    assert sections == ({section} if section else set())
    # The same figures mean the same thing everywhere.
    final, timing, plan = record.final, record.timing, record.plan
    assert final.step == 12 and record.epochs[-1].step == 12
    assert final.val_accuracy == record.epochs[-1].val_accuracy  # the curve ends at the final
    assert timing.warmup_steps == 3 and timing.steady_steps == 9 and timing.steps == 12
    assert timing.median_step_s is not None and timing.median_step_s > 0
    trainers = strategy.get("workers", 1) * strategy.get("data_parallel", 1)
    trainers *= strategy.get("stages", 1)
    assert len(record.workers) == trainers
    assert all(w.status == "completed" and w.steps == 12 for w in record.workers)
    # All data-parallel workers together, each counted once: a pipeline replica's stages train
    # the same samples, at the pace of the slowest.
    replicas = plan.global_batch_size // plan.batch_size
    rates: dict[int, float] = {}
    for worker in record.workers:
        rank = worker.model_extra["data_rank"]
        rates[rank] = min(worker.samples_per_s, rates.get(rank, worker.samples_per_s))
    assert len(rates) == replicas
    assert final.train_samples_per_s == pytest.approx(sum(rates.values()))
    assert record.checkpoints and record.checkpoints[-1].endswith("step-00000012.pt")
