"""The clocks :func:`~cubicml_lab.timing.time_steps` reads at the edges of a window of steps:
:class:`StepTimer` (``time.perf_counter`` with the workload's ``sync`` at both edges),
:class:`CudaEventTimer` (CUDA events recorded at the edges) and :func:`make_timer`, which picks
one for a device. Durations are in seconds. Importing this module imports no torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["CudaEventTimer", "StepTimer", "make_timer"]


class StepTimer:
    """Wall clock of a window of steps: ``time.perf_counter``, ``sync()`` called at both edges.

    Args:
        sync: Blocks until queued device work is done (e.g. ``torch.cuda.synchronize``); ``None``
            for eager CPU work.
    """

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self._t0 = 0.0

    def start(self) -> None:
        """Mark the start of a window."""
        if self.sync is not None:
            self.sync()
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        """Mark the end of the window; return its duration in seconds."""
        if self.sync is not None:
            self.sync()
        return time.perf_counter() - self._t0


class CudaEventTimer(StepTimer):
    """Device-side clock: CUDA events recorded at the window edges, synchronised at the end only.

    The elapsed time is the GPU stream's time between the two events, so it includes kernels and
    any idle gaps while the CPU was launching them.

    Args:
        device: A CUDA device, e.g. ``"cuda"`` or ``"cuda:1"``.
    """

    def __init__(self, device: str = "cuda") -> None:
        import torch

        super().__init__(None)
        self.device = torch.device(device)
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)
        with torch.cuda.device(self.device):
            self._start.record()

    def stop(self) -> float:
        import torch

        with torch.cuda.device(self.device):
            self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end) / 1e3  # ms -> s


def make_timer(device: str = "cpu", sync: Callable[[], None] | None = None) -> StepTimer:
    """The right clock for ``device``: CUDA events on ``cuda[:N]``, else perf_counter + ``sync``."""
    return CudaEventTimer(device) if str(device).startswith("cuda") else StepTimer(sync)
