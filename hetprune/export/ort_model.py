"""An ONNX file run as if it were a PyTorch model, so that a Task's own metric measures what deployment runs.

A Task's metric is ``metric(model, val)`` and calls ``model(images)``; `OnnxModule` answers those
calls from an ONNX Runtime session. It cuts a batch into runs of at most ``max_batch`` images (a file with a
fixed batch is run at exactly that batch, the last run padded and the padding dropped), so a large validation
batch neither exceeds what the file accepts nor the memory an INT8 DeiT-B session needs.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..errors import HetpruneError

EVAL_BATCH = 32   # images per ONNX Runtime run when the file's batch is free


def fixed_batch(session) -> int | None:
    """The batch size the file was exported with, or None when it is free (``--dynamic-batch``)."""
    dim = session.get_inputs()[0].shape[0]
    return dim if isinstance(dim, int) and dim > 0 else None


class OnnxModule(nn.Module):
    """``model(x)`` for an ONNX Runtime session: float32 images in, the file's first output back as a tensor."""

    def __init__(self, session, max_batch: int = EVAL_BATCH):
        super().__init__()
        self.session = session
        self.input_name = session.get_inputs()[0].name
        self.batch = fixed_batch(session)
        self.max_batch = self.batch or max_batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() < 1:
            raise HetpruneError(f"an ONNX model takes a batch of images as a tensor, got {type(x).__name__}")
        images = x.detach().float().cpu().numpy()
        outs = []
        for start in range(0, len(images), self.max_batch):
            chunk = images[start:start + self.max_batch]
            n = len(chunk)
            if self.batch and n < self.batch:   # a fixed-batch file: pad the last run, keep the real rows
                chunk = np.concatenate([chunk, np.zeros((self.batch - n, *chunk.shape[1:]), chunk.dtype)])
            outs.append(self.session.run(None, {self.input_name: chunk})[0][:n])
        return torch.from_numpy(np.concatenate(outs)).to(x.device)
