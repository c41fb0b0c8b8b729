"""Model zoo: published parameter counts, output shapes, causality, and the builder's errors."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
import torch
from torch import nn

from dlscale.errors import UserError
from dlscale.models import ZOO, build_model, count_parameters
from dlscale.models.registry import parameter_count_meta

# Published torchvision figures (weights tables of torchvision.models) at 1000 classes.
TORCHVISION_PARAMS = {
    "alexnet": 61_100_840,
    "vgg11": 132_863_336,
    "vgg16": 138_357_544,
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
}


@pytest.mark.parametrize(("name", "expected"), TORCHVISION_PARAMS.items())
def test_imagenet_parameter_counts_match_torchvision(name: str, expected: int) -> None:
    assert parameter_count_meta(name) == expected


def test_meta_build_allocates_no_storage() -> None:
    with torch.device("meta"):
        model = build_model("vgg16")
    assert all(p.is_meta for p in model.parameters())


def test_lenet_parameter_count_by_hand() -> None:
    # conv1 6·25+6, conv2 16·6·25+16, fc1 256·120+120, fc2 120·60+60, fc3 60·10+10
    by_hand = 156 + 2_416 + 30_840 + 7_260 + 610
    assert by_hand == 41_282
    assert count_parameters(build_model("lenet")) == 41_282


def test_lenet_layers_and_output_shape() -> None:
    model = build_model("lenet")
    names = [name for name, _ in model.named_children()]
    assert names == [
        "conv1",
        "relu1",
        "pool1",
        "conv2",
        "relu2",
        "pool2",
        "flatten",
        "fc1",
        "relu3",
        "fc2",
        "relu4",
        "fc3",
    ]
    assert isinstance(model.flatten, nn.Flatten)
    assert all(isinstance(getattr(model, f"relu{i}"), nn.ReLU) for i in range(1, 5))
    assert model.fc1.in_features == 256
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_resnet_small_input_changes_only_the_stem() -> None:
    small = parameter_count_meta("resnet18", {"small_input": True})
    # conv1 goes from 64·3·7·7 to 64·3·3·3 weights; the max pool has no parameters.
    assert TORCHVISION_PARAMS["resnet18"] - small == 64 * 3 * (49 - 9)
    model = build_model("resnet18", {"small_input": True})
    assert isinstance(model.maxpool, nn.Identity)
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    for attr in ("conv1", "bn1", "relu", "maxpool", "layer1", "layer4", "avgpool", "fc"):
        assert hasattr(model, attr)


# (name, kwargs, input batch, expected output shape): small real inputs, small class counts.
FORWARD_CASES = [
    ("lenet", {"num_classes": 3}, torch.randn(2, 1, 28, 28), (2, 3)),
    ("mlp", {"input_size": 12, "hidden": 8, "num_classes": 3}, torch.randn(2, 3, 4), (2, 3)),
    ("mlp", {"input_size": 5, "hidden": [], "num_classes": 2}, torch.randn(4, 5), (4, 2)),
    ("alexnet", {"num_classes": 5}, torch.randn(1, 3, 64, 64), (1, 5)),
    ("alexnet_2gpu", {"num_classes": 5}, torch.randn(1, 3, 64, 64), (1, 5)),
    ("vgg11", {"num_classes": 4}, torch.randn(2, 3, 32, 32), (2, 4)),
    ("vgg16", {"num_classes": 4, "batch_norm": True}, torch.randn(2, 3, 32, 32), (2, 4)),
    (
        "resnet18",
        {"num_classes": 7, "in_channels": 1, "small_input": True},
        torch.randn(2, 1, 28, 28),
        (2, 7),
    ),
    ("resnet50", {"num_classes": 6}, torch.randn(2, 3, 64, 64), (2, 6)),
    ("gpt", {"vocab_size": 50, "context_length": 16}, torch.randint(0, 50, (2, 16)), (2, 16, 50)),
    ("lstm", {"vocab_size": 30, "num_classes": 4}, torch.randint(0, 30, (3, 9)), (3, 4)),
]


@pytest.mark.parametrize(
    ("name", "kwargs", "x", "expected"), FORWARD_CASES, ids=[c[0] for c in FORWARD_CASES]
)
def test_forward_shape_on_small_input(name: str, kwargs: dict, x, expected: tuple) -> None:
    model = build_model(name, kwargs).eval()
    with torch.no_grad():
        out = model(x)
    assert out.shape == expected
    assert torch.isfinite(out).all()


def test_every_zoo_model_has_a_forward_case() -> None:
    assert {case[0] for case in FORWARD_CASES} == set(ZOO)


@pytest.mark.parametrize("name", list(ZOO))
def test_example_input_shape_matches_listing_kwargs(name: str) -> None:
    # Shapes propagate on the meta device, so even VGG-16 at 224×224 costs nothing here.
    entry = ZOO[name]
    assert entry.input_kind in ("image", "features", "tokens")
    dtype = torch.int64 if entry.input_kind == "tokens" else torch.float32
    with torch.device("meta"):
        model = build_model(name, entry.listing_kwargs)
        out = model(torch.zeros((2, *entry.example_input_shape), dtype=dtype))
    assert out.shape[0] == 2


def test_gpt_is_causal() -> None:
    torch.manual_seed(0)
    model = build_model("gpt", {"vocab_size": 40, "context_length": 12}).eval()
    x = torch.randint(0, 40, (1, 12))
    changed = x.clone()
    changed[0, 8] = (x[0, 8] + 1) % 40
    with torch.no_grad():
        before, after = model(x), model(changed)
    torch.testing.assert_close(before[:, :8], after[:, :8])
    assert not torch.allclose(before[:, 8:], after[:, 8:])


def test_gpt_rejects_sequences_longer_than_context() -> None:
    model = build_model("gpt", {"context_length": 8})
    with pytest.raises(ValueError, match="exceeds the model's context_length 8"):
        model(torch.zeros(1, 9, dtype=torch.int64))


def test_gpt_tied_weights_counted_once() -> None:
    kwargs = {"vocab_size": 100, "d_model": 32, "n_head": 2}
    tied = build_model("gpt", kwargs)
    untied = build_model("gpt", {**kwargs, "tie_weights": False})
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert count_parameters(untied) - count_parameters(tied) == 100 * 32


def test_gpt_module_names() -> None:
    model = build_model("gpt", {"n_layer": 1})
    block = model.blocks[0]
    for path in ("tok_emb", "pos_emb", "ln_f", "lm_head"):
        assert hasattr(model, path)
    assert block.attn.q.out_features == block.attn.k.out_features == 128
    assert isinstance(block.mlp.act, nn.GELU) and block.mlp.fc.out_features == 4 * 128
    assert isinstance(block.ln1, nn.LayerNorm) and isinstance(block.ln2, nn.LayerNorm)


def test_count_parameters_trainable_only() -> None:
    model = build_model("lenet")
    for p in model.conv1.parameters():
        p.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == 41_282 - 156
    assert count_parameters(model) == 41_282


def test_defaults_fill_only_accepted_and_missing_parameters() -> None:
    image_defaults = {"num_classes": 3, "in_channels": 1, "input_size": 12}
    model = build_model("mlp", defaults=image_defaults)  # mlp takes no in_channels
    assert model[1].in_features == 12 and model[-1].out_features == 3
    model = build_model("mlp", {"num_classes": 5}, defaults=image_defaults)
    assert model[-1].out_features == 5  # the user's value wins over the data's
    model = build_model("lenet", defaults=image_defaults)  # lenet takes no input_size
    assert model.conv1.in_channels == 1 and model.fc3.out_features == 3
    token_defaults = {"num_classes": 20, "vocab_size": 20, "context_length": 16}
    model = build_model("gpt", defaults=token_defaults)  # gpt takes no num_classes
    assert model.tok_emb.num_embeddings == 20 and model.pos_emb.num_embeddings == 16
    model = build_model("lstm", defaults=token_defaults)  # context_length accepted, unused
    assert model(torch.zeros(2, 16, dtype=torch.int64)).shape == (2, 20)


USER_MODULE = """
import torch.nn as nn

NOT_CALLABLE = 3

def tiny(width=4, **extra):
    net = nn.Linear(width, 2)
    net.extra = extra
    return net

def fussy(num_classes=2):
    raise TypeError("bad things\\nsecond line")

def not_a_module():
    return 42
"""


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """A package "usermodels" with one module, in a fresh working directory."""
    package = tmp_path / "usermodels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(textwrap.dedent(USER_MODULE))
    (package / "broken.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # undo build_model's insert afterwards
    importlib.invalidate_caches()
    yield "usermodels"
    for module in [m for m in sys.modules if m == "usermodels" or m.startswith("usermodels.")]:
        del sys.modules[module]


def test_user_factory_is_imported_from_the_working_directory(user_package: str) -> None:
    model = build_model(f"{user_package}.nets:tiny", {"width": 6})
    assert isinstance(model, nn.Linear) and model.in_features == 6


def test_user_factory_with_var_kwargs_gets_only_named_defaults(user_package: str) -> None:
    model = build_model(
        f"{user_package}.nets:tiny", {"colour": "red"}, defaults={"num_classes": 3, "width": 5}
    )
    assert model.in_features == 5
    assert model.extra == {"colour": "red"}  # num_classes was not named, so not passed


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("usermodels.nets:missing", {}, "module 'usermodels.nets' has no attribute 'missing'"),
        ("usermodels.nets:NOT_CALLABLE", {}, "'usermodels.nets:NOT_CALLABLE' is a int, not"),
        ("usermodels.nets:fussy", {}, "model 'usermodels.nets:fussy' could not be built: bad"),
        ("usermodels.nets:not_a_module", {}, "returned an int, not a torch.nn.Module"),
        ("usermodels.broken:f", {}, "importing module 'usermodels.broken' failed: RuntimeError"),
        ("usermodels.absent:f", {}, "cannot import module 'usermodels.absent': No module named"),
        (
            "usermodels.nets:fussy",
            {"width": 1},
            "model 'usermodels.nets:fussy' does not take argument 'width' (it takes: num_classes)",
        ),
    ],
)
def test_user_factory_errors(user_package: str, name: str, kwargs: dict, message: str) -> None:
    with pytest.raises(UserError) as caught:
        build_model(name, kwargs)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_unknown_zoo_name_lists_the_zoo() -> None:
    with pytest.raises(UserError) as caught:
        build_model("foo")
    assert str(caught.value) == (
        "unknown model 'foo'; the zoo has: lenet, mlp, alexnet, alexnet_2gpu, vgg11, vgg16, "
        "resnet18, resnet50, gpt, lstm (or give package.module:factory)"
    )


def test_unimportable_top_level_module_is_named(monkeypatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(UserError) as caught:
        build_model("no_such_pkg_xyz.mod:factory")
    assert "cannot import module 'no_such_pkg_xyz.mod': No module named" in str(caught.value)


def test_malformed_reference() -> None:
    with pytest.raises(UserError) as caught:
        build_model("somemodule:")
    assert str(caught.value) == "model 'somemodule:' must look like package.module:factory"


def test_zoo_model_rejects_unknown_argument() -> None:
    with pytest.raises(UserError) as caught:
        build_model("lenet", {"bogus": 1})
    assert str(caught.value) == (
        "model 'lenet' does not take argument 'bogus' (it takes: num_classes, in_channels)"
    )


def test_factory_value_error_becomes_user_error() -> None:
    with pytest.raises(UserError) as caught:
        build_model("gpt", {"d_model": 130, "n_head": 4})
    assert str(caught.value) == (
        "model 'gpt' could not be built: d_model (130) must be divisible by n_head (4)"
    )


def test_mlp_rejects_bad_hidden_widths() -> None:
    with pytest.raises(UserError, match="hidden widths must be positive integers"):
        build_model("mlp", {"hidden": [8, 0]})
