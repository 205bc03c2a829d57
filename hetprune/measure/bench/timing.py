"""Timing: models timed interleaved in one process (warm-up and repeats round-robin), each repeat
calibrated to last ``min_time_s``, summarised by the median and quartiles; torch and ONNX Runtime
runners; `measure` (whole models) and `per_block` (each block's parts).
"""

from __future__ import annotations

import copy
import math
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ...core import devices
from ...core.errors import HetpruneError
from ...model.macs import CONVENTION, count_macs, count_params
from .environment import BACKENDS, DEVICES, DTYPES, check_dtype, environment, load_average, resolve_device


CASTS = ("autocast", "weights")   # how a bf16/fp16 timing runs the model (`measure`)


def precision_of(dtype: str, cast: str) -> str:
    """What a row ran in: ``fp32``, ``bf16 autocast`` (fp32 weights, matmuls cast per call) or ``bf16 weights``."""
    return dtype if DTYPES[dtype] is None else f"{dtype} {cast}"


# -- timing --------------------------------------------------------------------
def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def summarize(latencies: list[float]) -> dict:
    """Median, quartiles, min and max of per-batch latencies (seconds)."""
    q1, q3 = _quartiles(latencies)
    return {
        "median": statistics.median(latencies),
        "q1": q1,
        "q3": q3,
        "min": min(latencies),
        "max": max(latencies),
        "runs": list(latencies),
    }


class Runner:
    """Calls one model on a fixed input (or any call, ``fn``), under autocast, and times ``number`` calls."""

    def __init__(self, model: Callable | None, x: torch.Tensor | None, device: torch.device, dtype: str,
                 fn: Callable[[], object] | None = None):
        self.fn = fn if fn is not None else (lambda: model(x))
        self.device = device
        self.autocast = DTYPES[dtype]

    def __call__(self):
        if self.autocast is None:
            return self.fn()
        with torch.autocast(self.device.type, dtype=self.autocast):
            return self.fn()

    def time(self, number: int) -> float:
        """Seconds per call, averaged over ``number`` back-to-back calls."""
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(self.device)
            start.record()
            for _ in range(number):
                self()
            end.record()
            torch.cuda.synchronize(self.device)
            return start.elapsed_time(end) / 1000.0 / number
        t0 = time.perf_counter()
        for _ in range(number):
            self()
        return (time.perf_counter() - t0) / number


class OrtRunner:
    """Runs one ONNX Runtime session on a fixed input; the same interface as `Runner`.

    On CUDA the input is bound on the GPU once (io binding), so the timed
    calls do not include a host-to-device copy, as with the torch path.
    """

    def __init__(self, session, x: torch.Tensor, dtype: str):
        feed = x.detach().cpu().numpy()
        if dtype == "fp16":
            feed = feed.astype("float16")
        self.name = session.get_inputs()[0].name
        self.session, self.feed = session, feed
        self.binding = None
        if "CUDAExecutionProvider" in session.get_providers():
            import onnxruntime as ort

            self.binding = session.io_binding()
            self.value = ort.OrtValue.ortvalue_from_numpy(feed, "cuda", 0)
            self.binding.bind_ortvalue_input(self.name, self.value)
            self.binding.bind_output(session.get_outputs()[0].name, "cuda")

    def __call__(self):
        if self.binding is not None:
            return self.session.run_with_iobinding(self.binding)  # returns once the GPU work is done
        return self.session.run(None, {self.name: self.feed})

    def time(self, number: int) -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            self()
        return (time.perf_counter() - t0) / number


def _ort_device(device: str) -> torch.device:
    """cpu, or cuda where ONNX Runtime has its CUDA execution provider (auto: cuda only then)."""
    from ..export import need

    ort = need("onnxruntime", "--backend onnxruntime")
    has_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    if device not in DEVICES:
        raise HetpruneError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda" and not has_cuda:
        raise HetpruneError(f"--device cuda with --backend onnxruntime needs ONNX Runtime's CUDA execution provider; "
                            f"onnxruntime {ort.__version__} here has {', '.join(ort.get_available_providers())} "
                            "(install onnxruntime-gpu)")
    return torch.device("cuda" if device == "cuda" or (device == "auto" and has_cuda) else "cpu")


def _ort_sessions(models: dict[str, nn.Module], dtype: str, device: torch.device, threads: int, folder: str,
                  log) -> dict:
    """Export every model to ONNX (verified against PyTorch) and open an ONNX Runtime session on it."""
    from ..export import export_onnx, onnx_session

    sessions = {}
    for i, (name, model) in enumerate(models.items()):
        path = Path(folder) / f"model{i}.onnx"
        check = export_onnx(model, path, dynamic_batch=True, dtype=dtype, threads=threads)
        log(f"  {name}: exported to ONNX, verified in ONNX Runtime (max abs error {check['max_abs_error']:.2g})")
        sessions[name] = onnx_session(path, threads=threads, device=device.type)
    return sessions


def _check_input(path, dims: list, input_shape: tuple, batch_sizes: list[int]) -> None:
    """An ONNX file's input dims (None where free) against the models' input and the batch sizes to time."""
    fixed = [d if isinstance(d, int) and d > 0 else None for d in dims]
    if len(dims) != len(input_shape) + 1 or any(d is not None and d != want
                                                 for d, want in zip(fixed[1:], input_shape)):
        shown = tuple(d if d is not None else "?" for d in fixed)
        raise HetpruneError(f"--onnx {path} takes input {shown}, the models here take (batch, "
                            f"{', '.join(map(str, input_shape))})")
    if fixed[0] is not None and any(b != fixed[0] for b in batch_sizes):
        raise HetpruneError(f"--onnx {path} has a fixed batch of {fixed[0]}: time it at --batch-sizes {fixed[0]}, "
                            "or export it with --dynamic-batch")


def check_onnx_file(path, input_shape: tuple, batch_sizes: list[int]) -> None:
    """An ONNX file to time as it is, checked before any model is exported or timed (exporting DeiT-B takes
    minutes): it exists, is an ONNX model with one image input, and that input takes the models' image
    shape at every batch size asked for."""
    from ..export import need

    onnx = need("onnx", "--onnx")
    if not Path(path).is_file():
        raise HetpruneError(f"--onnx {path}: no such file")
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:   # protobuf's decode errors, or an unreadable file
        why = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HetpruneError(f"--onnx {path} is not a readable ONNX file: {why}") from exc
    weights = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in weights]
    if len(inputs) != 1 or not graph.node:
        raise HetpruneError(f"--onnx {path} is not an ONNX model with one image input (it has {len(inputs)} "
                            f"inputs and {len(graph.node)} nodes)")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in inputs[0].type.tensor_type.shape.dim]
    _check_input(path, dims, tuple(input_shape), list(batch_sizes))


def _file_sessions(files: dict, input_shape: tuple, batch_sizes: list[int], dtype: str, device: torch.device,
                   threads: int, log=None) -> tuple[dict, dict]:
    """ONNX Runtime sessions on ONNX files given as they are (an INT8 export), and their costs: the params and
    MACs ``hetprune export --quantize`` recorded in the file (None for another file: it is timed, not counted).
    An INT8 file with full-range weights timed on a CPU without VNNI is warned of: it runs, but its outputs there
    may be wrong (ONNX Runtime's kernels saturate), so its speed is not that of a file one would deploy."""
    from ..export import onnx_session, read_metadata
    from ..export.quantize import lacks_vnni

    if dtype != "fp32":
        raise HetpruneError(f"ONNX files are timed as they are, with float32 input; --dtype {dtype} is for the "
                            "models hetprune exports itself")
    sessions, costs = {}, {}
    for name, path in files.items():
        check_onnx_file(path, input_shape, batch_sizes)
        try:
            session = onnx_session(path, threads=threads, device=device.type)
        except HetpruneError:
            raise
        except Exception as exc:
            raise HetpruneError(f"--onnx {path}: ONNX Runtime cannot load it: {str(exc).splitlines()[0]}") from exc
        _check_input(path, session.get_inputs()[0].shape, input_shape, batch_sizes)
        meta = read_metadata(path) or {}
        if meta.get("reduce_range") is False and device.type == "cpu" and lacks_vnni():
            _warn(f"{path} has full-range INT8 weights and this CPU lacks VNNI: ONNX Runtime's kernels here can "
                  "saturate them, so its outputs may be wrong; for this CPU export it with --reduce-range on (or "
                  "auto, on this machine)", log)
        sessions[name] = session
        costs[name] = {"params": meta.get("params"), "macs": meta.get("macs")}
    return sessions, costs


def _warn(message: str, log=None) -> None:
    """A warning through the caller's log (the CLI prints it), else Python's warnings."""
    if log:
        log(f"warning: {message}")
    else:
        warnings.warn(message, stacklevel=3)


def _is_oom(exc: BaseException) -> bool:
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or "out of memory" in str(exc).lower()


def _time_batch(models: dict, input_shape: tuple, batch: int, device: torch.device, dtype: str,
                repeats: int, warmup: int, min_time_s: float, log, ort: bool = False,
                budget_s: float | None = None, weights_dtype: torch.dtype | None = None, **until) -> dict[str, dict]:
    """Time every model (torch modules, or ONNX Runtime sessions with ``ort``) at one batch size, interleaved;
    raises on OOM. ``weights_dtype``: the models hold weights of that dtype and take input in it (no autocast)."""
    x = torch.randn(batch, *input_shape)
    x = x if ort else devices.place(x, device)   # the one door to a run's device (and a test's watch)
    if weights_dtype is not None:
        x, dtype = x.to(weights_dtype), "fp32"   # the model is already in that dtype: nothing to autocast
    runners = {name: OrtRunner(m, x, dtype) if ort else Runner(m, x, device, dtype) for name, m in models.items()}
    peak = {}
    if device.type == "cuda" and not ort:  # peak memory, one model at a time (interleaving would mix them)
        with torch.inference_mode():
            for name, r in runners.items():
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
                r()
                torch.cuda.synchronize(device)
                peak[name] = torch.cuda.max_memory_allocated(device)
    timed = time_interleaved(runners, repeats, warmup, min_time_s, log, label=f"batch {batch}", budget_s=budget_s,
                             **until)
    return {name: {**t, **({"peak_memory_bytes": peak[name]} if name in peak else {})} for name, t in timed.items()}


def ratio_spread(reference: list[float], times: list[float]) -> float:
    """The spread of a speed ratio over interleaved rounds: half the interquartile range of the per-round
    ratios ``reference / times``, relative to their median (0.02: the ratio is known to about ±2 %)."""
    ratios = [a / b for a, b in zip(reference, times)]
    q1, q3 = _quartiles(ratios)
    return (q3 - q1) / 2 / statistics.median(ratios)


@torch.inference_mode()   # every timed call without autograd: recording a graph doubled a ViT's time at batch 64
def time_interleaved(runners: dict, repeats: int, warmup: int, min_time_s: float, log=None,
                     label: str = "", warm_long_once: bool = False, budget_s: float | None = None,
                     max_repeats: int = 60, reference: str | None = None, spread_target: float | None = None,
                     spread_budget_s: float | None = None, clock: Callable[[], float] = time.perf_counter
                     ) -> dict[str, dict]:
    """Time every runner (anything with ``time(number)``) round-robin: warm-up, calibration (calls per repeat
    so one repeat lasts ``min_time_s``), then ``repeats`` interleaved rounds. Per runner: the latency summary
    (seconds per call) and the calls per repeat.

    With ``budget_s`` the rounds are as many as fit that many seconds per runner (at least ``repeats``, at
    most ``max_repeats``): on a shared machine whose speed drifts by up to 2x within seconds, many short
    interleaved rounds see every runner under the same conditions, where a few long ones do not.

    A runner is calibrated from its last warm-up call when that was not its first (a cold call reads slow).
    With ``warm_long_once`` (the latency table), a call that lasts a whole window (``min_time_s`` > 0) counts
    as warm after one warm-up call and skips the later warm-up rounds and its calibration call: on a model
    whose calls take a second (DeiT-B at batch 8 on 2 CPU cores) a five-repeat table makes 6 calls per part
    instead of 8.

    With ``reference`` and ``spread_target``, rounds go on after ``repeats`` until every runner's speed ratio
    to the reference is known within the target (`ratio_spread`), or ``spread_budget_s`` more seconds
    have passed, or ``max_repeats`` rounds were run; each runner's result says its ratio's spread."""
    warm: dict[str, list[float]] = {name: [] for name in runners}
    for w in range(warmup):
        for name, r in runners.items():
            if w and warm_long_once and 0 < min_time_s <= warm[name][-1]:
                continue
            warm[name].append(r.time(1))
    number, once = {}, {}
    for name, r in runners.items():  # calibrate: enough calls per repeat to last min_time_s
        seen = warm[name]
        long_once = warm_long_once and seen and 0 < min_time_s <= seen[-1]
        once[name] = seen[-1] if len(seen) > 1 or long_once else r.time(1)
        number[name] = max(1, math.ceil(min_time_s / once[name])) if once[name] > 0 else 1
    if budget_s is not None:
        longest = max(number[name] * once[name] for name in runners)
        repeats = max(repeats, min(max_repeats, int(budget_s / longest) if longest > 0 else max_repeats))
    runs: dict[str, list[float]] = {name: [] for name in runners}
    others = [n for n in runners if n != reference] if reference in runners else []

    def spreads() -> dict[str, float]:
        return {n: ratio_spread(runs[reference], runs[n]) for n in others}

    def settled() -> bool:
        return spread_target is None or not others or max(spreads().values()) <= spread_target

    started, i = None, 0
    while True:
        if i >= repeats:   # more rounds only while a ratio is not yet known well enough, within the budget
            started = clock() if started is None else started
            if i >= max_repeats or settled() or (spread_budget_s is not None
                                                 and clock() - started >= spread_budget_s):
                break
        for name, r in runners.items():
            runs[name].append(r.time(number[name]))
        i += 1
        if log:
            log(f"  {label}: repeat {i}/{max(repeats, i)} " +
                ", ".join(f"{n} {runs[n][-1] * 1e3:.1f} ms" for n in runners))
    spread = spreads()
    return {name: {"latency_s": summarize(runs[name]), "calls_per_repeat": number[name], "rounds": i,
                   **({"ratio_spread": spread[name]} if name in spread else {})} for name in runners}


def measure(models: dict[str, nn.Module], input_shape: tuple[int, ...], batch_sizes: list[int],
            device: str = "auto", dtype: str = "fp32", compile: bool = False, repeats: int = 7, warmup: int = 2,
            min_time_s: float = 0.2, reference: str | None = None, threads: int | None = None,
            log: Callable[[str], None] | None = None, backend: str = "torch", budget_s: float | None = None,
            spread_target: float | None = None, spread_budget_s: float | None = None,
            onnx_files: dict | None = None, cast: str = "autocast", tf32: bool | None = None) -> dict:
    """Time ``models`` (name -> module) on random input of shape ``(B, *input_shape)``.

    ``reference`` names the model others are compared with (speedup = its
    median latency / the model's, beside the MAC ratio); default: the first
    model when there are several. ``threads`` sets torch's CPU thread count for
    the measurement (restored afterwards; ONNX Runtime sessions get the same
    count). ``backend``: ``torch`` or ``onnxruntime``. ``budget_s``: seconds per
    model and batch size; the rounds are as many as fit (at least ``repeats``;
    see `time_interleaved`). ``spread_target`` (e.g. 0.02): more rounds, up to ``spread_budget_s``
    seconds per batch size, until every speedup over the reference is known within it; each row says its
    speedup's spread either way (``speedup_spread``: half the per-round IQR, relative). ``onnx_files`` (name ->
    path; backend ``onnxruntime``): ONNX files timed as they are in the same interleaved session, after the
    models (an INT8 export beside the fp32 models it came from). ``cast`` (bf16, fp16): ``autocast`` runs
    fp32 weights under autocast (what training does), ``weights`` a copy of each model with its weights in
    that dtype and input in it too (what one deploys: no casts per call); each row's ``precision`` says which.
    ``tf32``: fp32 matmuls on a GPU that has TF32 run in it (True) or in full fp32 (False), put back as they were
    afterwards; None (a run's latency cost model) leaves them as the caller set them. ``environment.fp32_matmuls``
    says what ran.
    Returns a JSON-ready dict:
    ``environment``, ``models`` (params, MACs), ``results`` (one row per model
    and batch size).
    """
    log = log or (lambda msg: None)
    onnx_files = dict(onnx_files or {})
    if not models and not onnx_files:
        raise HetpruneError("nothing to measure: give at least one model")
    if onnx_files and backend != "onnxruntime":
        raise HetpruneError("ONNX files are timed in ONNX Runtime: use --backend onnxruntime with --onnx")
    clash = sorted(set(models) & set(onnx_files))
    if clash:
        raise HetpruneError(f"{clash[0]!r} names both a model and an ONNX file; give them different names")
    input_shape = tuple(int(s) for s in input_shape)
    if not batch_sizes or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in batch_sizes):
        raise HetpruneError(f"batch sizes must be positive integers, got {batch_sizes!r}")
    if repeats < 1 or warmup < 0 or not (math.isfinite(min_time_s) and min_time_s >= 0):
        raise HetpruneError(f"need repeats >= 1, warmup >= 0, min_time_s >= 0; got {repeats}, {warmup}, {min_time_s}")
    if budget_s is not None and not (math.isfinite(budget_s) and budget_s > 0):
        raise HetpruneError(f"budget_s must be a number of seconds > 0, got {budget_s!r}")
    if backend not in BACKENDS:
        raise HetpruneError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    ort = backend == "onnxruntime"
    if cast not in CASTS:
        raise HetpruneError(f"cast must be one of {', '.join(CASTS)}, got {cast!r}")
    if ort and cast != "autocast":
        raise HetpruneError("--cast weights is for the torch backend; ONNX Runtime runs the exported graph's dtype")
    if ort and (compile or dtype == "bf16"):
        raise HetpruneError("--compile and --dtype bf16 are for the torch backend; ONNX Runtime runs fp32, "
                            "or fp16 (CUDA)")
    dev = _ort_device(device) if ort else resolve_device(device)
    check_dtype(dtype, dev)
    if reference is None and len(models) + len(onnx_files) > 1:
        reference = next(iter({**models, **onnx_files}))
    if reference is not None and reference not in models and reference not in onnx_files:
        raise HetpruneError(f"reference {reference!r} is not one of the models: {', '.join([*models, *onnx_files])}")

    old_threads, old_matmuls = torch.get_num_threads(), torch.get_float32_matmul_precision()
    if threads is not None:
        if threads < 1:
            raise HetpruneError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    tmp = None
    try:
        env = environment(dev, dtype, compile)
        env["backend"] = backend
        precision = precision_of(dtype, cast)
        weights_dtype = DTYPES[dtype] if cast == "weights" else None   # None for fp32: nothing to cast
        env["precision"] = precision
        if not ort:
            env["fp32_matmuls"] = devices.fp32_matmuls(dev) if tf32 is None else devices.set_tf32(dev, tf32)
        costs, runnable = {}, {}
        example = torch.randn(1, *input_shape)
        example = example if ort else devices.place(example, dev)
        for name, model in models.items():
            model.eval()
            if not ort:
                model = devices.place(model, dev)
            costs[name] = {"params": count_params(model), "macs": count_macs(model, example)}
            if weights_dtype is not None:   # a copy: the caller's model stays as it was
                model = copy.deepcopy(model).to(weights_dtype)
            runnable[name] = torch.compile(model) if compile else model
        if ort:
            import tempfile

            import onnxruntime

            # the files first: one that cannot be timed is refused before any model is exported
            files, file_costs = _file_sessions(onnx_files, input_shape, list(batch_sizes), dtype, dev,
                                               torch.get_num_threads(), log)
            tmp = tempfile.TemporaryDirectory(prefix="hetprune-bench-")
            runnable = {**_ort_sessions(models, dtype, dev, torch.get_num_threads(), tmp.name, log), **files}
            costs.update(file_costs)
            env["onnxruntime"] = onnxruntime.__version__
            env["providers"] = next(iter(runnable.values())).get_providers()[:1]
        env["load_start"] = load_average()
        rows = []
        for requested in batch_sizes:
            batch, note = requested, None
            while True:
                load = load_average()
                try:
                    timed = _time_batch(runnable, input_shape, batch, dev, dtype, repeats, warmup, min_time_s, log,
                                        ort=ort, budget_s=budget_s, weights_dtype=weights_dtype, reference=reference,
                                        spread_target=spread_target, spread_budget_s=spread_budget_s)
                    break
                except RuntimeError as exc:
                    if not _is_oom(exc):
                        raise
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
                    if batch == 1:
                        raise HetpruneError(f"{dev.type.upper()} out of memory even at batch 1: {exc}") from exc
                    log(f"  batch {batch}: {dev.type.upper()} out of memory, halving to {batch // 2}")
                    batch //= 2
                    note = f"{dev.type.upper()} out of memory at batch {requested}; halved to {batch}"
            for name, t in timed.items():
                median = t["latency_s"]["median"]
                row = {"model": name, "backend": backend, "batch_size": batch, "requested_batch_size": requested,
                       "dtype": dtype, "precision": precision, "compile": bool(compile),
                       "device": env["device_name"], "threads": torch.get_num_threads(),
                       "latency_s": t["latency_s"], "calls_per_repeat": t["calls_per_repeat"],
                       "throughput_img_s": batch / median, **costs[name],
                       "peak_memory_bytes": t.get("peak_memory_bytes"),
                       "load_start": load, "load_end": load_average(), "note": note}
                if reference is not None:
                    ref = timed[reference]["latency_s"]
                    row["speedup"] = ref["median"] / median
                    # rounds are interleaved, so a round's two times share its noise: their ratio is a
                    # second, paired estimate of the speedup, with a spread
                    paired = summarize([a / b for a, b in zip(ref["runs"], t["latency_s"]["runs"])])
                    row["paired_speedup"] = {k: v for k, v in paired.items() if k != "runs"}
                    row["speedup_spread"] = t.get("ratio_spread", 0.0)   # the reference's own ratio: exactly 1
                    row["rounds"] = t["rounds"]
                    known = costs[reference]["macs"] and costs[name]["macs"]   # an ONNX file may not say
                    row["mac_ratio"] = costs[reference]["macs"] / costs[name]["macs"] if known else None
                    row["speedup_over_mac_ratio"] = row["speedup"] / row["mac_ratio"] if known else None
                rows.append(row)
        env["load_end"] = load_average()
        env["threads"] = torch.get_num_threads()
    finally:
        torch.set_num_threads(old_threads)
        torch.set_float32_matmul_precision(old_matmuls)
        if tmp is not None:
            tmp.cleanup()
    return {
        "environment": env,
        "settings": {"input_shape": list(input_shape), "batch_sizes": list(batch_sizes), "repeats": repeats,
                     "budget_s": budget_s, "spread_target": spread_target, "spread_budget_s": spread_budget_s,
                     "warmup": warmup, "min_time_s": min_time_s, "interleaved": True,
                     "timer": "cuda events" if dev.type == "cuda" and not ort else "time.perf_counter",
                     "backend": backend, "cast": cast, "tf32": tf32},
        "reference": reference,
        "macs_convention": CONVENTION,
        "models": costs,
        "results": rows,
    }


# -- formatting ------------------------------------------------------------------
@torch.inference_mode()
def per_block(model: nn.Module, input_shape: tuple[int, ...], batch: int, device: str | torch.device = "cpu",
              repeats: int = 5, warmup: int = 1) -> dict:
    """Where one forward pass's time goes: per block its attention and MLP parts (each with its norm), the
    rest of the block (residual adds, LayerScale), and the model outside its blocks (embedding, head).

    Measured with forward hooks around the parts during whole forward passes (the device synchronised at
    each hook on CUDA), median over ``repeats`` passes, in milliseconds.
    """
    from ...model.adapters import adapter_for

    dev = resolve_device(device)
    adapter = adapter_for(model)
    model = devices.place(model, dev).eval()
    x = devices.place(torch.randn(batch, *input_shape), dev)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    spent: dict[tuple[int, str], float] = {}
    started: dict[int, float] = {}
    handles = []

    def watch(module: nn.Module, key: tuple[int, str]) -> None:
        def pre(mod, args):
            sync()
            started[id(mod)] = time.perf_counter()

        def post(mod, args, out):
            sync()
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - started.pop(id(mod))

        handles.extend([module.register_forward_pre_hook(pre), module.register_forward_hook(post)])

    blocks = adapter.blocks(model)
    for i, block in enumerate(blocks):
        watch(block, (i, "block"))
        for part, modules in adapter.time_parts(model, i).items():
            for m in modules:
                watch(m, (i, part))
    runs: list[dict] = []
    try:
        for r in range(warmup + repeats):
            spent.clear()
            sync()
            t0 = time.perf_counter()
            model(x)
            sync()
            if r >= warmup:
                runs.append({**spent, "model": time.perf_counter() - t0})
    finally:
        for h in handles:
            h.remove()

    def median_ms(key) -> float:
        return 1000 * statistics.median(run.get(key, 0.0) for run in runs)

    rows = []
    for i in range(len(blocks)):
        total, attn, mlp = median_ms((i, "block")), median_ms((i, "attention")), median_ms((i, "mlp"))
        rows.append({"block": i, "attention_ms": attn, "mlp_ms": mlp, "other_ms": max(0.0, total - attn - mlp),
                     "total_ms": total})
    model_ms = median_ms("model")
    return {"batch_size": batch, "device": str(dev), "repeats": repeats, "blocks": rows, "model_ms": model_ms,
            "outside_blocks_ms": max(0.0, model_ms - sum(r["total_ms"] for r in rows))}
