import os
import socket
from pathlib import Path

import pytest

from agent.jobs.peer_identity import (
    Credentials,
    PeerGoneError,
    PeerResolver,
    SchedulerJob,
    boot_time,
    peer_credentials,
    scheduler_job,
    start_ticks,
)

POD = "8f2c1a4e-3b7d-4c1e-9a0f-1d2e3f4a5b6c"
POD_SYSTEMD = POD.replace("-", "_")

# /proc/<pid>/cgroup of processes on real nodes, as the kernel writes it.
SLURM_V1 = """\
12:pids:/slurm/uid_1000/job_1234/step_0/task_0
11:hugetlb:/
10:freezer:/slurm/uid_1000/job_1234/step_0
9:devices:/slurm/uid_1000/job_1234/step_0/task_0
8:memory:/slurm/uid_1000/job_1234/step_0/task_0
7:cpu,cpuacct:/system.slice/slurmd.service
6:cpuset:/slurm/uid_1000/job_1234/step_0
5:net_cls,net_prio:/
4:perf_event:/
3:blkio:/system.slice/slurmd.service
2:rdma:/
1:name=systemd:/system.slice/slurmd.service
0::/system.slice/slurmd.service
"""
SLURM_V2 = "0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0\n"
SLURM_V2_BATCH = "0::/system.slice/slurmstepd.scope/job_987654/step_batch/user/task_0\n"
SLURM_V2_MULTIPLE_SLURMD = "0::/system.slice/gpu07_slurmstepd.scope/job_55/step_3/user/task_1\n"
SLURM_V1_NODE_ROOT = "4:memory:/slurm_gpu07/uid_0/job_12/step_0/task_0\n0::/\n"
K8S_SYSTEMD_V2 = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{POD_SYSTEMD}.slice/"
    "cri-containerd-4c3f5e0a9d8b7c6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e.scope\n"
)
K8S_SYSTEMD_GUARANTEED = (
    f"0::/kubepods.slice/kubepods-pod{POD_SYSTEMD}.slice/"
    "cri-containerd-4c3f5e0a9d8b7c6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e.scope\n"
)
K8S_SYSTEMD_V1 = f"""\
11:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_SYSTEMD}.slice/docker-0a1b2c.scope
1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_SYSTEMD}.slice/docker-0a1b2c.scope
"""
K8S_CGROUPFS_V1 = f"""\
12:pids:/kubepods/burstable/pod{POD}/0a1b2c3d4e5f
8:memory:/kubepods/burstable/pod{POD}/0a1b2c3d4e5f
1:name=systemd:/kubepods/burstable/pod{POD}/0a1b2c3d4e5f
"""
K8S_CGROUPFS_GUARANTEED = f"0::/kubepods/pod{POD}/0a1b2c3d4e5f\n"
K8S_KIND = (
    "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
    f"kubelet-kubepods-besteffort-pod{POD_SYSTEMD}.slice/cri-containerd-0a1b2c.scope\n"
)
USER_SESSION = "0::/user.slice/user-1000.slice/session-3.scope\n"
USER_SESSION_V1 = """\
12:pids:/user.slice/user-1000.slice/session-3.scope
8:memory:/user.slice/user-1000.slice/session-3.scope
1:name=systemd:/user.slice/user-1000.slice/session-3.scope
0::/user.slice/user-1000.slice/session-3.scope
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SLURM_V1, SchedulerJob("slurm", "1234")),
        (SLURM_V2, SchedulerJob("slurm", "1234")),
        (SLURM_V2_BATCH, SchedulerJob("slurm", "987654")),
        (SLURM_V2_MULTIPLE_SLURMD, SchedulerJob("slurm", "55")),
        (SLURM_V1_NODE_ROOT, SchedulerJob("slurm", "12")),
        (K8S_SYSTEMD_V2, SchedulerJob("k8s", POD)),
        (K8S_SYSTEMD_GUARANTEED, SchedulerJob("k8s", POD)),
        (K8S_SYSTEMD_V1, SchedulerJob("k8s", POD)),
        (K8S_CGROUPFS_V1, SchedulerJob("k8s", POD)),
        (K8S_CGROUPFS_GUARANTEED, SchedulerJob("k8s", POD)),
        (K8S_KIND, SchedulerJob("k8s", POD)),
        (USER_SESSION, None),
        (USER_SESSION_V1, None),
        ("0::/\n", None),
        ("", None),
    ],
    ids=[
        "slurm-v1",
        "slurm-v2",
        "slurm-v2-batch",
        "slurm-v2-multiple-slurmd",
        "slurm-v1-node-root",
        "k8s-systemd-v2",
        "k8s-systemd-guaranteed",
        "k8s-systemd-v1",
        "k8s-cgroupfs-v1",
        "k8s-cgroupfs-guaranteed",
        "k8s-kind",
        "user-session",
        "user-session-v1",
        "root",
        "empty",
    ],
)
def test_scheduler_job_from_real_cgroup_layouts(text, expected):
    assert scheduler_job(text) == expected


@pytest.mark.parametrize(
    "path",
    [
        # A user's own systemd instance may create cgroups below user@<uid>.service.
        "/user.slice/user-1000.slice/user@1000.service/app.slice/slurm/uid_1000/job_1234/step_0",
        "/user.slice/user-1000.slice/user@1000.service/slurmstepd.scope/job_1234",
        f"/user.slice/user-1000.slice/user@1000.service/kubepods/pod{POD}/x",
        f"/user.slice/user-1000.slice/user@1000.service/kubepods.slice/kubepods-pod{POD_SYSTEMD}.slice",
        "/user.slice/user-1000.slice/session-3.scope/job_1234",
        "/system.slice/slurmstepd.scope/system",  # slurmstepd itself, not a job's task
        "/system.slice/slurmd.service",
        "/slurm/uid_1000/job_abc/step_0",
        "/system.slice/slurmstepd.scope/job_12x/step_0",
        f"/kubepods/burstable/pod{POD_SYSTEMD}/x",  # cgroupfs names use dashes
        "/kubepods/burstable/podnot-a-uuid/x",
        "/kubepods.slice/kubepods-burstable.slice/x.scope",
    ],
)
def test_paths_a_user_could_make_or_that_name_no_job_give_none(path):
    """Only paths under a scheduler's own root count: a user's delegated subtree names none."""
    assert scheduler_job(f"0::{path}\n") is None


def test_the_unified_line_is_read_before_v1_hierarchies():
    text = "4:memory:/slurm/uid_0/job_1/step_0\n0::/system.slice/slurmstepd.scope/job_2/step_0\n"
    assert scheduler_job(text) == SchedulerJob("slurm", "2")


def test_labels_are_what_the_wire_carries():
    assert SchedulerJob("slurm", "1234").label == "slurm:1234"
    assert SchedulerJob("k8s", POD).label == f"k8s:{POD}"


# ---- /proc/<pid>/stat and /proc/stat ----------------------------------------------------------


def stat_line(pid: int, name: str, start: int) -> str:
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12 + [str(start)]
    return f"{pid} ({name}) {' '.join(fields)} 1234567 890 18446744073709551615\n"


def test_start_ticks_reads_field_22_even_when_the_name_has_spaces_and_parens():
    assert start_ticks(stat_line(42, "python3", 777)) == 777
    assert start_ticks(stat_line(42, "evil) S 1 2 3 (x", 778)) == 778


def test_start_ticks_reads_this_process_as_the_kernel_wrote_it():
    ticks = start_ticks(Path(f"/proc/{os.getpid()}/stat").read_text())
    assert PeerResolver(Path("/proc")).alive(os.getpid(), ticks)


def test_boot_time_is_the_btime_line():
    assert boot_time("cpu  1 2 3\nintr 5\nbtime 1767225600\nprocesses 9\n") == 1767225600
    with pytest.raises(ValueError, match="btime"):
        boot_time("cpu 1 2 3\n")


# ---- PeerResolver against an injected proc root -----------------------------------------------


@pytest.fixture
def proc(tmp_path):
    (tmp_path / "stat").write_text("cpu 1 2 3\nbtime 1767225600\n")

    def process(pid: int, start: int, cgroup: str) -> None:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        (tmp_path / str(pid) / "stat").write_text(stat_line(pid, "python3", start))
        (tmp_path / str(pid) / "cgroup").write_text(cgroup)

    process.root = tmp_path  # type: ignore[attr-defined]
    return process


def test_resolve_finds_start_time_and_scheduler_job(proc):
    proc(4242, 500, SLURM_V2)
    peer = PeerResolver(proc.root, ticks_per_s=100).resolve(Credentials(4242, 1000, 1000))
    assert (peer.pid, peer.uid, peer.gid, peer.start_ticks) == (4242, 1000, 1000, 500)
    assert peer.start_unix_ms == 1767225600_000 + 5_000
    assert peer.scheduler == SchedulerJob("slurm", "1234")


def test_a_reused_pid_is_looked_up_again(proc):
    """The cgroup is cached per process (pid and start); a new process with the pid is re-read."""
    resolver = PeerResolver(proc.root, ticks_per_s=100)
    proc(4242, 500, SLURM_V2)
    assert resolver.resolve(Credentials(4242, 1000, 1000)).scheduler is not None
    proc(4242, 900, USER_SESSION)
    assert resolver.resolve(Credentials(4242, 1001, 1001)).scheduler is None


def test_a_sender_that_is_gone_raises(proc):
    resolver = PeerResolver(proc.root)
    with pytest.raises(PeerGoneError, match="process 99 is gone"):
        resolver.resolve(Credentials(99, 1000, 1000))
    assert not resolver.alive(99, 1)


def test_alive_checks_the_start_too(proc):
    proc(4242, 500, USER_SESSION)
    resolver = PeerResolver(proc.root)
    assert resolver.alive(4242, 500)
    assert not resolver.alive(4242, 501)


def test_no_btime_gives_no_start_time(tmp_path):
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "stat").write_text(stat_line(7, "x", 500))
    (tmp_path / "7" / "cgroup").write_text(USER_SESSION)
    assert PeerResolver(tmp_path).resolve(Credentials(7, 0, 0)).start_unix_ms == 0


# ---- credentials from the kernel --------------------------------------------------------------


def test_the_kernel_names_who_connected_with_so_peercred(tmp_path):
    """A connection accepted on a listening socket carries the connecting process's pid, uid
    and gid, as the kernel took them at connect."""
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listening:
        listening.bind(str(path))
        listening.listen(1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as client:
            client.connect(str(path))
            conn, _ = listening.accept()
            with conn:
                creds = peer_credentials(conn)
    assert creds == Credentials(os.getpid(), os.getuid(), os.getgid())
    peer = PeerResolver(Path("/proc")).resolve(creds)
    assert peer.start_unix_ms > 1_600_000_000_000
