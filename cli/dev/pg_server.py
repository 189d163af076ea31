"""A throwaway PostgreSQL server for tests and benchmarks: initdb, start, a database each, stop.

The server is the real one from the distribution (``/usr/lib/postgresql/<version>/bin``, which
``scripts/ensure-test-deps.sh`` installs when missing), in a temporary directory, listening on
127.0.0.1 and a free port with ``trust`` authentication. PostgreSQL refuses to run as root: as
root, the server runs as the ``postgres`` user the package creates (or ``nobody``).

``durable=False`` turns fsync off, which suits tests; benchmarks keep the server's defaults.
:meth:`PgServer.kill` (SIGKILL), :meth:`PgServer.shut_down` (a clean stop) and
:meth:`PgServer.restart` take the server down and bring it back on the same data and port, for
tests and benchmarks of a database restart (keep it ``durable`` for those: without fsync a killed
server may lose commits it confirmed).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Final

from fleetwatch.testing import free_port

START_TIMEOUT_S: Final = 60.0


class PgServerError(RuntimeError):
    """The PostgreSQL server could not be found, initialised or started."""


def find_bin_dir(root: Path = Path("/usr/lib/postgresql")) -> Path | None:
    """The newest installed server's ``bin`` directory, or None."""
    found = sorted(
        (p for p in root.glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    return found[-1] if found else None


class PgServer:
    """One PostgreSQL server, from :meth:`start` to :meth:`stop`."""

    def __init__(self, *, durable: bool = False, bin_dir: Path | None = None) -> None:
        """Nothing runs until :meth:`start`."""
        self.durable = durable
        self.bin_dir = bin_dir or find_bin_dir()
        self.port = 0
        self.base: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._user: str | None = None

    def _as_user(self, args: list[str]) -> list[str]:
        return args if self._user is None else ["runuser", "-u", self._user, "--", *args]

    def start(self) -> None:
        """Run initdb in a new temp dir and start the server; wait until it accepts connections."""
        if self.bin_dir is None:
            msg = "no PostgreSQL under /usr/lib/postgresql (apt-get install postgresql)"
            raise PgServerError(msg)
        self.base = Path(tempfile.mkdtemp(prefix="fleetwatch-pg-"))
        data, sockets = self.base / "data", self.base / "run"
        sockets.mkdir()
        if os.geteuid() == 0:
            self._user = _unprivileged_user()
            entry = pwd.getpwnam(self._user)
            for path in (self.base, sockets):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        init = [str(self.bin_dir / "initdb"), "-D", str(data), "-U", "postgres"]
        init += ["--auth=trust", "--encoding=UTF8", "--no-instructions"]
        if not self.durable:
            init.append("--no-sync")
        done = subprocess.run(self._as_user(init), capture_output=True, check=False)  # noqa: S603
        if done.returncode != 0:
            msg = f"initdb failed: {done.stderr.decode(errors='replace')[-2000:]}"
            raise PgServerError(msg)
        self.port = free_port()
        self._launch()

    def _launch(self) -> None:
        """Start the server on the data directory :meth:`start` made; wait until it is ready."""
        if self.base is None or self.bin_dir is None:
            msg = "the server was never initialised (call start first)"
            raise PgServerError(msg)
        settings = [
            f"port={self.port}",
            "listen_addresses=127.0.0.1",
            f"unix_socket_directories={self.base / 'run'}",
            "max_connections=200",
            "shared_buffers=64MB",
        ]
        if not self.durable:
            settings += ["fsync=off", "synchronous_commit=off", "full_page_writes=off"]
        args = [str(self.bin_dir / "postgres"), "-D", str(self.base / "data")]
        for setting in settings:
            args += ["-c", setting]
        with (self.base / "server.log").open("ab") as log:  # the child keeps its own copy
            self._proc = subprocess.Popen(  # noqa: S603 - our own arguments
                self._as_user(args), stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_ready()

    def _postmaster_pid(self) -> int | None:
        """The running server's main process (``postmaster.pid``), or None when none runs."""
        if self.base is None:
            return None
        try:
            first = (self.base / "data" / "postmaster.pid").read_text().split("\n", 1)[0]
            pid = int(first)
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def _wait_gone(self) -> None:
        if self._proc is not None:
            try:
                self._proc.wait(timeout=START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def kill(self) -> None:
        """SIGKILL the server and every process of it at once, as a crash or the OOM killer would.

        The data directory stays; :meth:`restart` starts the server on it again (it recovers from
        its write-ahead log, so what it committed durably is kept).
        """
        pid = self._postmaster_pid()
        if pid is not None:
            # Stopped first, the main process cannot start new processes (a lost one makes it
            # restart them all) between the listing and the kill; one left over would keep the
            # shared memory and stop the next start.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            doomed = [pid, *_children(pid)]
            for victim in doomed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + START_TIMEOUT_S
            while any(_alive(v) for v in doomed) and time.monotonic() < deadline:
                time.sleep(0.02)
        if self._proc is not None and self._proc.poll() is None:
            # runuser stops itself when its child stops: wake it to see the child gone
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGCONT)
        self._wait_gone()

    def shut_down(self) -> None:
        """Stop the server cleanly (fast shutdown: sessions are ended, work is checkpointed).

        The data directory stays; :meth:`restart` starts the server on it again.
        """
        pid = self._postmaster_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
        self._wait_gone()

    def restart(self) -> None:
        """Start the server again on its data directory and port; wait until it is ready.

        After :meth:`kill` or :meth:`shut_down`.
        """
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._postmaster_pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)  # a killed server's processes are still going away
        if self.base is not None and self._postmaster_pid() is None:
            # a killed server's lock file names a process that is gone, or a zombie nobody
            # reaps (which PostgreSQL would take for a server still running)
            (self.base / "data" / "postmaster.pid").unlink(missing_ok=True)
            for stale in (self.base / "run").glob(f".s.PGSQL.{self.port}*"):
                stale.unlink(missing_ok=True)
        self._launch()

    @property
    def running(self) -> bool:
        """Whether the server's main process is alive."""
        return self._postmaster_pid() is not None

    def _wait_ready(self) -> None:
        import psycopg  # noqa: PLC0415 - only where a server runs

        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                msg = f"postgres exited with {self._proc.returncode}: {self.log_tail()}"
                raise PgServerError(msg)
            try:
                with psycopg.connect(self.dsn("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    msg = f"postgres did not accept connections in time: {self.log_tail()}"
                    raise PgServerError(msg) from None
                time.sleep(0.1)

    def log_tail(self) -> str:
        """The end of the server's log."""
        if self.base is None:
            return ""
        with contextlib.suppress(OSError):
            return (self.base / "server.log").read_text(errors="replace")[-2000:]
        return ""

    def dsn(self, database: str) -> str:
        """A connection string for ``database`` on this server."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def create_database(self, name: str) -> str:
        """Create an empty database; return its connection string."""
        import psycopg  # noqa: PLC0415

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, closing its connections first."""
        import psycopg  # noqa: PLC0415

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its files."""
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._postmaster_pid() is not None:  # run as another user: runuser went, not it
            self.shut_down()
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from ``/proc``)."""
    out: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # the command may hold spaces and parentheses: the fields after its last ")"
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (which holds no memory)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _unprivileged_user() -> str:
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    msg = "running as root, and neither a postgres nor a nobody user exists to run postgres as"
    raise PgServerError(msg)
