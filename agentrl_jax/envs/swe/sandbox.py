"""Runs untrusted commands (model-written code, a repository's test suite) in a sandbox.

Two backends build the same jail; ``detect_backend`` picks one, ``AGENTRL_SANDBOX=bwrap|unshare``
forces one (the tests force each):

* ``bwrap`` (Debian package ``bubblewrap``): new PID, network, IPC and UTS namespaces, the whole
  system bind-mounted read-only, a small private ``/tmp`` and ``/dev/shm``, fresh ``/dev`` and
  ``/proc``.
* ``unshare`` (util-linux): the same namespaces made with ``unshare``, then a generated shell
  script remounts every mount read-only and mounts the private ``/tmp``, before dropping to the
  sandbox user. Used where bubblewrap is missing.

Both run the command as a dedicated non-root uid when the caller is root (``setpriv --reuid``,
with every capability dropped and ``no_new_privs``): the process limit (RLIMIT_NPROC) counts per
real uid and does not bind root at all, so each live sandbox leases its own uid from a small
pool. A non-root caller keeps its own uid. Around both: ``prlimit`` sets CPU, address-space,
file-size and process limits; a seccomp filter (``seccomp_program``) refuses the few system calls
that reach past the namespaces (sockets other than IP and netlink: a host daemon's unix socket on
a visible path, vsock to the VM host; new user namespaces; the kernel keyrings, which are per uid
and so would carry data from one episode to the next); the environment is scrubbed to a minimal
PATH/HOME; only the workspace is writable; ``hidden`` paths are masked by empty tmpfs (``/root``
by default, and the runtime adds the task repositories so the gold patch cannot be read);
``exposed`` paths (the Python that runs the tests, when it lives under a hidden path) are
bind-mounted back read-only.

The wall-clock timeout kills the process group we started; the PID namespace's init dies with it
(``--die-with-parent`` / ``--kill-child``), and the kernel then kills every process left in the
namespace, including ones that called setsid. Output is read while the command runs and only a
head and a tail are kept, so a command that prints gigabytes costs a bounded amount of memory; past
``kill_output_bytes`` it is killed.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import fcntl
import os
import selectors
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence

BACKENDS = ("bwrap", "unshare")
_UID_BASE = 200_000  # far from system (<1000) and login (1000-60000) uids
_UID_SLOTS = 1000
_UID_LOCK_DIR = "/tmp/agentrl_swe_uids"


# Masked by empty tmpfs: other users' files and live sockets (/run) are none of the jail's business.
DEFAULT_HIDDEN = ("/root", "/home", "/run", "/var/tmp")


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (not a failure of the sandboxed command)."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed command.

    Attributes:
      timeout_s: wall-clock seconds before the whole process tree is killed.
      cpu_s: CPU seconds per process (RLIMIT_CPU).
      memory_bytes: address space per process (RLIMIT_AS).
      file_bytes: largest file a process may write (RLIMIT_FSIZE).
      nproc: processes of the sandbox uid (RLIMIT_NPROC); binds only for a non-root uid.
      tmp_bytes: size of the private /tmp.
      keep_output_bytes: bytes of output kept (half head, half tail); the middle is counted.
      kill_output_bytes: total output after which the command is killed.
    """

    timeout_s: float = 60.0
    cpu_s: int = 120
    memory_bytes: int = 4 << 30
    file_bytes: int = 256 << 20
    nproc: int = 256
    tmp_bytes: int = 256 << 20
    keep_output_bytes: int = 256 << 10
    kill_output_bytes: int = 64 << 20

    def __post_init__(self):
        minimum = {"timeout_s": 0.01, "cpu_s": 1, "memory_bytes": 64 << 20, "file_bytes": 1,
                   "nproc": 8, "tmp_bytes": 1 << 20, "keep_output_bytes": 2,
                   "kill_output_bytes": self.keep_output_bytes}  # fmt: skip
        for name, low in minimum.items():
            if getattr(self, name) < low:
                raise ValueError(f"Limits.{name}={getattr(self, name)}: expected >= {low}")


@dataclasses.dataclass
class ExecResult:
    """What a command did.

    Attributes:
      exit_code: the exit status; negative for a signal; None when we killed it.
      output: stdout and stderr interleaved, decoded; head + marker + tail when cut.
      timed_out: the wall-clock limit was hit and the tree was killed.
      output_killed: more than ``kill_output_bytes`` were printed and the tree was killed.
      total_bytes: bytes the command printed in all.
      elided_bytes: bytes dropped from the middle of ``output``.
      wall_s: seconds from start to the end of the process tree.
    """

    exit_code: int | None
    output: str
    timed_out: bool = False
    output_killed: bool = False
    total_bytes: int = 0
    elided_bytes: int = 0
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_killed


def detect_backend() -> str:
    """The backend to use: ``$AGENTRL_SANDBOX`` if set, else bwrap if it works, else unshare.

    Raises:
      SandboxError: the forced backend is unknown, or no backend works here (with each one's
        complaint: a container may lack the rights to make namespaces).
    """
    forced = os.environ.get("AGENTRL_SANDBOX", "").strip()
    if forced:
        if forced not in BACKENDS:
            raise SandboxError(f"AGENTRL_SANDBOX={forced!r}: expected one of {BACKENDS}")
        return forced
    problems = []
    for backend in BACKENDS:
        problem = _probe(backend)
        if problem is None:
            return backend
        problems.append(f"{backend}: {problem}")
    raise SandboxError(
        "no sandbox works here (" + "; ".join(problems) + "). Install bubblewrap (scripts/setup.sh "
        "does, as root) or util-linux, and allow namespaces (e.g. docker run --privileged or "
        "--security-opt seccomp=unconfined)"
    )


_PROBED: dict[str, str | None] = {}


def _probe(backend: str) -> str | None:
    """None when ``backend`` can make its namespaces here, else why not (tried once)."""
    if backend not in _PROBED:
        user = [] if os.geteuid() == 0 else ["--unshare-user"]
        if backend == "bwrap":
            argv = ["bwrap", *user, "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "true"]
        else:
            user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
            argv = ["unshare", *user, "--mount", "--pid", "--fork", "--net", "true"]
        needed = [argv[0], "prlimit"] + (["setpriv"] if os.geteuid() == 0 else [])
        missing = [t for t in needed if not shutil.which(t)]
        if missing:
            _PROBED[backend] = f"{missing} not installed"
        else:
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
                _PROBED[backend] = None if r.returncode == 0 else r.stderr.strip()[-200:]
            except (OSError, subprocess.TimeoutExpired) as e:
                _PROBED[backend] = str(e)
    return _PROBED[backend]


def default_exposed() -> tuple[str, ...]:
    """Directories the sandboxed Python needs: this interpreter's prefixes and venv."""
    paths = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    return tuple(sorted(os.path.realpath(p) for p in paths))


# Syscall numbers and audit arch of the machines we run on (x86_64, aarch64).
_SYSCALLS = {
    "x86_64": dict(arch=0xC000003E, socket=41, clone=56, unshare=272, clone3=435,
                   add_key=248, request_key=249, keyctl=250, io_uring_setup=425),
    "aarch64": dict(arch=0xC00000B7, socket=198, clone=220, unshare=97, clone3=435,
                    add_key=217, request_key=218, keyctl=219, io_uring_setup=425),
}  # fmt: skip
# Socket families a jailed command may open: IP and netlink live in its own network namespace.
# AF_UNIX is refused because a ro mount does not stop connect() to a host daemon's socket on a
# visible path, and AF_VSOCK is not namespaced at all (socketpair() stays allowed).
_SOCKET_FAMILIES = (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK)
_CLONE_NEWUSER = 0x10000000


def seccomp_program(machine: str | None = None) -> bytes:
    """The jail's seccomp filter as a classic BPF program (``struct sock_filter[]``, native order).

    Refused with EPERM: ``socket()`` of any family but ``_SOCKET_FAMILIES``; ``unshare``/``clone``
    with CLONE_NEWUSER (a nested user namespace is kernel attack surface and lets the command mount
    over its own view); ``add_key``/``request_key``/``keyctl`` (a uid's keyring outlives the
    episode and the next task of that uid could read it); ``io_uring_setup`` (io_uring opens
    sockets without the ``socket`` call this filter sees). ``clone3`` answers ENOSYS, as in Docker's
    profile: its flags sit behind a pointer seccomp cannot read, and libc then falls back to
    ``clone``. Another architecture's ABI (i386 via int 0x80, x32) kills the process.

    Raises:
      SandboxError: the machine is not one we have syscall numbers for.
    """
    machine = machine or os.uname().machine
    if machine not in _SYSCALLS:
        raise SandboxError(f"seccomp filter: machine {machine!r} not in {sorted(_SYSCALLS)}")
    nr = _SYSCALLS[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|..|K, BPF_RET|K
    allow, kill, eperm, enosys = 0x7FFF0000, 0x80000000, 0x00050000 | 1, 0x00050000 | 38
    arg0, arch_off = 16, 4  # offsetof(struct seccomp_data, args[0]) (low word, little-endian)
    prog = [(ld, 0, 0, arch_off), (jeq, 1, 0, nr["arch"]), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    if machine == "x86_64":
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, kill)]  # x32 numbers share the arch
    for name in ("add_key", "request_key", "keyctl", "io_uring_setup"):
        prog += [(jeq, 0, 1, nr[name]), (ret, 0, 0, eperm)]
    prog += [(jeq, 0, 1, nr["clone3"]), (ret, 0, 0, enosys)]
    for name in ("unshare", "clone"):  # flags are the first argument of both
        prog += [(jeq, 0, 3, nr[name]), (ld, 0, 0, arg0), (jset, 0, 1, _CLONE_NEWUSER)]
        prog += [(ret, 0, 0, eperm), (ld, 0, 0, 0)]  # reload the number for the next check
    # socket(family, ...): allow the listed families, refuse the rest.
    n = len(_SOCKET_FAMILIES)
    prog += [(jeq, 0, n + 2, nr["socket"]), (ld, 0, 0, arg0)]
    prog += [(jeq, n - i, 0, fam) for i, fam in enumerate(_SOCKET_FAMILIES)]
    prog += [(ret, 0, 0, eperm), (ret, 0, 0, allow)]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


# Installs the filter (hex in argv[1]) and execs argv[2:]: the unshare backend has no loader of
# its own (bwrap reads the program from --seccomp FD). It sets no_new_privs, which a filter needs
# without CAP_SYS_ADMIN; the filter then stays through setpriv's uid drop and every exec.
_SECCOMP_LOADER = (
    "import ctypes as c,os,sys\n"
    "p=bytes.fromhex(sys.argv[1]);b=c.create_string_buffer(p,len(p))\n"
    "class F(c.Structure):_fields_=[('n',c.c_ushort),('f',c.c_void_p)]\n"
    "l=c.CDLL(None,use_errno=True);l.prctl(38,1,0,0,0)\n"
    "if l.prctl(22,2,c.byref(F(len(p)//8,c.addressof(b))),0,0):"
    "raise OSError(c.get_errno(),'seccomp filter not installed')\n"
    "os.execvp(sys.argv[2],sys.argv[2:])"
)


def _outermost(paths) -> tuple[str, ...]:
    """The sorted distinct ``paths`` that are not inside another of them."""
    paths = sorted(set(paths))
    return tuple(p for p in paths if not any(p.startswith(o.rstrip("/") + "/") for o in paths))


class _UidLease:
    """A uid from the pool, held (flock) for as long as one Sandbox lives."""

    def __init__(self):
        os.makedirs(_UID_LOCK_DIR, mode=0o700, exist_ok=True)
        start = os.getpid() % _UID_SLOTS
        for i in range(_UID_SLOTS):
            slot = (start + i) % _UID_SLOTS
            fd = os.open(os.path.join(_UID_LOCK_DIR, str(slot)), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.fd, self.uid = fd, _UID_BASE + slot
            return
        raise SandboxError(f"all {_UID_SLOTS} sandbox uids are in use ({_UID_LOCK_DIR})")

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Sandbox:
    """A jail around one writable workspace; ``run`` executes commands in it.

    Args:
      workspace: the only writable directory (host path; the same path inside).
      limits: default limits of each command.
      backend: 'bwrap' or 'unshare'; None picks with ``detect_backend``.
      hidden: host paths masked by an empty tmpfs (missing ones are ignored). /tmp is always
        private. The workspace and ``exposed`` paths are mounted back on top when under them.
      exposed: host paths bind-mounted back read-only (default: this Python's installation).
      path: PATH inside; defaults to the exposed Python's bin dir plus the system dirs.
    """

    def __init__(
        self,
        workspace: str,
        limits: Limits = Limits(),
        backend: str | None = None,
        hidden: Sequence[str] = DEFAULT_HIDDEN,
        exposed: Sequence[str] | None = None,
        path: str | None = None,
    ):
        self.workspace = os.path.realpath(workspace)
        if not os.path.isdir(self.workspace):
            raise SandboxError(f"workspace {workspace!r} is not a directory")
        self.limits = limits
        self.backend = backend or detect_backend()
        if self.backend not in BACKENDS:
            raise SandboxError(f"backend={self.backend!r}: expected one of {BACKENDS}")
        tools = ("bwrap", "prlimit") if self.backend == "bwrap" else ("unshare", "prlimit")
        missing = [
            t for t in tools + (("setpriv",) if os.geteuid() == 0 else ()) if not shutil.which(t)
        ]
        if missing:
            raise SandboxError(f"sandbox backend {self.backend!r} needs {missing} on PATH")
        # A path inside another hidden path is already masked (and its mount point gone).
        self.hidden = _outermost(os.path.realpath(h) for h in hidden if os.path.isdir(h))
        exposed = default_exposed() if exposed is None else exposed
        self._seccomp = seccomp_program()
        self._loader_python = sys.executable
        if self.backend == "unshare":  # this interpreter installs the seccomp filter there
            exposed = (*exposed, *default_exposed())
        # A path inside another exposed path is already visible.
        self.exposed = _outermost(os.path.realpath(e) for e in exposed if os.path.exists(e))
        bin_dir = os.path.dirname(sys.executable)
        self.path = path or f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"
        self.is_root = os.geteuid() == 0
        self._lease = _UidLease() if self.is_root else None
        self.uid = self._lease.uid if self._lease else os.getuid()
        self.own(self.workspace)

    def own(self, path: str) -> None:
        """Gives ``path`` (recursively) to the sandbox uid so commands can write it."""
        if not self.is_root:
            return
        os.lchown(path, self.uid, self.uid)
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                os.lchown(os.path.join(root, name), self.uid, self.uid)

    def close(self) -> None:
        """Returns the uid to the pool. Safe to call twice."""
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(
        self,
        argv: Sequence[str] | str,
        *,
        cwd: str | None = None,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        limits: Limits | None = None,
    ) -> ExecResult:
        """Runs ``argv`` (a string runs under ``bash -c``) in the jail and returns its result.

        Args:
          argv: the command; a string is a bash script.
          cwd: directory inside the jail (default the workspace).
          timeout_s: wall-clock limit, overriding ``limits.timeout_s``.
          env: extra environment variables (nothing of the caller's leaks in otherwise).
          limits: limits of this call.
        """
        if self._lease is None and self.is_root:
            raise SandboxError("sandbox is closed")
        limits = limits or self.limits
        if timeout_s is not None:
            limits = dataclasses.replace(limits, timeout_s=timeout_s)
        if isinstance(argv, str):
            argv = ["bash", "-c", argv]
        cwd = os.path.realpath(cwd or self.workspace)
        full_env = {
            "PATH": self.path,
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            **(env or {}),
        }
        if self.backend == "bwrap":
            # bwrap reads the filter from a file descriptor and installs it just before exec.
            seccomp_fd = os.memfd_create("agentrl-seccomp")
            try:
                os.write(seccomp_fd, self._seccomp)
                os.lseek(seccomp_fd, 0, os.SEEK_SET)
                cmd = self._bwrap_argv(list(argv), cwd, full_env, limits, seccomp_fd)
                result = run_capped(cmd, limits, env={"PATH": _HOST_PATH}, pass_fds=(seccomp_fd,))
            finally:
                os.close(seccomp_fd)
        else:
            cmd = self._unshare_argv(list(argv), cwd, full_env, limits)
            result = run_capped(cmd, limits, env={"PATH": _HOST_PATH})
        if self.is_root:
            # The namespace's processes die asynchronously after its init; wait them out so the
            # next command (and the NPROC count) starts from zero.
            _kill_uid(self.uid)
        return result

    def _prlimit(self, limits: Limits) -> list[str]:
        return [
            "prlimit",
            f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",
            f"--as={limits.memory_bytes}",
            f"--fsize={limits.file_bytes}",
            f"--nproc={limits.nproc}",
            "--core=0",
            "--",
        ]

    def _drop(self, env: dict[str, str]) -> list[str]:
        """Switch to the sandbox uid (root callers) and replace the environment."""
        drop = []
        if self.is_root:
            drop = [
                "setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.uid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                "--",
            ]
        return drop + ["env", "-i", *(f"{k}={v}" for k, v in env.items())]

    def _bwrap_argv(self, argv, cwd, env, limits, seccomp_fd) -> list[str]:
        cmd = self._prlimit(limits) + ["bwrap"]
        if not self.is_root:
            cmd += ["--unshare-user"]
        cmd += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        cmd += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
        cmd += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for h in self.hidden:
            cmd += ["--perms", "0755", "--size", str(1 << 20), "--tmpfs", h]
        for private in ("/tmp", "/dev/shm"):  # like the unshare backend's: writable, bounded
            cmd += ["--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", private]
        for e in self.exposed:
            cmd += self._bwrap_parents(e) + ["--ro-bind", e, e]
        cmd += self._bwrap_parents(self.workspace)
        cmd += ["--bind", self.workspace, self.workspace, "--chdir", cwd, "--clearenv"]
        if self.is_root:
            # bwrap runs privileged (no user namespace, so the kernel counts processes against
            # the real sandbox uid); it drops every capability except what setpriv needs.
            for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"):
                cmd += ["--cap-add", cap]
        cmd += ["--seccomp", str(seccomp_fd)]
        return cmd + ["--"] + self._drop(env) + argv

    def _bwrap_parents(self, path: str) -> list[str]:
        # bwrap would create missing mount points 0700, which the sandbox uid cannot traverse.
        out = []
        for top in (*self.hidden, "/tmp"):
            if path.startswith(top + "/"):
                parts = path[len(top) + 1 :].split("/")[:-1]
                for i in range(len(parts)):
                    out += ["--perms", "0755", "--dir", os.path.join(top, *parts[: i + 1])]
        return out

    def _unshare_argv(self, argv, cwd, env, limits) -> list[str]:
        q = shlex.quote
        keep = (*self.exposed, self.workspace)
        if len(keep) > 7:  # dash redirects single-digit fds only (3..9)
            raise SandboxError(f"unshare backend: at most 6 exposed paths, got {self.exposed}")
        fds = {p: 3 + i for i, p in enumerate(keep)}
        lines = ["set -e"]
        # Opened before the masks below hide them; bound back through /proc/self/fd.
        lines += [f"exec {fd}<{q(p)}" for p, fd in fds.items()]
        lines += [
            "mount --make-rprivate /",
            # Private shm and an empty cgroup dir, like bwrap's: fewer mounts to remount below.
            f"if [ -d /dev/shm ]; then mount -t tmpfs -o size={limits.tmp_bytes},mode=1777"
            " tmpfs /dev/shm; fi",
            "if [ -d /sys/fs/cgroup ]; then mount -t tmpfs -o size=1m,ro tmpfs /sys/fs/cgroup; fi",
            # Every other mount read-only (one `mount` each, so skip what is already ro, seen,
            # masked, or the fresh /proc); then private tmpfs over hidden paths and /tmp.
            # (fields 5 and 6 of mountinfo: mount point, per-mount options; mountinfo escapes
            # spaces and the like as \040, which printf %b decodes)
            'seen=" "; while read -r _ _ _ _ m o _; do'
            " case $m in *\\\\*) m=$(printf '%b' \"$m\");; esac;"
            " case $o in ro*) continue;; esac;"
            " case $m in /proc|/proc/*|/dev/shm|/dev/shm/*) continue;; esac;"
            " case $m in /sys/fs/cgroup|/sys/fs/cgroup/*) continue;; esac;"
            ' case $seen in *" $m "*) continue;; esac; seen="$seen$m ";'
            ' mount -o remount,bind,ro "$m" 2>/dev/null || true; done < /proc/self/mountinfo',
        ]
        for h in self.hidden:
            lines.append(f"mount -t tmpfs -o size=1m,mode=755 tmpfs {q(h)}")
        lines.append(f"mount -t tmpfs -o size={limits.tmp_bytes},mode=1777 tmpfs /tmp")
        for e in self.exposed:
            lines += [
                f"mkdir -p {q(e)}",
                f"mount --no-canonicalize -o bind /proc/self/fd/{fds[e]} {q(e)}",
                f"mount -o remount,bind,ro {q(e)}",
            ]
        ws = self.workspace
        lines += [
            f"mkdir -p {q(ws)}",
            f"mount --no-canonicalize -o bind /proc/self/fd/{fds[ws]} {q(ws)}",
            f"mount -o remount,bind,rw {q(ws)}",
            f"cd {q(cwd)}",
        ]
        for fd in fds.values():
            lines.append(f"exec {fd}<&-")
        # The filter goes on before the uid drop: still root here, the loader can read an
        # interpreter the sandbox uid could not reach (under a 0700 /root, say).
        loader = [self._loader_python, "-I", "-S", "-c", _SECCOMP_LOADER, self._seccomp.hex()]
        lines.append("exec " + " ".join(q(a) for a in loader + self._drop(env) + argv))
        script = "\n".join(lines)
        cmd = self._prlimit(limits) + ["unshare"]
        if not self.is_root:
            cmd += ["--user", "--map-root-user"]
        cmd += ["--mount", "--pid", "--fork", "--kill-child", "--mount-proc"]
        cmd += ["--net", "--ipc", "--uts", "--", "/bin/sh", "-c", script]
        return cmd


def _kill_uid(uid: int, patience_s: float = 5.0) -> None:
    """SIGKILLs every process of ``uid`` (a leased sandbox uid: all of them are ours) until none."""
    deadline = time.monotonic() + patience_s
    while True:
        pids = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{name}").st_uid == uid:
                        pids.append(int(name))
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


_HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def run_capped(
    argv: Sequence[str],
    limits: Limits = Limits(),
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    pass_fds: tuple[int, ...] = (),
) -> ExecResult:
    """Runs ``argv`` in its own process group, keeping a bounded head and tail of its output.

    Not a sandbox by itself: the sandbox wraps its command line in this; the benchmark also calls
    it directly as the unsandboxed reference.
    """
    head_cap = limits.keep_output_bytes // 2
    tail_cap = limits.keep_output_bytes - head_cap
    head = bytearray()
    tail: collections.deque[bytes] = collections.deque()
    tail_len = total = 0
    timed_out = output_killed = False
    t0 = time.monotonic()
    deadline = t0 + limits.timeout_s
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env,
        pass_fds=pass_fds,
        start_new_session=True,
    )
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if not sel.select(timeout=min(remaining, 0.5)):
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                break
            total += len(chunk)
            if len(head) < head_cap:
                take = head_cap - len(head)
                head += chunk[:take]
                chunk = chunk[take:]
            if chunk:
                tail.append(chunk)
                tail_len += len(chunk)
                while tail and tail_len - len(tail[0]) >= tail_cap:
                    tail_len -= len(tail.popleft())
            if total > limits.kill_output_bytes:
                output_killed = True
                break
    if not (timed_out or output_killed):
        # EOF: let the leader finish exiting (without reaping it) so its exit status is real.
        while time.monotonic() < deadline:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                break
            time.sleep(0.002)
        else:
            timed_out = True
    # Kill the group before reaping the leader, so its pgid cannot have been reused.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    exit_code = proc.wait()
    proc.stdout.close()
    wall = time.monotonic() - t0
    tail_bytes = b"".join(tail)[-tail_cap:] if tail else b""
    elided = total - len(head) - len(tail_bytes)
    text = head.decode("utf-8", "replace")
    if elided:
        text += f"\n[... {elided} bytes elided ...]\n"
    text += tail_bytes.decode("utf-8", "replace")
    return ExecResult(
        exit_code=None if (timed_out or output_killed) else exit_code,
        output=text,
        timed_out=timed_out,
        output_killed=output_killed,
        total_bytes=total,
        elided_bytes=elided,
        wall_s=wall,
    )
