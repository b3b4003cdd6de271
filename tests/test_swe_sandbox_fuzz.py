"""Fuzz of the SWE sandbox: generated hostile commands (families x variants) for both backends.

One sandbox per backend plays one task: every attack runs in it in turn, and after each one the
host must be unchanged (canary files, no file written outside the workspace, the caller's secret
never printed, no connection seen by the host's listeners), the attack must have stayed within its
limits (time, output, memory, processes), no process of it may be left, and the next command
still runs (each command starts by printing a sentinel; a pytest run in the repository ends the
task). An attack that succeeds prints ``ESCAPED`` (spelled so that the script's own text, which
/proc shows, never contains it). A positive control plays a dozen of the attacks without a jail:
each must get out there and the same checks must catch it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pathlib
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

import pytest
import test_swe_sandbox as base

from agentrl_jax.envs.swe.sandbox import ExecResult, Limits, Sandbox

BEGIN = "__fuzz_begin__"
ESCAPED = "ESCAPED"
SAY = 'echo "ESC""APED"'  # bash: prints ESCAPED, the script text does not contain it
PY_SAY = "print('ESC'+'APED')"
RUN_ID = uuid.uuid4().hex[:10]
NAME = f"agentrl_fuzz_{RUN_ID}"  # every file an attack tries to create outside is called this
SECRET = f"fuzz-secret-{uuid.uuid4().hex}"
PY = f"{shlex.quote(sys.executable)} -I -S"  # stdlib only: no site import keeps each start cheap
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECKOUT_DIRS = {"work": REPO_ROOT.parent, "repo": REPO_ROOT}


def _masked(path: pathlib.Path) -> bool:
    """Whether the jail shows a private directory of its own at ``path`` (or above it)."""
    real = os.path.realpath(path)
    masked = (*base.sandbox_lib.DEFAULT_HIDDEN, "/tmp", "/dev/shm")
    return any(real == m or real.startswith(m + "/") for m in masked)


# Small limits so that bombs, floods and sleepers end within a second or two.
LIMITS = Limits(
    timeout_s=5, cpu_s=5, memory_bytes=512 << 20, file_bytes=4 << 20, nproc=48,
    tmp_bytes=16 << 20, keep_output_bytes=8 << 10, kill_output_bytes=1 << 20,
)  # fmt: skip
TIME_MARGIN_S = 3.0  # start-up, kill and reap after the wall-clock limit on a loaded machine


@dataclasses.dataclass
class Task:
    """The host side of one backend's task: the sandbox, canaries, listeners, hidden secret."""

    box: Sandbox
    workspace: pathlib.Path
    canary_dir: pathlib.Path  # outside the workspace, visible read-only in the jail, mode 0777
    canary: pathlib.Path  # a 0666 file in it: only the jail can keep it unchanged
    hidden_dir: pathlib.Path  # masked in the jail (like the task repositories)
    root_secret: pathlib.Path | None  # a 0644 file in /root (as root only)
    tcp_port: int
    udp_port: int
    unix_path: pathlib.Path  # a 0777 host socket in canary_dir
    abstract_name: str
    listeners: list[socket.socket]  # TCP, UDP, unix and abstract-unix listeners on the host
    snapshot: dict


@dataclasses.dataclass(frozen=True)
class Attack:
    """One generated attack.

    Attributes:
      family: what it tries (network, secrets, ptrace, links, write, namespaces, bombs, ...).
      name: the variant.
      script: the bash script, built from the task (ports, paths).
      expect: how it must end: 'blocked' (runs to its end, nothing gets out), 'timeout' (killed at
        the wall-clock limit), 'flood' (killed for its output), 'bounded' (any end, within the
        limits).
      limits: overrides of LIMITS for this command.
      check: extra host-side check of the result.
    """

    family: str
    name: str
    script: Callable[[Task], str]
    expect: str = "blocked"
    limits: dict = dataclasses.field(default_factory=dict)
    check: Callable[[Task, ExecResult], None] | None = None

    @property
    def id(self) -> str:
        return f"{self.family}/{self.name}"


def _py(code: str) -> str:
    return f"{PY} -c {shlex.quote(code)}"


def _py_try(body: str, success: str = PY_SAY) -> str:
    """Python that runs ``success`` (prints ESCAPED) when ``body`` raises no exception."""
    return _py(f"try:\n    {body}\n    {success}\nexcept Exception as e:\n    print('blocked', e)")


Script = str | Callable[[Task], str]


def _family(family: str, scripts: dict[str, Script], *args, **kwargs) -> list[Attack]:
    """One Attack per variant; a plain string is a script that needs nothing from the task."""
    return [
        Attack(family, name, s if callable(s) else (lambda t, s=s: s), *args, **kwargs)
        for name, s in scripts.items()
    ]


def _matrix(clients: dict[str, Callable], targets: dict[str, Callable]) -> dict[str, Script]:
    """Every client script (of a target's host, port) against every target (of the task)."""
    return {
        f"{c}_{tn}": (lambda t, c=client, g=target: c(*g(t)))
        for c, client in clients.items()
        for tn, target in targets.items()
    }


# ---- network ---------------------------------------------------------------------------------

LIBC = (
    "import ctypes, os\nl = ctypes.CDLL(None, use_errno=True)\nl.syscall.restype = ctypes.c_long\n"
)
X86 = "os.uname().machine == 'x86_64'"


def _network() -> list[Attack]:
    tcp_clients = {
        "python": lambda h, p: _py_try(f"__import__('socket').create_connection({(h, p)!r}, 2)"),
        "bash_dev_tcp": lambda h, p: f"exec 3<>/dev/tcp/{h}/{p} && {SAY}",
    }
    if shutil.which("curl"):
        tcp_clients["curl"] = lambda h, p: (
            f"curl -sS -m 2 -o /dev/null http://{f'[{h}]' if ':' in h else h}:{p}/ && {SAY}"
        )
    tcp_targets = {
        "localhost": lambda t: ("127.0.0.1", t.tcp_port),
        "localhost6": lambda t: ("::1", t.tcp_port),
        "host_ip": lambda t: (_host_ip(), t.tcp_port),
        "cloudflare_dns": lambda t: ("1.1.1.1", 53),
        "google_https": lambda t: ("8.8.8.8", 443),
        "pypi_by_name": lambda t: ("pypi.org", 443),
    }
    # Sending may "work" into the jail's own namespace: only the host's listener decides.
    udp_clients = {
        "python": lambda h, p: _py_try(
            f"__import__('socket').socket(2, 2).sendto(b'{RUN_ID}', {(h, p)!r})", "print('sent')"
        ),
        "bash_dev_udp": lambda h, p: f"echo {RUN_ID} > /dev/udp/{h}/{p}",
    }
    udp_targets = {
        "localhost": lambda t: ("127.0.0.1", t.udp_port),
        "google_dns": lambda t: ("8.8.8.8", 53),
        "cloudflare_dns": lambda t: ("1.1.1.1", 53),
    }
    dns_clients = {
        "getent": lambda h, _: f"getent hosts {h} && {SAY}",
        "python": lambda h, p: _py_try(f"__import__('socket').getaddrinfo({h!r}, {p})"),
    }
    dns_targets = {"pypi": lambda t: ("pypi.org", 443), "github": lambda t: ("github.com", 443)}
    raw = {
        "icmp_raw": "socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)",
        "icmp_dgram": "socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)",
        "packet": "socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0x0300)",
        "vsock_to_vm_host": "socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)",  # never connects
    }
    raw = {n: _py_try(f"import socket; {c}") for n, c in raw.items()}
    if shutil.which("ping"):
        raw["ping"] = f"ping -c1 -W1 127.0.0.1 && {SAY}"
    unix_clients = {
        "python": lambda path: _py_try(
            f"s = __import__('socket').socket(1); s.settimeout(2); s.connect({path!r})"
        )
    }
    if shutil.which("curl"):
        unix_clients["curl"] = lambda path: f"curl -sS -m 2 --unix-socket {path} http://x/ && {SAY}"
    unix_targets = {
        "host_socket_0777": lambda t: (str(t.unix_path),),
        "abstract": lambda t: ("\0" + t.abstract_name,),
        "docker_run": lambda t: ("/run/docker.sock",),
        "docker_var_run": lambda t: ("/var/run/docker.sock",),
        "dbus_system": lambda t: ("/run/dbus/system_bus_socket",),
        "dbus_var_run": lambda t: ("/var/run/dbus/system_bus_socket",),
    }
    unix = _matrix(unix_clients, unix_targets)
    unix.pop("curl_abstract", None)  # curl takes a path
    # The jail's own network namespace shows only its loopback.
    ifaces = {
        "python_if_nameindex": _py(
            "import socket; print('IFACES', *[n for _, n in socket.if_nameindex()])"
        ),
        "proc_net_dev": "echo IFACES $(tail -n +3 /proc/net/dev | cut -d: -f1)",
    }
    if shutil.which("ip"):
        ifaces["ip_link"] = "echo IFACES $(ip -o link | cut -d: -f2)"
    return (
        _family("net_tcp", _matrix(tcp_clients, tcp_targets))
        + _family("net_udp", _matrix(udp_clients, udp_targets))
        + _family("net_dns", _matrix(dns_clients, dns_targets))
        + _family("net_raw", raw)
        + _family("net_unix", unix)
        + _family("net_iface", ifaces, check=_only_loopback)
    )


def _host_ip() -> str:
    """An address of this host other than loopback (the default route's source), or loopback."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))  # UDP connect sends nothing
        return s.getsockname()[0]
    return "127.0.0.1"


def _only_loopback(task: Task, r: ExecResult) -> None:
    line = next(ln for ln in r.output.splitlines() if ln.startswith("IFACES"))
    assert line.split()[1:] == ["lo"], line


# ---- secrets: /root, /proc/1, the caller's environment, hidden paths -------------------------


def _secrets() -> list[Attack]:
    host_pid = os.getpid()
    reads = {
        "env": "env; set; declare -p",
        "python_environ": _py("import os; print(dict(os.environ))"),
        "proc_all_environ": "cat /proc/*/environ | tr '\\0' '\\n'",
        "proc1_environ": "cat /proc/1/environ",
        "proc_ppid_environ": "cat /proc/$PPID/environ",
        "proc_host_pid_environ": f"cat /proc/{host_pid}/environ",
        "proc1_root_listing": "ls -la /proc/1/root/ /proc/1/root/root/",
        "proc1_root_secret": lambda t: f"cat /proc/1/root{t.root_secret or '/root/x'}",
        "proc1_cwd": "ls -la /proc/1/cwd/ && cat /proc/1/cwd/*",
        "proc1_mem": "dd if=/proc/1/mem bs=4096 count=16 skip=16 | strings",
        "proc_host_pid_root": f"ls /proc/{host_pid}/root/root/",
        "root_listing": "find /root /home -maxdepth 2 -ls",
        "root_secret": lambda t: f"cat {t.root_secret or '/root/x'}",
        "root_find": "find /root /home -maxdepth 3 -type f -exec cat {} + | head -c 4000",
        "hidden_cat": lambda t: f"cat {t.hidden_dir}/patch.diff",
        "hidden_listing": lambda t: f"ls -la {t.hidden_dir}",
        "hidden_via_proc_self_root": lambda t: f"cat /proc/self/root{t.hidden_dir}/patch.diff",
        "grep_visible_dirs": lambda t: (
            f"timeout 2 grep -rl {SECRET[:24]} /etc /home /run /var/tmp {t.canary_dir} | head"
        ),
    }
    return _family("secrets", reads, check=_secret_absent)


def _secret_absent(task: Task, r: ExecResult) -> None:
    assert SECRET not in r.output and "AGENTRL_FUZZ_SECRET" not in r.output, r.output[-2000:]


# ---- ptrace, /proc/<pid>/mem, signals --------------------------------------------------------


def _ptrace() -> list[Attack]:
    # Targets outside the jail's uid: whatever the jail's /proc shows of another owner (bwrap's
    # init, root), and the host's pid of this test (not in the jail's PID namespace). Tracing the
    # jail's own processes is allowed and is no escape.
    host_pid = os.getpid()
    foreign = (
        f"{LIBC}pids = [int(p) for p in os.listdir('/proc') if p.isdigit() and "
        f"os.stat('/proc/' + p).st_uid != os.getuid()] + [{host_pid}]\n"
    )
    each = "for p in pids:\n r = {}\n print(p, r, os.strerror(ctypes.get_errno()))\n"
    vm_readv = (
        "b = ctypes.create_string_buffer(8)\n"
        "iov = (ctypes.c_void_p * 2)(ctypes.addressof(b), 8)\n"
        "rem = (ctypes.c_void_p * 2)(0x400000, 8)\n"
    )
    dd = {"read": "if={}/mem bs=4096 count=1 skip=1024", "write": "of={}/mem bs=1 seek=4M"}
    scripts = {
        "attach": _py(foreign + each.format("l.ptrace(16, p, 0, 0)") + f" if r == 0: {PY_SAY}"),
        "seize": _py(foreign + each.format("l.ptrace(0x4206, p, 0, 0)") + f" if r == 0: {PY_SAY}"),
        "process_vm_readv": _py(
            foreign
            + vm_readv
            + each.format(f"l.syscall(310 if {X86} else 270, p, iov, 1, rem, 1, 0)")
            + f" if r > 0: {PY_SAY}"
        ),
        **{
            f"{verb}_foreign_mem": (
                "for p in /proc/[0-9]*; do [ -O $p ] && continue; "
                f"printf AAAA | dd {arg.format('$p')} conv=notrunc && {SAY}; done; "
                f"printf AAAA | dd {arg.format(f'/proc/{host_pid}')} conv=notrunc && {SAY}"
            )
            for verb, arg in dd.items()
        },
    }
    signals = {
        "kill_all_of_uid": "kill -9 -1; echo after",
        "kill_foreign": "for p in /proc/[0-9]*; do [ -O $p ] || kill -9 ${p#/proc/}; done; true",
        "kill_pid1": "kill -9 1; kill -STOP 1; echo after",
        "kill_host_pytest": f"kill -STOP {host_pid}; true",
    }
    return _family("ptrace", scripts) + _family("signals", signals)


# ---- symlinks, hardlinks, ../ ----------------------------------------------------------------


def _links() -> list[Attack]:
    def chown_safe(task: Task, r: ExecResult) -> None:
        # The host later gives the workspace to the sandbox uid again: links must not be followed.
        before = {p: os.lstat(p).st_uid for p in ("/etc/passwd", "/etc", str(task.canary))}
        task.box.own(str(task.workspace))
        assert {p: os.lstat(p).st_uid for p in before} == before

    followed = {
        "symlink_etc_write": f"ln -sfn /etc e && echo pwned > e/{NAME} && {SAY}",
        "symlink_canary_write": lambda t: f"ln -sfn {t.canary} c && echo pwned >> c && {SAY}",
        "symlink_root_dir": "ln -sfn / rootlink && ls rootlink/",
    }
    secret = {
        "symlink_root_secret": lambda t: f"ln -sfn {t.root_secret or '/root/x'} s && cat s",
        "symlink_hidden_secret": lambda t: f"ln -sfn {t.hidden_dir}/patch.diff h && cat h",
        "hardlink_hidden": lambda t: f"ln -f {t.hidden_dir}/patch.diff hh && cat hh",
    }
    outside = {
        "hardlink_canary": lambda t: f"ln -f {t.canary} hl && echo pwned >> hl && {SAY}",
        "hardlink_passwd": f"ln -f /etc/passwd hp && {SAY}",
        "dotdot_write_canary": lambda t: (
            f"echo pwned > {'../' * 12}{str(t.canary_dir).lstrip('/')}/{NAME} && {SAY}"
        ),
        "dotdot_write_parent": f"echo pwned > ../{NAME} && {SAY}",
        "dotdot_cd_write": (
            f"cd ../../../../../../tmp && echo pwned > {NAME}; cd / && echo pwned > {NAME} && {SAY}"
        ),
        "python_openat_escape": _py_try(
            "import os; d = os.open('..', os.O_RDONLY)\n    "
            f"os.close(os.open('{NAME}', os.O_CREAT | os.O_WRONLY, dir_fd=d))"
        ),
    }
    return (
        _family("links", followed, check=chown_safe)
        + _family("links", secret, check=_secret_absent)
        + _family("links", outside)
    )


# ---- writes outside the workspace ------------------------------------------------------------


def _writes() -> list[Attack]:
    targets = {
        "etc": f"/etc/{NAME}",
        "var_tmp": f"/var/tmp/{NAME}",
        "home_parent": f"$HOME/../{NAME}",
        "root": f"/root/{NAME}",
        "usr_lib": f"/usr/lib/{NAME}",
        "proc_sys": "/proc/sys/kernel/hostname",
        "sysrq": "/proc/sysrq-trigger",
        "cgroup": "/sys/fs/cgroup/cgroup.procs",
    }
    canary_ops = {
        "dir_new_file": "echo pwned > {d}/" + NAME,
        "append": "echo pwned >> {c}",
        "truncate": "truncate -s 0 {c}",
        "remove": "rm -f {c}",
        "move": "mv {c} ./stolen",
        "chmod": "chmod 000 {c}",
        "touch_mtime": "touch -d 2000-01-01 {c}",
        "python_write": PY + " -c \"open('{c}', 'w').write('pwned')\"",
        "mkdir_in_dir": "mkdir {d}/" + NAME,
    }
    # Writable in the jail but private to it: the host's directories must stay without the file.
    private_dirs = {"host_tmp": "/tmp", "dev_shm": "/dev/shm", "home": "$HOME"}
    # The checkout and its parent are read-only in the jail, unless they lie where the jail puts
    # a private directory of its own (a clone under /tmp or /home): there a write may work and
    # only the host's directory (OUTSIDE_DIRS) decides.
    for label, d in CHECKOUT_DIRS.items():
        if _masked(d):
            private_dirs[label] = str(d)
        else:
            targets[label] = f"{d}/{NAME}"
    private = {n: f"echo pwned > {d}/{NAME} && ls {d}/{NAME}" for n, d in private_dirs.items()}
    return (
        _family("write", {f"echo_{n}": f"echo pwned > {p} && {SAY}" for n, p in targets.items()})
        + _family("write", {f"private_{n}": c for n, c in private.items()})
        + _family(
            "write",
            {
                f"canary_{n}": (lambda t, o=op: o.format(c=t.canary, d=t.canary_dir) + f" && {SAY}")
                for n, op in canary_ops.items()
            },
        )
    )


# ---- mount, unshare, setns, chroot, nsenter, setuid, keyrings, io_uring ----------------------


def _namespaces() -> list[Attack]:
    cmds = {
        "mount_tmpfs": f"mount -t tmpfs none /mnt && {SAY}",  # mount is setuid root
        "mount_bind_root": f"mkdir -p /tmp/m && mount --bind / /tmp/m && {SAY}",
        "remount_rw": f"mount -o remount,rw / && touch /{NAME} && {SAY}",
        "umount_root_mask": "umount /root || umount -l /root; cat /root/* 2>&1; ls -a /root",
        "unshare_user": f"unshare -Ur id && {SAY}",
        "unshare_user_mount": f"unshare -Urm sh -c 'mount -t tmpfs t /etc' && {SAY}",
        "unshare_net": f"unshare -n true && {SAY}",
        "nsenter_pid1": f"nsenter -t 1 -a true && {SAY}",
        "setpriv_root": f"setpriv --reuid=0 true && {SAY}",
        "su_root": f"su -c true root < /dev/null && {SAY}",
        "sethostname": f"hostname pwned && {SAY}",
        "python_chroot": _py_try("__import__('os').chroot('/tmp')"),
    }
    calls = {  # a raw system call that must fail: (call, how success shows)
        "unshare_newuser": ("l.unshare(0x10000000)", "r == 0"),
        "clone_newuser": (f"l.syscall(56 if {X86} else 220, 0x10000011, 0, 0, 0, 0)", "r > 0"),
        "setns_pid1_mnt": ("l.setns(os.open('/proc/1/ns/mnt', os.O_RDONLY), 0)", "r == 0"),
        "io_uring_setup": ("l.syscall(425, 4, ctypes.create_string_buffer(120))", "r >= 0"),
        "keyring_add_key": (
            f"l.syscall(248 if {X86} else 217, b'user', b'{NAME}', b'leak', 4, ctypes.c_int(-4))",
            "r > 0",
        ),
    }
    for n, (call, success) in calls.items():
        # The clone child (r == 0) exits at once; the caller reports.
        cmds[f"python_{n}"] = _py(
            f"{LIBC}r = {call}\nif r == 0 and 'clone' in {n!r}: os._exit(0)\n"
            f"print({n!r}, r, os.strerror(ctypes.get_errno()))\nif {success}: {PY_SAY}"
        )
    if shutil.which("chroot"):
        cmds["chroot"] = f"chroot / true && {SAY}"
    return _family("namespaces", cmds)


# ---- fork and memory bombs, disk fill, CPU -----------------------------------------------------


def _bombs() -> list[Attack]:
    bomb = {"timeout_s": 1.5, "nproc": 24}

    def forks_capped(task: Task, r: ExecResult) -> None:
        line = next(ln for ln in r.output.splitlines() if ln.startswith("FORKED"))
        assert int(line.split()[1]) < 24, line  # RLIMIT_NPROC held (a non-root uid)

    def mem_refused(task: Task, r: ExecResult) -> None:
        assert "ALLOCATED" not in r.output
        assert "MemoryError" in r.output or "annot allocate" in r.output, r.output[-500:]

    def tmp_capped(task: Task, r: ExecResult) -> None:
        assert "No space left" in r.output, r.output[-500:]
        used_kib = int(next(ln for ln in r.output.splitlines() if ln.startswith("USED")).split()[1])
        assert used_kib <= (LIMITS.tmp_bytes >> 10) + 64  # du counts directories too

    def size_capped(task: Task, r: ExecResult) -> None:
        big = task.workspace / "big"
        assert big.stat().st_size <= LIMITS.file_bytes
        big.unlink()

    def killed_for_cpu(task: Task, r: ExecResult) -> None:
        assert not r.timed_out and r.exit_code != 0, r  # RLIMIT_CPU ended it, not the timeout

    forks = {
        "python_fork_loop": _py(
            "import os, time\nn = 0\ntry:\n while True:\n"
            "  if os.fork() == 0:\n   time.sleep(30)\n"
            "  n += 1\nexcept OSError as e:\n print('FORKED', n, e)"
        ),
        "python_threads": _py(
            "import threading, time\nn = 0\ntry:\n while True:\n"
            "  threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); n += 1\n"
            "except RuntimeError as e:\n print('FORKED', n, e)"
        ),
    }
    bombs = {
        "bash_fork_bomb": "b() { b | b & }; b; sleep 5",
        "background_sleepers": "for i in $(seq 200); do sleep 30 & done",
    }
    memory = {
        "python_bytearray": _py("x = bytearray(4 << 30); print('ALLOCATED', len(x))"),
        "python_list_growth": _py("l = []\nwhile True: l.append(b'x' * (8 << 20))"),
    }
    fill = {
        f"fill_{n}": (
            f"for i in $(seq 12); do head -c 3M /dev/zero > {d}/f$i || break; done;"
            f" echo USED $(du -skx {d} | cut -f1)"  # -x: not the exposed paths bound under it
        )
        for n, d in (("tmp", "/tmp"), ("dev_shm", "/dev/shm"))
    }
    return (
        _family("bombs", forks, "bounded", bomb, forks_capped)
        + _family("bombs", bombs, "bounded", bomb)
        + _family("bombs", memory, "bounded", {}, mem_refused)
        + _family("bombs", fill, "bounded", {}, tmp_capped)
        + _family("bombs", {"file_size": "head -c 64M /dev/zero > big"}, "bounded", {}, size_capped)
        + _family(
            "bombs",
            {"cpu_burn": "while :; do :; done"},
            "bounded",
            {"timeout_s": 10, "cpu_s": 1},
            killed_for_cpu,
        )
    )


# ---- output floods, sleeping past the limit --------------------------------------------------


def _floods_and_sleepers() -> list[Attack]:
    floods = {
        "yes": "yes",
        "urandom": "cat /dev/urandom",
        "stderr": "yes pwned >&2",
        "one_long_line": "tr '\\0' x < /dev/zero",
        "python_print": _py("while True: print('x' * 1000)"),
    }
    sleepers = {
        "sleep": "sleep 30",
        "trap_signals": "trap '' TERM INT HUP QUIT; sleep 30",
        "busy_loop": "while :; do :; done",
        "python_sleep_ignoring_signals": _py(
            "import signal, time\nfor s in (1, 2, 3, 15): signal.signal(s, signal.SIG_IGN)\n"
            "time.sleep(30)"
        ),
        "tail_follow": "tail -f /dev/null",
    }
    quick = {"timeout_s": 0.5}
    return (
        _family("flood", floods, "flood")
        # The leader exits while a grandchild writes on: killed for its output, or with the jail.
        + _family("flood", {"orphan_writer": "(yes &); exit 0"}, "bounded")
        + _family("time", sleepers, "timeout", quick)
        # A background child holds the output open after the leader exits: ends at the timeout,
        # or when the jail's init goes (bwrap's goes when its first child exits).
        + _family("time", {"child_holds_output": "sleep 30 & exit 0"}, "bounded", quick)
    )


# ---- daemons left behind ---------------------------------------------------------------------


def _daemons() -> list[Attack]:
    def sleeper(marker: str) -> str:
        return f"exec -a {marker} sleep 300"

    starts = {
        "nohup": lambda m: f"nohup bash -c '{sleeper(m)}' >/dev/null 2>&1 &",
        "setsid": lambda m: f"setsid bash -c '{sleeper(m)}' >/dev/null 2>&1 < /dev/null &",
        "disown": lambda m: f"bash -c '{sleeper(m)}' >/dev/null 2>&1 & disown",
        "double_fork_bash": lambda m: f"( ( {sleeper(m)} ) >/dev/null 2>&1 & ) &",
        "trap_hup": lambda m: f"trap '' HUP; ( trap '' HUP TERM; {sleeper(m)} ) >/dev/null 2>&1 &",
        "python_double_fork": lambda m: _py(
            "import os\nif os.fork() == 0:\n os.setsid()\n if os.fork() == 0:\n"
            "  os.closerange(0, 256)\n"
            f"  os.execvp('bash', ['bash', '-c', {sleeper(m)!r}])\n os._exit(0)\nos.wait()"
        ),
        "setsid_in_loop": lambda m: (
            f"for i in 1 2 3; do setsid -f bash -c '{sleeper(m)}' >/dev/null 2>&1; done"
        ),
    }
    return _family(
        "daemons",
        {
            n: (lambda t, c=c: c(_marker(t)) + "; sleep 0.2; echo started")
            for n, c in starts.items()
        },
    )


def _marker(task: Task) -> str:
    return f"fz{RUN_ID}{task.box.backend}"


ATTACKS = (
    _network() + _secrets() + _ptrace() + _links() + _writes() + _namespaces()
    + _bombs() + _floods_and_sleepers() + _daemons()
)  # fmt: skip


# ---- the task around the attacks -------------------------------------------------------------


def _snapshot(task_dirs: dict[str, pathlib.Path], canary_dir: pathlib.Path) -> dict:
    """What must not change on the host: the canary dir's entries, modes, times and contents."""
    snap = {}
    for p in sorted(canary_dir.iterdir()):
        st = p.lstat()
        data = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
        snap[p.name] = (st.st_mode, st.st_uid, st.st_mtime_ns, data)
    for label, d in task_dirs.items():
        snap[label] = sorted(n for n in os.listdir(d) if NAME in n) if d.is_dir() else None
    snap["etc/passwd"] = hashlib.sha256(pathlib.Path("/etc/passwd").read_bytes()).hexdigest()
    return snap


OUTSIDE_DIRS = {
    d: pathlib.Path(d)
    for d in ("/etc", "/tmp", "/var/tmp", "/root", "/", "/usr/lib", "/dev/shm", "/mnt")
} | CHECKOUT_DIRS


def _reached(listeners: list[socket.socket]) -> list[str]:
    """What got through to the host's listeners: queued connections and datagrams (non-blocking)."""
    got = []
    for s in listeners:
        with contextlib.suppress(BlockingIOError):
            if s.type == socket.SOCK_DGRAM:
                got.append(f"datagram {s.recv(512)!r} on {s.getsockname()!r}")
            else:
                conn, addr = s.accept()
                conn.close()
                got.append(f"connection from {addr!r} to {s.getsockname()!r}")
    return got


def _visible_base() -> pathlib.Path:
    """A host directory the jail shows read-only: the checkout, unless it lies under a path the
    jail masks (a clone in /tmp or /home), else /var/lib."""
    return pathlib.Path("/var/lib") if _masked(REPO_ROOT) else REPO_ROOT


@contextlib.contextmanager
def _task_on(backend: str, root: pathlib.Path, box_factory=Sandbox):
    """A task's host side (canaries, listeners, secrets) around a ``box_factory`` box."""
    old_secret = os.environ.get("AGENTRL_FUZZ_SECRET")
    os.environ["AGENTRL_FUZZ_SECRET"] = SECRET  # the caller's environment holds a secret
    workspace = root / "repo"
    workspace.mkdir()
    (workspace / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (workspace / "test_calc.py").write_text(
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    # Visible in the jail (read-only), world-writable on the host: only the jail protects it.
    canary_dir = pathlib.Path(tempfile.mkdtemp(prefix=".fuzz_canary_", dir=_visible_base()))
    os.chmod(canary_dir, 0o777)
    canary = canary_dir / "canary.txt"
    canary.write_text("canary: unchanged\n")
    os.chmod(canary, 0o666)
    hidden_dir = pathlib.Path(tempfile.mkdtemp(prefix="fuzz_hidden_", dir="/var/tmp"))
    os.chmod(hidden_dir, 0o755)
    (hidden_dir / "patch.diff").write_text(SECRET)
    os.chmod(hidden_dir / "patch.diff", 0o644)
    root_secret = None
    if os.geteuid() == 0 and os.path.isdir("/root"):
        root_secret = pathlib.Path(f"/root/.{NAME}_{backend}_secret")
        root_secret.write_text(SECRET)
        os.chmod(root_secret, 0o644)  # readable by anyone: only the mask stops it
    tcp = socket.socket()
    tcp.bind(("0.0.0.0", 0))
    tcp.listen(16)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix_path = canary_dir / "host.sock"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(unix_path))
    os.chmod(unix_path, 0o777)
    unix.listen(16)
    abstract_name = f"agentrl_fuzz_{RUN_ID}_{backend}"
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0" + abstract_name)
    abstract.listen(16)
    listeners = [tcp, udp, unix, abstract]
    for s in listeners:
        s.setblocking(False)  # a connection that got through waits in the backlog
    box = box_factory(
        str(workspace),
        LIMITS,
        backend=backend,
        hidden=(*base.sandbox_lib.DEFAULT_HIDDEN, str(hidden_dir)),
    )
    task = Task(
        box, workspace, canary_dir, canary, hidden_dir, root_secret, tcp.getsockname()[1],
        udp.getsockname()[1], unix_path, abstract_name, listeners, {},
    )  # fmt: skip
    task.snapshot = _snapshot(OUTSIDE_DIRS, canary_dir)
    try:
        yield task
    finally:
        box.close()
        for s in listeners:
            s.close()
        shutil.rmtree(canary_dir, ignore_errors=True)
        shutil.rmtree(hidden_dir, ignore_errors=True)
        if root_secret is not None:
            root_secret.unlink(missing_ok=True)
        if old_secret is None:
            os.environ.pop("AGENTRL_FUZZ_SECRET", None)
        else:
            os.environ["AGENTRL_FUZZ_SECRET"] = old_secret


@pytest.fixture(scope="module", params=base.BACKENDS)
def task(request, tmp_path_factory):
    backend = request.param
    with _task_on(backend, tmp_path_factory.mktemp(f"fuzz_{backend}")) as t:
        yield t


def _check_contained(task: Task, attack: Attack, r: ExecResult, limits: Limits) -> None:
    out = r.output
    reached = _reached(task.listeners)  # drained first: a failure below must not leave it queued
    assert BEGIN in out, f"the jail did not run the command after the previous attack: {r}"
    assert ESCAPED not in out, out[-2000:]
    assert SECRET not in out and "AGENTRL_FUZZ_SECRET" not in out, out[-2000:]
    assert not reached, reached
    assert _snapshot(OUTSIDE_DIRS, task.canary_dir) == task.snapshot
    assert r.wall_s < limits.timeout_s + TIME_MARGIN_S, r.wall_s
    assert len(out) <= limits.keep_output_bytes + 100  # head + elision marker + tail
    assert r.total_bytes <= limits.kill_output_bytes + (64 << 10)  # one read past the cap
    if attack.expect == "blocked":
        assert r.exit_code is not None and not r.timed_out, r
    elif attack.expect == "timeout":
        assert r.timed_out and r.exit_code is None, r
        assert r.wall_s >= limits.timeout_s
    elif attack.expect == "flood":
        assert r.output_killed and r.total_bytes > limits.kill_output_bytes, r
    # No process of the attack outlives its command: none of the sandbox uid, none with its marker.
    assert not base._procs_with(_marker(task)), base._procs_with(_marker(task))
    if os.geteuid() == 0:
        assert not base._uid_procs(task.box.uid)


# Each costs a timeout or a kill of many processes (0.5-3 s); one of each family stays in the
# default run.
SLOW = {
    "bombs/bash_fork_bomb", "bombs/python_fork_loop", "bombs/background_sleepers",
    "bombs/python_list_growth", "bombs/cpu_burn",
    "flood/urandom", "flood/stderr", "flood/one_long_line", "flood/python_print",
    "flood/orphan_writer",
    "time/trap_signals", "time/busy_loop", "time/python_sleep_ignoring_signals",
    "time/tail_follow", "time/child_holds_output", "namespaces/su_root",
    "daemons/nohup", "daemons/disown", "daemons/double_fork_bash", "daemons/trap_hup",
    "daemons/setsid_in_loop",
}  # fmt: skip


@pytest.mark.parametrize(
    "attack",
    [pytest.param(a, id=a.id, marks=[pytest.mark.slow] if a.id in SLOW else []) for a in ATTACKS],
)
def test_attack_is_contained(task, attack):
    limits = dataclasses.replace(LIMITS, **attack.limits)
    t0 = time.monotonic()
    r = task.box.run(f"echo {BEGIN}; {attack.script(task)}", limits=limits)
    # Includes killing what the command left: the limit holds for the whole episode.
    assert time.monotonic() - t0 < limits.timeout_s + TIME_MARGIN_S
    _check_contained(task, attack, r, limits)
    if attack.check is not None:
        attack.check(task, r)


def test_task_still_works_after_the_attacks(task):
    # Runs after the attacks of its backend (pytest groups tests by the module fixture's param).
    r = task.box.run("echo ok")
    assert r.ok and r.output == "ok\n", r
    r = task.box.run(f"{shlex.quote(sys.executable)} -m pytest -q -p no:cacheprovider test_calc.py")
    assert r.ok and "1 passed" in r.output, r.output
    assert _snapshot(OUTSIDE_DIRS, task.canary_dir) == task.snapshot
    assert not _reached(task.listeners)


def test_fuzz_has_enough_attacks():
    ids = [a.id for a in ATTACKS]
    assert len(set(ids)) == len(ids) and set(ids) >= SLOW
    default = [a for a in ATTACKS if a.id not in SLOW]
    assert len(default) >= 100, len(default)  # per backend, in the default run
    assert {a.family for a in default} == {a.family for a in ATTACKS}


class HostBox:
    """No jail: the attack as a plain subprocess of the host, for the positive control."""

    backend = "host"
    uid = -1  # no process runs as a sandbox uid

    def __init__(self, workspace: str, limits: Limits, **_):
        self.workspace, self.limits = workspace, limits

    def run(self, command: str, limits: Limits) -> ExecResult:
        t0 = time.monotonic()
        out = subprocess.run(
            ["bash", "-c", command],
            cwd=self.workspace,
            capture_output=True,
            text=True,
            timeout=limits.timeout_s,
        )
        text = out.stdout + out.stderr
        return ExecResult(out.returncode, text, total_bytes=len(text), wall_s=time.monotonic() - t0)

    def close(self) -> None:
        pass


# Attacks that work on an unjailed host and are harmless there (they touch only the control's own
# temporary canaries, listeners and secrets): each must get out, and the check must say so.
CONTROLS = [
    "net_tcp/python_localhost", "net_tcp/bash_dev_tcp_localhost", "net_udp/python_localhost",
    "net_unix/python_host_socket_0777", "net_unix/python_abstract", "secrets/env",
    "secrets/python_environ", "secrets/hidden_cat", "secrets/root_secret",
    "write/canary_append", "write/canary_dir_new_file", "write/canary_remove",
]  # fmt: skip


@pytest.mark.parametrize("attack_id", CONTROLS)
def test_positive_control_each_attack_escapes_without_the_jail(attack_id, tmp_path):
    """Without the jail the attack gets out and ``_check_contained`` fails: the attack's code
    works and the check can see it (a typo in either would make the fuzz pass silently)."""
    if attack_id == "secrets/root_secret" and os.geteuid() != 0:
        pytest.skip("the /root secret is written as root only")
    (attack,) = [a for a in ATTACKS if a.id == attack_id]
    with _task_on("host", tmp_path, box_factory=HostBox) as host:
        r = host.box.run(f"echo {BEGIN}; {attack.script(host)}", limits=LIMITS)
        assert BEGIN in r.output, r
        with pytest.raises(AssertionError) as escaped:
            _check_contained(host, attack, r, LIMITS)
        # One of the escape checks failed, not a check of the command's limits or leftovers.
        assert re.search(r"ESCAPED|fuzz-secret|AGENTRL_FUZZ_SECRET|connection|datagram|snapshot|"
                         r"canary", str(escaped.value)), str(escaped.value)[-500:]  # fmt: skip
