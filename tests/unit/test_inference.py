"""`profile --inference [--precision int8]`: forward only, at the format's peak and bytes
(tests/cli/test_profile_predictions_cli.py: the command, and an op int8 has no kernel for)."""

import torch

from dlscale.hardware import get_hardware
from dlscale.models import build_model
from dlscale.profiler.inference import predict_inference
from dlscale.profiler.roofline import predict
from dlscale.profiler.trace import trace_step


def lenet_trace(batch: int = 256):
    return trace_step(
        lambda: build_model("lenet", {}),
        torch.zeros(1, 28, 28),
        batch,
        "fp32",
        torch.optim.SGD,
        "sgd",
    )


def test_int8_inference_is_the_forward_at_int8_rates_and_one_byte_an_element():
    trace, gpu = lenet_trace(), get_hardware("a100-40gb")
    fp32 = predict_inference(trace, gpu, "fp32")
    int8 = predict_inference(trace, gpu, "int8")
    assert int8.precision_used == "int8" and int8.weights_bytes * 4 == fp32.weights_bytes
    assert int8.weights_bytes == trace.params and int8.activation_bytes * 4 <= fp32.activation_bytes
    assert int8.forward_s < fp32.forward_s  # int8 peak and a quarter of the bytes
    training = predict(trace, gpu)
    assert fp32.forward_s < training.step_s  # no backward, no optimizer
    cpu = predict_inference(trace, get_hardware("i7-7700k"), "int8")
    assert cpu.precision_used == "fp32"  # no int8 peak catalogued: it says which it used
