"""Which process runs a trial, told apart from a later one with the same pid, and cleaning up
after a campaign that died.

A pid names a process only while it lives: once it exits, the kernel hands the number to the next
process. A *process identity* is the pid together with the process's start time (clock ticks
since boot on Linux, read from ``/proc/<pid>/stat``; seconds since the epoch elsewhere, from
``ps``), so a recycled pid never matches a stored identity and is never signalled.

A launcher describes each trial process it starts as a :func:`trial_record` (plain JSON), and the
campaign keeps that record with the running trial (``trial.hardware["process"]``). When a campaign
resumes a trial still marked ``running``, :func:`owner_state` says whether the campaign that ran it
is alive (another process sharing the campaign: leave it), is this process, is on another host, or
is dead; :func:`end_trial_process` ends what a dead campaign left, by identity and by proof.

A store is data: anyone may import, copy or hand-edit a record naming any pid and start time, so
neither ever leads to a signal on its own. A campaign signals a process only when it can prove
that this lab started it: every guard gets a fresh 128-bit secret (:func:`guard_environment`,
``CUBICML_LAB_TRIAL_TOKEN``) and the pid and start time of the campaign process that started it
(``CUBICML_LAB_TRIAL_OWNER``) in its environment, which its trial inherits, and the lab writes the
same secret into the trial's record. :func:`end_trial_process` reads the environment the kernel
holds for the recorded process group (``/proc/<pid>/environ``, readable only by its owner) and
signals nothing unless a member carries the record's secret and owner; a secret still held by a
guard of this process (:func:`hold_token`) proves nothing either, so a record copied onto another
trial never ends this process's own trials. Where ``/proc`` is missing nothing can be proved and
nothing is signalled.

A trial's temporary folder is ``cubicml-trial-<owner pid>-<owner start>-<random>`` in the temp
directory: the owner is the process that launched it, so :func:`sweep_trial_dirs` can tell the
folders of dead owners from those in use without reading anything inside them.

This module imports no torch.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["OWNER_ENV", "TOKEN_ENV", "TRIAL_DIR_PREFIX", "carries_proof", "end_trial_process",
           "group_members", "guard_environment", "hold_token", "identity", "is_running",
           "new_token", "new_trial_dir", "owner_state", "process_start", "release_token",
           "sweep_trial_dirs", "trial_record"]

#: Environment variable holding a trial guard's secret (also in the trial's stored record).
TOKEN_ENV = "CUBICML_LAB_TRIAL_TOKEN"
#: Environment variable naming the campaign process that started a guard (``pid:start``).
OWNER_ENV = "CUBICML_LAB_TRIAL_OWNER"
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
_ENVIRON_MAX_BYTES = 1 << 20  # the kernel's own limit on an environment is far below this
#: Secrets of the guards this process runs now (a record naming one proves nothing).
_HELD: set[str] = set()
_HELD_LOCK = threading.Lock()

#: Prefix of every trial's temporary folder.
TRIAL_DIR_PREFIX = "cubicml-trial-"
_TRIAL_DIR = re.compile(rf"^{re.escape(TRIAL_DIR_PREFIX)}(\d+)-(\d+)-[0-9a-f]+$")
_RECORD_KEYS = ("host", "pid", "start", "owner_pid", "owner_start")


def process_start(pid: int) -> int | None:
    """Start time of a live process, or None when there is no such process (or a zombie).

    Linux: clock ticks since boot (``/proc/<pid>/stat`` field 22). Elsewhere: seconds since the
    epoch, from ``ps -o lstart=``. Only equality between two readings is meaningful.
    """
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if sys.platform.startswith("linux"):
        fields = _stat(pid)
        return None if fields is None or fields[0] in ("Z", "X") else int(fields[19])
    out = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True,
                         check=False)
    text = out.stdout.strip()
    if out.returncode != 0 or not text:
        return None
    try:
        return int(time.mktime(time.strptime(text, "%a %b %d %H:%M:%S %Y")))
    except ValueError:
        return None


def _stat(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state first), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``; Linux only (else ``[]``)."""
    if not sys.platform.startswith("linux"):
        return []
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                members.append(int(entry))
    return members


@lru_cache(maxsize=1)
def _host() -> str:
    return socket.gethostname()


def identity(pid: int | None = None) -> dict[str, Any]:
    """``{"host", "pid", "start"}`` of a live process (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return {"host": _host(), "pid": pid, "start": process_start(pid)}


def trial_record(pid: int | None = None, token: str | None = None) -> dict[str, Any]:
    """The record a launcher gives for a trial process ``pid`` started by this process (default:
    the trial runs in this process): its identity and its owner's (this process), and the
    guard's secret ``token`` (:func:`guard_environment`) when there is one."""
    me = identity()
    proc = me if pid is None else identity(pid)
    record = {"host": me["host"], "pid": proc["pid"], "start": proc["start"],
              "owner_pid": me["pid"], "owner_start": me["start"]}
    if token is not None:
        record["token"] = token
    return record


def new_token() -> str:
    """A fresh secret for one trial guard: 32 hex digits (128 random bits)."""
    return secrets.token_hex(16)


def guard_environment(token: str) -> dict[str, str]:
    """The variables a guard (and so its trial) gets so that this lab can later prove it
    started it: the secret and this process's identity as its owner."""
    me = identity()
    return {TOKEN_ENV: token, OWNER_ENV: f"{me['pid']}:{me['start']}"}


def hold_token(token: str) -> None:
    """Note that a guard of this process runs with ``token`` (until :func:`release_token`)."""
    with _HELD_LOCK:
        _HELD.add(token)


def release_token(token: str) -> None:
    """The guard that ran with ``token`` is gone."""
    with _HELD_LOCK:
        _HELD.discard(token)


def _environ(pid: int) -> dict[str, str] | None:
    """The environment the kernel holds for ``pid`` (Linux), or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read(_ENVIRON_MAX_BYTES)
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def carries_proof(pid: int, record: Any) -> bool:
    """True if process ``pid`` carries the secret and the owner that ``record`` names in its
    environment, i.e. a guard this lab started for that record (or a process it started).
    A record without a well-formed secret, or with one a guard of this process still holds,
    proves nothing."""
    if not _valid(record):
        return False
    token = record.get("token")
    if not isinstance(token, str) or not _TOKEN.match(token):
        return False
    with _HELD_LOCK:
        if token in _HELD:
            return False
    env = _environ(pid)
    if env is None:
        return False
    return (hmac.compare_digest(env.get(TOKEN_ENV, ""), token)
            and env.get(OWNER_ENV) == f"{record['owner_pid']}:{record['owner_start']}")


def is_running(pid: Any, start: Any) -> bool:
    """True if a process with this pid and this start time is alive on this host."""
    if not (isinstance(pid, int) and isinstance(start, int)) or pid <= 0:
        return False
    return process_start(pid) == start


def _valid(record: Any) -> bool:
    """A record as :func:`trial_record` writes it (a store may hold anything)."""
    if not isinstance(record, dict) or not all(k in record for k in _RECORD_KEYS):
        return False
    ints = [record[k] for k in _RECORD_KEYS[1:]]
    return isinstance(record["host"], str) and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 1 for v in ints)


def owner_state(record: Any) -> str:
    """Who ran the trial this record describes, as far as this process can tell.

    Returns:
        ``"unknown"`` (no valid record, e.g. a store written before records existed),
        ``"elsewhere"`` (another host: cannot be checked), ``"this process"``, ``"alive"``
        (another live process on this host) or ``"dead"``.
    """
    if not _valid(record):
        return "unknown"
    if record["host"] != _host():
        return "elsewhere"
    me = identity()
    if (record["owner_pid"], record["owner_start"]) == (me["pid"], me["start"]):
        return "this process"
    return "alive" if is_running(record["owner_pid"], record["owner_start"]) else "dead"


def end_trial_process(record: Any, timeout_s: float = 5.0) -> str:
    """End the trial process a record names, with its whole process group, if any of it lives
    and this lab can prove it started it (see the module doc).

    Every launcher here starts a trial process as the leader of a new process group, so the
    record's pid is also the group's id. The group is killed (``SIGKILL``) only when its leader
    is the recorded process (same pid and start time, alive or a zombie), or no process has that
    pid any more but the group lives on (the leader died first), *and* a live member of the
    group carries the record's secret and owner in its environment (:func:`carries_proof`). A pid
    now held by another process means the recorded group is empty. Never this process or its
    group; a trial that ran inside its campaign's process has nothing to end.

    Returns:
        ``"gone"``: nothing of the recorded process is left (or there never was a separate one);
        ``"ended"``: it was killed and is gone; ``"not ours"``: something lives under that pid
        but nothing proves this lab started it, so it was not signalled; ``"alive"``: it would not
        die within ``timeout_s``; ``"elsewhere"``: another host, which cannot be checked.
    """
    if not _valid(record):
        return "gone"
    if record["host"] != _host():
        return "elsewhere"
    pid, start = record["pid"], record["start"]
    if pid == record["owner_pid"] or pid in (os.getpid(), os.getpgid(0)):
        return "gone"  # ran in the campaign's process: there is no separate process to end
    if not sys.platform.startswith("linux"):
        return "not ours" if is_running(pid, start) else "gone"  # nothing to prove it with
    fields = _stat(pid)
    if fields is not None and int(fields[19]) != start:
        return "gone"  # the pid was recycled, so its old group is empty
    members = group_members(pid)
    if not members:
        return "gone"
    if not any(carries_proof(member, record) for member in members):
        return "not ours"
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + timeout_s
    while (group_members(pid) or is_running(pid, start)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return "alive" if group_members(pid) or is_running(pid, start) else "ended"


def new_trial_dir(tempdir: str | None = None) -> str:
    """A fresh path (not created) for a trial's folder, naming this process as its owner."""
    me = identity()
    name = f"{TRIAL_DIR_PREFIX}{me['pid']}-{me['start'] or 0}-{uuid.uuid4().hex[:12]}"
    return os.path.join(tempdir or tempfile.gettempdir(), name)


def sweep_trial_dirs(tempdir: str | None = None) -> list[str]:
    """Remove the trial folders whose owner process is dead; return the paths removed.

    A trial's guard removes its folder when its campaign dies; this catches what a machine crash
    or a killed guard left. Folders of live owners, of other users, and folders not named by
    :func:`new_trial_dir` are left alone.
    """
    root = tempdir or tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return []
    removed = []
    for name in names:
        match = _TRIAL_DIR.match(name)
        if match is None:
            continue
        path = os.path.join(root, name)
        try:
            if os.lstat(path).st_uid != os.getuid() or not os.path.isdir(path):
                continue
        except OSError:
            continue
        pid, start = int(match.group(1)), int(match.group(2))
        if start and not is_running(pid, start):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
