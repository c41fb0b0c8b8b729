"""dlscale's predicted training throughput against published measurements of the same runs.

SINGLE DEVICE: each published one-GPU run whose model is in dlscale's zoo and whose GPU is in the
catalogue is profiled through dlscale's API at the run's batch, precision and optimizer (a
meta-device trace, no GPU needed), and its predicted images/s is set beside the published figure:
ratio = predicted / published, the goal within 0.8-1.2. Nothing here is fitted to these rows: the
catalogue's parameters (peaks, the compute efficiency, Winograd's saving) come from datasheets and
papers, and each row says whether it informed one of them or only checks them.

    python benchmarks/prediction_vs_published.py
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.api.profiling import profile
from dlscale.profiler.request import ProfileRequest

TF_BENCHMARKS = (
    "https://www.tensorflow.org/performance/benchmarks, as kept in https://github.com/tensorflow/"
    "tensorflow/blob/5984ffefd320c5d71b801ee06079a51b91ea42c0/tensorflow/docs_src/performance/"
    "benchmarks.md (TensorFlow Benchmarks, tests of May 2017; read 2026-11-27)"
)
# Both TensorFlow setups: tf_cnn_benchmarks, synthetic ImageNet data, fp32, plain SGD, NCHW,
# CUDA 8.0 / cuDNN 5.1; one GPU of the machine.
DGX1 = "DGX-1, one P100 SXM2; TensorFlow, cuDNN 5.1, fp32, SGD, synthetic data"
GCE_K80 = "GCE n1-standard-32-k80x8, one K80 GPU; TensorFlow, cuDNN 5.1, fp32, SGD, synthetic data"
VALIDATES = "validates"
# The K80 entry has no winograd_convs: cuDNN 5.1's Winograd kernels are not assumed on Kepler,
# which this row is consistent with (at the direct count it ran at 0.75 of the boost peak).
INFORMED_K80 = "informed k80's winograd_convs = false"


@dataclass(frozen=True)
class PublishedRun:
    """One published single-device training throughput."""

    label: str  # the model as the source names it
    model: str | None  # the zoo model profiled for it; None: not in the zoo
    hardware: str  # catalogue entry
    batch: int
    precision: str
    images_per_s: float  # published
    setup: str
    source: str
    role: str  # whether the row informed a catalogue parameter or only checks them
    differs: str = ""  # where the zoo model differs from the published one


RESNET_V1 = "TensorFlow's ResNet-50 v1 strides the first 1×1 of a block; the zoo's (v1.5) its 3×3"
SINGLE_DEVICE_RUNS = [
    PublishedRun(
        "AlexNet", "alexnet", "p100-sxm2-16gb", 512, "fp32", 2987, DGX1, TF_BENCHMARKS, VALIDATES
    ),
    PublishedRun(
        "VGG16", "vgg16", "p100-sxm2-16gb", 64, "fp32", 154, DGX1, TF_BENCHMARKS, VALIDATES
    ),
    PublishedRun(
        "VGG16", "vgg16", "p100-sxm2-16gb", 32, "fp32", 144, DGX1, TF_BENCHMARKS, VALIDATES
    ),
    PublishedRun(
        "ResNet-50",
        "resnet50",
        "p100-sxm2-16gb",
        64,
        "fp32",
        219,
        DGX1,
        TF_BENCHMARKS,
        VALIDATES,
        RESNET_V1,
    ),
    PublishedRun(
        "ResNet-50",
        "resnet50",
        "p100-sxm2-16gb",
        32,
        "fp32",
        195,
        DGX1,
        TF_BENCHMARKS,
        VALIDATES,
        RESNET_V1,
    ),
    PublishedRun(
        "InceptionV3", None, "p100-sxm2-16gb", 64, "fp32", 142, DGX1, TF_BENCHMARKS, VALIDATES
    ),
    PublishedRun("AlexNet", "alexnet", "k80", 512, "fp32", 656, GCE_K80, TF_BENCHMARKS, VALIDATES),
    PublishedRun("VGG16", "vgg16", "k80", 32, "fp32", 35.4, GCE_K80, TF_BENCHMARKS, INFORMED_K80),
    PublishedRun(
        "ResNet-50",
        "resnet50",
        "k80",
        64,
        "fp32",
        51.9,
        GCE_K80,
        TF_BENCHMARKS,
        VALIDATES,
        RESNET_V1,
    ),
    PublishedRun("InceptionV3", None, "k80", 64, "fp32", 30.5, GCE_K80, TF_BENCHMARKS, VALIDATES),
]
GOAL = (0.8, 1.2)


def predicted_images_per_s(run: PublishedRun) -> float:
    """dlscale's prediction for one run: its zoo model traced at the run's batch and precision,
    with plain SGD, predicted on the run's catalogue device."""
    assert run.model is not None, f"{run.label} has no zoo model"
    request = ProfileRequest(
        target=run.model,
        batch_size=run.batch,
        precision=run.precision,
        optimizer="sgd",
        hardware=(run.hardware,),
    )
    (report,) = profile(request).reports
    return report.prediction.samples_per_s


def single_device_table() -> list[dict]:
    """Print every SINGLE_DEVICE_RUNS row with its prediction and ratio; return the rows."""
    print("SINGLE DEVICE: predicted / published training throughput (images/s)")
    print(
        f"{'model':<12} {'device':<15} {'batch':>5} {'prec':<5} {'published':>9} "
        f"{'predicted':>9} {'ratio':>6}  role"
    )
    rows = []
    for run in SINGLE_DEVICE_RUNS:
        predicted = predicted_images_per_s(run) if run.model else None
        ratio = predicted / run.images_per_s if predicted else None
        shown = f"{predicted:>9.1f} {ratio:>6.2f}" if predicted else f"{'-':>9} {'-':>6}"
        note = run.role if run.model else "not profiled: no zoo model"
        print(
            f"{run.label:<12} {run.hardware:<15} {run.batch:>5} {run.precision:<5} "
            f"{run.images_per_s:>9.1f} {shown}  {note}"
        )
        rows.append({"run": run, "predicted": predicted, "ratio": ratio})
    ratios = [row["ratio"] for row in rows if row["ratio"] is not None]
    inside = sum(GOAL[0] <= ratio <= GOAL[1] for ratio in ratios)
    print(f"{inside} of {len(ratios)} profiled rows within {GOAL[0]}-{GOAL[1]}")
    for setup in sorted({run.setup for run in SINGLE_DEVICE_RUNS}):
        print(f"  setup: {setup}")
    for differs in sorted({run.differs for run in SINGLE_DEVICE_RUNS if run.differs}):
        print(f"  model: {differs}")
    print(f"  source: {TF_BENCHMARKS}")
    return rows


def main() -> None:
    single_device_table()
    # The multi-device table (scaling efficiency against published runs) lives beside this one.
    if "scaling_table" in globals():
        print()
        globals()["scaling_table"]()


if __name__ == "__main__":
    main()
