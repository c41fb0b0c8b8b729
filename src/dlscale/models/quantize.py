"""Post-training dynamic int8 quantization of a trained fp32 model, on the CPU.

torch's `quantize_dynamic` stores every Linear layer's weights as int8 and quantizes its
activations on the fly (convolutions stay fp32); torch's quantized kernels run on the CPU only.
`dlscale bench precision` measures the model it makes, and `dlscale predict --precision int8`
runs it.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from dlscale.errors import UserError


def quantize_dynamic_int8(model: nn.Module) -> nn.Module:
    """A copy of `model` (fp32, on the CPU, in eval mode) with its Linear layers int8."""
    from torch.ao.quantization import quantize_dynamic

    # torch 2.x deprecates its quantized tensor types in favour of torchao and says so at every
    # conversion; the kernels still run, and a user of this function cannot act on the notice.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*", category=UserWarning)
        quantized = quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    if not any("quantized" in type(m).__module__ for m in quantized.modules()):
        raise UserError("no Linear layer: dynamic quantization changes nothing here")
    return quantized
