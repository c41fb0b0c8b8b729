"""`estimate`: time a few real training steps, extrapolate the run, compare with the roofline."""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dlscale.errors import UserError
from dlscale.hardware.device import Hardware
from dlscale.hardware.trust import calibration
from dlscale.jobspec import load_spec
from dlscale.profiler import profile
from dlscale.profiler.target import resolve
from dlscale.train.device import synchronize
from dlscale.train.loop import Trainer
from dlscale.train.score import evaluate
from dlscale.train.threads import intra_op_threads


@dataclass
class Estimate:
    spec_name: str
    steps_measured: int
    step_s_median: float
    step_s_p10: float
    step_s_p90: float
    eval_s: float  # one pass over the validation set
    setup_s: float
    total_steps: int
    epochs: int
    total_s: float  # setup + steps × median step + one evaluation per epoch
    predicted_step_s: float | None  # the roofline on `local`, if this machine was measured
    predicted_total_s: float | None
    # Which measurement of this machine the prediction rests on, and whether to trust it.
    calibration: dict | None = None
    warmup_steps: int = 0  # run before the timed ones

    @property
    def ratio(self) -> float | None:
        """Roofline prediction over measurement (1.0 = exact)."""
        if self.predicted_step_s is None:
            return None
        return self.predicted_step_s / self.step_s_median


def measure_steps(trainer: Trainer, warmup: int, steps: int) -> list[float]:
    """Seconds per step, timed as the training loop times them, after `warmup` steps."""
    needed = warmup + steps
    times: list[float] = []
    epoch = 0
    while len(times) < needed:
        trainer.sampler.set_epoch(epoch)
        t_prev = time.perf_counter()
        for x, y, *_ in trainer.train_loader:
            x, y = x.to(trainer.device), y.to(trainer.device)
            float(trainer.step_fn(x, y))  # reading the loss waits for the device
            synchronize(trainer.device)
            now = time.perf_counter()
            times.append(now - t_prev)
            t_prev = now
            if len(times) >= needed:
                break
        epoch += 1
    return times[warmup:]


def estimate(
    spec_path: str | Path, local: Hardware | None, steps: int = 20, warmup: int = 5
) -> Estimate:
    if steps < 3 or warmup < 0:
        raise UserError(
            f"--steps must be at least 3 and --warmup not negative (got {steps}, {warmup})"
        )
    spec = load_spec(spec_path)
    with tempfile.TemporaryDirectory() as scratch, intra_op_threads(spec.threads):
        trainer = Trainer(spec, Path(scratch))
        times = measure_steps(trainer, warmup, steps)
        start = time.perf_counter()
        evaluate(trainer.model, trainer.val_loader, trainer.device, spec.precision)
        eval_s = time.perf_counter() - start
    deciles = statistics.quantiles(times, n=10)
    median = statistics.median(times)
    plan = trainer.plan
    total = trainer.setup_s + plan.total_steps * median + plan.epochs * eval_s
    predicted_step = predicted_total = None
    if local is not None:
        prediction = profile(resolve(str(spec_path)), [local]).reports[0].prediction
        predicted_step = prediction.step_s
        predicted_total = trainer.setup_s + plan.total_steps * predicted_step + plan.epochs * eval_s
    return Estimate(
        spec_name=spec.name,
        steps_measured=len(times),
        step_s_median=median,
        step_s_p10=deciles[0],
        step_s_p90=deciles[-1],
        eval_s=eval_s,
        setup_s=trainer.setup_s,
        total_steps=plan.total_steps,
        epochs=plan.epochs,
        total_s=total,
        predicted_step_s=predicted_step,
        predicted_total_s=predicted_total,
        calibration=calibration(local) if local is not None else None,
        warmup_steps=warmup,
    )
