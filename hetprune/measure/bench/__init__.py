"""Speed measurement: one harness for GPU and CPU.

`measure` times several models on random input and returns plain data
(JSON-ready); `format_table` renders it. Choices, and why:

* The models of one comparison are timed **interleaved** in one process
  (warm-up and repeats go round-robin A, B, A, B, ...), so a noisy neighbour,
  turbo or thermal drift hits every model alike instead of whichever ran last.
* Each repeat runs the forward ``number`` times, ``number`` calibrated per
  model so one repeat lasts at least ``min_time_s`` (timer resolution does not
  matter for tiny models). We report the median per-batch latency and its
  spread (quartiles, min, max) over the repeats, never a single run or a mean.
* CPU: ``time.perf_counter``. CUDA: CUDA events around the repeat, then a
  synchronise, so queued kernels are counted. We do not use
  ``torch.utils.benchmark.Timer.blocked_autorange`` because it times one
  statement at a time and cannot interleave.
* Low precision is ``torch.autocast`` (what deployment code does), not a cast
  of the weights. ``bf16`` on CPU is allowed (autocast CPU; only fast on CPUs
  with native bf16 support, so measure rather than assume). ``fp16`` on CPU is
  refused: most CPU kernels have no fp16 path and the number would mean little.
* On CUDA out-of-memory the batch of the whole comparison is halved (all
  models keep the same batch, so speedups stay comparable) and the result says
  so (``requested_batch_size``, ``note``).
* Costs are MACs (``costs.CONVENTION``), counted once per model in fp32.
* ``backend="onnxruntime"`` times what deployment runs: each model is
  exported to ONNX (``hetprune.measure.export``, verified against PyTorch first) and
  timed in an ONNX Runtime session (CPU execution provider; CUDA provider with
  the input bound on the GPU where ``onnxruntime-gpu`` has it), interleaved
  and summarised exactly like the torch path. The session gets the same
  thread count torch would use, so the two backends are comparable.

Models are put in eval mode and moved to the device in place (torch backend).

The package's files, one job each: `environment` (what a timing ran
on), `timing` (the timers and `measure`), `report` (the
tables people read).
"""

from .environment import BACKENDS, DEVICES, DTYPES, check_dtype, cpu_name, environment, load_average, resolve_device
from .report import environment_line, format_per_block, format_table
from .timing import CASTS, OrtRunner, Runner, measure, per_block, precision_of, summarize, time_interleaved

__all__ = ["BACKENDS", "CASTS", "DEVICES", "DTYPES", "OrtRunner", "Runner", "check_dtype", "cpu_name", "environment", "environment_line",
           "format_per_block", "format_table", "load_average", "measure", "per_block", "precision_of", "resolve_device",
           "summarize", "time_interleaved"]
