"""The trial entry point: run one trial from a JSON spec and write its result as JSON.

Launchers that use a separate process (:class:`~cubicml_lab.launch.Subprocess`, and later
torchrun or Slurm jobs) all run this::

    python -m cubicml_lab.launch.worker --spec SPEC.json --result RESULT.json [--memory-limit-gib X]

In order, it:

0. on Linux, executes itself again with the kernel's address-space layout randomisation off
   (:func:`fix_address_layout`), so that every trial process of this code lays out its
   libraries and memory alike; under a launcher's guard or torchrun, asks to be killed when its
   parent dies (:func:`die_with_parent`), so a trial never outlives its campaign; bounds how
   long idle OpenMP threads spin (:func:`set_thread_waiting`), so that a trial on a shared
   machine slows down by the share others take rather than many times over;
1. applies the memory limit (``RLIMIT_AS``, virtual address space, in GiB) before anything
   imports torch, so that every allocation of the trial counts against it;
2. reads the spec (see :mod:`cubicml_lab.launch.base`); a missing or malformed file is an error
   message on stderr and exit code 2;
3. runs :func:`cubicml_lab.launch.runner.run_trial`, which maps trial failures to statuses
   (``MemoryError`` and "can't allocate memory" become ``"oom"``);
4. writes the :class:`~cubicml_lab.trials.TrialResult` atomically (a temporary file in the same
   directory, then ``os.replace``), so a reader never sees half a result.

The exit code is 0 whenever a result was written, whatever its status; a non-zero exit means
there is no result. ``import cubicml_lab.launch.worker`` imports no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..trials import TrialResult

__all__ = ["THREAD_WAIT_ENV", "apply_memory_limit", "die_with_parent",
           "fix_address_layout", "main", "read_spec", "result_path_for_rank",
           "set_thread_waiting", "write_result"]

EXIT_OK = 0
EXIT_USAGE = 2


def apply_memory_limit(limit_gib: float) -> int:
    """Cap this process's virtual address space (``RLIMIT_AS``) at ``limit_gib`` GiB.

    Both the soft and the hard limit are set, so the trial cannot lift the cap. A request above
    an existing hard limit is clamped to it.

    Args:
        limit_gib: The cap in GiB (2**30 bytes), > 0.

    Returns:
        The limit applied, in bytes.

    Raises:
        ValueError: ``limit_gib`` is not > 0.
        OSError: The platform has no ``resource`` module or refuses the limit.
    """
    if not limit_gib > 0:
        raise ValueError(f"memory limit must be > 0 GiB, got {limit_gib!r}")
    try:
        import resource
    except ImportError as err:  # Windows
        raise OSError(f"cannot limit memory on this platform: {err}") from err
    limit = int(limit_gib * 2**30)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit


def read_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a trial spec from a JSON file.

    Raises:
        ValueError: The file is missing, unreadable, not JSON, or not a JSON object with a
            ``workload`` string; the message names the file.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot read spec file {os.fspath(path)!r}: {err}") from err
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"spec file {os.fspath(path)!r} is not valid JSON: {err}") from err
    if not isinstance(spec, dict) or not isinstance(spec.get("workload"), str):
        raise ValueError(
            f"spec file {os.fspath(path)!r} must hold a JSON object with a 'workload' string, "
            f"got {text[:200]!r}"
        )
    return spec


def write_result(path: str | os.PathLike[str], result: TrialResult) -> None:
    """Write ``result`` as JSON to ``path`` atomically (temporary file, then ``os.replace``)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(result.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _run(spec: dict[str, Any]) -> TrialResult:
    """Run the trial; an error that escapes ``run_trial`` (e.g. an import) becomes a result."""
    try:
        from .runner import run_spec  # a user's command, or run_trial

        return run_spec(spec)
    except Exception as err:  # noqa: BLE001 - every failure must become a stored result
        from ..trials import failure_result

        status = "oom" if isinstance(err, MemoryError) else "failed"
        return failure_result(spec, status, "".join(traceback.format_exception(err)).rstrip())


def die_with_parent() -> None:
    """Get ``SIGKILL`` when the parent dies (Linux, ``PR_SET_PDEATHSIG``), so that no trial
    process outlives the launcher that started it.

    Applies under a launcher's guard (``CUBICML_LAB_GUARD_PID`` set: the parent is the guard, or
    under torchrun the agent that the guard started) and under torchrun (whose agent starts its
    workers in their own sessions, out of reach of a signal to its group). A process whose parent
    is already not the expected one (the parent died before the request took effect) exits at
    once. Run by hand, outside both, it does nothing.
    """
    guard = os.environ.get("CUBICML_LAB_GUARD_PID", "")
    torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    if not (guard.isdigit() or torchrun) or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
    if guard.isdigit() and int(guard) not in (parent, _parent_of(parent)):
        os._exit(1)  # orphaned before we got here: the guard is gone


def _parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (Linux ``/proc``), or None."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def result_path_for_rank(path: str, rank: int) -> str:
    """Rank 0 writes ``path``; a failed rank N of a multi-process trial ``path.rankN``."""
    return path if rank == 0 else f"{path}.rank{rank}"


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def pin_to_cpus(cpus: str | None) -> None:
    """Bind this process (and what it starts later) to the cores listed in ``cpus`` ("0,2"),
    as :class:`~cubicml_lab.launch.LocalPool` asks through ``CUBICML_LAB_CPUS``; no-op when
    unset. Done before torch loads, so its thread pool sizes itself to these cores."""
    if not cpus:
        return
    cores = {int(c) for c in cpus.split(",")}
    os.sched_setaffinity(0, cores)


#: How the trial's OpenMP threads wait for work between parallel regions, unless the caller's
#: environment says otherwise: set before torch (and its libgomp) loads. See
#: :func:`set_thread_waiting` for what was measured.
THREAD_WAIT_ENV = {"GOMP_SPINCOUNT": "1000", "KMP_BLOCKTIME": "0"}


def set_thread_waiting(env: dict[str, str] | None = None) -> dict[str, str]:
    """Make the trial's idle OpenMP threads sleep soon instead of spinning; return what was set.

    torch's CPU wheels use GNU OpenMP, whose idle threads spin for a while (300,000 polls by
    default) before they sleep. On a machine that other processes share, the spinning threads
    take the cores from the threads that have work, and a step slows down many times over
    instead of by the share the others take. ``GOMP_SPINCOUNT`` bounds the spinning
    (``KMP_BLOCKTIME`` does the same for Intel's OpenMP). 1k polls (the value set) costs
    1-2% of an idle step and degrades by about the share the others take. A variable already
    set in ``env``
    (default ``os.environ``: e.g. ``Subprocess(env={"OMP_WAIT_POLICY": "ACTIVE"})``) is left
    alone, and so is everything when ``OMP_WAIT_POLICY`` is set.

    Threads are not pinned (``OMP_PROC_BIND``): pinning did not steady the figures, and a
    pinned thread cannot move off a core that another process takes.
    """
    env = os.environ if env is None else env
    if "OMP_WAIT_POLICY" in env:
        return {}
    done = {k: v for k, v in THREAD_WAIT_ENV.items() if k not in env}
    env.update(done)
    return done


_REEXECUTED_ENV = "_CUBICML_LAB_LAYOUT_REEXEC"


def fix_address_layout(argv: list[str] | None = None) -> bool:
    """Run this trial process with the kernel's address-space layout randomisation off: set
    ``ADDR_NO_RANDOMIZE`` in its personality and execute it again, same pid and arguments,
    before anything heavy loads; return False where nothing was done (already fixed, not
    Linux, ``CUBICML_LAB_ADDRESS_LAYOUT=randomized``, or the kernel refused); on success it
    does not return. ``argv``: the command line to execute (default ``sys.orig_argv``).
    ``hardware["address_layout"]`` records what the trial ran with. The
    launchers' guard (:mod:`cubicml_lab.launch._guard`) sets the flag before it starts the
    trial, which saves the second start (0.2 s: importing ``cubicml_lab`` again); torchrun's
    and Slurm's ranks come here.

    Why: where libraries, heap and thread stacks land moves a CPU step's speed by a few percent
    from one fresh process to the next (address-indexed predictors and caches), and a
    measurement is one process. With randomisation off the stored figure
    spreads less across fresh processes. Some configurations still fall on two levels 5-8%
    apart (physical pages are placed as before), and one fixed layout may favour a
    configuration by a few percent that randomised processes would average away only over
    repeats a campaign does not make. LLVM's benchmarking tips turn
    randomisation off for repeatability and warn of the same bias (Mytkowicz et al., "Producing
    Wrong Data Without Doing Anything Obviously Wrong!", ASPLOS 2009)."""
    from ..hardware.machine import address_layout
    from ._guard import no_layout_randomization

    if (os.environ.get(_REEXECUTED_ENV) or address_layout() != "randomized"
            or not no_layout_randomization()):
        return False
    os.environ[_REEXECUTED_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    args = list(sys.orig_argv) if argv is None else argv
    try:
        os.execv(sys.executable, [sys.executable, *args[1:]])
    except OSError:  # the trial runs on, randomised (the flag only acts at an exec)
        os.environ.pop(_REEXECUTED_ENV, None)
        return False
    return True  # not reached


def main(argv: list[str] | None = None) -> int:
    """Run one trial as the command line asks; return the process exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m cubicml_lab.launch.worker",
        description="Run one cubicml-lab trial from a JSON spec and write its result as JSON.",
    )
    parser.add_argument("--spec", required=True, help="path of the trial spec (JSON)")
    parser.add_argument("--result", required=True, help="path to write the TrialResult (JSON)")
    parser.add_argument(
        "--memory-limit-gib",
        type=_positive_float,
        default=None,
        help="cap on the virtual address space (RLIMIT_AS) in GiB, applied before torch loads",
    )
    args = parser.parse_args(argv)
    if argv is None:
        fix_address_layout()
    die_with_parent()
    set_thread_waiting()
    try:
        pin_to_cpus(os.environ.get("CUBICML_LAB_CPUS"))
    except (OSError, ValueError) as err:
        print(f"cubicml_lab.launch.worker: cannot pin to CUBICML_LAB_CPUS: {err}",
              file=sys.stderr)
        return EXIT_USAGE
    if args.memory_limit_gib is not None:
        try:
            apply_memory_limit(args.memory_limit_gib)
        except (OSError, ValueError) as err:
            print(f"cubicml_lab.launch.worker: cannot apply --memory-limit-gib: {err}",
                  file=sys.stderr)
            return EXIT_USAGE
    try:
        spec = read_spec(args.spec)
    except ValueError as err:
        print(f"cubicml_lab.launch.worker: {err}", file=sys.stderr)
        return EXIT_USAGE
    rank = int(os.environ.get("RANK", "0") or 0)
    result = _run(spec)
    if rank == 0 or result.status != "ok":
        write_result(result_path_for_rank(args.result, rank), result)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
