"""A :class:`~cubicml_lab.space.Space`'s configurations as float64 columns for a Gaussian process,
and back.

Each parameter takes its own columns, in the space's order: one for Int (value, or log(value)),
PowerOfTwo (log2(value)), Ordinal (index), Bool (0/1) and Float (value, or log); one per value
for Choice (one-hot). Decoding rounds each parameter to its nearest allowed value on its own;
constraints are not enforced. NumPy is imported when a function is called, torch never.

Example:
    >>> from cubicml_lab._params import Choice, PowerOfTwo
    >>> params = [PowerOfTwo("tp", 1, 8), Choice("recompute", ["none", "full"])]
    >>> encode_rows(params, [{"tp": 4, "recompute": "full"}]).tolist()
    [[2.0, 0.0, 1.0]]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._params import Parameter
from .errors import SpaceError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["decode_rows", "encode_rows", "encoded_bounds", "encoded_names"]


def encoded_names(parameters: Sequence[Parameter]) -> list[str]:
    """One name per encoded column (Choice parameters take one column per value)."""
    return [name for p in parameters for name in p.encoded_names()]


def encoded_bounds(parameters: Sequence[Parameter]) -> np.ndarray:
    """Lower and upper bound of each encoded column, shape (2, d), float64."""
    import numpy as np

    pairs = [b for p in parameters for b in p.encoded_bounds()]
    return np.array(pairs, dtype=np.float64).T.copy()


def encode_rows(parameters: Sequence[Parameter],
                configs: Iterable[Mapping[str, Any]]) -> np.ndarray:
    """Checked parameter values (one mapping per configuration) as a float64 array (n, d)."""
    import numpy as np

    rows = [[x for p in parameters for x in p.encode(values[p.name])] for values in configs]
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(encoded_names(parameters)))


def decode_rows(parameters: Sequence[Parameter], X: Any) -> list[dict[str, Any]]:
    """Nearest parameter values for each row of ``X`` (array or tensor of shape (n, d)).

    Raises:
        SpaceError: If ``X`` is not two-dimensional with one column per encoded name, or holds
            NaN or infinite values.
    """
    import numpy as np

    names = encoded_names(parameters)
    arr = np.asarray(X.detach().cpu().numpy() if hasattr(X, "detach") else X, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != len(names):
        raise SpaceError(f"decode expects shape (n, {len(names)}), got {arr.shape}",
                         hint=f"columns: {names}")
    if not np.isfinite(arr).all():
        rows = sorted({int(i) for i in np.argwhere(~np.isfinite(arr))[:, 0]})
        raise SpaceError(f"decode got NaN or infinite values in row(s) {rows[:10]}",
                         hint="decode only finite encodings (drop or repair those rows)")
    out = []
    for row in arr:
        cfg, col = {}, 0
        for p in parameters:
            width = len(p.encoded_names())
            cfg[p.name] = p.decode(row[col:col + width])
            col += width
        out.append(cfg)
    return out
