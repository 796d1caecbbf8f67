"""Atomic file and directory writes: a crash never leaves a half-written file or checkpoint behind. And the
content digests that key the toy's caches."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; give ordinary permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `path` in one rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp.chmod(0o777 & ~_UMASK)
    try:
        yield tmp
        replace_directory(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_directory(complete: Path, path: Path) -> None:
    """Put the finished directory `complete` at `path`, replacing what was there."""
    if path.exists():
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(complete, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(complete, path)


def append_jsonl(path: str | os.PathLike, record: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()


def read_jsonl(path: str | os.PathLike, on_bad_line: Callable[[int, str], None] | None = None) -> list[dict]:
    records = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if on_bad_line is None:
                raise
            on_bad_line(lineno, line)
    return records


def content_digest(*parts: str | bytes) -> str:
    """16 hex digits of a sha256 over `parts` (a cache key: settings, weights, source files)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def model_digest(model_dir: str | os.PathLike) -> str:
    """The content digest of a model directory's safetensors files and config.json: the same weights under
    another configuration (e.g. another rotary layout) are another model."""
    files = [*sorted(Path(model_dir).glob("*.safetensors")), Path(model_dir) / "config.json"]
    return content_digest(*(f.read_bytes() for f in files if f.is_file()))
