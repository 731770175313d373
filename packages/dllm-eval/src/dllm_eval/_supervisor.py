"""Sandbox supervisor: isolates itself, drops privileges, then runs the untrusted program.

Run by :func:`dllm_eval.sandbox.execute_code` as ``python -I -S _supervisor.py CONFIG_JSON``
in a fresh session. Standard library only (it runs before ``site``). Steps:

1. enter new mount, network, PID, IPC and UTS namespaces (plus a user namespace when not root);
2. mount a private size-limited tmpfs on ``/tmp`` (the program's cwd) and on ``/dev/shm`` and
   ``/var/tmp``; re-expose the interpreter if it lives under a directory others cannot enter;
3. set resource limits, scrub groups, drop to an unprivileged uid/gid, set no_new_privs;
4. fork the program (PID 1 of the new PID namespace, so everything it spawns dies with it),
   report its host pid on the report fd, wait, and exit with its status (128 + signal if killed).

Every step that the kernel refuses is skipped and left out of the reported isolation list, so
the harness can say honestly what protected a run.
"""

import ctypes
import json
import os
import resource
import signal
import stat
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_MOVE = 8192
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

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


def _enter_namespaces(is_root: bool) -> bool:
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    uid, gid = os.getuid(), os.getgid()
    if not is_root:
        flags |= CLONE_NEWUSER
    if _libc.unshare(ctypes.c_int(flags)) != 0:
        return False
    if not is_root:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    return True


def _blocked_ancestor(path: str) -> str | None:
    """First ancestor of ``path`` that other users cannot traverse (mode lacks o+x)."""
    parts = os.path.realpath(path).strip("/").split("/")
    cur = ""
    for part in parts:
        cur = f"{cur}/{part}"
        try:
            if not os.stat(cur).st_mode & stat.S_IXOTH:
                return cur
        except OSError:
            return None
    return None


def _expose(dirs: list[str], stage_root: str) -> None:
    """Re-expose ``dirs`` (the interpreter) hidden under untraversable ancestors (e.g. /root)."""
    plan: dict[str, list[str]] = {}
    for d in sorted({os.path.realpath(d) for d in dirs}):
        if d.startswith("/tmp/"):
            continue  # already bound into the private /tmp by _private_tmp
        blocked = _blocked_ancestor(d)
        if blocked is not None and not any(d.startswith(k + "/") for k in plan.get(blocked, [])):
            plan.setdefault(blocked, []).append(d)
    for i, (blocked, targets) in enumerate(plan.items()):
        stages = []
        for j, d in enumerate(targets):
            stage = os.path.join(stage_root, f".stage{i}_{j}")
            os.mkdir(stage, 0o700)
            _mount(d, stage, None, MS_BIND | MS_REC, None)
            stages.append(stage)
        _mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
        for d, stage in zip(targets, stages):
            os.makedirs(d, 0o755, exist_ok=True)
            _mount(stage, d, None, MS_MOVE, None)
            os.rmdir(stage)
        _mount(None, blocked, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


def _read_inputs(host_dir: str) -> dict[str, bytes]:
    files = {}
    for name in os.listdir(host_dir):
        if not name.startswith("_"):
            with open(os.path.join(host_dir, name), "rb") as src:
                files[name] = src.read()
    return files


def _under_tmp(dirs: list[str]) -> list[tuple[str, int]]:
    """O_PATH handles on the outermost of `dirs` that live under /tmp (e.g. a venv in a clone
    there), taken before the private tmpfs hides them."""
    real = sorted({os.path.realpath(d) for d in dirs if os.path.realpath(d).startswith("/tmp/")})
    outer = [d for d in real if not any(d.startswith(o + "/") for o in real if o != d)]
    return [(d, os.open(d, os.O_PATH | os.O_DIRECTORY)) for d in outer if os.path.isdir(d)]


def _private_tmp(cfg: dict[str, Any], files: dict[str, bytes], uid: int, gid: int) -> str:
    size = int(cfg["disk_mb"])
    keep = _under_tmp(list(cfg.get("expose", [])))
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={size}m,mode=0700,uid={uid},gid={gid}")
    for path, fd in keep:
        # the interpreter's own folders stay visible, read-only, at the same path
        os.makedirs(path, 0o755, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
        os.close(fd)
    for extra in ("/dev/shm", "/var/tmp"):
        if os.path.isdir(extra):
            _mount("tmpfs", extra, "tmpfs", MS_NOSUID | MS_NODEV, "size=4k,mode=0755")
    work = "/tmp"
    for name, data in files.items():
        dst = os.path.join(work, name)
        with open(dst, "wb") as out:
            out.write(data)
        os.chown(dst, uid, gid)
    return work


def _set_limits(cfg: dict[str, Any]) -> None:
    mem = int(cfg["memory_mb"]) * 1024 * 1024
    cpu = int(cfg["cpu_s"])
    limits = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (mem, mem),
        resource.RLIMIT_NPROC: (int(cfg["max_processes"]),) * 2,
        resource.RLIMIT_FSIZE: (int(cfg["disk_mb"]) * 1024 * 1024,) * 2,
        resource.RLIMIT_NOFILE: (int(cfg["max_open_files"]),) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for key, value in limits.items():
        resource.setrlimit(key, value)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    report = int(cfg["report_fd"])
    is_root = os.geteuid() == 0
    isolation: list[str] = ["rlimits", "session"]
    sandbox_uid, sandbox_gid = (int(cfg["uid"]), int(cfg["gid"])) if is_root else (0, 0)
    files = _read_inputs(cfg["host_dir"])
    if _enter_namespaces(is_root):
        isolation += ["netns", "pidns", "mountns"] + ([] if is_root else ["userns"])
        work = _private_tmp(cfg, files, sandbox_uid, sandbox_gid)
        if is_root:
            _expose(cfg["expose"], "/tmp")
        isolation.append("private-tmp")
    else:
        work = cfg["host_dir"]
        if is_root:
            os.chown(work, sandbox_uid, sandbox_gid)
            for name in os.listdir(work):
                if not name.startswith("_"):
                    os.chown(os.path.join(work, name), sandbox_uid, sandbox_gid)
        sandbox_uid, sandbox_gid = int(cfg["uid"]), int(cfg["gid"])
    os.chdir(work)
    _set_limits(cfg)
    if is_root:
        os.setgroups([])
        os.setgid(sandbox_gid)
        os.setuid(sandbox_uid)
        isolation.append("uid-drop")
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0:
        isolation.append("no-new-privs")
    env = {str(k): str(v) for k, v in cfg["env"].items()}
    env["HOME"] = env["TMPDIR"] = work
    stdin_path = os.path.join(work, "stdin.txt")
    pid = os.fork()
    if pid == 0:
        try:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            fd = os.open(stdin_path, os.O_RDONLY) if os.path.exists(stdin_path) else os.open(
                os.devnull, os.O_RDONLY)
            os.dup2(fd, 0)
            os.closerange(3, 1 << 16)
            os.execve(cfg["python"], [cfg["python"], "-I", cfg["script"]], env)
        finally:
            os._exit(127)
    os.write(report, json.dumps({"pid": pid, "isolation": isolation}).encode() + b"\n")
    os.close(report)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
