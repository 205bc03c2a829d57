"""An ONNX file run as if it were a PyTorch model, so that a Task's own metric measures what deployment runs.

A Task's metric is ``metric(model, val)`` and calls ``model(images)``; `OnnxModule` answers those
calls from an ONNX Runtime session, with the outputs nested as the PyTorch model nests them (``like``), so a
metric written for a model with several outputs reads them as it always does. It cuts a batch into runs of
at most ``max_batch`` images (a file with a fixed batch is run at exactly that batch, the last run padded and
the padding dropped), so a large validation batch neither exceeds what the file accepts nor the memory an
INT8 DeiT-B session needs.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from ...core.errors import HetpruneError

EVAL_BATCH = 32   # images per ONNX Runtime run when the file's batch is free


def fixed_batch(session) -> int | None:
    """The batch size the file was exported with, or None when it is free (``--dynamic-batch``)."""
    dim = session.get_inputs()[0].shape[0]
    return dim if isinstance(dim, int) and dim > 0 else None


class OnnxModule(nn.Module):
    """``model(x)`` for an ONNX Runtime session: float32 images in, the file's outputs back as tensors.

    ``like`` is the PyTorch model's output on any input: the outputs come back nested the same way (a tuple,
    a dict, a ``ModelOutput``; the exporter writes them flat in torch's pytree order, `flat_outputs`).
    Without it, a file with one output gives a tensor and one with several a tuple.
    """

    def __init__(self, session, max_batch: int = EVAL_BATCH, like=None):
        super().__init__()
        self.session = session
        self.input_name = session.get_inputs()[0].name
        self.batch = fixed_batch(session)
        self.max_batch = self.batch or max_batch
        self.leaves, self.spec = tree_flatten(like) if like is not None else (None, None)

    def forward(self, x: torch.Tensor):
        if not isinstance(x, torch.Tensor) or x.dim() < 1:
            raise HetpruneError(f"an ONNX model takes a batch of images as a tensor, got {type(x).__name__}")
        images = x.detach().float().cpu().numpy()
        if not len(images):
            raise HetpruneError("an ONNX model was called on an empty batch (no image)")
        runs = []
        for start in range(0, len(images), self.max_batch):
            chunk = images[start:start + self.max_batch]
            n = len(chunk)
            if self.batch and n < self.batch:   # a fixed-batch file: pad the last run, keep the real rows
                chunk = np.concatenate([chunk, np.zeros((self.batch - n, *chunk.shape[1:]), chunk.dtype)])
            runs.append([out[:n] for out in self.session.run(None, {self.input_name: chunk})])
        outs = [torch.from_numpy(np.concatenate(arrays)).to(x.device) for arrays in zip(*runs)]
        return self._nested(outs)

    def _nested(self, outs: list[torch.Tensor]):
        """The file's outputs nested as ``like`` (its non-tensor leaves kept as they are)."""
        if self.spec is None:
            return outs[0] if len(outs) == 1 else tuple(outs)
        wanted = sum(isinstance(leaf, torch.Tensor) for leaf in self.leaves)
        if wanted != len(outs):
            raise HetpruneError(f"the ONNX file has {len(outs)} outputs, the PyTorch model returns {wanted} tensors")
        it = iter(outs)
        return tree_unflatten([next(it) if isinstance(leaf, torch.Tensor) else leaf for leaf in self.leaves],
                              self.spec)
