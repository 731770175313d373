"""Sandbox supervisor: builds a private root, drops privileges, runs the untrusted program.

Run by :mod:`dllm_eval.sandbox` as ``python -I -S _supervisor.py CONFIG_JSON`` in a fresh
session. Standard library only (it runs before ``site``). Steps:

1. enter new mount, network, PID, IPC and UTS namespaces (plus a user namespace when not root);
2. build a new root on a small tmpfs: read-only binds of the system libraries (``/usr``,
   ``/lib*``, ``/bin``, ``/sbin``) and of the interpreter's own folders (``bin``, ``lib`` and
   ``pyvenv.cfg`` of ``sys.prefix`` and ``sys.base_prefix``), the few device nodes Python uses,
   a size-limited writable tmpfs on ``/tmp`` (the program's cwd) and ``/dev/shm``, where the
   folders above an interpreter exposed from under the host's ``/tmp`` are read-only mount
   points; then ``pivot_root`` into it and detach the old root, so no host path is reachable;
3. fork the program as PID 1 of the new PID namespace; it mounts a fresh ``/proc`` (showing
   only its own processes), joins the run's cgroups (opened before the root was replaced) and
   a cgroup namespace, sets rlimits, empties its capability bounding set, drops to an
   unprivileged uid/gid when root, sets ``no_new_privs`` and execs the interpreter.

The supervisor and PID 1 are killed when their parent dies (``PR_SET_PDEATHSIG``).

With tests (``mode == "tests"``) the forked child is the *test runner*: it forks the solution
into a further PID namespace of its own (so the solution cannot see, signal or read the runner),
drops privileges, makes itself non-dumpable and runs the tests against the solution over two
pipes (:mod:`dllm_eval._rpc`); its exit status is the verdict. The tests' source only ever
exists in the runner's memory.

The supervisor reports on the report fd ``{"pid": ..., "isolation": [...]}`` (or
``{"error": ...}`` when isolation was required but could not be set up) and exits with the
child's status (128 + signal if killed).
"""

import ctypes
import errno
import fcntl
import importlib.util
import json
import os
import resource
import signal
import sys
from typing import Any


def _load_rpc() -> Any:
    """The test runner's half of :mod:`dllm_eval._rpc`, loaded before the root is replaced."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_rpc.py")
    spec = importlib.util.spec_from_file_location("_rpc", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_rpc = _load_rpc()

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
_KEEP_FLAGS = MS_NODEV | MS_NOEXEC | 1024 | 2048 | (1 << 21)  # + noatime, nodiratime, relatime
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
DEVICES = ("null", "zero", "full", "random", "urandom")
EXIT_NO_ISOLATION = 125
EXIT_ORPHANED = 126

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None) -> None:
    rc = _libc.mount(
        src.encode() if src else None,
        dst.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    _check(rc, f"mount {src} -> {dst}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _unshare(flags: int, what: str) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({what})")


def _enter_namespaces(is_root: bool, sandbox_uid: int, extra: int) -> None:
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | extra
    uid, gid = os.getuid(), os.getgid()
    if not is_root:
        flags |= CLONE_NEWUSER
    _unshare(flags, "mount, net, pid, ipc, uts" + ("" if is_root else ", user"))
    if not is_root:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)


def _bind_ro(src: str, dst: str) -> None:
    if os.path.isdir(src):
        os.makedirs(dst, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
        if not os.path.exists(dst):
            open(dst, "wb").close()
    _mount(src, dst, None, MS_BIND | MS_REC, None)
    # a remount in a user namespace must keep the source's locked flags (nodev, noexec, ...)
    keep = os.statvfs(src).f_flag & _KEEP_FLAGS
    _mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | keep, None)


def _importable(path: str, work: str) -> bool:
    """Whether `path` stays on the runner's sys.path: the interpreter's own directories do (also when
    they live under /tmp, e.g. a virtual environment in a checkout there); the work dir, /tmp and
    anything under them do not, so no file the program writes is importable by the tests."""
    if not path:
        return False
    real = os.path.realpath(path)
    own = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    if any(real == p or real.startswith(p.rstrip("/") + "/") for p in own):
        return True
    return not any(real == d or real.startswith(d.rstrip("/") + "/") for d in ("/tmp", os.path.realpath(work)))


def _covered(path: str, done: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in done)


def _tops_under(paths: list[str], folder: str) -> list[str]:
    """The first-level entries of ``folder`` above any of ``paths`` (or their real paths)."""
    tops = set()
    for path in paths:
        for p in (path, os.path.realpath(path)):
            rest = p[len(folder):].lstrip("/") if p.startswith(folder.rstrip("/") + "/") else ""
            if rest:
                tops.add(folder.rstrip("/") + "/" + rest.split("/")[0])
    return sorted(tops)


def _build_root(root: str, cfg: dict[str, Any], uid: int, gid: int) -> None:
    """Populate the tmpfs mounted at ``root`` (see the module docstring, step 2)."""
    for d in ("/proc", "/tmp", "/etc", "/.dllm"):
        os.makedirs(root + d, 0o755, exist_ok=True)
    # the private /tmp first: an interpreter exposed from under the host's /tmp (a virtual
    # environment in a checkout there) is bound on top of it, not hidden by it
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={int(cfg['disk_mb'])}m,mode=0700,uid={uid},gid={gid}")
    done: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            os.symlink(os.readlink(d), root + d)
        elif os.path.isdir(d):
            _bind_ro(d, root + d)
            done.append(d)
    for f in SYSTEM_FILES:
        if os.path.isfile(f):
            _bind_ro(os.path.realpath(f), root + f)
    for path in cfg["expose"]:
        real = os.path.realpath(path)
        if os.path.exists(real) and not _covered(real, done):
            _bind_ro(real, root + real)
            done.append(real)
        if path != real and os.path.exists(real) and not os.path.lexists(root + path):
            os.makedirs(os.path.dirname(root + path), 0o755, exist_ok=True)
            os.symlink(real, root + path)
    for top in _tops_under(cfg["expose"], "/tmp"):
        # the folders between the program's /tmp and an exposed path (a checkout's .venv under
        # the host's /tmp) would be plain folders of its tmpfs, which the program could rename
        # to plant modules where the runner imports from (issue 38 S1): each top folder is
        # bound onto itself read-only (a mount point cannot be renamed, nothing under a
        # read-only mount can)
        _bind_ro(root + top, root + top)
    for hidden in cfg["hide"]:
        if os.path.isdir(root + hidden):
            _mount("tmpfs", root + hidden, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY,
                   "size=4k,mode=0555")
    dev = root + "/dev"
    os.makedirs(dev, 0o755, exist_ok=True)
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            open(f"{dev}/{name}", "wb").close()
            _mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND, None)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    os.makedirs(dev + "/shm", 0o755)
    _mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size=1m,mode=0700,uid={uid},gid={gid}")


def _pivot(root: str) -> None:
    nr = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if nr is None:
        raise OSError(0, f"pivot_root: unknown syscall number on {os.uname().machine}")
    os.chdir(root)
    _check(_libc.syscall(ctypes.c_long(nr), b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", ctypes.c_int(MNT_DETACH)), "umount old root")
    os.chdir("/")


def _isolate(cfg: dict[str, Any], files: dict[str, bytes], is_root: bool, uid: int,
             gid: int) -> list[str]:
    """Namespaces + private root; returns the isolation tags (raises OSError on failure)."""
    _enter_namespaces(is_root, uid, int(cfg.get("extra_unshare_flags", 0)))
    tags = ["netns", "pidns", "ipcns", "mountns"] + ([] if is_root else ["userns"])
    root = os.path.join(cfg["host_dir"], "_root")
    os.mkdir(root, 0o755)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID, "size=1m,mode=0755")
    _build_root(root, cfg, uid, gid)
    for name, data in files.items():
        dst = f"{root}/tmp/{name}"
        with open(dst, "wb") as out:
            out.write(data)
        os.chown(dst, uid, gid)
    for name, data in cfg["harness"].items():
        with open(f"{root}/.dllm/{name}", "w", encoding="utf-8") as out:
            out.write(data)
    _pivot(root)
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID, None)
    return tags + ["private-root", "private-tmp"]


def _fallback(cfg: dict[str, Any], files: dict[str, bytes], is_root: bool, uid: int,
              gid: int) -> str:
    """No namespaces: run in the host temp dir (rlimits and, as root, the uid drop only)."""
    work = str(cfg["host_dir"])
    if is_root:
        os.chown(work, uid, gid)
        for name in files:
            os.chown(os.path.join(work, name), uid, gid)
    for name, data in cfg["harness"].items():
        with open(os.path.join(work, name), "w", encoding="utf-8") as out:
            out.write(data)
    return work


def _set_limits(cfg: dict[str, Any]) -> None:
    mem = int(cfg["memory_mb"]) * 1024 * 1024
    cpu = int(cfg["cpu_s"])
    limits = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (mem, mem),
        resource.RLIMIT_FSIZE: (int(cfg["disk_mb"]) * 1024 * 1024,) * 2,
        resource.RLIMIT_NOFILE: (int(cfg["max_open_files"]),) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    if not cfg["cgroup_procs"]:  # a cgroup's pids.max counts this sandbox's tasks instead
        limits[resource.RLIMIT_NPROC] = (int(cfg["max_processes"]),) * 2
    for key, value in limits.items():
        resource.setrlimit(key, value)


def _join_budget(fds: list[int], tags: list[str]) -> None:
    """Move this process (about to exec the program) into the run's cgroups, then close them."""
    for fd in fds:
        os.write(fd, b"0")
        os.close(fd)
    if fds:
        tags.append("cgroup-budget")
        try:  # /proc/self/cgroup then names "/" rather than the host's cgroup folders
            _unshare(CLONE_NEWCGROUP, "cgroup")
            tags.append("cgroupns")
        except OSError:
            pass


def _drop_capabilities() -> bool:
    """Empty the capability bounding set, so the exec'd program holds no capability even as
    root of a user namespace (where it could otherwise unmount what hides the host)."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            return ctypes.get_errno() == errno.EINVAL and cap > 0  # past the last capability
    return True


def _drop(cfg: dict[str, Any], is_root: bool, uid: int, gid: int, tags: list[str]) -> None:
    _set_limits(cfg)
    if _drop_capabilities():
        tags.append("no-caps")
    if is_root:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        tags.append("uid-drop")
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        tags.append("no-new-privs")


def _own_proc(isolated: bool, tags: list[str]) -> None:
    """Mount a /proc of the caller's (new) PID namespace, in a mount namespace of its own."""
    if not isolated:
        return
    try:
        _unshare(CLONE_NEWNS, "mount")
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        tags.append("private-proc")
    except OSError:
        pass  # /proc stays an empty directory: no process is visible at all


def _exec_program(cfg: dict[str, Any], work: str, argv: list[str], keep: dict[int, int]) -> None:
    """In a forked child: stdin, fds, then exec the interpreter (never returns)."""
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.setsid()
        stdin_path = os.path.join(work, "stdin.txt")
        fd = os.open(stdin_path if os.path.exists(stdin_path) else os.devnull, os.O_RDONLY)
        os.dup2(fd, 0)
        high = {dst: fcntl.fcntl(src, fcntl.F_DUPFD, 100) for dst, src in keep.items()}
        for dst, src in high.items():
            os.dup2(src, dst)
        os.closerange(3 + len(keep), 1 << 16)
        env = {str(k): str(v) for k, v in cfg["env"].items()}
        env["HOME"] = env["TMPDIR"] = work
        os.chdir(work)
        os.execve(cfg["python"], [cfg["python"], "-I", *argv], env)
    finally:
        os._exit(127)


def _report(fd: int, tags: list[str]) -> None:
    os.write(fd, json.dumps({"isolation": tags}).encode() + b"\n")
    os.close(fd)


def _run_tests(cfg: dict[str, Any], tests: str, work: str, harness_dir: str, isolated: bool,
               ids: tuple[bool, int, int], tags: list[str], report: int) -> None:
    """PID 1 of the sandbox: fork the solution (own PID namespace), run the tests (no return)."""
    is_root, uid, gid = ids
    code = 1
    try:
        import site

        sys.dont_write_bytecode = True
        site.main()  # the tests may import installed packages (numpy for HumanEval+)
        sys.path[:] = [p for p in sys.path if _importable(p, work)]
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        if isolated:
            _unshare(CLONE_NEWPID, "pid")
            tags.append("solution-pidns")
        pid = os.fork()
        if pid == 0:
            os.close(req_w)
            os.close(resp_r)
            os.close(report)
            _own_proc(isolated, [])
            _join_budget(cfg["budget_fds"], [])
            _drop(cfg, is_root, uid, gid, [])
            _exec_program(cfg, work, [f"{harness_dir}/serve.py", f"{work}/solution.py"],
                          {3: req_r, 4: resp_w})
        os.close(req_r)
        os.close(resp_w)
        for fd in cfg["budget_fds"]:
            os.close(fd)
        if cfg["budget_fds"]:
            tags.append("cgroup-budget")
        _drop(cfg, is_root, uid, gid, tags)
        if _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0:
            tags.append("runner-undumpable")
        os.chdir("/" if isolated else work)
        _report(report, tags + ["split-tests"])
        code = _rpc.run_tests(tests, resp_r, req_w, frozenset(cfg["solution_names"]))
    except BaseException as e:  # noqa: BLE001 - any failure of the runner is a failed run
        sys.stderr.write(f"[dllm-eval tests] runner error: {type(e).__name__}: {e}\n")
    finally:
        sys.stderr.flush()
        os._exit(code)


def _die_with_parent(parent: int | None, alive: int | None) -> None:
    """SIGKILL this process when its parent exits (issue 38 S3: a SIGKILLed caller left the
    sandbox running), and exit now if the parent is already gone: ``parent`` is its expected
    pid, or ``alive`` the read end of a pipe whose write end only the parent holds."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    gone = parent is not None and os.getppid() != parent
    if alive is not None:
        os.set_blocking(alive, False)
        try:
            gone = gone or os.read(alive, 1) == b""
        except BlockingIOError:
            pass
        os.close(alive)
    if gone:
        os._exit(EXIT_ORPHANED)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    _die_with_parent(int(cfg["parent_pid"]), None)
    report = int(cfg["report_fd"])
    is_root = os.geteuid() == 0
    tags: list[str] = ["rlimits", "session"]
    uid, gid = (int(cfg["uid"]), int(cfg["gid"])) if is_root else (0, 0)
    host_dir = cfg["host_dir"]
    files = {}
    for name in os.listdir(host_dir):
        if not name.startswith("_"):
            with open(os.path.join(host_dir, name), "rb") as src:
                files[name] = src.read()
    # the run's cgroups (issue 38 S4/S5), opened while the host's /sys is still there
    cfg["budget_fds"] = [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in cfg["cgroup_procs"]]
    tests = None
    if cfg["mode"] == "tests":
        with open(os.path.join(host_dir, "_tests.py"), encoding="utf-8") as src:
            tests = src.read()
    try:
        tags += _isolate(cfg, files, is_root, uid, gid)
        isolated, work, harness_dir = True, "/tmp", "/.dllm"
    except OSError as e:
        if cfg["isolation"] == "required":
            os.write(report, json.dumps({"error": str(e)}).encode() + b"\n")
            os._exit(EXIT_NO_ISOLATION)
        uid, gid = int(cfg["uid"]), int(cfg["gid"])
        work = harness_dir = _fallback(cfg, files, is_root, uid, gid)
        isolated = False
    alive, keep_alive = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(keep_alive)
        _die_with_parent(None, alive)  # PID 1 of the namespace: its parent is outside
        if tests is not None:
            _run_tests(cfg, tests, work, harness_dir, isolated, (is_root, uid, gid), tags,
                       report)
        _own_proc(isolated, tags)
        _join_budget(cfg["budget_fds"], tags)
        _drop(cfg, is_root, uid, gid, tags)
        _report(report, tags)
        _exec_program(cfg, work, [cfg["script"]], {})
    del tests
    os.write(report, json.dumps({"pid": pid}).encode() + b"\n")
    os.close(report)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
