"""One exception hierarchy for cubicml-lab.

Every error the library raises on purpose is a :class:`CubicMLError`. Each child also inherits
the builtin exception a caller would naturally catch (``ValueError`` for bad input,
``RuntimeError`` for things that went wrong while running, ``ImportError`` for a missing optional
dependency), so ``except ValueError`` keeps working for code that does not know this library.

Every message says what was wrong, with the actual values, and a ``hint`` says what to do.

Example:
    >>> from cubicml_lab.errors import SpaceError
    >>> try:
    ...     raise SpaceError("Int 'tp': low = 8 > high = 1", hint="swap the bounds")
    ... except ValueError as err:
    ...     print(err)
    Int 'tp': low = 8 > high = 1
      hint: swap the bounds
"""

from __future__ import annotations

__all__ = [
    "CubicMLError",
    "ConfigError",
    "DataError",
    "DependencyError",
    "LaunchError",
    "MeasurementError",
    "PredictorError",
    "SearchError",
    "SearchExhausted",
    "SpaceError",
    "StoreError",
]


class CubicMLError(Exception):
    """Root of every error raised on purpose by cubicml-lab.

    Args:
        message: What was wrong, with the actual values.
        hint: What to do about it. Shown on its own line.
    """

    def __init__(self, message: str, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  hint: {hint}")


class SpaceError(CubicMLError, ValueError):
    """A search space, parameter, constraint or configuration is invalid."""


class ConfigError(CubicMLError, ValueError):
    """A workload or launcher configuration is invalid (unknown knob, bad value, bad degrees)."""


class StoreError(CubicMLError, RuntimeError):
    """The trial store cannot be opened, read or written as asked."""


class LaunchError(CubicMLError, RuntimeError):
    """A launcher could not start a trial at all (not a trial that failed: that is data)."""


class MeasurementError(CubicMLError, RuntimeError):
    """A measurement could not be made or its inputs are inconsistent."""


class PredictorError(CubicMLError, ValueError):
    """A predictor got unusable training data or was used before fitting."""


class SearchError(CubicMLError, ValueError):
    """A searcher was asked for something it cannot do (e.g. the pool is exhausted)."""


class SearchExhausted(SearchError):
    """A searcher has nothing left to propose: every configuration of its pool was tried, is
    pending, or was skipped.

    Args:
        message, hint: As :class:`CubicMLError`.
        skipped: How many of the configurations not yet tried were skipped (by hand or by a
            review rule): 0 where the space itself is exhausted, else un-skipping them
            (``Searcher.unskip``, ``Campaign.unskip``) gives the search something to propose.
    """

    def __init__(self, message: str, hint: str | None = None, *, skipped: int = 0) -> None:
        super().__init__(message, hint)
        self.skipped = skipped


class DataError(CubicMLError, RuntimeError):
    """A dataset is unknown, or its file is missing or cannot be read as a table."""


class DependencyError(CubicMLError, ImportError):
    """An optional dependency needed for this feature is not installed."""
