"""A served model's request checks and statistics, without a server: every malformed body is
one status and one line; counts and quantiles worked out by hand."""

import asyncio
import base64
import io
import json

import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image

from dlscale.data.pixels import ImageLayout
from dlscale.errors import UserError
from dlscale.infer.inputs import decode_images
from dlscale.serving.inputs import (
    MAX_BODY_BYTES,
    MAX_SAMPLES_PER_REQUEST,
    BadInput,
    parse_body,
)
from dlscale.serving.plain import PlainEngine
from dlscale.serving.routes import build_app
from dlscale.serving.stats import ServingStats, prometheus_text, quantile


class Model:
    """A stand-in for a Predictor: only what the checks read."""

    def __init__(self, input_shape, input_kind, num_classes=10, vocab_size=None):
        self.input_shape = input_shape
        self.input_kind = input_kind
        self.num_classes = num_classes
        self.vocab_size = vocab_size if vocab_size is not None else num_classes

    def images(self, files):
        decoded = []
        for file in files:
            try:
                image = Image.open(io.BytesIO(file))
                image.load()
            except OSError:
                raise UserError("Pillow cannot decode it") from None
            decoded.append(torch.zeros(self.input_shape))
        return torch.stack(decoded)


FEATURES = Model((2, 3), "features")
TOKENS = Model((4,), "tokens", num_classes=50)
# A token classifier (an LSTM on token npz): 3 classes over a vocabulary of 100 tokens.
TOKEN_CLASSIFIER = Model((4,), "tokens", num_classes=3, vocab_size=100)
IMAGES = Model((1, 2, 2), "image")


def status_of(body, model) -> tuple[int, str]:
    with pytest.raises(BadInput) as caught:
        parse_body(body, model)
    return caught.value.status, str(caught.value)


def test_arrays_become_one_batch_of_the_models_dtype():
    batch = parse_body({"inputs": [[[1, 2, 3], [4, 5, 6]], [[0, 0, 0], [0, 0, 0.5]]]}, FEATURES)
    assert batch.num_samples == 2 and batch.tensor.dtype == torch.float32
    assert batch.tensor[0].tolist() == [[1, 2, 3], [4, 5, 6]] and batch.tensor[1, 1, 2] == 0.5
    tokens = parse_body({"inputs": [[0, 1, 2, 49]]}, TOKENS).tensor
    assert tokens.dtype == torch.int64 and tokens.tolist() == [[0, 1, 2, 49]]


@pytest.mark.parametrize(
    ("body", "model", "status", "says"),
    [
        ([1, 2], FEATURES, 400, "JSON object"),
        ({"input": []}, FEATURES, 400, "JSON object"),
        ({"inputs": [], "x": 1}, FEATURES, 400, "unknown field(s) x"),
        ({"inputs": []}, FEATURES, 400, "non-empty list"),
        ({"inputs": [[[1, 2, 3]]]}, FEATURES, 422, "inputs[0]: shape (1, 3)"),
        ({"inputs": [[[1, 2, 3], [4, 5]]]}, FEATURES, 422, "not a rectangular array"),
        ({"inputs": [[[1, 2, "3"], [4, 5, 6]]]}, FEATURES, 422, "not a rectangular array"),
        ({"inputs": [[[1, 2, True], [4, 5, 6]]]}, FEATURES, 422, "not a rectangular array"),
        ({"inputs": [[[1, 2, 3], [4, 5, None]]]}, FEATURES, 422, "inputs[0]"),
        ({"inputs": [[0, 1, 2, 50]]}, TOKENS, 422, "token ids must lie in [0, 50)"),
        ({"inputs": [[0, 1, 2, -1]]}, TOKENS, 422, "token ids must lie in [0, 50)"),
        ({"inputs": [[0, 1, 2.5, 3]]}, TOKENS, 422, "whole numbers"),
        ({"inputs": ["AAAA"]}, TOKENS, 422, "base64 images sent to a model of tokens"),
        ({"inputs": ["AAAA", [[[0, 0], [0, 0]]]]}, IMAGES, 422, "mix of base64 images"),
        ({"inputs": ["@@"]}, IMAGES, 422, "inputs[0]: not base64"),
        ({"inputs": ["aGVsbG8="]}, IMAGES, 422, "Pillow cannot decode it"),
    ],
)
def test_each_bad_body_is_one_status_and_one_line(body, model, status, says):
    got_status, message = status_of(body, model)
    assert (got_status, "\n" in message) == (status, False)
    assert says in message


def test_nan_and_too_many_samples_are_refused():
    # JSON has no NaN, but Python's json module reads it: the check must not rely on JSON.
    assert status_of({"inputs": [[[1, 2, float("nan")], [4, 5, 6]]]}, FEATURES)[0] == 422
    sample = [[0, 0, 0], [0, 0, 0]]
    status, message = status_of({"inputs": [sample] * (MAX_SAMPLES_PER_REQUEST + 1)}, FEATURES)
    assert status == 413 and str(MAX_SAMPLES_PER_REQUEST) in message


def test_token_ids_are_checked_against_the_vocabulary_not_the_classes():
    tokens = parse_body({"inputs": [[0, 5, 50, 99]]}, TOKEN_CLASSIFIER).tensor
    assert tokens.tolist() == [[0, 5, 50, 99]]
    status, message = status_of({"inputs": [[0, 1, 2, 100]]}, TOKEN_CLASSIFIER)
    assert status == 422 and "[0, 100)" in message


def test_numbers_too_big_for_a_float_and_nesting_deeper_than_a_sample_are_refused():
    huge = 10**400  # a whole number JSON allows; float64 cannot hold it
    status, message = status_of({"inputs": [[[huge, 1, 1], [1, 1, 1]]]}, FEATURES)
    assert status == 422 and "inputs[0]" in message
    deep: list = [1]
    for _ in range(5000):  # far deeper than Python's recursion limit
        deep = [deep]
    status, message = status_of({"inputs": [deep]}, FEATURES)
    assert status == 422 and "inputs[0]" in message
    # A sample less deep than the model's is named by its shape, as before.
    assert "inputs[0]: shape (3,)" in status_of({"inputs": [[1, 2, 3]]}, FEATURES)[1]


class ImageModel(Model):
    """Decodes with the predictor's own decoder (Pillow's limits included)."""

    def images(self, files):
        return decode_images(ImageLayout("L", 2, 2, resize=False), files)


def test_hostile_bodies_through_the_routes_are_one_4xx_line_never_a_500():
    bomb = io.BytesIO()  # 200 M pixels in 0.2 MB: past Pillow's decompression-bomb limit
    Image.new("L", (20000, 10000)).save(bomb, format="PNG")
    bodies = [
        '{"inputs": ' + "[" * 100_000 + "]" * 100_000 + "}",  # nesting past the parser's limit
        '{"inputs": [[[' + "9" * 5000 + ", 1, 1], [1, 1, 1]]]}",  # past int's 4300 digits
        '{"inputs": [[[' + "9" * 400 + ", 1, 1], [1, 1, 1]]]}",  # past float64
        '{"inputs": ["' + base64.b64encode(bomb.getvalue()).decode() + '"]}',
    ]
    client = TestClient(
        build_app(PlainEngine(ImageModel((2, 3), "features"), {})),
        raise_server_exceptions=False,
    )
    for body in bodies[:3]:
        answer = client.post("/predict", content=body.encode())
        assert 400 <= answer.status_code < 500, (body[:40], answer.text)
        assert "\n" not in answer.json()["error"]
    client = TestClient(
        build_app(PlainEngine(ImageModel((1, 2, 2), "image"), {})),
        raise_server_exceptions=False,
    )
    answer = client.post("/predict", content=bodies[3].encode())
    assert answer.status_code == 422, answer.text
    assert "image 0" in answer.json()["error"]


def test_base64_images_reach_the_models_decoder():
    png = io.BytesIO()
    Image.new("L", (2, 2)).save(png, format="PNG")
    text = base64.b64encode(png.getvalue()).decode()
    assert parse_body({"inputs": [text, text]}, IMAGES).tensor.shape == (2, 1, 2, 2)


def test_nearest_rank_quantiles_by_hand():
    assert quantile([], 0.5) is None
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0  # rank ceil(0.5 × 4) = 2
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.9) == 4.0  # rank ceil(3.6) = 4
    hundred = [float(i) for i in range(1, 101)]
    assert quantile(hundred, 0.99) == 99.0 and quantile(hundred, 0.5) == 50.0


def test_stats_count_requests_samples_and_batches():
    stats = ServingStats()
    stats.record_batch(num_samples=5, latencies_s=[0.1, 0.3])  # two requests in one call
    stats.record_batch(num_samples=1, latencies_s=[0.2])
    stats.record_refusal(422)
    snapshot = stats.snapshot()
    assert snapshot["requests"] == 4 and snapshot["requests_by_status"] == {"200": 3, "422": 1}
    assert snapshot["samples"] == 6 and snapshot["batches"] == 2
    assert snapshot["batch_sizes"] == {"1": 1, "2": 1}
    assert snapshot["latency_s"] == {"p50": 0.2, "p90": 0.3, "p99": 0.3}
    text = prometheus_text(snapshot)
    assert 'dlscale_serve_requests_total{status="200"} 3' in text
    assert 'dlscale_serve_batches_total{requests="2"} 1' in text
    assert 'dlscale_serve_latency_seconds{quantile="0.5"} 0.2' in text
    assert "dlscale_serve_latency_seconds_count 3" in text


def test_an_image_of_another_size_is_refused_from_its_header_before_its_pixels_decode():
    """A run that did not resize takes one size: a bigger image (a small file can hold a huge
    one) is named from its header, so a request never makes the server decode it."""
    png = io.BytesIO()
    Image.new("L", (9, 9)).save(png, format="PNG")
    header_only = png.getvalue()[:41]  # signature, IHDR (9×9), the next chunk cut short
    text = base64.b64encode(header_only).decode()
    status, message = status_of({"inputs": [text]}, ImageModel((1, 2, 2), "image"))
    assert status == 422 and "image 0: image is 9×9 (H×W); this model takes 2×2" in message


def test_a_body_without_a_length_is_read_only_up_to_the_limit():
    """A chunked body declares no length: reading stops once it passes MAX_BODY_BYTES, so a
    client cannot make the server hold gigabytes before it is refused."""
    chunk = b" " * 2**20
    sent = []
    replies = []

    async def receive():
        sent.append(len(chunk))
        return {"type": "http.request", "body": chunk, "more_body": len(sent) < 1024}  # 1 GiB

    async def send(message):
        replies.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/predict",
        "raw_path": b"/predict",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"transfer-encoding", b"chunked")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    app = build_app(PlainEngine(FEATURES, {}))
    asyncio.run(app(scope, receive, send))
    assert replies[0]["status"] == 413
    assert "at most" in json.loads(replies[1]["body"])["error"]
    assert sum(sent) <= MAX_BODY_BYTES + len(chunk)  # one chunk past the limit, no more


class DivergedModel(Model):
    """A model whose second sample's output is not a number (softmax of NaN logits)."""

    def predict(self, x):
        from dlscale.infer.predictor import Prediction

        return Prediction([3, 0], [0.9, float("nan")], torch.zeros(2, 10))


def test_a_sample_whose_output_is_not_a_number_gets_no_class():
    """As `predict` gives no prediction for a non-finite output, the endpoint answers that
    sample with no class (argmax of NaN is a meaningless 0), saying why, and the others as usual."""
    client = TestClient(build_app(PlainEngine(DivergedModel((2,), "features"), {})))
    answer = client.post("/predict", json={"inputs": [[0.0, 1.0], [1.0, 0.0]]})
    assert answer.status_code == 200, answer.text
    first, second = answer.json()["predictions"]
    assert first == {"class": 3, "confidence": 0.9}
    assert second["class"] is None and second["confidence"] is None
    assert "not finite" in second["error"]


def test_remote_predict_prints_a_sample_with_no_class(tmp_path, monkeypatch):
    """`dlscale remote predict` printed the class with a number format: a sample answered with
    no class (its output not a number) was a TypeError traceback."""
    import contextlib
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from dlscale.cli import remote
    from dlscale.cli.main import app
    from dlscale.serving.routes import predictions

    answer = {
        "predictions": predictions(SimpleNamespace(classes=[3, 0], confidence=[0.9, float("nan")]))
    }
    server = SimpleNamespace(model=lambda *args, **kwargs: answer)
    monkeypatch.setattr(remote, "connect", lambda url: contextlib.nullcontext(server))
    body = tmp_path / "in.json"
    body.write_text('{"inputs": [[0.0, 1.0], [1.0, 0.0]]}')
    shown = CliRunner().invoke(
        app, ["remote", "predict", "job1", str(body), "--server", "http://x"]
    )
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[1].split() == ["0", "3", "0.9000"]
    assert lines[2].split()[:3] == ["1", "-", "-"] and "not finite" in lines[2]
