"""Engine leases (engine_lease.py): a lease whose process died is found once, a running or a
cleanly stopped engine's never, an earlier server's with the same pid never; a new lease clears
the dead leases of servers that are gone; the server's exit timeout read from its command line."""

import os
import signal
import subprocess
import sys
import time

from flint_backend.serving.engine_lease import EngineLease, dead_engines, exit_timeout_s, process_start, server_key

HOLD = """
import sys, time
from pathlib import Path
from flint_backend.serving.engine_lease import EngineLease
lease = EngineLease(server="4242.1", directory=Path(sys.argv[1]))
if sys.argv[2] == "release":
    lease.release()
print("held", flush=True)
time.sleep(60)
"""


def hold(tmp_path, mode: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path), mode], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_killed_holder_is_dead_once_and_a_running_one_never(tmp_path):
    running, killed = hold(tmp_path, "keep"), hold(tmp_path, "keep")
    try:
        assert dead_engines("4242.1", tmp_path) == []
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert [p.name for p in dead_engines("4242.1", tmp_path)] == [f"4242.1-{killed.pid}"]
        assert dead_engines("4242.1", tmp_path) == []  # removed: reported once
        assert [p.name for p in tmp_path.iterdir()] == [f"4242.1-{running.pid}"]
        assert dead_engines("4343.1", tmp_path) == []  # another server's leases are not ours
    finally:
        running.kill()


def test_a_released_lease_is_gone_and_not_dead(tmp_path):
    child = hold(tmp_path, "release")
    child.kill()
    child.wait()
    assert list(tmp_path.iterdir()) == [] and dead_engines("4242.1", tmp_path) == []


def test_a_lease_between_its_creation_and_its_lock_is_not_a_dead_engine(tmp_path):
    (tmp_path / "4242.1-77").write_bytes(b"")  # opened, not yet locked nor written
    assert dead_engines("4242.1", tmp_path) == [] and (tmp_path / "4242.1-77").exists()


def test_an_earlier_server_with_the_same_pid_leaves_no_dead_engine_to_the_next(tmp_path):
    earlier = tmp_path / f"{os.getpid()}.1-77"  # an engine that died under a server gone since
    earlier.write_bytes(b"running")
    assert server_key(os.getpid()) != f"{os.getpid()}.1"
    assert dead_engines(server_key(os.getpid()), tmp_path) == [] and earlier.exists()


def test_a_new_lease_removes_the_dead_engines_of_servers_that_are_gone(tmp_path):
    orphan = hold(tmp_path, "keep")  # its server is gone, the engine still runs
    server = server_key(os.getpid())
    gone = [tmp_path / f"{os.getpid()}.1-77", tmp_path / "4242-78"]  # the pid reused; a name without a start
    watched = tmp_path / f"{server}-79"  # its server runs: its watcher reports it
    for path in (*gone, watched):
        path.write_bytes(b"running")
    try:
        lease = EngineLease(server=server, directory=tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [f"4242.1-{orphan.pid}", watched.name, lease.path.name])
        lease.release()
    finally:
        orphan.kill()
        orphan.wait()


def test_a_process_start_names_one_process():
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert process_start(child.pid).isdigit()
        assert process_start(child.pid) == process_start(child.pid)
    finally:
        child.kill()
        child.wait()
    assert process_start(child.pid) is None


def test_a_lease_released_while_a_watcher_holds_it_open_reads_stopped(tmp_path):
    lease = EngineLease(server="4242.1", directory=tmp_path)
    fd = os.open(lease.path, os.O_RDWR)  # a watcher that opened it before the release
    lease.release()
    assert os.pread(fd, 16, 0) == b"stopped"
    os.close(fd)


def test_exit_timeout_from_the_servers_command_line():
    for argv, expected in ((["--exit-timeout-secs=7"], 7), (["--exit-timeout-secs", "12"], 12), ([], 30)):
        child = subprocess.Popen(["sh", "-c", "sleep 30", "tritonserver", "--model-repository=x", *argv])
        try:
            time.sleep(0.1)
            assert exit_timeout_s(child.pid) == expected, argv
        finally:
            child.kill()
            child.wait()
