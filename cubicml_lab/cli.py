"""The ``cubicml-lab`` command: ``demo``, ``run``, ``report`` and ``export``.

``cubicml-lab demo`` runs the demo co-design campaign (see :mod:`cubicml_lab.demo`);
``cubicml-lab run CAMPAIGN.yaml`` starts or resumes the campaign a campaign file describes
(``Campaign.to_yaml`` writes one), headless, e.g. in tmux or as a job of its own;
``cubicml-lab report CAMPAIGN`` prints a stored campaign's trials and best configuration;
``cubicml-lab export CAMPAIGN PATH`` writes its raw trials to CSV or Parquet.
Errors from the library print as one clear message (and exit code 2), not a traceback; Ctrl-C
prints one line (what the campaign stopped and re-queued) and exits with code 130, in every
subcommand and at any moment once ``main`` runs (a second Ctrl-C, or one while the interpreter
shuts down, exits at once with the same line).

What the command reads and writes is checked first: a campaign file must be a regular file
(a FIFO or ``/dev/zero`` is refused, never read), a ``--store`` or an export target that exists
must be a regular file, and a campaign file that names programs of its own (a command, an
interpreter, environment variables, Slurm setup lines or sbatch options) is refused with the
list of what it would run unless ``--allow-programs`` (or ``--allow-commands``) is given; see
``docs/threat-model.md``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from ._bounds import check_regular_or_absent
from .errors import CubicMLError, StoreError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cubicml-lab",
                                     description="Measure, predict and search fast training configurations.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a real co-design campaign on this machine's CPU")
    demo.add_argument("--budget", type=int, default=14, help="finished trials (default 14)")
    demo.add_argument("--store", default="data/demo.sqlite", help="SQLite file (default data/demo.sqlite)")
    demo.add_argument("--out", default="runs", help="folder for demo.png (default runs)")
    demo.add_argument("--campaign", default=None, help="campaign name; an existing one resumes")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--launcher", choices=["subprocess", "inprocess"], default="subprocess")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    demo.add_argument("--processes", type=int, default=None,
                      help="fresh processes per trial, each timing it for --max-time-s, "
                           "the fastest one's figures kept (default 2)")
    demo.add_argument("--max-time-s", type=float, default=6.0,
                      help="seconds of timed steps per trial (default 6; shorter is noisier)")
    demo.add_argument("--early-stop", action="store_true",
                      help="stop a trial's timing once it cannot beat the best so far")
    demo.add_argument("--wait-for-idle-s", type=float, default=0.0,
                      help="before each trial, wait up to this many seconds for other work to "
                           "leave the cores idle (default 0: no wait)")
    run = sub.add_parser("run", help="start or resume the campaign a YAML campaign file describes")
    run.add_argument("file", help="campaign file (Campaign.to_yaml writes one)")
    run.add_argument("--budget", type=int, default=None, help="finished trials (default: the file's)")
    run.add_argument("--parallel", type=int, default=None, help="trials at once (default: the file's)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument("--allow-programs", "--allow-commands", dest="allow_commands",
                     action="store_true",
                     help="run the programs the file names: its command, a launcher's own "
                          "interpreter, environment variables, Slurm setup lines and sbatch "
                          "options (without this flag such a file is checked, what it would "
                          "run is listed, and nothing runs)")

    report = sub.add_parser("report", help="print a stored campaign's trials and best configuration")
    report.add_argument("campaign")
    report.add_argument("--store", default="data/demo.sqlite")
    export = sub.add_parser("export", help="write a campaign's raw trials to .csv or .parquet")
    export.add_argument("campaign")
    export.add_argument("path")
    export.add_argument("--store", default="data/demo.sqlite")
    return parser


def _report(campaign: str, store_path: str) -> None:
    import pandas as pd

    from .demo import summary_table
    from .space import Space
    from .store import TrialStore

    from pathlib import Path

    from .errors import StoreError

    if not Path(store_path).exists():
        raise StoreError(f"no store at {store_path}", hint="pass --store PATH of an existing file")
    with TrialStore(store_path) as store:
        info = store.campaign_info(campaign)
        df = store.to_dataframe(campaign)
    meta = info.get("metadata") or {}
    objective = meta.get("objective", "throughput")
    direction = meta.get("direction", "maximize")
    print(f"campaign {campaign!r}: workload {info.get('workload')!r}, {len(df)} trials, "
          f"objective {objective} ({direction})")
    if info.get("space"):
        space = Space.from_dict(info["space"])
        with pd.option_context("display.width", 160, "display.max_columns", 20):
            print(summary_table(df, space).to_string())
        print("status counts: " + ", ".join(f"{k}={v}" for k, v in df["status"].value_counts().items()))
        ok = df[df["status"].eq("ok")]
        if len(ok) and objective in ok:
            best = ok.loc[ok[objective].idxmax() if direction == "maximize" else ok[objective].idxmin()]
            print(f"best: {{{', '.join(f'{n}: {best[n]!r}' for n in space.names)}}} -> "
                  f"{objective} = {best[objective]:,.1f}")


def _checked_paths(args: argparse.Namespace) -> None:
    """Refuse a ``--store`` or an export target that exists and is not a regular file (opening
    a FIFO or a device would hang)."""
    hint = "pass the path of a regular file, or of one that does not exist yet"
    if getattr(args, "store", None):
        check_regular_or_absent(args.store, what="--store", error=StoreError, hint=hint)
    if args.command == "export":
        check_regular_or_absent(args.path, what="export target", error=StoreError, hint=hint)


def _dispatch(args: argparse.Namespace) -> None:
    _checked_paths(args)
    if args.command == "demo":
        from .demo import run_demo

        run_demo(args.budget, args.store, args.out, campaign=args.campaign, seed=args.seed,
                 launcher=args.launcher, progress=not args.no_progress,
                 max_time_s=args.max_time_s, wait_for_idle_s=args.wait_for_idle_s,
                 early_stop=args.early_stop,
                 **({} if args.processes is None else {"processes": args.processes}))
    elif args.command == "run":
        from .campaign import Campaign

        camp = Campaign.from_yaml(args.file, allow_commands=args.allow_commands)
        camp.run(args.budget, args.parallel, progress=not args.no_progress)
        print(camp)
    elif args.command == "report":
        _report(args.campaign, args.store)
    elif args.command == "export":
        from .store import TrialStore

        with TrialStore(args.store) as store:
            path = store.export(args.path, campaign=args.campaign)
        print(f"wrote {path}")


def _exit_on_interrupt(name: str) -> None:
    """From now on, Ctrl-C prints ``name: interrupted`` and exits 130 at once (while an error
    is printed, or while the interpreter shuts down and joins its threads)."""
    def stop(signum: int, frame: object) -> None:
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os.write(2, f"{name}: interrupted\n".encode())
        os._exit(130)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, stop)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cubicml-lab`` command; returns the exit code.

    Called as the program (``argv`` None), a Ctrl-C after ``main`` returns, while the
    interpreter shuts down, still exits 130 with one line; called with ``argv`` (from Python),
    the caller's SIGINT handler is put back on return.
    """
    name = "cubicml-lab"
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main_thread else None
    ctrl_c = _CtrlC() if main_thread else None
    try:
        args = _parser().parse_args(argv)
        name = f"cubicml-lab {args.command}"
        _dispatch(args)
        if ctrl_c is not None and ctrl_c.lost:  # it landed where Python only prints it
            raise KeyboardInterrupt
    except CubicMLError as err:
        _exit_on_interrupt(name)
        print(f"{name}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C: the campaign re-queued its trials first
        _exit_on_interrupt(name)
        print(f"{name}: {str(err) or 'interrupted'}", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports a program Ctrl-C ended
    finally:
        if ctrl_c is not None:
            ctrl_c.close()
        if argv is None:
            _exit_on_interrupt(name)
        elif main_thread and previous is not None:
            signal.signal(signal.SIGINT, previous)
    return 0


class _CtrlC:
    """Ctrl-C raises KeyboardInterrupt, as Python's own handler does, and is never lost.

    Python only prints (``Exception ignored in ...``) an exception raised inside a weakref
    callback or a ``__del__``; a Ctrl-C that lands there (seen in the import system's module-lock
    callback, while a subcommand imports) would be dropped and the command go on. Such a lost
    one is taken silently and delivered again 10 ms later (to the SIGINT handler in place,
    so a process that ignores SIGINT still does), in the main thread's ordinary code; ``lost``
    tells the caller one was lost at least once.
    """

    def __init__(self) -> None:
        self.lost = False
        self._again: threading.Timer | None = None
        self._hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable

    def _unraisable(self, info: object) -> None:
        if isinstance(getattr(info, "exc_value", None), KeyboardInterrupt):
            import _thread

            self.lost = True
            if self._again is not None and self._again.is_alive():
                return  # one delivery pending already: one Ctrl-C ends the command once
            self._again = threading.Timer(0.01, _thread.interrupt_main)
            self._again.daemon = True
            self._again.start()
        else:
            self._hook(info)  # type: ignore[arg-type]

    def close(self) -> None:
        """Put Python's hook back; a delivery not yet made is not made."""
        if self._again is not None:
            self._again.cancel()
        if sys.unraisablehook == self._unraisable:
            sys.unraisablehook = self._hook


if __name__ == "__main__":
    sys.exit(main())
