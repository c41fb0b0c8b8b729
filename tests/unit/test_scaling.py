"""Predictions on many devices against hand-computed values, and the links and prices behind."""

import pytest
import torch
from torch import nn

from dlscale.errors import UserError
from dlscale.hardware.catalogue import load_catalogue
from dlscale.hardware.device import Hardware
from dlscale.hardware.links import Link, device_link, load_links
from dlscale.profiler.collectives import (
    BUCKET_BYTES,
    Framework,
    allreduce_s,
    bucket_allreduce_s,
    expected_max_normal,
    overlapped_allreduce,
    ring_allreduce_s,
    skew_s,
)
from dlscale.profiler.request import ProfileRequest, ScalingRequest, parse_duration
from dlscale.profiler.roofline import predict
from dlscale.profiler.scaling import closed_loop_cycle_s, gradient_buckets, predict_scaling
from dlscale.profiler.scaling_report import Costed, deadline_pick
from dlscale.profiler.trace import trace_step
from tests.unit.test_advice import device


def gpu(**changes) -> Hardware:
    """A test GPU (test_advice's) on a PCIe 3.0 host link."""
    return device(
        **{
            "peak_flops": {"fp32": 10e12},
            "host_link": "PCIe 3.0 x16",
            "host_link_bytes_per_s": 15.75e9,
            **changes,
        }
    )


LINK = Link("test", "test link", "pcie", bytes_per_s=10e9, latency_s=5e-6, efficiency=1.0)
DDP_ONE = ScalingRequest((1,), strategies=("ddp",))


def mlp_trace(batch=64, width=512, depth=4):
    def build():
        layers = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(width, 10))

    return trace_step(build, torch.zeros(width), batch, "fp32", torch.optim.SGD, "sgd")


def test_ring_allreduce_by_hand():
    # 4 ranks, 100 MB: 2·3/4 of the bytes (150 MB) at 10 GB/s = 15 ms, plus 6 hops of 5 µs.
    assert ring_allreduce_s(100e6, 4, LINK) == pytest.approx(0.015 + 6 * 5e-6)
    assert ring_allreduce_s(100e6, 1, LINK) == 0.0
    half = Link("h", "h", "pcie", 10e9, 5e-6, efficiency=0.5)
    assert ring_allreduce_s(100e6, 4, half) == pytest.approx(0.030 + 6 * 5e-6)


def test_buckets_fill_in_reverse_and_overlap_hides_all_but_the_tail():
    trace = mlp_trace(width=2048, depth=4)  # 4 × 16.8 MB of weight gradients
    prediction = predict(trace, gpu())
    buckets = gradient_buckets(trace, prediction)
    assert sum(nbytes for nbytes, _ in buckets) == trace.trainable_params * 4
    assert all(nbytes >= BUCKET_BYTES for nbytes, _ in buckets[:-1])
    ready = [t for _, t in buckets]
    assert ready == sorted(ready) and ready[-1] == pytest.approx(prediction.backward_s)
    # Buckets ready at 1 s and 2 s of a 2 s backward, each 0.5 s to reduce: only the last shows.
    exposed, total = overlapped_allreduce([(1, 1.0), (1, 2.0)], 2.0, lambda _: 0.5)
    assert (exposed, total) == (0.5, 1.0)
    # A slow link queues them: the second starts when the first ends (1 + 3 + 3 = 7 s).
    exposed, total = overlapped_allreduce([(1, 1.0), (1, 2.0)], 2.0, lambda _: 3.0)
    assert (exposed, total) == (5.0, 6.0)


def test_ddp_one_device_is_the_single_step_and_ddps_own_work_and_more_never_beat_linear():
    trace = mlp_trace()
    device = gpu()
    points = predict_scaling(trace, device, ScalingRequest((1, 2, 4, 8), strategies=("ddp",)), LINK)
    one = points[0]
    single = predict(trace, device).step_s
    # DDP's reducer, by hand: 5 linear layers' 10 tensors copied into their bucket (the
    # gradients are its views: nothing back) and one bucket divided, launched at the device's
    # per-op cost (no dispatch measured); two passes over the 4.2 MB of gradients, read and
    # written, at its memory bandwidth (no copies timed); on a GPU the launches run ahead of the
    # copies: the longer counts; no fixed cost (none measured).
    grads = trace.trainable_params * 4
    bandwidth = device.memory_bandwidth_bytes_per_s * device.efficiency_memory
    reducer = max((10 + 1) * device.overhead_per_op_s, 2 * 2 * grads / bandwidth)
    assert one.detail["reducer_s"] == pytest.approx(reducer) and one.detail["buckets"] == 1
    assert one.step_s == pytest.approx(single + reducer) and one.comm_s == 0
    assert one.efficiency == pytest.approx(single / (single + reducer))
    # A framework without torch's reducer (TensorFlow's, Horovod's): the single step, exactly.
    (bare,) = predict_scaling(trace, device, DDP_ONE, LINK, framework=Framework("no reducer"))
    assert bare.step_s == pytest.approx(single) and bare.efficiency == pytest.approx(1.0)
    efficiencies = [p.efficiency for p in points]
    assert efficiencies == sorted(efficiencies, reverse=True) and max(efficiencies) <= 1 + 1e-9
    assert all(p.step_s >= p.compute_s for p in points)
    assert [p.global_batch for p in points] == [64, 128, 256, 512]
    slow = Link("slow", "slow", "ethernet", 1e6, 1e-3, 1.0)
    (bound,) = predict_scaling(trace, device, ScalingRequest((8,), strategies=("ddp",)), slow)
    assert bound.bound == "link" and bound.efficiency < 0.1
    measured = predict_scaling(trace, device, DDP_ONE, LINK, single_step_s=1.0)
    assert measured[0].step_s == pytest.approx(1.0 + reducer)  # it replaces the roofline's


def test_pipeline_bubble_and_ps_servers():
    trace = mlp_trace(depth=6)
    (pipe,) = predict_scaling(trace, gpu(), ScalingRequest((4,), strategies=("pipeline",)), LINK)
    stages, micro = pipe.detail["stages"], pipe.detail["microbatches"]
    assert (stages, micro) == (4, 16)
    assert pipe.detail["bubble"] == pytest.approx(3 / 19)  # (S − 1) / (M + S − 1)
    assert pipe.global_batch == 64  # a pipeline splits one batch
    assert not predict_scaling(trace, gpu(), ScalingRequest((1,), strategies=("pipeline",)), LINK)
    one, many = (
        predict_scaling(
            trace, gpu(), ScalingRequest((8,), strategies=("ps",), ps_servers=servers), LINK
        )[0]
        for servers in (1, 8)
    )
    # 8 servers take a push's 8 shards side by side: each one's link and update 8 times shorter.
    assert one.detail["server_link_s"] == pytest.approx(8 * many.detail["server_link_s"])
    assert one.detail["server_update_s"] == pytest.approx(8 * many.detail["server_update_s"])
    grads = trace.trainable_params * 4
    assert one.detail["worker_s"] == pytest.approx(2 * grads / 10e9)  # gradients out, weights in
    slow = Link("slow", "slow", "ethernet", 1e7, 0.0, 1.0)
    (bound,) = predict_scaling(trace, gpu(), ScalingRequest((8,), strategies=("ps",)), slow)
    assert bound.bound == "server"
    (hybrid,) = predict_scaling(trace, gpu(), ScalingRequest((8,), strategies=("hybrid",)), LINK)
    assert hybrid.detail["replicas"] == 4 and hybrid.global_batch == 4 * 64


def test_links_devices_and_prices_carry_sources():
    links = load_links()
    assert {"pcie3-x16", "pcie4-x16", "nvlink1", "nvlink4", "ib-hdr", "eth-100g"} <= set(links)
    assert all(link.sources for link in links.values())
    catalogue = load_catalogue()
    p100 = catalogue["p100-sxm2-16gb"]
    assert device_link(p100, None, links).name == "nvlink1"  # its own interconnect by default
    assert device_link(p100, "pcie", links).name == "pcie3-x16"
    assert device_link(catalogue["l4"], None, links).name == "pcie4-x16"  # no NVLink: PCIe
    mi50 = device_link(catalogue["mi50"], None, links)  # built from its own entry
    assert mi50.bytes_per_s == pytest.approx(100e9)
    with pytest.raises(UserError, match="'l4' has no NVLink"):
        device_link(catalogue["l4"], "nvlink", links)
    with pytest.raises(UserError, match="unknown link 'warp'; known: nvlink, pcie"):
        device_link(p100, "warp", links)
    priced = [hw for hw in catalogue.values() if hw.price_per_hour is not None]
    assert len(priced) >= 10
    assert all(hw.price_source.startswith("https://") and hw.price_date for hw in priced)


def test_a_user_entry_overrides_a_price(tmp_path, monkeypatch):
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path))
    (tmp_path / "hardware").mkdir()
    text = (load_catalogue()["l4"].name, 0.71)
    (tmp_path / "hardware" / "mine.toml").write_text(
        '[[device]]\nname = "l4"\ndisplay_name = "L4 (ours)"\nkind = "gpu"\nvendor = "NVIDIA"\n'
        "memory_gib = 24\nmemory_bandwidth_gbs = 300\nprice_per_hour = 0.71\n"
        'price_source = "our invoice"\nprice_date = "2026-11"\n[device.peak_tflops]\nfp32 = 30\n'
    )
    assert load_catalogue()[text[0]].price_per_hour == text[1]


def test_deadline_picks_the_cheapest_run_that_meets_it():
    def row(devices, run_s, cost, fits=True):
        point = predict_scaling(mlp_trace(), gpu(), DDP_ONE, LINK)[0]
        from dataclasses import replace

        return Costed(replace(point, devices=devices, fits=fits), 1, run_s, 1, cost, 1, 1)

    rows = [row(1, 10_000, 5.0), row(2, 5_000, 6.0), row(4, 2_600, 7.0), row(8, 1_000, 4.0, False)]
    assert deadline_pick(rows, 6_000).point.devices == 2  # 1 device is too slow
    assert deadline_pick(rows, 3_000).point.devices == 4  # 8 would be cheaper but do not fit
    assert deadline_pick(rows, 500) is None
    assert parse_duration("1.5h") == 5400 and parse_duration("90s") == 90
    with pytest.raises(UserError, match="--deadline must be a positive duration"):
        parse_duration("soon")


def test_the_requests_are_refused_when_made_before_any_trace():
    """The checks run once, in the requests: a bad option costs no model trace."""
    for bad, message in [
        ({"strategies": ("ddp",)}, "need --devices"),
        ({"devices": (2,), "epochs": 0}, "--epochs must be a positive number"),
        ({"devices": (2,), "deadline": "soon"}, "--deadline must be a positive duration"),
        ({"devices": (0, 2)}, r"--devices must be positive counts, e.g. 1,2,4,8 \(got \[0, 2\]\)"),
        ({"devices": (3,), "nodes": 2, "network": "ib-hdr"}, r"--devices \[3\]"),
        ({"devices": (2,), "strategies": ("zz",)}, "--strategies: unknown 'zz'"),
        ({"devices": (2,), "nodes": 2}, "--nodes above 1 needs --network"),
        # Options that only the scaling table reads are refused without it, not ignored.
        ({"epochs": 7}, "--epochs, .*need --devices"),
        ({"strategies": ()}, "need --devices"),
        ({"pipeline_schedule": "1f1b"}, "--pipeline-schedule and --sync-batchnorm need --devices"),
        ({"devices": (2,), "network": "ib-ndr"}, "--network is the link between nodes"),
        ({"devices": (2,), "nodes": 0}, "--nodes must be at least 1 \\(got 0\\)"),
        ({"devices": (2, 4, 2)}, "--devices: 2 is given twice"),
        ({"devices": (2,), "strategies": ("ddp", "ps", "ddp")}, "--strategies: ddp is given twice"),
        ({"devices": (2,), "strategies": ()}, "--strategies: no strategy named"),
    ]:
        with pytest.raises(UserError, match=message):
            ScalingRequest(**bad)
    assert ScalingRequest((2,), deadline="2h").deadline_s == 7200
    assert ScalingRequest((2,)).strategy_names == ("ddp", "pipeline", "ps", "hybrid", "tensor")
    with pytest.raises(UserError, match="--precision int8 is for inference"):
        ProfileRequest("mlp", precision="int8")
    with pytest.raises(UserError, match="--optimizer must be sgd, momentum, adam or adamw"):
        ProfileRequest("mlp", optimizer="lion")
    with pytest.raises(UserError, match="--hardware: a100-40gb is given twice"):
        ProfileRequest("mlp", hardware=("a100-40gb", "h100-sxm", "a100-40gb"))
    with pytest.raises(UserError, match="--hardware: no device named"):
        ProfileRequest("mlp", hardware=())
    with pytest.raises(UserError, match="--batch 99999999999999999999 is more samples than"):
        ProfileRequest("mlp", batch_size=99999999999999999999)


def test_the_local_link_fit_recovers_latency_and_bandwidth():
    from dlscale.bench.link import fit_link

    latency, bandwidth = 2e-4, 3e9  # two ranks: 2 hops of latency, each rank sends the bytes
    times = {size: 2 * latency + size / bandwidth for size in (4096, 2**20, 2**25)}
    fitted = fit_link(times)
    assert fitted["latency_s"] == pytest.approx(latency)
    assert fitted["bytes_per_s"] == pytest.approx(bandwidth)
    assert fitted["fit_max_error"] == pytest.approx(0, abs=1e-9)


def test_a_pipeline_never_has_more_microbatches_than_samples():
    """Found predicting a 13B GPT at batch 4 on 8 devices: 32 microbatches of an eighth of a
    sample each made the bubble 18% instead of (8 − 1) / (4 + 8 − 1) = 64%."""
    (pipe,) = predict_scaling(
        mlp_trace(batch=4, depth=8), gpu(), ScalingRequest((8,), strategies=("pipeline",)), LINK
    )
    assert pipe.detail["microbatches"] == 4
    assert pipe.detail["bubble"] == pytest.approx(7 / 11)


def test_tensor_parallel_divides_the_split_layers_and_pays_its_collectives():
    from dlscale.profiler.tensor_plan import plans_for

    def build():
        return nn.Sequential(
            nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512), nn.ReLU(), nn.Linear(512, 10)
        )

    trace = trace_step(build, torch.zeros(512), 64, "fp32", torch.optim.SGD, "sgd")
    plans = plans_for(build, torch.zeros(512), trace.params)
    assert plans(2).styles == {"0": "colwise", "2": "rowwise"}
    single = predict(trace, gpu())
    (two,) = predict_scaling(
        trace, gpu(), ScalingRequest((2,), strategies=("tensor",)), LINK, tensor_plans=plans
    )
    # One all-reduce in forward: the row layer's (64, 512) fp32 output; no backward one (the
    # column layer's input is data).
    assert two.detail["collectives"] == {"all_reduce": {"count": 1, "payload_bytes": 64 * 512 * 4}}
    assert two.comm_s == pytest.approx(ring_allreduce_s(64 * 512 * 4, 2, LINK))
    split = {"0", "1", "2"}  # the pair and the ReLU between them (it works on split features)
    times = {layer.name: layer.seconds for layer in single.layers}
    halved = sum(times[name] for name in split) / 2
    assert two.compute_s < single.step_s - halved * 0.99  # the split layers' time halved
    assert two.global_batch == 64 and two.detail["params_per_device"] < trace.params
    # Without a plan for the count (an indivisible layer), no row.
    assert not predict_scaling(
        trace, gpu(), ScalingRequest((3,), strategies=("tensor",)), LINK, tensor_plans=plans
    )


def test_for_a_model_too_big_for_one_device_the_faster_split_is_named():
    """Batch 2 on 4 devices: a pipeline gets 2 microbatches (bubble 3/5); tensor parallel over a
    fast link splits each wide layer instead, and wins."""
    from dlscale.profiler.memory import training_memory
    from dlscale.profiler.scaling_report import ScalingReport, costed, split_choice
    from dlscale.profiler.tensor_plan import plans_for

    def build():
        return nn.Sequential(
            nn.Linear(4096, 8192),
            nn.ReLU(),
            nn.Linear(8192, 4096),
            nn.ReLU(),
            nn.Linear(4096, 8192),
            nn.ReLU(),
            nn.Linear(8192, 4096),
        )

    trace = trace_step(build, torch.zeros(4096), 2, "fp32", torch.optim.SGD, "sgd")
    whole = training_memory(trace).total_bytes
    small = gpu(memory_bytes=int(whole / 2))  # a quarter of the model fits, the whole does not
    fast = Link("fast", "fast", "nvlink", 300e9, 3e-6, 1.0)
    plans = plans_for(build, torch.zeros(4096), trace.params)
    request = ScalingRequest((4,), strategies=("pipeline", "tensor"))
    points = predict_scaling(trace, small, request, fast, tensor_plans=plans)
    report = ScalingReport(small, fast, [costed(p, small, None, 1) for p in points], 1, "default")
    report.fits_one_device = False
    (line,) = split_choice(report)
    assert "on 4, tensor parallel is the better split" in line and "bubble 60%" in line
    report.fits_one_device = True  # a model that fits needs no split: no advice
    assert split_choice(report) == []


# ------------------------------------------------------- communication's costs, worked by hand

COSTLY = Link("costly", "costly", "pcie", 10e9, 5e-6, 1.0, launch_s=1e-3, contention=2.0)


def test_each_bucket_pays_its_launch_the_framework_wait_and_the_contention():
    # 4 ranks, 10 MB: ring 1.5 × 10 MB / 10 GB/s = 1.5 ms + 6 hops × 5 µs = 1.53 ms; + 1 ms
    # launch = 2.53 ms alone; × 2 contention = 5.06 ms; + 0.5 ms framework wait = 5.56 ms.
    alone, _ = allreduce_s(10e6, 4, COSTLY, 1, None)
    assert alone == pytest.approx(2.53e-3)
    horovod_like = Framework("test", bucket_s=0.5e-3)
    seconds, part = bucket_allreduce_s(10e6, 4, COSTLY, 1, None, horovod_like)
    assert (seconds, part) == (pytest.approx(5.56e-3), "link")
    assert bucket_allreduce_s(10e6, 1, COSTLY, 1, None, horovod_like)[0] == 0.0  # one device
    # Three buckets, none hidden (overlap 0): the step shows 3 × 5.56 ms.
    buckets = [(10e6, 0.0), (10e6, 0.0), (10e6, 0.0)]

    def reduce(nbytes):
        return bucket_allreduce_s(nbytes, 4, COSTLY, 1, None, horovod_like)[0]

    exposed, total = overlapped_allreduce(buckets, 1.0, reduce, overlap=0.0)
    assert exposed == total == pytest.approx(3 * 5.56e-3)


def test_overlap_caps_what_the_timeline_hides():
    # Buckets ready at 1 s and 2 s of a 2 s backward, 0.5 s each: the timeline hides 0.5 s of
    # 1 s; with overlap 0.25 only 0.25 s counts as hidden, 0.75 s is exposed.
    exposed, total = overlapped_allreduce([(1, 1.0), (1, 2.0)], 2.0, lambda _: 0.5, overlap=0.25)
    assert (exposed, total) == (0.75, 1.0)
    exposed, _ = overlapped_allreduce([(1, 1.0), (1, 2.0)], 2.0, lambda _: 0.5, overlap=1.0)
    assert exposed == 0.5  # the timeline's own limit: the last bucket cannot hide


def test_skew_is_zero_for_one_device_and_grows_with_the_slowest_of_n():
    # Blom: Φ⁻¹((N − 0.375) / (N + 0.25)); N = 2: Φ⁻¹(0.7222) = 0.589 (exact E[max] 0.564);
    # N = 8: Φ⁻¹(0.9242) = 1.434; N = 512: Φ⁻¹(0.99878) = 3.03.
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(0.589, abs=1e-3)
    assert expected_max_normal(8) == pytest.approx(1.434, abs=1e-3)
    assert expected_max_normal(512) == pytest.approx(3.03, abs=1e-2)
    # 1% cv of a 1 s step on 8 devices: the slowest is 14.3 ms late.
    assert skew_s(1.0, 0.01, 8) == pytest.approx(0.01434, abs=1e-5)
    trace, device = mlp_trace(), gpu()
    shaky = Framework("shaky", step_cv=0.1)
    one, eight = predict_scaling(
        trace, device, ScalingRequest((1, 8), strategies=("ddp",)), LINK, framework=shaky
    )
    assert one.detail["skew_s"] == 0.0 and one.step_s == pytest.approx(one.compute_s)
    step = predict(trace, device).step_s
    assert eight.detail["skew_s"] == pytest.approx(0.1 * step * expected_max_normal(8))
    assert eight.step_s == pytest.approx(eight.compute_s + eight.comm_s + eight.detail["skew_s"])


def test_across_nodes_hierarchical_and_flat_rings_by_hand():
    link = Link("in", "in", "nvlink", 10e9, 5e-6, 1.0)
    network = Link("net", "net", "infiniband", 1e9, 10e-6, 1.0)
    # 8 devices on 2 nodes, 40 MB. Hierarchical: within a node, a ring of 4: 6/4 × 40 MB /
    # 10 GB/s = 6 ms + 6 × 5 µs; between, each device's 10 MB share over its port in a ring of
    # 2: 2/2 × 10 MB / 1 GB/s = 10 ms + 2 × 10 µs. 16.05 ms.
    seconds, part = allreduce_s(40e6, 8, link, 2, network)
    assert (seconds, part) == (pytest.approx(16.05e-3), "network")
    # Flat: one ring of 8 at its slowest edge, a node's port (4 devices × 1 GB/s = 4 GB/s):
    # 14/8 × 40 MB / 4 GB/s = 17.5 ms; 14 hops, 2 leaving a node: (12 × 5 + 2 × 10) µs × 1.9 =
    # 152 µs. 17.652 ms.
    seconds, _ = allreduce_s(40e6, 8, link, 2, network, hierarchical=False)
    assert seconds == pytest.approx(17.652e-3)


def test_closed_loop_by_hand():
    # One customer never waits: 1 s on its own + 0.5 + 0.25 at the stations.
    assert closed_loop_cycle_s(1.0, [0.5, 0.25], 1) == pytest.approx(1.75)
    # Two: each finds the other at a station for its share of the first one's cycle
    # (queue 0.5 / 1.75 and 0.25 / 1.75), so waits that share of a service there.
    two = 1.0 + 0.5 * (1 + 0.5 / 1.75) + 0.25 * (1 + 0.25 / 1.75)
    assert closed_loop_cycle_s(1.0, [0.5, 0.25], 2) == pytest.approx(two)
    # Many: the busiest station bounds the throughput (one customer per 0.5 s).
    assert 100 / closed_loop_cycle_s(1.0, [0.5, 0.25], 100) == pytest.approx(2.0, rel=1e-3)
    assert closed_loop_cycle_s(1.0, [], 5) == 1.0  # nothing shared: nobody waits


def test_async_ps_workers_queue_at_their_servers():
    """dlscale's async ps by hand: a step with no other worker is compute, the gradients out,
    the server's update, the weights back and four messages a server; more workers queue at the
    server (its link in, its update, its link out) as the closed loop says, and the servers' busiest
    part bounds the throughput."""
    trace, device = mlp_trace(depth=6), gpu()
    prediction = predict(trace, device)
    grads = trace.trainable_params * 4
    transfer = grads / 10e9
    update = prediction.optimizer_s
    compute = prediction.step_s - update
    for servers in (1, 4):
        messages = 4 * servers * 5e-6  # request, gradients, reply, weights: 5 µs each, a server
        request = ScalingRequest((1, 2, 8), strategies=("ps",), ps_servers=servers)
        one, two, eight = predict_scaling(trace, device, request, LINK)
        assert one.step_s == pytest.approx(compute + 2 * transfer + update / servers + messages)
        assert one.detail["waiting_s"] == pytest.approx(0.0, abs=1e-15)
        stations = [transfer / servers, update / servers, transfer / servers]
        own = 2 * (transfer - transfer / servers)
        for point, count in ((two, 2), (eight, 8)):
            think = compute + messages + own
            assert point.step_s == pytest.approx(closed_loop_cycle_s(think, stations, count))
            assert point.samples_per_s == pytest.approx(count * 64 / point.step_s)
            assert point.detail["waiting_s"] > 0
        assert one.step_s < two.step_s < eight.step_s  # more workers, longer queues
        # Bound by the longest part of a step: this small model's compute is shorter than its
        # gradients' and weights' 2 × 0.63 ms; one server serves them all, four a quarter each
        # while the worker's own link carries the rest.
        parts = {
            "compute": compute,
            "server": sum(stations),
            "link": own + messages,
        }
        assert one.bound == max(parts, key=parts.get) == ("server" if servers == 1 else "link")
    slow = Link("slow", "slow", "ethernet", 1e7, 0.0, 1.0)  # the server's link saturates
    (bound,) = predict_scaling(trace, device, ScalingRequest((512,), strategies=("ps",)), slow)
    assert bound.bound == "server"
    assert bound.detail["server_busy"] == pytest.approx(1.0, rel=0.01)
    busiest = max(grads / 1e7, update)
    assert bound.samples_per_s == pytest.approx(64 / busiest, rel=0.01)  # 64 samples a push


def test_a_pipeline_pays_a_fixed_cost_per_microbatch_send():
    trace = mlp_trace(depth=6)
    (pipe,) = predict_scaling(trace, gpu(), ScalingRequest((4,), strategies=("pipeline",)), COSTLY)
    # 4 stages, 16 microbatches: 19 slots, each sending forward and back at (5 µs + 1 ms).
    assert pipe.detail["microbatch_overhead_s"] == pytest.approx(19 * 2 * (5e-6 + 1e-3))


def test_the_report_says_where_the_time_goes():
    from dlscale.profiler.scaling_report import where_time_goes

    request = ScalingRequest((1, 8), strategies=("ddp", "ps", "pipeline", "hybrid"))
    points = predict_scaling(mlp_trace(depth=6), gpu(), request, COSTLY)
    lines = where_time_goes(points)
    # ps on one device still talks to its server (and the server steps the optimizer): its
    # comm column is not zero, so its terms are listed; ddp on one sends nothing, but DDP's
    # own work still costs its step.
    assert [line.split(":")[0] for line in lines] == [
        "ddp × 1",
        "ps × 1",
        "ddp × 8",
        "ps × 8",
        "pipeline × 8",
        "hybrid × 8",
    ]
    alone, ddp = lines[0], lines[2]
    assert "no all-reduce on one device; DDP's own work" in alone
    assert "1 ms fixed each, contention ×2.00" in ddp and "skew" in ddp
    assert "DDP's own work" in ddp
    # A framework without torch's reducer: ddp on one device has nothing to list.
    bare = predict_scaling(mlp_trace(depth=6), gpu(), request, COSTLY, framework=Framework("tf"))
    assert [line.split(":")[0] for line in where_time_goes(bare)][:2] == ["ps × 1", "ddp × 8"]


@pytest.mark.parametrize("depth", [1, 4, 7])
def test_a_bucket_ready_at_the_end_of_backward_hides_nothing(depth):
    # One bucket (a few MiB < 25 MiB): its gradients are all ready when backward ends, so none
    # of its all-reduce hides, exactly (no float residue from summing the layers twice).
    request = ScalingRequest((8,), strategies=("ddp",))
    (point,) = predict_scaling(mlp_trace(depth=depth), gpu(), request, LINK)
    assert point.detail["buckets"] == 1
    assert point.detail["hidden_s"] == 0.0
    assert point.detail["exposed_s"] == point.detail["allreduce_s"]


def test_ddp_with_accumulation_reduces_once_per_optimizer_step():
    """K = 4 micro-batches of 64 on 4 devices, by hand from one device's predicted parts: the
    step adds 3 × (forward + backward + copy in), the update and per-step cost stay once, and
    the exposed all-reduce is the K = 1 step's (one per optimizer step, behind the last
    backward only). No skew (cv 0), so step = compute + exposed."""
    trace, device = mlp_trace(width=2048, depth=4), gpu()
    steady = Framework("steady", step_cv=0.0)
    request = ScalingRequest((1, 4), strategies=("ddp", "pipeline", "ps"))
    plain = predict_scaling(trace, device, request, LINK, framework=steady)
    one, four = predict_scaling(trace, device, request, LINK, framework=steady, accumulate=4)
    assert [p.strategy for p in (one, four)] == ["ddp", "ddp"]  # the others refuse K
    p = predict(trace, device)
    micro = p.forward_s + p.backward_s + p.h2d_s
    assert one.step_s == pytest.approx(p.step_s + 3 * micro)
    (plain_four,) = [q for q in plain if q.strategy == "ddp" and q.devices == 4]
    assert four.detail["allreduce_s"] == pytest.approx(plain_four.detail["allreduce_s"])
    assert four.comm_s == pytest.approx(plain_four.comm_s) and four.comm_s > 0
    assert four.step_s == pytest.approx(p.step_s + 3 * micro + plain_four.comm_s)
    assert (four.global_batch, four.detail["accumulate"]) == (4 * 4 * 64, 4)
    assert four.samples_per_s == pytest.approx(4 * 4 * 64 / four.step_s)
    # Efficiency against one device that accumulates too: the same exposed share, amortised.
    assert one.efficiency == pytest.approx(1.0)
    assert four.efficiency == pytest.approx(one.step_s / four.step_s)
    assert four.efficiency > plain_four.efficiency


def test_a_2bw_pipeline_has_no_fill_per_step_and_holds_two_weight_snapshots():
    trace = mlp_trace(depth=6)  # six Linear(512, 512) of 262,656 parameters, then Linear(512, 10)
    gpipe, async_ = (
        predict_scaling(
            trace,
            gpu(),
            ScalingRequest((4,), strategies=("pipeline",), pipeline_schedule=schedule),
            LINK,
        )[0]
        for schedule in ("gpipe", "2bw")
    )
    assert gpipe.detail["bubble"] == pytest.approx(3 / 19) and async_.detail["bubble"] == 0
    # 16 microbatches: gpipe's step is 16 + 4 − 1 = 19 slots of the slowest stage's microbatch,
    # 2bw's 16 (it never flushes); each slot also sends over the link.
    slot = max(gpipe.detail["stage_s"]) / 16
    assert gpipe.compute_s - async_.compute_s == pytest.approx(3 * slot)
    assert async_.comm_s == pytest.approx(gpipe.comm_s * 16 / 19)
    # The costliest stage holds two of the 512 × 512 layers, 525,312 parameters: two fp32
    # snapshots of them are 2 × 4 × 525,312 = 4,202,496 bytes more.
    more = async_.detail["stage_memory_bytes"] - gpipe.detail["stage_memory_bytes"]
    assert more == 4_202_496
    with pytest.raises(UserError, match="--pipeline-schedule: unknown 'pipedream'"):
        ScalingRequest((4,), pipeline_schedule="pipedream")


def test_tensor_parallel_with_accumulation_sends_each_micro_batchs_collectives():
    """K = 3 micro-batches of 64 on a degree-2 group, from the K = 1 point's parts: compute
    adds 2 micro-batches (the split layers' halved time, the others whole, the copy in), the
    update once; every micro-batch sends the plan's all-reduce (3 × the K = 1 step's); the
    device holds the step's 3 batches of inputs."""
    from dlscale.profiler.memory import training_memory
    from dlscale.profiler.tensor_plan import plans_for

    def build():
        return nn.Sequential(
            nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512), nn.ReLU(), nn.Linear(512, 10)
        )

    trace = trace_step(build, torch.zeros(512), 64, "fp32", torch.optim.SGD, "sgd")
    plans = plans_for(build, torch.zeros(512), trace.params)
    request = ScalingRequest((2,), strategies=("tensor", "pipeline"))
    plain = predict_scaling(trace, gpu(), request, LINK, tensor_plans=plans)
    (two,) = [p for p in plain if p.strategy == "tensor"]
    (three,) = predict_scaling(trace, gpu(), request, LINK, tensor_plans=plans, accumulate=3)
    assert three.strategy == "tensor"  # pipeline refuses K
    single = predict(trace, gpu())
    split = {"0", "1", "2"}
    micro = sum(t.seconds / 2 if t.name in split else t.seconds for t in single.layers)
    micro += single.h2d_s
    assert three.compute_s == pytest.approx(two.compute_s + 2 * micro)
    assert three.comm_s == pytest.approx(3 * two.comm_s)
    assert three.comm_s == pytest.approx(3 * ring_allreduce_s(64 * 512 * 4, 2, LINK))
    assert three.step_s == pytest.approx(three.compute_s + three.comm_s)
    assert (three.global_batch, three.detail["accumulate"]) == (192, 3)
    assert three.samples_per_s == pytest.approx(192 / three.step_s)
    batch_bytes = training_memory(trace).batch_bytes
    held = two.detail["memory_per_device_bytes"] + 2 * batch_bytes
    assert three.detail["memory_per_device_bytes"] == pytest.approx(held)


def test_local_processes_beyond_the_machines_cores_share_them():
    """`local` measured at 1 thread on 2 cores: 2 ddp workers have a core each, 4 share them
    and each computes twice as slowly (DDP's own work too); a catalogue CPU's devices are
    devices, never crowded; `threads_per_device` (what `dlscale scale` gives each worker) counts
    in place of the calibration's."""
    from dlscale.profiler.scaling import cores_shared
    from tests.toy_hardware import toy_hardware

    measured = {"threads": 1, "load": {"cores": 2}}
    local = toy_hardware(name="local", measured=measured)
    assert [cores_shared(local, n) for n in (1, 2, 4, 8)] == [1.0, 1.0, 2.0, 4.0]
    assert cores_shared(local, 2, threads=2) == 2.0
    assert cores_shared(toy_hardware(name="local"), 8) == 1.0  # no cores recorded: a catalogue's
    assert cores_shared(gpu(measured=measured), 8) == 1.0  # a GPU's devices are devices
    trace = mlp_trace(depth=2)
    request = ScalingRequest((2, 4), strategies=("ddp", "ps"))
    fast = Link("fast", "fast", "loopback", 1e15, 0.0, 1.0)
    points = {(p.strategy, p.devices): p for p in predict_scaling(trace, local, request, fast)}
    two, four = points["ddp", 2], points["ddp", 4]
    assert four.compute_s == pytest.approx(2 * two.compute_s)
    assert four.detail["reducer_s"] == pytest.approx(2 * two.detail["reducer_s"])
    assert points["ps", 4].efficiency < points["ps", 2].efficiency / 1.9
    alone = predict_scaling(trace, local, request, fast, threads_per_device=1)
    assert [p.compute_s for p in alone] == [p.compute_s for p in points.values()]
