"""System call names and numbers of this host's architecture, as runc resolves them.

runc turns a seccomp profile's names into numbers with libseccomp; asking the
same library keeps the tests honest about what the filter holds. Sandboxes run
on the host's architecture, so these numbers hold inside them too.
"""

from __future__ import annotations

import ctypes
import functools

import pytest

SCMP_ARCH_NATIVE = 0


@functools.cache
def _libseccomp() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libseccomp.so.2")
    except OSError:
        pytest.fail("libseccomp.so.2 is missing: runc needs it too; install libseccomp2")
    lib.seccomp_syscall_resolve_num_arch.restype = ctypes.c_void_p
    lib.seccomp_syscall_resolve_num_arch.argtypes = [ctypes.c_uint32, ctypes.c_int]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    return lib


@functools.cache
def table() -> dict[int, str]:
    """Every system call libseccomp knows on this architecture, by number."""
    lib, libc = _libseccomp(), ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    names = {}
    for nr in range(1024):
        if name := lib.seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, nr):
            names[nr] = ctypes.string_at(name).decode()
            libc.free(name)
    return names


def numbers(*names: str) -> dict[str, int]:
    """The numbers of ``names`` that exist on this architecture (modify_ldt is x86 only)."""
    resolve = _libseccomp().seccomp_syscall_resolve_name
    found = {name: resolve(name.encode()) for name in names}
    return {name: nr for name, nr in found.items() if nr >= 0}
