"""Writing inside a run directory without following links someone else planted there.

A run directory may come from elsewhere (a copied run, a shared disk). A symbolic link
planted in it (`.lock -> ~/.bashrc`, `config.yaml.tmp -> /elsewhere`) must not make a run
write, truncate or move anything outside it. So every file rmtjax writes there is opened
with `O_NOFOLLOW` (a link is refused, not followed), a file replaced atomically is first
written to a new temporary file with an unpredictable name created with `O_EXCL`, and a
directory that is to be written is refused outright if it holds a link anywhere
(`find_links`) — rmtjax itself never makes one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import secrets
from pathlib import Path

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class UnsafePathError(OSError):
    """A path in a run directory is a link or not a regular file where one is written."""


def write_atomic(path: Path, text: str | bytes) -> None:
    """Replace `path` by `text` so that a reader (or a crash) sees the old file or the new one.
    The new text goes to a fresh temporary file beside `path` (random name, created
    exclusively, so a planted file or link of that name is never opened) and is renamed over
    `path`; a rename replaces a link at `path` itself instead of writing through it."""
    with atomic_file(path) as f:
        f.write(text if isinstance(text, bytes) else text.encode("utf-8"))


def _create_exclusive(path: Path) -> tuple[int, Path]:
    """A new file `.<name>.<random>.tmp` beside `path`: created exclusively (an existing file
    or link of that name is never opened) with the permissions a plain `open` would give."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "could not create a temporary file beside it", str(path))


def _open_regular(path: Path, flags: int, mode: int = 0o644) -> int:
    """A file descriptor of the regular file `path`, opened without following a link (and
    without blocking on a FIFO); `UnsafePathError` for a link or anything but a regular file."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK, mode)
    except OSError:
        if os.path.islink(path):  # ELOOP on Linux, EMLINK or EFTYPE on the BSDs
            raise UnsafePathError(errno.ELOOP, "is a symbolic link; rmtjax does not write through links "
                                               "(remove it)", str(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(errno.EINVAL, "is not a regular file (remove it)", str(path))
    if _NONBLOCK:
        os.set_blocking(fd, True)
    return fd


def append_text(path: Path, text: str) -> None:
    """Append `text` to the regular file `path` (created if missing), never through a link."""
    fd = _open_regular(Path(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(text)


def open_lock_file(path: Path):
    """The lock file `path` opened for reading and writing (created if missing), never
    through a link; a text file object."""
    fd = _open_regular(Path(path), os.O_RDWR | os.O_CREAT)
    return os.fdopen(fd, "r+", encoding="utf-8")


def find_links(root: Path, limit: int = 5) -> list[Path]:
    """Up to `limit` symbolic links found at or below `root` (the links themselves are not
    followed)."""
    root = Path(root)
    found: list[Path] = []
    if root.is_symlink():
        return [root]
    if not root.is_dir():
        return found
    for top, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            p = Path(top, name)
            if p.is_symlink():
                found.append(p)
                if len(found) >= limit:
                    return found
    return found


def move_within(src: Path, destination_dir: Path, name: str) -> Path:
    """Rename `src` into `destination_dir` as `name` (or `name.1`, `name.2`, ... if taken),
    refusing a destination that is a link or holds a link of that name. Both lie on one file
    system (inside one run directory), so this is a rename, never a copy."""
    destination_dir = Path(destination_dir)
    if destination_dir.is_symlink() or (destination_dir.exists() and not destination_dir.is_dir()):
        raise UnsafePathError(errno.ELOOP, "is a symbolic link or not a directory; rmtjax moves nothing "
                                           "through it (remove it)", str(destination_dir))
    destination_dir.mkdir(exist_ok=True)
    dst, n = destination_dir / name, 1
    while os.path.lexists(dst):  # a dangling link counts as taken: it is never renamed onto
        dst, n = destination_dir / f"{name}.{n}", n + 1
    os.rename(src, dst)
    return dst


@contextlib.contextmanager
def atomic_file(path: Path):
    """A binary file to write `path`'s new contents into: a fresh temporary file beside it
    (as `write_atomic`), fsynced and renamed over `path` when the block ends without an error,
    removed otherwise."""
    path = Path(path)
    fd, tmp = _create_exclusive(path)
    try:
        with os.fdopen(fd, "w+b") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_regular(path: Path, mode: str = "rb"):
    """The regular file `path` opened without following a link: "rb" to read, "w+b" to create
    or truncate it for writing and reading; `UnsafePathError` for a link or a special file."""
    flags = {"rb": os.O_RDONLY, "w+b": os.O_RDWR | os.O_CREAT | os.O_TRUNC}[mode]
    return os.fdopen(_open_regular(Path(path), flags | getattr(os, "O_CLOEXEC", 0)), mode)


def make_dir(path: Path, parents: bool = False) -> Path:
    """`path` as a directory (made if missing), refused if it is a symbolic link or something
    other than a directory: what is then written into it stays where it is named."""
    path = Path(path)
    if os.path.islink(path):
        raise UnsafePathError(errno.ELOOP, "is a symbolic link; rmtjax writes nothing through it (remove it)",
                              str(path))
    path.mkdir(parents=parents, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(errno.ENOTDIR, "is a symbolic link or not a directory (remove it)", str(path))
    return path


def remove_file(path: Path) -> None:
    """Delete `path` if it is a regular file; a link or anything else is left alone."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        os.unlink(path)
