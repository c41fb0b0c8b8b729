"""`compare` counts the processes a model-parallel run trained with, not its data replicas
(issue 37: pipeline and tensor runs of 2 processes were shown as "1 worker")."""

from dlscale.bench.compare import trainers


def test_compare_counts_every_stage_and_shard_as_a_worker():
    assert trainers({"name": "pipeline", "stages": 2, "schedule": "2bw"}) == 2
    assert trainers({"name": "tensor", "degree": 2}) == 2
    assert trainers({"name": "hybrid", "stages": 2, "data_parallel": 2}) == 4
    assert trainers({"name": "ps", "mode": "async", "workers": 3}) == 3  # servers train nothing
