"""Job names and the advisory-lock key derived from them."""

import re

JOB_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
# Who manages a job (a GitOps tool, a Helm release): `argocd/billing`, `helm:tickgate`.
MANAGER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}$"
_JOB_NAME = re.compile(JOB_NAME_PATTERN)

_FNV64_OFFSET = 0xCBF29CE484222325
_FNV64_PRIME = 0x100000001B3
_U64 = 1 << 64


def is_valid_job_name(name: str) -> bool:
    return _JOB_NAME.fullmatch(name) is not None


def lock_key(name: str) -> int:
    """FNV-1a 64 of the UTF-8 name read as a signed int64.

    This is exactly Go's `int64(fnv.New64a().Sum64())`, so a Go replica that
    derives its key from the same job name contends for the same advisory lock.
    """
    digest = _FNV64_OFFSET
    for byte in name.encode():
        digest = ((digest ^ byte) * _FNV64_PRIME) % _U64
    return digest - _U64 if digest >= 1 << 63 else digest
