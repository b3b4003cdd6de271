"""Security tests of the SWE sandbox: model-written code tries to escape, each attempt is blocked,
bounded or killed, and the host is unchanged afterwards. Run for both backends (bubblewrap and the
unshare/setpriv fallback), as root in CI (the sandbox drops to a leased non-root uid)."""

import contextlib
import os
import pathlib
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid

import pytest

from agentrl_jax.envs.swe import sandbox as sandbox_lib
from agentrl_jax.envs.swe.sandbox import Limits, Sandbox

BACKENDS = [
    pytest.param(
        "bwrap",
        marks=pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap not installed"),
    ),
    "unshare",
]
LIMITS = Limits(timeout_s=10, cpu_s=20, memory_bytes=1 << 30, nproc=64, file_bytes=64 << 20)


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    # The environment variable is the documented way to force a backend; Sandbox reads it.
    monkeypatch.setenv("AGENTRL_SANDBOX", request.param)
    return request.param


@pytest.fixture
def box(backend, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    sb = Sandbox(str(ws), LIMITS)
    assert sb.backend == backend
    yield sb
    sb.close()


def _procs_with(marker: str) -> list[int]:
    """Pids of host processes whose command line contains ``marker``."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def test_runs_as_non_root_with_clean_env(box):
    r = box.run("id -u; echo $HOME; pwd; echo ok > f")
    assert r.exit_code == 0, r.output
    uid, home, cwd = r.output.split()[:3]
    assert int(uid) != 0
    if os.geteuid() == 0:
        assert int(uid) == box.uid >= sandbox_lib._UID_BASE
    assert home == "/tmp" and cwd == box.workspace
    with open(os.path.join(box.workspace, "f")) as f:
        assert f.read() == "ok\n"


def test_network_is_blocked(box):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        # Runs after the command: a connection that got through would wait in the backlog.
        with contextlib.suppress(OSError):
            accepted.append(server.accept())

    code = (
        "import socket\n"
        f"try:\n socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')\n"
        "except OSError as e: print('BLOCKED', e)\n"
        "try:\n socket.create_connection(('pypi.org', 443), timeout=2); print('CONNECTED')\n"
        "except OSError as e: print('BLOCKED', e)\n"
    )
    r = box.run([sys.executable, "-c", code])
    thread = threading.Thread(target=accept)
    thread.start()
    thread.join()
    server.close()
    assert r.output.count("BLOCKED") == 2 and "CONNECTED" not in r.output, r.output
    assert not accepted  # the host listener saw no connection


def test_write_outside_workspace_is_blocked(box, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.chmod(outside, 0o777)  # even a world-writable host dir stays untouched
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    os.chmod(victim, 0o666)
    marker = f"/tmp/agentrl_escape_{uuid.uuid4().hex}"
    r = box.run(
        f"echo pwned > {outside}/x; echo pwned > {victim}; echo pwned > {marker}; "
        f"echo pwned > /etc/agentrl_pwned; rm -rf {tmp_path}/outside; echo done"
    )
    assert "done" in r.output
    assert not (outside / "x").exists() and outside.is_dir()
    assert victim.read_text() == "original"
    assert not os.path.exists(marker) and not os.path.exists("/etc/agentrl_pwned")


def test_secret_in_caller_env_is_not_readable(box, monkeypatch):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("AGENTRL_TEST_SECRET", secret)
    r = box.run("env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; ls /proc; ls -a /root")
    assert r.exit_code is not None
    assert secret not in r.output
    assert "AGENTRL_TEST_SECRET" not in r.output


def test_fork_bomb_is_bounded_and_killed(box):
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    r = box.run(
        f"bomb() {{ bomb | bomb & }}; bomb; sleep 1; exec -a {marker} sleep 30",
        timeout_s=4,
    )
    assert time.monotonic() - t0 < 15
    assert r.timed_out or r.exit_code != 0 or "Resource temporarily unavailable" in r.output
    time.sleep(0.2)
    assert not _procs_with(marker)
    if os.geteuid() == 0:  # nothing of the sandbox uid survives on the host
        survivors = [p for p in _uid_procs(box.uid)]
        assert not survivors, survivors


def _uid_procs(uid: int) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    out.append(int(pid))
            except OSError:
                pass
    return out


def test_memory_past_limit_fails(box):
    code = "x = bytearray(8 << 30); print('ALLOCATED', len(x))"
    r = box.run([sys.executable, "-c", code])
    assert "ALLOCATED" not in r.output
    assert "MemoryError" in r.output and r.exit_code != 0


def test_infinite_loop_is_killed(box):
    marker = f"loop{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    r = box.run(f"exec -a {marker} bash -c 'while :; do :; done'", timeout_s=1.5)
    assert r.timed_out and r.exit_code is None
    assert time.monotonic() - t0 < 5
    time.sleep(0.2)
    assert not _procs_with(marker)


def test_setsid_escape_does_not_survive(box):
    marker = f"esc{uuid.uuid4().hex[:8]}"
    # Detached, new session, stdout closed: it would outlive a plain subprocess.
    r = box.run(
        f"setsid nohup bash -c 'exec -a {marker} sleep 300' >/dev/null 2>&1 < /dev/null & "
        f"sleep 0.3; echo started",
        timeout_s=5,
    )
    assert "started" in r.output and not r.timed_out
    time.sleep(0.3)
    assert not _procs_with(marker)
    # Also when the command is still running at the timeout.
    r = box.run(f"setsid bash -c 'exec -a {marker} sleep 300' & sleep 100", timeout_s=1)
    assert r.timed_out
    time.sleep(0.3)
    assert not _procs_with(marker)


def test_printing_gigabytes_is_capped(box):
    import resource

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    r = box.run("head -c 4000000000 /dev/zero | tr '\\0' 'x'", timeout_s=20)
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert r.output_killed and r.exit_code is None
    assert LIMITS.kill_output_bytes < r.total_bytes < LIMITS.kill_output_bytes + (1 << 20)
    assert len(r.output) < LIMITS.keep_output_bytes + 200
    assert f"[... {r.elided_bytes} bytes elided ...]" in r.output
    assert (rss1 - rss0) < 64 * 1024  # KiB: nothing near the printed volume was buffered
    assert time.monotonic() - t0 < 20


def test_file_size_limit(box):
    r = box.run("head -c 100000000 /dev/zero > big; echo rc=$?; stat -c %s big")
    assert os.path.getsize(os.path.join(box.workspace, "big")) <= LIMITS.file_bytes
    assert "rc=0" not in r.output


@pytest.mark.parametrize("default", [True, False])
def test_hidden_paths_are_masked(backend, tmp_path, default):
    # Outside /tmp (always private); /var/tmp is among the default hidden paths.
    secret_dir = pathlib.Path(tempfile.mkdtemp(dir="/var/tmp"))
    try:
        os.chmod(secret_dir, 0o755)
        (secret_dir / "patch.diff").write_text("the answer")
        os.chmod(secret_dir / "patch.diff", 0o644)  # readable by anyone: only the mask stops it
        ws = tmp_path / "ws"
        ws.mkdir()
        hidden = sandbox_lib.DEFAULT_HIDDEN if default else (str(secret_dir),)
        with Sandbox(str(ws), LIMITS, hidden=hidden) as box:
            r = box.run(f"cat {secret_dir}/patch.diff; echo listing; ls -A {secret_dir}; echo end")
        assert "the answer" not in r.output and "No such file or directory" in r.output
        listing = r.output.split("listing\n")[1]
        assert "patch.diff" not in listing and listing.endswith("end\n")
        assert (secret_dir / "patch.diff").read_text() == "the answer"  # host copy untouched
    finally:
        shutil.rmtree(secret_dir)


def test_no_working_backend_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("AGENTRL_SANDBOX", raising=False)
    monkeypatch.setattr(sandbox_lib, "_PROBED", {})
    monkeypatch.setattr(sandbox_lib.shutil, "which", lambda name: None)
    with pytest.raises(sandbox_lib.SandboxError, match=r"no sandbox works here \(bwrap: \['bwrap'"):
        sandbox_lib.detect_backend()


def test_bad_limits_are_clear_errors():
    with pytest.raises(ValueError, match=r"Limits.cpu_s=0: expected >= 1"):
        Limits(cpu_s=0)
    with pytest.raises(ValueError, match=r"Limits.nproc=1: expected >= 8"):
        Limits(nproc=1)


def test_bad_backend_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTRL_SANDBOX", "chroot")
    with pytest.raises(sandbox_lib.SandboxError, match="AGENTRL_SANDBOX='chroot'"):
        Sandbox(str(tmp_path))
