"""PipeDream-2BW: idle slots counted against GPipe, the weight version each backward used, the
staleness of each update, and the weights against the rule W(t+1) = W(t) − ν·∇f(W(t−1))."""

from __future__ import annotations

import copy
import queue
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from dlscale.strategies.pipeline.slots import count_slots, run_actions
from dlscale.strategies.pipeline.twobw import TwoBWStage
from dlscale.train.score import compute_loss


def update(stage, optimizer, drained=False):
    """The worker's update after a slot: step only when 2BW hands a whole gradient over."""
    optimizer.zero_grad(set_to_none=True)
    if stage.take_gradient(drained):
        optimizer.step()
        stage.updated()


def test_2bw_idles_only_to_fill_and_drain_where_gpipe_flushes_every_step():
    # 2 stages, 4 microbatches, 3 steps; a forward or backward of a microbatch is one slot.
    # GPipe: each step is M forwards, M backwards and S − 1 slots of fill for each:
    # 2 × (4 + 1) = 10 slots, 2 of them idle per stage, and 3 steps of it.
    gpipe = count_slots("gpipe", 2, 4, 3)
    assert gpipe.slots == 30 and gpipe.idle == [6, 6]
    # Between stage 0's first backward (slot 6) and its last forward, step 2's flush idles
    # slots 14, 15; stage 1 idles 9, 10 and 19, 20.
    assert gpipe.steady_idle == [2, 4]
    # 2bw: 24 busy slots per stage; only the fill (stage 0 waits one slot for its first
    # backward, stage 1 one for its first forward) and the drain: 2 × (S − 1) = 2 per stage,
    # however long the run.
    async_ = count_slots("2bw", 2, 4, 3)
    assert async_.slots == 26 and async_.idle == [2, 2] and async_.steady_idle == [0, 0]
    assert count_slots("2bw", 2, 4, 30).idle == [2, 2]
    deeper = count_slots("2bw", 4, 4, 6)
    assert deeper.steady_idle == [0, 0, 0, 0] and deeper.idle == [6, 6, 6, 6]
    assert sum(count_slots("gpipe", 4, 4, 6).steady_idle) > 0


def test_2bw_stage_order_is_1f1b_with_the_backlog_of_the_stages_after_it():
    # Stage 0 of 3 keeps 2 microbatches in flight: F0 F1 F2 B0 F3 B1 ...; the last stage none.
    assert run_actions("2bw", 3, 3, 2, 0)[:6] == [
        ("F", 0),
        ("F", 1),
        ("F", 2),
        ("B", 0),
        ("F", 3),
        ("B", 1),
    ]
    assert run_actions("2bw", 3, 3, 2, 2)[:4] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    for stage in range(3):  # every microbatch forward and backward once, the drain included
        actions = run_actions("2bw", 3, 3, 2, stage)
        assert sorted(actions) == sorted([(kind, k) for kind in "FB" for k in range(6)])


class Queues:
    """Threads as stages: one queue per direction between neighbours."""

    def __init__(self, stages: int):
        self.down = [queue.Queue() for _ in range(stages)]  # into stage i from i − 1
        self.up = [queue.Queue() for _ in range(stages)]  # into stage i from i + 1

    def transport(self, index: int):
        queues = self

        class Transport:
            def send(self, to_next, tensors):
                target = queues.down[index + 1] if to_next else queues.up[index - 1]
                target.put([t.detach().clone() for t in tensors])

            def recv(self, from_next, like):
                source = queues.up[index] if from_next else queues.down[index]
                got = source.get(timeout=30)
                assert [(tuple(t.shape), t.dtype) for t in got] == [tuple(m) for m in like]
                return got

        return Transport()


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


def _run_2bw(batches, micro: int, lr: float):
    """Two stages in two threads, each with its own SGD, stepping like the training loop."""
    whole = _model()
    parts = [whole[:2], whole[2:]]
    queues = Queues(2)
    mb = batches[0][0].shape[0] // micro
    meta = [((mb, 8), torch.float32)]
    stages = [
        TwoBWStage(
            parts[i], i, 2, micro, queues.transport(i), meta, meta, torch.device("cpu"), "fp32"
        )
        for i in range(2)
    ]
    losses: list[list[float]] = []

    def work(i: int):
        stage, optimizer = stages[i], torch.optim.SGD(parts[i].parameters(), lr=lr)

        for x, y in batches:
            out = stage.step(x if i == 0 else None, y if i == 1 else None)
            if i == 1:
                losses.append([float(v) for v in out])
            update(stage, optimizer)
        stage.drain()
        update(stage, optimizer, drained=True)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return whole, stages, losses


def _batches(steps: int, batch: int):
    generator = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(batch, 6, generator=generator),
            torch.randint(0, 3, (batch,), generator=generator),
        )
        for _ in range(steps)
    ]


def test_2bw_weights_follow_the_one_step_late_gradient_rule():
    steps, micro, lr = 5, 2, 0.5
    batches = _batches(steps, 8)
    trained, stages, _ = _run_2bw(batches, micro, lr)
    # By hand on the whole model: batch b's gradient is taken at W(max(b − 1, 0)) and applied
    # to the newest weights, W(b + 1) = W(b) − lr · ∇f_b(W(b − 1)).
    reference = _model()
    versions = [[p.detach().clone() for p in reference.parameters()]]
    for b, (x, y) in enumerate(batches):
        with torch.no_grad():
            for p, w in zip(reference.parameters(), versions[max(b - 1, 0)], strict=True):
                p.copy_(w)
        reference.zero_grad()
        compute_loss(reference(x), y).backward()
        grads = [p.grad.clone() for p in reference.parameters()]
        versions.append([w - lr * g for w, g in zip(versions[-1], grads, strict=True)])
    for got, want in zip(trained.parameters(), versions[-1], strict=True):
        torch.testing.assert_close(got.detach(), want)
    # A plain (synchronous) step would give other weights: the test can tell them apart.
    plain = _model()
    for x, y in batches:
        plain.zero_grad()
        compute_loss(plain(x), y).backward()
        with torch.no_grad():
            for p in plain.parameters():
                p -= lr * p.grad
    assert not torch.allclose(next(plain.parameters()), next(trained.parameters()))
    for stage in stages:  # batch 0 at W(0) applied to W(0), every later batch one update late
        assert stage.log.staleness == [0] + [1] * (steps - 1)


def test_2bw_backward_of_each_microbatch_uses_the_version_its_forward_used():
    steps, micro = 4, 2
    _, stages, losses = _run_2bw(_batches(steps, 8), micro, 0.1)
    for stage in stages:
        forward = {k: v for kind, k, v in stage.log.actions if kind == "F"}
        backward = {k: v for kind, k, v in stage.log.actions if kind == "B"}
        assert forward == backward and len(forward) == steps * micro
        # Batch b ran on W(max(b − 1, 0)): versions 0, 0, 1, 2 for batches 0..3.
        assert [forward[b * micro] for b in range(steps)] == [0, 0, 1, 2]
    # Stage 0 ran batch 1's first forward before batch 0's last backward (no flush between).
    order = [(kind, k) for kind, k, _ in stages[0].log.actions]
    assert order.index(("F", 2)) < order.index(("B", 1))
    assert [len(step) for step in losses] == [micro] * steps


@pytest.mark.parametrize("micro, stages", [(1, 2), (3, 4)])
def test_spec_refuses_2bw_with_fewer_microbatches_than_stages(micro, stages):
    from pydantic import ValidationError

    from dlscale.jobspec import PipelineStrategy

    with pytest.raises(ValidationError, match="microbatches >= stages"):
        PipelineStrategy(name="pipeline", stages=stages, microbatches=micro, schedule="2bw")


def test_validate_refuses_2bw_in_fp16_as_train_does(tmp_path):
    import yaml

    from dlscale import api
    from dlscale.errors import UserError

    example = Path(__file__).resolve().parents[2] / "examples" / "pipeline-gpt.yaml"
    spec = yaml.safe_load(example.read_text())
    spec["strategy"]["schedule"] = "2bw"
    spec["precision"] = "fp16"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(UserError, match="schedule 2bw trains in fp32 or bf16"):
        api.validate(path)
    with pytest.raises(UserError, match="schedule 2bw trains in fp32 or bf16"):
        api.train(path, out_dir=tmp_path / "run")


def _run_stages(batches, micro, *, settle_after=None, saved=None):
    """Two stages in threads with momentum SGD, as the loop steps them. `settle_after`: a
    checkpoint after that many batches (every stage settles, its state is kept); `saved`: start
    from such a checkpoint (weights, optimizer, 2bw state per stage) instead of the start.
    Returns the whole model and each stage's checkpoint."""
    whole = _model()
    parts = [whole[:2], whole[2:]]
    queues = Queues(2)
    meta = [((batches[0][0].shape[0] // micro, 8), torch.float32)]
    checkpoints: list[dict | None] = [None, None]

    def work(i: int):
        stage = TwoBWStage(
            parts[i], i, 2, micro, queues.transport(i), meta, meta, torch.device("cpu"), "fp32"
        )
        optimizer = torch.optim.SGD(parts[i].parameters(), lr=0.3, momentum=0.9)
        if saved is not None:
            parts[i].load_state_dict(saved[i]["model"])
            optimizer.load_state_dict(saved[i]["optimizer"])
            if saved[i]["twobw"] is not None:
                stage.restore(saved[i]["twobw"])

        for x, y in batches:
            stage.step(x if i == 0 else None, y if i == 1 else None)
            update(stage, optimizer)
            if stage.steps == settle_after:
                checkpoints[i] = {
                    "twobw": stage.settle(),
                    "model": {k: v.clone() for k, v in parts[i].state_dict().items()},
                    "optimizer": copy.deepcopy(optimizer.state_dict()),
                }
                if len(batches) == settle_after:  # the run is killed here
                    return
        stage.drain()
        update(stage, optimizer, drained=True)
        # The loop's final checkpoint comes after the drain: nothing is left in flight.
        assert stage.settle()["pending"] is None

    failures: list[BaseException] = []

    def guarded(i: int):
        try:
            work(i)
        except BaseException as exc:  # a thread's exception would not fail the test
            failures.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures and not any(thread.is_alive() for thread in threads), failures
    return whole, checkpoints


def test_2bw_resumes_from_a_checkpoint_to_the_uninterrupted_weights():
    micro, steps, at = 2, 6, 3
    batches = _batches(steps, 8)
    straight, _ = _run_stages(batches, micro)
    # Settling for a checkpoint runs batch 2's last backwards a step early: the same weights,
    # bit for bit, as a run that never checkpoints.
    checkpointed, _ = _run_stages(batches, micro, settle_after=at)
    # Killed after the checkpoint at step 3, resumed from it with batches 3..5.
    _, saved = _run_stages(batches[:at], micro, settle_after=at)
    assert saved[0]["twobw"]["pending"]["batch"] == at - 1  # stage 0 had it in flight
    resumed, _ = _run_stages(batches[at:], micro, saved=saved)
    # What a checkpoint without the batch in flight gives: that batch's gradient lost.
    lost = [{**part, "twobw": None} for part in saved]
    dropped, _ = _run_stages(batches[at:], micro, saved=lost)
    for name, want in straight.state_dict().items():
        assert torch.equal(checkpointed.state_dict()[name], want), name
        assert torch.equal(resumed.state_dict()[name], want), name
    assert not torch.equal(dropped.state_dict()["0.weight"], straight.state_dict()["0.weight"])
