"""dlscale's predicted training throughput against published measurements of the same runs.

SINGLE DEVICE: each published one-GPU run whose model is in dlscale's zoo and whose GPU is in the
catalogue is profiled through dlscale's API at the run's batch, precision and optimizer (a
meta-device trace, no GPU needed), and its predicted images/s is set beside the published figure:
ratio = predicted / published, the goal within 0.8-1.2. Nothing here is fitted to these rows: the
catalogue's parameters (peaks, the compute efficiency, Winograd's saving) come from datasheets and
papers, and each row says whether it informed one of them or only checks them.

A run whose source says its weights lived on the host (tf_cnn_benchmarks' variable_update =
parameter_server, local_parameter_device = cpu) is predicted as dlscale's `ps` strategy on one
device, the server on the host across the GPU's PCIe link: each step pushes the gradients and
pulls the weights over it (profiler/scaling.py), as that configuration does.

    python benchmarks/prediction_vs_published.py
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.api.profiling import profile
from dlscale.profiler.request import ProfileRequest, ScalingRequest

TF_BENCHMARKS = (
    "TensorFlow Benchmarks (https://www.tensorflow.org/performance/benchmarks, tests of May 2017), "
    "as kept in https://github.com/tensorflow/tensorflow/blob/"
    "5984ffefd320c5d71b801ee06079a51b91ea42c0/tensorflow/docs_src/performance/benchmarks.md "
    "(read 2026-11-27)"
)
NVIDIA_RESNET50 = (
    "NVIDIA DeepLearningExamples, ResNet50 v1.5 for PyTorch, training performance "
    "(pytorch-21.03 NGC container), https://github.com/NVIDIA/DeepLearningExamples/blob/"
    "291f0d02e815b148fa5c2b81bf07aa3552142895/PyTorch/Classification/ConvNets/resnet50v1.5/"
    "README.md; batch sizes from ConvNets/configs.yml (read 2026-11-27)"
)
# tf_cnn_benchmarks: synthetic ImageNet data, fp32, plain SGD, NCHW, CUDA 8.0 / cuDNN 5.1. The
# source's configuration tables: on the DGX-1, ResNet-50 and InceptionV3 ran with
# variable_update = parameter_server and local_parameter_device = cpu (AlexNet and VGG16
# replicated with NCCL, weights on the GPU); on GCE every model ran parameter_server on the cpu.
# The batch-32 runs are taken to use their model's configuration (the source lists one per model).
DGX1_P100 = "DGX-1, one P100 SXM2; TensorFlow, cuDNN 5.1, fp32, SGD, synthetic data"
GCE_K80 = "GCE n1-standard-32-k80x8, one K80 GPU; TensorFlow, cuDNN 5.1, fp32, SGD, synthetic data"
HOST_PS = "weights on the host (parameter_server, local_parameter_device = cpu): ps on 1 GPU"
HOST_LINK = "pcie3-x16"  # the P100 SXM2's and the K80's link to a DGX-1's / GCE VM's host
# With synthetic data the benchmark makes the images on the GPU, as a local variable
# ("gpu_cached_images", commented "Minor hack to avoid H2D copy when using synthetic data"), so
# no batch crosses PCIe; the source's benchmark hash is tensorflow/benchmarks@9165a70 (read
# 2026-11-27: scripts/tf_cnn_benchmarks/tf_cnn_benchmarks.py, add_forward_pass_and_gradients).
GPU_INPUT = "synthetic images made on the GPU (tf_cnn_benchmarks@9165a70): no host-to-device copy"
# NVIDIA's PyTorch recipe: SGD with momentum 0.875; mixed precision (AMP, fp16) in channels-last.
DGX1_V100 = "DGX-1 (V100), one GPU; PyTorch, SGD with momentum, FP32 or AMP (fp16, NHWC)"
DGXA100 = "DGX A100 (80 GB), one GPU; PyTorch, SGD with momentum, AMP (fp16, NHWC) or TF32"
RESNET_V1 = "TensorFlow's ResNet-50 v1 strides the first 1×1 of a block; the zoo's (v1.5) its 3×3"

VALIDATES = "validates"
# The K80 entry has no winograd_convs: cuDNN 5.1's Winograd kernels are not assumed on Kepler,
# which this row is consistent with (at the direct count it ran at 0.75 of the boost peak).
INFORMED_K80 = "informed k80's winograd_convs = false"
NOT_IN_ZOO = "not profiled: no zoo model"
NO_TF32 = "not profiled: dlscale plans fp32 training at the fp32 rate, not TF32"


@dataclass(frozen=True)
class PublishedRun:
    """One published single-device training throughput."""

    label: str  # the model as the source names it
    model: str  # the zoo model profiled for it
    hardware: str  # catalogue entry
    batch: int
    precision: str  # fp32 | bf16 | fp16 (AMP)
    images_per_s: float  # published
    optimizer: str  # as dlscale names it: sgd | momentum
    setup: str
    source: str
    role: str = VALIDATES  # whether the row informed a catalogue parameter or only checks them
    skip: str = ""  # why the row is not profiled
    differs: str = ""  # where the zoo model differs from the published one
    host_weights: bool = False  # a parameter server on the host: predicted as dlscale's ps
    input_on_gpu: bool = False  # synthetic images made on the GPU: no host-to-device copy


def _tf(label, model, hardware, batch, images_per_s, **extra) -> PublishedRun:
    on_k80 = hardware == "k80"
    host_weights = on_k80 or label in ("ResNet-50", "InceptionV3")
    return PublishedRun(
        label,
        model,
        hardware,
        batch,
        "fp32",
        images_per_s,
        "sgd",
        GCE_K80 if on_k80 else DGX1_P100,
        TF_BENCHMARKS,
        host_weights=host_weights,
        input_on_gpu=True,
        **extra,
    )


def _nvidia(hardware, batch, precision, images_per_s, **extra) -> PublishedRun:
    setup = DGXA100 if hardware.startswith("a100") else DGX1_V100
    return PublishedRun(
        "ResNet-50 v1.5",
        "resnet50",
        hardware,
        batch,
        precision,
        images_per_s,
        "momentum",
        setup,
        NVIDIA_RESNET50,
        **extra,
    )


SINGLE_DEVICE_RUNS = [
    _tf("AlexNet", "alexnet", "p100-sxm2-16gb", 512, 2987),
    _tf("VGG16", "vgg16", "p100-sxm2-16gb", 64, 154),
    _tf("VGG16", "vgg16", "p100-sxm2-16gb", 32, 144),
    _tf("ResNet-50", "resnet50", "p100-sxm2-16gb", 64, 219, differs=RESNET_V1),
    _tf("ResNet-50", "resnet50", "p100-sxm2-16gb", 32, 195, differs=RESNET_V1),
    _tf("InceptionV3", "-", "p100-sxm2-16gb", 64, 142, skip=NOT_IN_ZOO),
    _tf("AlexNet", "alexnet", "k80", 512, 656),
    _tf("VGG16", "vgg16", "k80", 32, 35.4, role=INFORMED_K80),
    _tf("ResNet-50", "resnet50", "k80", 64, 51.9, differs=RESNET_V1),
    _tf("InceptionV3", "-", "k80", 64, 30.5, skip=NOT_IN_ZOO),
    _nvidia("v100-sxm2-16gb", 112, "fp32", 367),
    _nvidia("v100-sxm2-16gb", 256, "fp16", 1200),
    _nvidia("v100-sxm2-32gb", 112, "fp32", 356),
    _nvidia("v100-sxm2-32gb", 256, "fp16", 1156),
    _nvidia("a100-80gb", 256, "fp16", 2470),
    _nvidia("a100-80gb", 256, "fp32", 938, skip=NO_TF32),
]
GOAL = (0.8, 1.2)


def predicted_images_per_s(run: PublishedRun) -> float:
    """dlscale's prediction for one run: its zoo model traced at the run's batch, precision and
    optimizer, predicted on the run's catalogue device; with its weights on the host, as the ps
    strategy on one device over the host link; with its input made on the GPU, less the step's
    host-to-device copy of the batch."""
    request = ProfileRequest(
        target=run.model,
        batch_size=run.batch,
        precision=run.precision,
        optimizer=run.optimizer,
        hardware=(run.hardware,),
    )
    scaling = ScalingRequest(devices=(1,), interconnect=HOST_LINK, strategies=("ps",))
    result = profile(request, scaling) if run.host_weights else profile(request)
    (report,) = result.reports
    step_s = report.prediction.step_s
    if run.host_weights:
        ((row,),) = [scaled.rows for scaled in result.scaling]
        step_s = row.point.step_s
    if run.input_on_gpu:
        step_s -= report.prediction.h2d_s
    return run.batch / step_s


def single_device_table() -> list[dict]:
    """Print every SINGLE_DEVICE_RUNS row with its prediction and ratio; return the rows."""
    print("SINGLE DEVICE: predicted / published training throughput (images/s)")
    print(
        f"{'model':<15} {'device':<15} {'batch':>5} {'prec':<5} {'published':>9} "
        f"{'predicted':>9} {'ratio':>6}  role"
    )
    rows = []
    for run in SINGLE_DEVICE_RUNS:
        predicted = None if run.skip else predicted_images_per_s(run)
        ratio = predicted / run.images_per_s if predicted else None
        shown = f"{predicted:>9.1f} {ratio:>6.2f}" if predicted else f"{'-':>9} {'-':>6}"
        print(
            f"{run.label:<15} {run.hardware:<15} {run.batch:>5} {run.precision:<5} "
            f"{run.images_per_s:>9.1f} {shown}  {run.skip or run.role}"
            + (" (host ps)" if run.host_weights and not run.skip else "")
        )
        rows.append({"run": run, "predicted": predicted, "ratio": ratio})
    ratios = [row["ratio"] for row in rows if row["ratio"] is not None]
    inside = sum(GOAL[0] <= ratio <= GOAL[1] for ratio in ratios)
    print(f"{inside} of {len(ratios)} profiled rows within {GOAL[0]}-{GOAL[1]}")
    for setup in dict.fromkeys(run.setup for run in SINGLE_DEVICE_RUNS):
        print(f"  setup: {setup}")
    print(f"  host ps: {HOST_PS}, over {HOST_LINK}")
    print(f"  TensorFlow rows: {GPU_INPUT}")
    for differs in dict.fromkeys(run.differs for run in SINGLE_DEVICE_RUNS if run.differs):
        print(f"  model: {differs}")
    for source in dict.fromkeys(run.source for run in SINGLE_DEVICE_RUNS):
        print(f"  source: {source}")
    return rows


def main() -> None:
    single_device_table()
    # The multi-device table (scaling efficiency against published runs) lives beside this one.
    if "scaling_table" in globals():
        print()
        globals()["scaling_table"]()


if __name__ == "__main__":
    main()
