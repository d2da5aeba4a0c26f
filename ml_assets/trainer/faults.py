"""Storage faults a restart cannot fix: a full disk or quota, a read-only or forbidden store, a
missing bucket, a file over the store's size limit. torchrun restarts crashed ranks (the spec's
``max_restarts``), which helps a rank that lost a connection and resumes; against one of these it
only fails again, twice more, and buries the reason in rank tracebacks. A rank that meets one says
why once, in words, and stops the agent, so the step fails at once with that reason on its last
line. Stdlib only, like the trainer's other entry points."""

from __future__ import annotations

import errno

PERMANENT = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "the operation is not permitted",
    errno.EFBIG: "the file is larger than the store allows",
}


def permanent_fault(exc: BaseException) -> str | None:
    """The reason, in words, when ``exc`` or one of its causes is such a fault; else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError):
            what = PERMANENT.get(current.errno or 0)
            if what is None and isinstance(current, PermissionError):
                what = "permission denied"
            if what is None and isinstance(current, FileNotFoundError) and "bucket" in str(current).lower():
                what = "the bucket does not exist"
            if what is not None:
                where = f" at {current.filename}" if current.filename else ""
                return (f"a storage fault{where}: {what} ({current}); a restart cannot fix it, so torchrun does not "
                        "restart the ranks. Fix the store, then run the partition again: it resumes from the last "
                        "complete checkpoint")
        current = current.__cause__ or current.__context__
    return None
