"""A one-node Slurm cluster on localhost, entirely under a temporary folder, for the slurm tests.

:func:`start_cluster` starts munged (its key and socket in the folder), mariadbd (TCP on
127.0.0.1, a fresh data directory, no grant tables), slurmdbd (accounting: submitit reads job
states through ``sacct``), slurmctld and slurmd, all in the foreground as children of this
process with ``SlurmUser=root``; state, spool and logs live in the folder. It waits until
``sinfo`` shows the node idle and ``sacct`` answers, and :meth:`SlurmCluster.stop` ends every
daemon it started by its recorded PID (SIGTERM, then SIGKILL) and removes the folder.

Slurm commands and submitit find the cluster through ``SLURM_CONF`` (:attr:`SlurmCluster.env`).
Memory limits are enforced through cgroup v1 (``proctrack/cgroup``, ``task/cgroup``,
``jobacct_gather/cgroup``, ``ConstrainRAMSpace=yes``), so a job over its ``--mem`` ends
``OUT_OF_MEMORY``. Needs root and Debian's ``slurm-wlm slurmdbd munge mariadb-server``.

Run it by hand: ``python tests/slurm_cluster.py`` starts a cluster, prints its ``SLURM_CONF``
and stops it on Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import final

PACKAGES = "slurm-wlm slurmdbd munge mariadb-server"
BINARIES = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd",
            "sinfo", "sacct", "sbatch", "scancel")
NODE = "localhost"


def missing_binaries() -> list[str]:
    """The daemons and commands this helper needs that are not on PATH (or in /usr/sbin)."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
    return [b for b in BINARIES if shutil.which(b, path=path) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@final
@dataclass
class SlurmCluster:
    """A running one-node cluster: its folder, config, environment and daemon PIDs."""

    folder: Path
    conf: Path
    pids: dict[str, int] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    startup_s: float = 0.0

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` naming the cluster's config."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (``sinfo``, ``sacct``, ...) against this cluster."""
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def log_tail(self, name: str, lines: int = 30) -> str:
        """The last lines of a daemon's log (``slurmctld``, ``slurmd``, ``slurmdbd``, ...)."""
        path = self.folder / "log" / f"{name}.log"
        if not path.exists():
            return f"(no {path})"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Cancel every job, end each daemon this helper started, and remove the folder."""
        if self.pids.get("slurmctld"):
            try:
                self.command("scancel", "--full", "--user", "root", timeout=10)
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(1)
        for proc in reversed(self.procs):  # slurmd first, munged last
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        self.procs.clear()
        self.pids.clear()
        shutil.rmtree(self.folder, ignore_errors=True)
        remove_stale_cgroups()

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def remove_stale_cgroups() -> None:
    """Remove the empty cgroup v1 folders Slurm left for this node's jobs (deepest first);
    ``rmdir`` refuses a cgroup that still holds a process, so nothing alive is touched."""
    for root in Path("/sys/fs/cgroup").glob(f"*/slurm_{NODE}"):
        for path in sorted((p for p in root.rglob("*") if p.is_dir()),
                           key=lambda p: len(p.parts), reverse=True):
            try:
                path.rmdir()
            except OSError:
                pass


def _write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def _slurm_conf(d: Path, ports: dict[str, int], cpus: int, mem_mib: int) -> str:
    socket_path = d / "munge" / "munge.socket"
    # job ids differ from one start to the next, so a job never meets the cgroup folder that a
    # killed earlier cluster left under the same id (its cpuset then refuses the job, and the
    # node drains)
    first_job_id = 1000 + int(time.time()) % 50_000_000
    return f"""\
ClusterName=cubicml
SlurmctldHost={NODE}(127.0.0.1)
SlurmctldPort={ports["ctld"]}
SlurmdPort={ports["slurmd"]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={socket_path}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/slurmd
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ReturnToService=2
MpiDefault=none
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
JobAcctGatherType=jobacct_gather/cgroup
JobAcctGatherFrequency=1
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
FirstJobId={first_job_id}
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={ports["dbd"]}
AccountingStoragePass={socket_path}
JobCompType=jobcomp/none
InactiveLimit=0
KillWait=5
MinJobAge=300
MessageTimeout=10
SlurmdTimeout=120
NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mib} State=UNKNOWN
PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""


def _slurmdbd_conf(d: Path, ports: dict[str, int]) -> str:
    return f"""\
AuthType=auth/munge
AuthInfo=socket={d / "munge" / "munge.socket"}
DbdHost={NODE}
DbdAddr=127.0.0.1
DbdPort={ports["dbd"]}
SlurmUser=root
PidFile={d}/run/slurmdbd.pid
LogFile={d}/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports["mysql"]}
StorageUser=root
StorageLoc=slurm_acct_db
"""


def _wait(check, what: str, timeout: float, cluster: SlurmCluster, log: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, pid in cluster.pids.items():
            proc = next(p for p in cluster.procs if p.pid == pid)
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}) while waiting for "
                                   f"{what}:\n{cluster.log_tail(name)}")
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}:\n{cluster.log_tail(log)}")


def _start(cluster: SlurmCluster, name: str, args: list[str], env: dict[str, str]) -> None:
    log = open(cluster.folder / "log" / f"{name}.out", "wb")  # noqa: SIM115 - the daemon owns it
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    cluster.procs.append(proc)
    cluster.pids[name] = proc.pid


def start_cluster(*, cpus: int | None = None, mem_mib: int = 4096,
                  timeout_s: float = 60) -> SlurmCluster:
    """Start the whole stack under a new temporary folder and wait until it takes jobs.

    Args:
        cpus: CPUs of the node; default this machine's count.
        mem_mib: The node's ``RealMemory`` in MiB (what jobs may ask for in all).
        timeout_s: Seconds to wait for each daemon.

    Raises:
        RuntimeError: Not root, a binary is missing, or a daemon did not come up (with the tail
            of its log); every daemon already started is stopped first.
    """
    if os.geteuid() != 0:
        raise RuntimeError("the test cluster runs its daemons as root (SlurmUser=root)")
    missing = missing_binaries()
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)}: apt-get install {PACKAGES}")
    t0 = time.monotonic()
    remove_stale_cgroups()
    d = Path(tempfile.mkdtemp(prefix="cubicml-slurm-"))
    d.chmod(0o755)
    for sub in ("munge", "db", "state", "spool/slurmd", "run", "log"):
        (d / sub).mkdir(parents=True)
    (d / "munge").chmod(0o700)
    ports = {k: _free_port() for k in ("ctld", "slurmd", "dbd", "mysql")}
    conf = _write(d / "slurm.conf", _slurm_conf(d, ports, cpus or os.cpu_count() or 1, mem_mib))
    _write(d / "slurmdbd.conf", _slurmdbd_conf(d, ports), 0o600)
    _write(d / "cgroup.conf", "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n"
           "ConstrainCores=yes\nConstrainRAMSpace=yes\nConstrainSwapSpace=yes\n")
    cluster = SlurmCluster(folder=d, conf=conf)
    env = cluster.env
    try:
        _start_daemons(cluster, d, ports, env, timeout_s)
    except BaseException:
        cluster.stop()
        raise
    cluster.startup_s = time.monotonic() - t0
    return cluster


def _start_daemons(cluster: SlurmCluster, d: Path, ports: dict[str, int], env: dict[str, str],
                   timeout_s: float) -> None:
    key = d / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    _start(cluster, "munged", ["munged", "--foreground", "--force", f"--key-file={key}",
                               f"--socket={d}/munge/munge.socket",
                               f"--pid-file={d}/run/munged.pid",
                               f"--log-file={d}/log/munged.log",
                               f"--seed-file={d}/munge/munge.seed"], env)
    subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={d}/db", "--user=root",
                    "--auth-root-authentication-method=normal", "--skip-test-db"],
                   check=True, capture_output=True, timeout=120)
    _start(cluster, "mariadbd", ["mariadbd", "--no-defaults", f"--datadir={d}/db", "--user=root",
                                 "--bind-address=127.0.0.1", f"--port={ports['mysql']}",
                                 f"--socket={d}/run/mysqld.sock", "--skip-grant-tables",
                                 f"--pid-file={d}/run/mariadbd.pid",
                                 f"--log-error={d}/log/mariadbd.log",
                                 "--innodb-buffer-pool-size=64M"], env)
    _wait(lambda: (d / "munge" / "munge.socket").exists(), "munged's socket", timeout_s,
          cluster, "munged")
    _wait(lambda: _port_open(ports["mysql"]), "mariadbd", timeout_s, cluster, "mariadbd")
    _start(cluster, "slurmdbd", ["slurmdbd", "-D"], env)
    _wait(lambda: _port_open(ports["dbd"]), "slurmdbd", timeout_s, cluster, "slurmdbd")
    _start(cluster, "slurmctld", ["slurmctld", "-D", "-i"], env)
    _start(cluster, "slurmd", ["slurmd", "-D", "-N", NODE], env)
    _wait(lambda: _node_idle(cluster), "the node to be idle in sinfo", timeout_s, cluster,
          "slurmctld")
    _wait(lambda: cluster.command("sacct", "-n", "-X").returncode == 0, "sacct", timeout_s,
          cluster, "slurmdbd")


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def node_state(cluster: SlurmCluster) -> str:
    """The node's state in ``sinfo`` without its flag suffix.

    ``sinfo`` marks a state with a trailing character (``mixed-``: planned by the backfill
    scheduler, ``idle*``: not responding, ``idle~``: powered off); the word before it is the state.
    """
    out = cluster.command("sinfo", "-h", "-N", "-o", "%T", timeout=10)
    return out.stdout.strip().rstrip("*~#!%$@^-+") if out.returncode == 0 else ""


def _node_idle(cluster: SlurmCluster) -> bool:
    return node_state(cluster) == "idle"


if __name__ == "__main__":
    with start_cluster() as c:
        print(f"up in {c.startup_s:.1f} s; export SLURM_CONF={c.conf}", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
