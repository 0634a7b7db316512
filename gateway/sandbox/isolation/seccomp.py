"""The gateway's seccomp profile for runc kernels: what sandboxed code may ask the host kernel.

Under runc every system call a cell makes reaches the host's kernel, and the
profile decides which may. Docker's default is written for any container, so
it lets a process ``ptrace`` its neighbours, set up io_uring rings, allocate
secret memory and enter the 32-bit system call table; a Jupyter kernel needs
none of that. (gVisor serves system calls in a kernel of its own and gets no
profile.)

It is an allowlist, and every system call the host's libseccomp knows is
decided here by purpose: ``ALLOWED`` groups what interpreters, their native
libraries and the programs they start use; ``DENIED`` says, group by group,
why the rest is refused. Refused calls answer ``EPERM``, the error a process
without privileges gets anyway and every program handles. An allowlist fails
closed: a call nobody thought about is refused, not let through. It can be
verified because it is complete: tests/security checks that each call is
decided, compares the profile with Docker's default call by call on the engine
(nothing Docker refuses is allowed here; what only this profile refuses is
listed in ``DENIED``), and runs the data stack, processes, pools and every
kernel under it. Running the test suite with this profile logging instead of
refusing (``SCMP_ACT_LOG``) showed the kernels asking for nothing outside the
allowlist but ``mbind`` (OpenBLAS) and ``pkey_alloc`` (Node.js), which Docker's
default refuses too and both do without.

Four calls are allowed only with some arguments (``RESTRICTED``):

- ``clone`` without namespace flags: threads and ``fork`` work, new namespaces
  (the first step of most container escapes) do not. ``clone3`` passes its
  flags in memory, where a filter cannot read them, so it answers ``ENOSYS``
  and the C library falls back to ``clone``. ``unshare`` and ``setns`` are
  refused outright.
- ``personality`` with the values that only change what ``uname`` reports,
  and the query; not those that turn off address randomisation or make data
  executable.
- ``socket`` and ``socketpair`` for Unix, IPv4, IPv6 and netlink (interface
  lists, the resolver) sockets: rarely used protocol families (vsock, AF_ALG,
  TIPC, RDS, ...) are where unprivileged kernel bugs keep turning up.

Beyond Docker 20.10's default this refuses ``ptrace``, ``get_robust_list``,
``process_mrelease``, io_uring, ``memfd_secret``, ``modify_ldt``, clock tuning
(``adjtimex``, ``clock_adjtime``), ``remap_file_pages``, ``fanotify_mark``, the
socket families above, and any 32-bit system call (only the native
architecture is in the filter, so one kills the process with ``SIGSYS``).
Calls newer than Docker's default (``ABSENT``), and any newer than the host's
libseccomp, answer ``ENOSYS`` (runc adds that for calls past the filter's
newest): "this kernel has no such call", so the C library falls back as on an
older kernel.
"""

from __future__ import annotations

import errno
import json
import socket
from typing import Any

ALLOWED: dict[str, tuple[str, ...]] = {
    "files and directories": (
        "access", "chdir", "chmod", "chown", "close", "close_range", "copy_file_range", "creat",
        "dup", "dup2", "dup3", "faccessat", "faccessat2", "fadvise64", "fallocate", "fchdir",
        "fchmod", "fchmodat", "fchown", "fchownat", "fcntl", "fdatasync", "flock",
        "fstat", "fstatfs", "fsync", "ftruncate", "futimesat", "getcwd", "getdents", "getdents64",
        "ioctl", "lchown", "link", "linkat", "lseek", "lstat", "mkdir", "mkdirat", "mknod",
        "mknodat", "newfstatat", "open", "openat", "openat2", "pread64", "preadv", "preadv2",
        "pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv",
        "rename", "renameat", "renameat2", "rmdir", "sendfile", "splice", "stat", "statfs",
        "statx", "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "tee", "truncate",
        "umask", "unlink", "unlinkat", "utime", "utimensat", "utimes", "vmsplice", "write",
        "writev",
    ),
    "extended attributes": (
        "fgetxattr", "flistxattr", "fremovexattr", "fsetxattr", "getxattr", "lgetxattr",
        "listxattr", "llistxattr", "lremovexattr", "lsetxattr", "removexattr", "setxattr",
    ),
    "waiting on files, events and timers": (
        "epoll_create", "epoll_create1", "epoll_ctl", "epoll_pwait", "epoll_pwait2", "epoll_wait",
        "eventfd", "eventfd2", "inotify_add_watch", "inotify_init", "inotify_init1",
        "inotify_rm_watch", "pipe", "pipe2", "poll", "ppoll", "pselect6", "select", "signalfd",
        "signalfd4", "timerfd_create", "timerfd_gettime", "timerfd_settime",
    ),
    "asynchronous I/O (libaio)": (
        "io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_setup", "io_submit",
    ),
    "memory": (
        "brk", "madvise", "membarrier", "memfd_create", "mincore", "mlock",
        "mlock2", "mlockall", "mmap", "mprotect", "mremap", "msync", "munlock", "munlockall",
        "munmap",
    ),
    "processes and threads (clone: see below)": (
        "arch_prctl", "capget", "capset", "execve", "execveat", "exit", "exit_group", "fork",
        "futex", "futex_waitv", "getcpu", "getpgid",
        "getpgrp", "getpid", "getppid", "getpriority", "getrlimit", "getrusage", "getsid",
        "gettid", "ioprio_get", "ioprio_set", "pidfd_open", "pidfd_send_signal", "prctl",
        "prlimit64", "rseq", "sched_get_priority_max", "sched_get_priority_min",
        "sched_getaffinity", "sched_getattr", "sched_getparam", "sched_getscheduler",
        "sched_rr_get_interval", "sched_setaffinity", "sched_setattr", "sched_setparam",
        "sched_setscheduler", "sched_yield", "set_robust_list", "set_tid_address", "setpgid",
        "setpriority", "setrlimit", "setsid", "vfork", "wait4", "waitid",
    ),
    # Without capabilities these can only keep or drop privileges (the kernel
    # answers EPERM otherwise); programs call them to drop, or to check.
    "user and group ids": (
        "getegid", "geteuid", "getgid", "getgroups", "getresgid", "getresuid", "getuid",
        "setfsgid", "setfsuid", "setgid", "setgroups", "setregid", "setresgid", "setresuid",
        "setreuid", "setuid",
    ),
    # Restricting oneself further is always allowed.
    "self-sandboxing": (
        "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self", "seccomp",
    ),
    "signals": (
        "alarm", "getitimer", "kill", "pause", "restart_syscall", "rt_sigaction",
        "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend",
        "rt_sigtimedwait", "rt_tgsigqueueinfo", "setitimer", "sigaltstack", "tgkill", "tkill",
    ),
    "time": (
        "clock_getres", "clock_gettime", "clock_nanosleep", "gettimeofday", "nanosleep", "time",
        "timer_create", "timer_delete", "timer_getoverrun", "timer_gettime", "timer_settime",
        "times",
    ),
    "sockets (socket and socketpair: see below)": (
        "accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt",
        "listen", "recvfrom", "recvmmsg", "recvmsg", "sendmmsg", "sendmsg", "sendto",
        "setsockopt", "shutdown",
    ),
    "inter-process communication": (
        "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedsend", "mq_unlink",
        "msgctl", "msgget", "msgrcv", "msgsnd", "semctl", "semget", "semop", "semtimedop",
        "shmat", "shmctl", "shmdt", "shmget",
    ),
    "randomness and system information": ("getrandom", "sysinfo", "uname"),
}  # fmt: skip

DENIED: dict[str, tuple[str, ...]] = {
    "namespaces and mounts: the walls of the container itself": (
        "fsconfig", "fsmount", "fsopen", "fspick", "mount", "mount_setattr", "move_mount",
        "open_tree", "pivot_root", "setns", "umount2", "unshare", "chroot",
    ),
    "reading or driving other processes (the sandbox's own included)": (
        "get_robust_list", "kcmp", "pidfd_getfd", "process_madvise", "process_mrelease",
        "process_vm_readv", "process_vm_writev", "ptrace",
    ),
    "the kernel's keyrings, shared by every container of a user id": (
        "add_key", "keyctl", "request_key",
    ),
    "large kernel interfaces with a history of privilege escalations": (
        "bpf", "io_uring_enter", "io_uring_register", "io_uring_setup", "perf_event_open",
        "userfaultfd", "memfd_secret", "fanotify_init", "fanotify_mark",
    ),
    "the host: modules, reboot, swap, accounting, quotas, logs, hostname, clock": (
        "acct", "adjtimex", "clock_adjtime", "clock_settime", "create_module", "delete_module",
        "finit_module", "init_module", "kexec_file_load", "kexec_load", "lookup_dcookie",
        "quotactl", "quotactl_fd", "reboot", "setdomainname", "sethostname", "settimeofday",
        "swapoff", "swapon", "syslog", "vhangup",
    ),
    "files by handle, which bypasses the path walk and so the mount namespace": (
        "name_to_handle_at", "open_by_handle_at",
    ),
    "NUMA memory policy: the sandbox has one node's worth of say": (
        "get_mempolicy", "mbind", "migrate_pages", "move_pages", "set_mempolicy",
        "set_mempolicy_home_node",
    ),
    "memory protection keys (Docker's default refuses them too)": (
        "pkey_alloc", "pkey_free", "pkey_mprotect",
    ),
    "hardware ports and x86 segments": ("ioperm", "iopl", "modify_ldt"),
    "obsolete, 32-bit only, or never implemented": (
        "_sysctl", "afs_syscall", "epoll_ctl_old", "epoll_wait_old", "get_kernel_syms",
        "get_thread_area", "getpmsg", "nfsservctl", "putpmsg", "query_module",
        "remap_file_pages", "security", "set_thread_area", "sysfs", "tuxcall", "uselib",
        "ustat", "vserver",
    ),
}  # fmt: skip

# Answered ENOSYS, "this kernel has no such call": the C library falls back to an
# older call the filter can judge (clone3 to clone), or the program does without.
# The rest are newer than Docker 20.10's default, which answers them the same.
ABSENT = (
    "clone3", "cachestat", "fchmodat2", "futex_requeue", "futex_wait", "futex_wake",
    "map_shadow_stack",
)  # fmt: skip
# clone's namespace flags: NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
CLONE_NAMESPACE_FLAGS = 0x7E020000
# PER_LINUX, PER_LINUX32 and UNAME26 (alone and together) change only what uname
# reports; 0xffffffff asks for the current persona.
SAFE_PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
SOCKET_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK)
# Architectures by the engine's name; none gets a 32-bit sub-architecture.
ARCHITECTURES = ("SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64")
# Decided here, with arguments; the rest of the profile is name by name.
RESTRICTED = ("clone", "personality", "socket", "socketpair")


def _allow_if_first_arg(name: str, values: tuple[int, ...], mask: int | None = None) -> list[dict]:
    """One rule per value (rules are ORed): the first argument equals it, or under ``mask`` does."""
    if mask is None:
        conditions = [{"index": 0, "value": v, "op": "SCMP_CMP_EQ"} for v in values]
    else:
        conditions = [
            {"index": 0, "value": mask, "valueTwo": v, "op": "SCMP_CMP_MASKED_EQ"} for v in values
        ]
    return [{"names": [name], "action": "SCMP_ACT_ALLOW", "args": [c]} for c in conditions]


def profile() -> dict[str, Any]:
    """The profile as Docker's seccomp JSON format reads it."""
    allowed = sorted(name for names in ALLOWED.values() for name in names)
    rules = [{"names": allowed, "action": "SCMP_ACT_ALLOW"}]
    rules += _allow_if_first_arg("clone", (0,), mask=CLONE_NAMESPACE_FLAGS)
    rules.append({"names": list(ABSENT), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS})
    rules += _allow_if_first_arg("personality", SAFE_PERSONALITIES)
    for name in ("socket", "socketpair"):
        rules += _allow_if_first_arg(name, tuple(int(f) for f in SOCKET_FAMILIES))
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": errno.EPERM,
        "archMap": [{"architecture": arch, "subArchitectures": []} for arch in ARCHITECTURES],
        "syscalls": rules,
    }


def profile_json() -> str:
    """The profile as the engine takes it in ``--security-opt seccomp=``."""
    return json.dumps(profile(), separators=(",", ":"))
