"""Deploy what was pruned: ONNX and ``torch.export`` files checked in their
runtime, and hub-style model folders.

Why each choice:

* ONNX goes through torch's ``dynamo=True`` exporter (``torch.export`` +
  onnxscript), torch's supported path. The TorchScript exporter also works on
  these models but is deprecated and leaves ``Identity`` nodes in the graph;
  the dynamo exporter's graph holds only the ops that compute.
* Every file is verified before it is renamed into place: ``onnx.checker``;
  an op census against the graph of the unpruned base model (each removed site
  takes exactly one attention or activation op away, matrix products drop by
  the linear layers removed or merged and two per attention, and nothing else
  changes: a removed site leaves no trace, and ops outside the sites, such as
  CaiT's class attention, need no family knowledge); and a run in the target
  runtime on a seeded batch compared with the PyTorch model. Anything wrong
  raises [`HetpruneError`][hetprune.core.errors.HetpruneError] and leaves no file.
* The exporter silently falls back to another opset when it cannot convert;
  we check the opset it wrote and refuse instead.
* A hub folder is a saved model folder (``recipe.json`` +
  ``model.safetensors``, so [`hetprune.load`][hetprune.model.recipe.load] reads it as is) plus what a
  model hub expects: a ``README.md`` card and a ``config.json`` shaped for the
  model's library: timm-style for a timm model; for a Hugging Face transformers
  model its own config (``architectures``, ``model_type``) and a
  ``preprocessor_config.json`` with its image processor's mean/std.

* INT8 (`quantize`) goes through ONNX Runtime's own quantization tools
  on the verified fp32 export, calibrated on the task's training images
  (`calibration`), and is checked on the task's metric measured through
  ONNX Runtime (`ort_model` runs a file as a model for the metric).

One file per format: `to_onnx`, `to_pt2`, `hub`, `quantize`; what they
share (request checks, the verification input and comparison, atomic writes)
is `common`.
"""

from .common import (DEFAULT_OPSET, DTYPES, FORMATS, INPUT_NAME, OUTPUT_NAME, TOLERANCE, check_dtype, check_output,
                     compare_outputs, need, quote_command, verify_input)
from .hub import INT8_FILE, export_hub, hub_config, hub_files, model_card, pretrained_cfg, transformers_model
from .quantize import SCHEMES, Int8Settings, export_int8, int8_census, read_metadata
from .to_onnx import check_census, expected_census, export_onnx, onnx_session, op_census, verify_onnx
from .to_pt2 import export_pt2

__all__ = ["DEFAULT_OPSET", "DTYPES", "FORMATS", "INPUT_NAME", "INT8_FILE", "Int8Settings", "OUTPUT_NAME", "SCHEMES",
           "TOLERANCE", "check_census", "check_dtype", "check_output", "compare_outputs", "expected_census",
           "export_hub", "export_int8", "export_onnx", "export_pt2", "hub_config", "hub_files", "int8_census",
           "model_card", "need", "onnx_session", "op_census", "pretrained_cfg", "quote_command", "read_metadata",
           "transformers_model", "verify_input", "verify_onnx"]
