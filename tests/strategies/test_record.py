"""One run record for every strategy: the same schema, checked on a few steps of each kind the
spec's strategy union holds (every registered strategy: tests/unit/test_strategy_facts.py), each
ps mode too, so that a new strategy cannot skip it."""

import itertools
import json
from pathlib import Path

import pytest

from dlscale import api
from dlscale.jobspec import STRATEGY_KINDS, parse_spec
from dlscale.train.record import RunRecord
from tests.conftest import RecordingReporter
from tests.small_runs import SGD, base_spec, synthetic_images

BASE = base_spec(
    "record", synthetic_images(600), batch_size=8, steps=12, optimizer=SGD, device="cpu"
)
# Every strategy as `compare` runs it (its section's defaults: two workers, stages or shards),
# the ps modes each by name.
VARIANTS = {name: s for kind in STRATEGY_KINDS for name, s in kind.variants().items()}
# Settings beyond the defaults, to try more than one shape of a kind.
EXTRA = {
    "averaging": {"servers": 2},
    "pipeline": {"microbatches": 2},
    "hybrid": {"microbatches": 2},
}
# The record's own section of each strategy (a new one says which it writes, or the test fails).
RECORD_SECTION = {
    "single": None,
    "ddp": "distributed",
    "ps": "ps",
    "pipeline": "pipeline",
    "hybrid": "pipeline",
    "tensor": "tensor",
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_strategy_writes_the_one_schema(tmp_path: Path, variant: str):
    strategy = {**VARIANTS[variant].model_dump(exclude_unset=True), **EXTRA.get(variant, {})}
    section = RECORD_SECTION[strategy["name"]]
    said = RecordingReporter()
    record = api.train(parse_spec({**BASE, "strategy": strategy}), out_dir=tmp_path, reporter=said)
    on_disk = json.loads((tmp_path / "run.json").read_text())
    assert on_disk == json.loads(json.dumps(record.to_json()))
    assert RunRecord.model_validate(on_disk) == record  # every key of final, timing, epochs, ...
    assert record.status == "completed" and record.strategy == strategy["name"]
    # Nothing in BASE is ignored: a worker must not warn about defaults it never was given. What
    # the machine check said before the run (more processes than cores, a busy machine) is all
    # the record may hold, first.
    early = list(itertools.takewhile(lambda event: event[0] == "warn", said.events))
    assert record.warnings == [message for _, message in early]
    sections = {key for key in set(RECORD_SECTION.values()) - {None} if key in on_disk}
    assert sections == ({section} if section else set())
    # The same figures mean the same thing everywhere.
    final, timing, plan = record.final, record.timing, record.plan
    assert final.step == 12 and record.epochs[-1].step == 12
    assert final.val_accuracy == record.epochs[-1].val_accuracy  # the curve ends at the final
    assert timing.warmup_steps == 3 and timing.steady_steps == 9 and timing.steps == 12
    assert timing.median_step_s is not None and timing.median_step_s > 0
    assert len(record.workers) == parse_spec({**BASE, "strategy": strategy}).strategy.trainers
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
