"""The bench verbs: measure this machine and run the field's classic experiments; their outputs
(JSON and PNG) and the `local` hardware entry a machine measurement becomes."""

from __future__ import annotations

from pathlib import Path

from dlscale.api import train
from dlscale.bench.batch import DEFAULT_BATCHES
from dlscale.bench.experiment_records import CompareResult, ScaleResult
from dlscale.bench.io_verdict import NOISY_SPREAD
from dlscale.bench.loader import DEFAULT_STEPS as DEFAULT_LOADER_STEPS
from dlscale.bench.precision import LATENCY_BATCH
from dlscale.errors import UserError
from dlscale.hardware import Hardware
from dlscale.jobspec import StoredData, load_spec
from dlscale.train.run_folder import new_run_dir
from dlscale.train.run_folder import output_dir as made_output_dir


def bench_machine(quick: bool = False, device: str = "auto", threads: int | None = None) -> dict:
    """Matmul FLOP/s, memory bandwidth, host link and per-op overhead of this machine, with
    `threads` intra-op threads (None: torch's default): what a spec's `threads` trains with, so
    that `local` predicts such a run (the `threads` it records says which)."""
    from dlscale.bench.machine import run_machine_bench
    from dlscale.train.threads import intra_op_threads

    with intra_op_threads(threads):  # a count under 1 is a UserError, before anything runs
        return run_machine_bench(quick=quick, device=device)


def check_machine_options(device: str = "auto", threads: int | None = None) -> None:
    """Before `bench_machine` runs: a device it cannot measure or a thread count under 1 is
    one line now, before anything says it is measuring."""
    from dlscale.bench.machine import bench_device
    from dlscale.train.threads import check_threads

    check_threads(threads)
    bench_device(device)


def worse_than_saved(result: dict) -> str | None:
    """Why this measurement is worse than the saved `local` entry (None: not worse, or none
    saved): a worse one never replaces a better one without --force."""
    from dlscale.bench.machine import measured_tables
    from dlscale.bench.plausible import worse
    from dlscale.hardware.catalogue import get_hardware, local_entry_path
    from dlscale.hardware.trust import unreliable

    if not local_entry_path().is_file():
        return None
    try:
        saved = get_hardware("local").measured
    except Exception:  # an unreadable saved entry is no reason to keep it
        return None
    if unreliable(saved) and not unreliable(result):
        return None  # a reliable measurement always replaces an unreliable one
    return worse(measured_tables(result), saved)


def calibration_problems(result: dict) -> list[str]:
    """Why this machine measurement cannot be the `local` entry predictions use (empty: it
    can); kept in the result as `unreliable`, so its JSON says so."""
    from dlscale.hardware.trust import unreliable

    result["unreliable"] = unreliable(result)
    return result["unreliable"]


def calibration_line(calibration: dict) -> str:
    """The one line a prediction prints about the measurement it rests on."""
    from dlscale.hardware.trust import calibration_line as line

    return line(calibration)


def hardware_calibration(hardware: Hardware) -> dict | None:
    """Which measurement predictions on `hardware` rest on, and how far to trust it (None: a
    datasheet entry)."""
    from dlscale.hardware.trust import calibration

    return calibration(hardware)


def saved_local_measured_at() -> str | None:
    """When the saved `local` entry was measured; None if there is none (or it is unreadable)."""
    from dlscale.hardware.catalogue import get_hardware, local_entry_path

    if not local_entry_path().is_file():
        return None
    try:
        return str(get_hardware("local").measured.get("measured_at", "an unknown date"))
    except Exception:  # an unreadable entry: nothing worth naming
        return None


def save_local_hardware(result: dict) -> Path:
    """A machine measurement saved as the hardware entry `local`; where it was written."""
    from dlscale.bench.machine import machine_hardware
    from dlscale.hardware import save_local

    return save_local(machine_hardware(result))


def bench_matmul(sizes: list[int] | None, precision: str) -> dict:
    """Square matrix products at each size (None: the bench's defaults) in `precision`: time
    and FLOP/s on the CPU and, when one is visible, the GPU (`bench matmul`)."""
    from dlscale.bench.matmul import run_matmul_bench

    return run_matmul_bench(sizes, precision)


def bench_loader(spec_path: str | Path | None, workers: list[int], steps: int) -> dict:
    """A compute-only baseline, then `steps` training steps of a spec (None: the bench's own) at
    each count of DataLoader workers, pinned and not (`bench loader`)."""
    from dlscale.api.capacity import check_process_count
    from dlscale.bench.loader import run_loader_bench
    from dlscale.launch.processes import available_cores

    # This process and its DataLoader workers, at the largest count measured.
    check_process_count(max(workers) + 1, "bench loader", available_cores(), spread=False)
    spec = load_spec(spec_path) if spec_path else None
    if spec is not None and isinstance(spec.data, StoredData):
        raise UserError(
            f"bench loader times per-sample loading of a data set held in memory; {spec_path} "
            f"reads its data ({spec.data.name}) from disk: `dlscale bench io {spec_path}` "
            "measures that (storage, decoding, the model)"
        )
    return run_loader_bench(spec, workers, steps)


def is_noisy(spread: float | None) -> bool:
    """Whether repeated timings (a bench's steps or batches) spread too far to be read as one
    figure: past 25% from their 10th to 90th percentile, bench io's rule."""
    return (spread or 0.0) > NOISY_SPREAD


def default_loader_steps() -> int:
    """The training steps per setting `bench loader` runs unless told (the CLI's default)."""
    return DEFAULT_LOADER_STEPS


def bench_width(
    widths: list[int],
    batch: int,
    dataset_size: int,
    threads: int | None = None,
    memory_limit: str | None = None,
    swap: str | None = None,
    swap_dir: Path | None = None,
) -> dict:
    """An MLP's step time as its width grows (`bench width`), in this process; or, with a
    `memory_limit` ('512MiB'), each width in a cgroup of that much memory and `swap` more of
    swap (default twice the limit), so that the widest run past it into swap."""
    from dlscale.bench.width import run_width_bench
    from dlscale.bench.width_wall import run_wall_bench
    from dlscale.launch.processes import available_cores
    from dlscale.units import parse_bytes

    cores = available_cores()
    if threads is not None and threads > cores:  # as bench levels refuses them
        raise UserError(
            f"--threads {threads} is more than the {cores} cores here: threads past the cores "
            f"only take turns (and wait for each other); give at most {cores}"
        )
    if memory_limit is None:
        if swap is not None or swap_dir is not None:
            raise UserError("--swap and --swap-dir take effect only with --memory-limit")
        return run_width_bench(widths, batch, dataset_size=dataset_size, threads=threads)
    sizes = {}
    for option, text in (("--memory-limit", memory_limit), ("--swap", swap)):
        try:
            sizes[option] = None if text is None else parse_bytes(text)
        except ValueError as error:
            raise UserError(f"{option}: {error}") from None
    return run_wall_bench(
        widths,
        batch,
        sizes["--memory-limit"],
        sizes["--swap"],
        swap_dir,
        dataset_size=dataset_size,
        threads=threads,
    )


def default_dataset_size() -> int:
    """The samples an epoch has in `bench width`'s 1,000-epoch estimate unless told (MNIST's)."""
    from dlscale.bench.width import DEFAULT_DATASET_SIZE

    return DEFAULT_DATASET_SIZE


def bench_batch(
    model: str,
    batches: list[int],
    kwargs: dict | None,
    steps: int,
    memory_fraction: float,
    input_shape: list[int] | None = None,
) -> dict:
    """A model's training throughput at each batch size, measured and predicted; a batch
    predicted to need more than `memory_fraction` of the free memory is not run (`bench batch`).
    `input_shape`: one sample's, for a model outside the zoo (package.module:factory)."""
    from dlscale.bench.batch import run_batch_bench

    return run_batch_bench(model, batches, kwargs, steps, memory_fraction, input_shape=input_shape)


def default_batches() -> tuple[int, ...]:
    """The batch sizes `bench batch` tries unless told (the CLI's default)."""
    return DEFAULT_BATCHES


def check_io(spec_path: str | Path, readers: int | None, seconds: float) -> None:
    """What `bench io` refuses (its options, a spec that is not one, data held in memory), in
    one line, before anything is measured or said."""
    from dlscale.bench.io import check_io_inputs

    check_io_inputs(load_spec(spec_path), readers, seconds)


def bench_io(spec_path: str | Path, readers: int | None, seconds: float) -> dict:
    """Storage read (1 and N readers), decode per loader worker and the model's rate, side by
    side, with the one that bounds training (`dlscale bench io`)."""
    from dlscale.bench.io import run_io_bench
    from dlscale.launch.processes import available_cores

    return run_io_bench(load_spec(spec_path), readers, seconds, available_cores())


def check_out_dir(out: Path | None, bench: str | None = None) -> None:
    """Before a bench runs: an --out that cannot be a folder, that another run holds, or that
    already holds this bench's results (`<bench>.json` or `.png`, which it would replace) is one
    line now rather than after minutes of measuring (a folder made to check it is removed)."""
    if out is None:
        return
    from dlscale.errors import UserError
    from dlscale.train.ownership import claim

    if bench is not None:
        for name in (f"{bench}.json", f"{bench}.png"):
            if (Path(out) / name).exists():
                raise UserError(
                    f"--out {out} already holds {name} from an earlier run: give another "
                    "folder, or move that one away"
                )
    with claim(out):
        pass


def output_dir(name: str, out: Path | None) -> Path:
    """`out`, or runs/bench-<name>-<timestamp>/; made now (one line if it cannot be)."""
    return made_output_dir(name, out)


def new_output_dir(name: str) -> Path:
    """A new runs/bench-<name>-<timestamp>/ for `out`, not made yet: the first run makes it,
    so a bad spec or option leaves no empty folder behind."""
    return new_run_dir(f"bench-{name}")


def write_outputs(
    name: str, result: dict | ScaleResult | CompareResult, out: Path | None
) -> tuple[Path, Path]:
    """`<name>.json` and `<name>.png` in `out` (default runs/bench-<name>-<timestamp>/), from a
    bench's document or the record `scale` or `compare` returned."""
    from dlscale.bench.output import write_outputs as write

    document = result if isinstance(result, dict) else result.to_json()
    return write(name, document, out)


def bench_precision(
    spec_path: str | Path, steps: int | None, latency_batch: int = LATENCY_BATCH
) -> dict:
    """fp32, bf16 (fp16 on a GPU) and int8 after training, side by side (`bench precision`);
    inference latency timed on a batch of `latency_batch` validation samples."""
    from dlscale.bench.precision import run_precision_bench

    return run_precision_bench(spec_path, steps, latency_batch)


def default_latency_batch() -> int:
    """The samples in the batch `bench precision` times a forward of unless told."""
    return LATENCY_BATCH


def bench_sparsity(
    spec_path: str | Path,
    levels: str,
    pattern: str,
    finetune_steps: int,
    steps: int | None,
    latency_batch: int = LATENCY_BATCH,
) -> dict:
    """Magnitude pruning at each level, fine-tuned, measured (`bench sparsity`)."""
    from dlscale.bench.sparsity import run_sparsity_bench
    from dlscale.errors import UserError

    try:
        fractions = [float(part) for part in levels.split(",") if part.strip()]
    except ValueError:
        raise UserError(
            f"--levels: '{levels}' is not a list of fractions, e.g. 0,0.5,0.9"
        ) from None
    return run_sparsity_bench(spec_path, fractions, pattern, finetune_steps, steps, latency_batch)


def bench_levels(spec_path: str | Path, steps: int, max_threads: int | None) -> dict:
    """SIMD levels, intra-op threads and ddp processes, each measured (`bench levels`)."""
    from dlscale.bench.levels import run_levels_bench

    return run_levels_bench(spec_path, steps, max_threads, train)


def bench_link(
    cluster: str,
    address: str | None,
    hosts: list[str] | None = None,
    name: str | None = None,
    quick: bool = False,
) -> dict:
    """The link between two hosts of a Ray cluster (the driver's and another, or `hosts`):
    all-reduce and point-to-point rates, the first as a named link for `dlscale scale`."""
    from dlscale.bench.link import measure_between
    from dlscale.errors import UserError
    from dlscale.launch import make_launcher

    check_link_cluster(cluster)
    launcher = make_launcher(cluster, address)
    nodes = launcher.node_addresses()
    if hosts is None:
        if len(nodes) < 2:
            raise UserError(f"the Ray cluster has {len(nodes)} node(s); a link needs two")
        hosts = nodes[:2]
    elif len(hosts) != 2 or hosts[0] == hosts[1]:
        raise UserError(f"--hosts takes two different node addresses, A,B (got {hosts})")
    else:
        missing = [host for host in hosts if host not in nodes]
        if missing:
            raise UserError(
                f"no live node at {', '.join(missing)}; the cluster's nodes: {', '.join(nodes)}"
            )
    result = measure_between(launcher, hosts[0], hosts[1], quick)
    result["name"] = name or link_name(hosts)
    result["address"] = address
    return result


def check_link_cluster(cluster: str) -> None:
    """One line unless `cluster` has hosts to measure between (Ray)."""
    from dlscale.errors import UserError

    if cluster != "ray":
        raise UserError(
            "bench link measures between two hosts of a cluster: --cluster ray --address "
            "HEAD:PORT (`bench machine` measures between this machine's processes)"
        )


def link_name(hosts: list[str]) -> str:
    """The name `bench link` saves a link between two hosts as: link-A-B (addresses sorted)."""
    return "link-" + "-".join(sorted(h.replace(":", ".") for h in hosts))


def save_link(result: dict) -> Path:
    """A measured link saved as a [[link]] in $DLSCALE_HOME/hardware/NAME.toml, atomically."""
    from dlscale.atomic import write_atomic
    from dlscale.hardware.catalogue import user_files
    from dlscale.hardware.links import link_to_toml, parse_links
    from dlscale.home import dlscale_home

    user_files()  # the folder every user hardware file is read from
    path = dlscale_home() / "hardware" / f"{result['name']}.toml"
    text = link_to_toml(result)
    parse_links(text, str(path))  # what we write must read back
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda handle: handle.write(text.encode("utf-8")))
    return path
