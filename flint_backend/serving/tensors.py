"""Reading Triton input tensors as numpy arrays: a request's tensors arrive as
{name: array}, with or without the batch dimension ([1] or [1, 1]); BYTES come as objects."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from flint_backend.chat.request_error import ChatRequestError, describe

Inputs = Mapping[str, np.ndarray]


def scalar(inputs: Inputs, name: str):
    """The one value of a [1] or [1, 1] tensor as a Python value; None when absent or empty."""
    array = inputs.get(name)
    if array is None or array.size == 0:
        return None
    if array.size != 1:
        raise ChatRequestError(name, "one value (shape [1] or [1, 1])", f"shape {list(array.shape)}")
    value = array.reshape(-1)[0]
    if isinstance(value, bytes):
        return _text(name, value)
    return value.item() if isinstance(value, np.generic) else value


def strings(inputs: Inputs, name: str) -> list[str]:
    array = inputs.get(name)
    if array is None:
        return []
    return [_text(name, v) if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]


def _text(name: str, value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ChatRequestError(name, "UTF-8 text", describe(value.decode("utf-8", "replace"))) from None


def bytes_tensor(text: str | list[str]) -> np.ndarray:
    """[1, n] BYTES (the batch form every flint tensor has)."""
    items = [text] if isinstance(text, str) else text
    return np.array([[t.encode("utf-8") for t in items]], dtype=np.object_)
