"""``torch.export`` programs saved with ``torch.export.save``, read back and compared with PyTorch.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ...core.errors import HetpruneError
from .common import (_dynamic_shapes, _example, _prepared, _publish, _quiet_exporter, _temp_path, _verify_batch,
                     check_batch, check_dtype, check_output, compare_outputs, verify_input)


# -- torch.export (.pt2) ----------------------------------------------------------------
def export_pt2(model: nn.Module, out: str | Path, dynamic_batch: bool = False, dtype: str = "fp32",
               batch: int = 1, overwrite: bool = False) -> dict:
    """Write ``model`` as a ``torch.export`` program (``.pt2``), read back and compared before the rename. An
    existing ``out`` is refused before any work unless ``overwrite``."""
    check_dtype(dtype)
    check_batch(batch)
    out = Path(out)
    check_output(out, overwrite)
    m = _prepared(model, dtype)
    tmp = _temp_path(out)
    try:
        with _quiet_exporter():
            try:
                program = torch.export.export(m, (_example(model, batch, dtype, dynamic_batch),),
                                              dynamic_shapes=_dynamic_shapes(dynamic_batch))
            except Exception as exc:
                raise HetpruneError(f"torch.export failed on this model: {str(exc).strip().splitlines()[0]}") from exc
            torch.export.save(program, str(tmp))
            loaded = torch.export.load(str(tmp)).module()
        vbatch = _verify_batch(batch, dynamic_batch)
        x = verify_input(model, vbatch)
        with torch.inference_mode():
            got = loaded(x.half() if dtype == "fp16" else x)
            reference = _prepared(model, "fp32")(x)
        check = compare_outputs(got, reference, dtype, "the reloaded .pt2 program's output")
        _publish(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"format": "pt2", "path": str(out), "dtype": dtype, "dynamic_batch": dynamic_batch,
            "verified_batch": vbatch, **check}
