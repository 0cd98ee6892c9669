"""Writing files so that a reader, or a process killed mid-write, never sees half of one: bytes in,
a file that is either wholly the old one or wholly the new one out."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: bytes, *, durable: bool = False) -> Path:
    """Write `data` to a temp file in `path`'s folder, then rename it over `path` (a rename within one
    file system is atomic). `durable`: fsync the file before the rename and the folder after it, so the
    new content also survives a power cut, not only a killed process (the workbench's autosave; caches
    need not pay for it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return path


_KIND_NAMES = {"zip": "a zip (bundle or .npz) file", "json": "a JSON file", "onnx": "a model annotated by tileweave"}


def check_output(path: str | Path, flag: str, inputs: tuple[str | Path | None, ...] = (),
                 kind: str | None = None) -> Path:
    """Fail before any work when `path` (the value of option `flag`) cannot take an output file, or
    when writing it would destroy something the user has: a folder, a missing or non-folder parent,
    the same file as one of the command's `inputs` (the model, an inputs .npz, a saved plan), an
    existing file that is not an earlier output of this `kind` ("zip": bundles and .npz, "json", "onnx":
    a model annotated by tileweave), no
    permission. Returns the path. Raises TileweaveError (one line, exit code 2)."""
    from engine.errors import TileweaveError

    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    hint = f"choose another {flag} path"
    if p.is_dir():
        raise TileweaveError(f"{flag} '{path}' is a folder", hint="give a file name inside it")
    if not parent.is_dir():
        what = "is a file, not a folder" if parent.exists() else "does not exist"
        raise TileweaveError(f"cannot write {flag} '{path}': '{parent}' {what}",
                             hint="create the folder first" if not parent.exists() else hint)
    for given in inputs:
        if given and p.exists() and Path(given).exists() and os.path.samefile(p, given):
            raise TileweaveError(f"{flag} '{path}' is the input file '{given}': writing it would overwrite "
                                 "the input", hint=hint)
    if kind and p.is_file() and p.stat().st_size and not _is_kind(p, kind):
        raise TileweaveError(f"{flag} '{path}' exists and is not {_KIND_NAMES.get(kind, kind)}: writing would replace it",
                             hint=f"remove it first or {hint}")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise TileweaveError(f"cannot write {flag} '{path}': permission denied", hint=hint)
    return p


def _is_kind(path: Path, kind: str) -> bool:
    import zipfile

    if kind == "zip":
        return zipfile.is_zipfile(path)
    if kind == "onnx":  # only a model we annotated before (tileweave.* metadata), never another model
        import onnx

        try:
            props = onnx.load(str(path), load_external_data=False).metadata_props
        except Exception:  # noqa: BLE001 - onnx raises DecodeError, OSError, ... for a file that is not a model
            return False
        return any(p.key.startswith("tileweave.") for p in props)
    try:
        with open(path, "rb") as f:
            head = f.read(64).lstrip()
    except OSError:
        return True  # unreadable: the permission check speaks
    return head[:1] in (b"{", b"[")


def write_output(path: str | Path, data: bytes | str, flag: str) -> Path:
    """Write a command's output file whole or not at all (`write_atomic`: a failed or interrupted write
    leaves the previous file as it was); an OS error becomes one TileweaveError line naming `flag`."""
    from engine.errors import TileweaveError

    try:
        return write_atomic(path, data.encode() if isinstance(data, str) else data)
    except OSError as err:
        raise TileweaveError(f"cannot write {flag} '{path}' ({err.strerror or err})",
                             hint=f"choose another {flag} path") from None
