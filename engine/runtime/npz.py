"""An .npz path in, its arrays by name out: NumPy's np.load first, and where NumPy cannot parse a member's
.npy header, the format read directly (magic, version, header literal, raw data; no pickles).

Why: on a GPU machine with numpy 2.5.2, np.load failed on an .npz written by that same numpy's np.savez
("source code cannot contain null bytes", a tokenize error from its header parser), which took a bundle's
run_bundle.py down with a traceback. Shared by the CLI's --inputs, the benchmarks and run_bundle.py (which
embeds this module's code), so all of them read what any NumPy wrote. Standard library + NumPy only.
"""

import ast
import io
import math
import zipfile

import numpy as np


def read_npy_bytes(data):
    """One .npy file's bytes -> its array (format 1.0, 2.0 or 3.0; NUL and space padding in the header
    tolerated). ValueError when the bytes are not such a file or hold Python objects."""
    if data[:6] != b"\x93NUMPY":
        raise ValueError("not an .npy file (no \\x93NUMPY magic)")
    major = data[6]
    if major not in (1, 2, 3):
        raise ValueError(f".npy format version {major}.{data[7]} is not known")
    size_bytes = 2 if major == 1 else 4
    length = int.from_bytes(data[8:8 + size_bytes], "little")
    start = 8 + size_bytes + length
    text = data[8 + size_bytes:start].decode("utf-8" if major == 3 else "latin1")
    try:
        meta = ast.literal_eval(text.replace("\x00", " ").strip())
        dtype = np.lib.format.descr_to_dtype(meta["descr"])
        shape, fortran = tuple(int(n) for n in meta["shape"]), bool(meta["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError) as err:
        raise ValueError(f"unreadable .npy header {text.strip()[:80]!r} ({err})") from None
    if dtype.hasobject:
        raise ValueError("the array holds Python objects (a pickle), which is not read")
    count = math.prod(shape)
    if len(data) - start < count * dtype.itemsize:
        raise ValueError(f"the data is {len(data) - start} B, shape {list(shape)} of {dtype} needs "
                         f"{count * dtype.itemsize} B")
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=start)
    return flat.reshape(shape, order="F" if fortran else "C").copy()


def read_npz_arrays(path):
    """{name: array} of the .npz at `path`. FileNotFoundError when it is missing; ValueError (one line,
    NumPy's complaint and the direct reading's) when neither can read it."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("a single .npy array, not an .npz archive")
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 - NumPy's header parser also raises tokenize errors
        numpy_said = _clip(str(err)) or type(err).__name__
    try:
        with zipfile.ZipFile(path) as z:
            return {name[:-4] if name.endswith(".npy") else name: read_npy_bytes(z.read(name))
                    for name in z.namelist()}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise ValueError(f"NumPy could not read it ({numpy_said}), nor could it be read directly "
                         f"({_clip(str(err))})") from None


def npz_bytes(arrays, date_time=(2020, 1, 1, 0, 0, 0)):
    """An .npz of `arrays` ({name: array}) written member by member in .npy format 1.0 with a fixed date:
    the same bytes for the same arrays, in the oldest header format every NumPy reads (on a GPU machine
    with numpy 2.5.2, an .npz that np.savez wrote into a BytesIO failed to load: "source code cannot contain
    null bytes"). Used for bundle weights, the CLI's --outputs and run_bundle.py's outputs."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
        for name, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(value), version=(1, 0), allow_pickle=False)
            z.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=date_time), member.getvalue())
    return buf.getvalue()


def _clip(text: str, limit: int = 120) -> str:
    """`text` on one line, cut at a word boundary (with an ellipsis) when longer than `limit`."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(".,;:") + " …"
