"""Reading a kernel bundle back: zip bytes (or a path) in, its files (name -> bytes) out. Entries
that could escape a folder they were unpacked into (absolute paths, `..`, symlinks), duplicate names,
too many or too large entries (zip bombs) and files that do not match manifest.json's hashes are
refused in one line; nothing is ever extracted to disk."""

from __future__ import annotations

import hashlib
import io
import json
import stat
import zipfile
from pathlib import Path, PurePosixPath

from engine.errors import BundleError

MAX_ENTRIES = 4096
MAX_FILE_BYTES = 256 << 20  # per entry, as declared and as actually inflated
MAX_TOTAL_BYTES = 1 << 30


def read_bundle(source: bytes | str | Path, what: str = "bundle") -> dict[str, bytes]:
    """Every file of a bundle, after the safety checks and the manifest's hash check."""
    if not isinstance(source, bytes | bytearray):
        what = str(source)
        try:
            source = Path(source).read_bytes()
        except OSError as err:
            raise BundleError(f"{what}: cannot read bundle ({err.strerror})", hint="check the path") from None
    try:
        archive = zipfile.ZipFile(io.BytesIO(source))
    except (zipfile.BadZipFile, ValueError, OSError) as err:
        raise BundleError(f"{what} is not a zip archive ({err})", hint="use a bundle written by tileweave export") \
            from None
    with archive:
        infos = archive.infolist()
        _check_entries(infos, what)
        files: dict[str, bytes] = {}
        for info in infos:
            if info.is_dir():
                continue
            try:
                with archive.open(info) as f:
                    data = f.read(MAX_FILE_BYTES + 1)
            except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError) as err:
                raise BundleError(f"{what}: entry '{info.filename}' cannot be read ({err})",
                                  hint="the zip is truncated or corrupt; export the bundle again") from None
            if len(data) > MAX_FILE_BYTES:
                raise BundleError(f"{what}: entry '{info.filename}' inflates past {MAX_FILE_BYTES >> 20} MiB",
                                  hint="refused as a zip bomb; export the bundle again")
            files[info.filename] = data
    _check_manifest(files, what)
    return files


def _check_entries(infos: list[zipfile.ZipInfo], what: str) -> None:
    if len(infos) > MAX_ENTRIES:
        raise BundleError(f"{what} has {len(infos)} entries (at most {MAX_ENTRIES})", hint="not a tileweave bundle")
    seen: set[str] = set()
    total = 0
    for info in infos:
        name = info.filename
        parts = PurePosixPath(name.replace("\\", "/")).parts
        if name.startswith(("/", "\\")) or (parts and (":" in parts[0])) or ".." in parts or "\0" in name:
            raise BundleError(f"{what}: entry '{name}' points outside the bundle",
                              hint="refused for safety (zip-slip); export the bundle again")
        if stat.S_ISLNK(info.external_attr >> 16):
            raise BundleError(f"{what}: entry '{name}' is a symbolic link",
                              hint="refused for safety; bundles hold plain files only")
        if name in seen:
            raise BundleError(f"{what}: entry '{name}' appears twice", hint="export the bundle again")
        seen.add(name)
        total += info.file_size
        if info.file_size > MAX_FILE_BYTES or total > MAX_TOTAL_BYTES:
            raise BundleError(f"{what}: entry '{name}' declares {info.file_size:,} bytes, past the "
                              f"{MAX_FILE_BYTES >> 20} MiB per file / {MAX_TOTAL_BYTES >> 30} GiB limit",
                              hint="refused as a zip bomb; export the bundle again")


def _check_manifest(files: dict[str, bytes], what: str) -> dict:
    if "manifest.json" not in files:
        raise BundleError(f"{what} has no manifest.json", hint="use a bundle written by tileweave export")
    try:
        manifest = json.loads(files["manifest.json"])
        hashes = manifest["sha256"]
        if not isinstance(hashes, dict):
            raise TypeError("sha256 is not an object")
    except (ValueError, KeyError, TypeError, RecursionError) as err:
        raise BundleError(f"{what}: manifest.json is malformed ({type(err).__name__}: {err})",
                          hint="export the bundle again") from None
    for name, data in files.items():
        if name == "manifest.json":
            continue
        if name not in hashes:
            raise BundleError(f"{what}: file '{name}' is not in manifest.json", hint="export the bundle again")
        if hashlib.sha256(data).hexdigest() != hashes[name]:
            raise BundleError(f"{what}: file '{name}' does not match its manifest hash",
                              hint="the bundle was modified; export it again")
    missing = sorted(set(hashes) - set(files))
    if missing:
        raise BundleError(f"{what}: manifest.json lists '{missing[0]}', which the zip lacks",
                          hint="export the bundle again")
    return manifest


def bundle_plan_json(source: bytes | str | Path, what: str = "bundle") -> dict:
    """The plan.json of a bundle, as a dict (for load_plan)."""
    files = read_bundle(source, what)
    if "plan.json" not in files:
        raise BundleError(f"{what} has no plan.json", hint="use a bundle written by tileweave export")
    try:
        return json.loads(files["plan.json"])
    except (ValueError, RecursionError) as err:
        raise BundleError(f"{what}: plan.json is not valid JSON ({err})") from None
