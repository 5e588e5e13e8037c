"""Engine leases (engine_lease.py): a lease whose process died is found once, a running or a
cleanly stopped engine's never; the server's exit timeout read from its command line."""

import os
import signal
import subprocess
import sys
import time

from flint_backend.serving.engine_lease import EngineLease, dead_engines, exit_timeout_s

HOLD = """
import sys, time
from pathlib import Path
from flint_backend.serving.engine_lease import EngineLease
lease = EngineLease(server_pid=4242, directory=Path(sys.argv[1]))
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
        assert dead_engines(4242, tmp_path) == []
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert [p.name for p in dead_engines(4242, tmp_path)] == [f"4242-{killed.pid}"]
        assert dead_engines(4242, tmp_path) == []  # removed: reported once
        assert [p.name for p in tmp_path.iterdir()] == [f"4242-{running.pid}"]
        assert dead_engines(4343, tmp_path) == []  # another server's leases are not ours
    finally:
        running.kill()


def test_a_released_lease_is_gone_and_not_dead(tmp_path):
    child = hold(tmp_path, "release")
    child.kill()
    child.wait()
    assert list(tmp_path.iterdir()) == [] and dead_engines(4242, tmp_path) == []


def test_a_lease_released_while_a_watcher_holds_it_open_reads_stopped(tmp_path):
    lease = EngineLease(server_pid=4242, directory=tmp_path)
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
