"""Input and output conversion shared by the wrappers: lists, numpy arrays and torch tensors.

torch is never imported here: a tensor is recognised by its type's module and duck typing, so
this package works (and is tested) without torch installed.
"""

from __future__ import annotations

import operator
from typing import Any, Tuple

import numpy as np


def is_torch_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (or a subclass such as ``nn.Parameter``)."""
    module = type(x).__module__ or ""
    return module.split(".")[0] == "torch" and hasattr(x, "detach") and hasattr(x, "cpu")


def _torch_to_numpy(t: Any) -> np.ndarray:
    t = t.detach().cpu()
    try:
        return t.numpy()
    except (TypeError, RuntimeError):
        # bfloat16 and other dtypes numpy cannot hold: go through float32, as the reference
        # EPLB does (`weight.float()`).
        return t.float().numpy()


def as_float64_matrix(x: Any, name: str) -> np.ndarray:
    """``x`` (list, numpy array, torch tensor, anything array-like) as a C-contiguous float64
    matrix. Raises ``ValueError`` on anything that is not a 2-D array of real numbers."""
    if is_torch_tensor(x):
        arr = _torch_to_numpy(x)
    else:
        try:
            arr = np.asarray(x)
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"{name} must be a 2-D array of numbers [layers, experts]; "
                f"it could not be read as an array: {err}"
            ) from None
    if arr.dtype.kind not in "biuf":
        raise ValueError(
            f"{name} must be a 2-D array of real numbers [layers, experts]; got dtype "
            f"{arr.dtype} (convert it with numpy.asarray({name}, dtype=float))"
        )
    if arr.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array [layers, experts]; got {arr.ndim} dimension(s) "
            f"with shape {tuple(arr.shape)} (a single layer is weight[None, :])"
        )
    return np.ascontiguousarray(arr, dtype=np.float64)


def as_count(x: Any, name: str) -> int:
    """``x`` as a non-negative Python int (accepts numpy and torch integer scalars)."""
    if isinstance(x, bool):
        raise ValueError(f"{name} must be a non-negative integer; got {x!r}")
    try:
        value = operator.index(x)
    except TypeError:
        raise ValueError(
            f"{name} must be a non-negative integer; got {x!r} of type {type(x).__name__}"
        ) from None
    if value < 0:
        raise ValueError(f"{name} must be a non-negative integer; got {value}")
    return value


def int64_array(buf: bytearray, shape: Tuple[int, ...]) -> np.ndarray:
    """A writable int64 numpy array over ``buf`` (native byte order), without a copy."""
    return np.frombuffer(buf, dtype=np.int64).reshape(shape)


def like_input(arr: np.ndarray, torch_input: bool) -> Any:
    """``arr`` as a torch tensor (sharing memory) when the input was one, else as is."""
    if torch_input:
        import torch  # only reached when the caller passed a torch tensor

        return torch.from_numpy(arr)
    return arr
