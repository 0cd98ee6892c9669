"""Kernel IR in, C-family source text out. One base printer walks the IR; CudaPrinter and CPrinter
(engine/codegen/targets.py) set spellings and override a few hooks.

Bodies are emitted in SSA form (one local per distinct subexpression), which is also common-subexpression
elimination for producers inlined at REGISTER; values under a pad guard are evaluated inside the guard.
"""

from __future__ import annotations

import dataclasses
import math

from engine.codegen.kexpr import Guard, InBounds, Reduce
from engine.codegen.kexpr import free_vars as _free_vars
from engine.codegen.kir import Buffer, Kernel, Phase, Program, Region, Scope, Segment
from engine.ir import expr as E
from engine.ir import index as I
from engine.ir.dtypes import DType
from engine.ir.expr import LIBM_CALLS
from engine.ir.graph import Combine


def int64_helpers(i64: str) -> dict[str, str]:
    """The helpers on 64-bit integers, spelled with the printer's 64-bit type (Printer.i64_type)."""
    return {
        "widx": f"int widx({i64} v, int n) {{ return (int)(v < 0 ? v + n : v); }}",
        "lmod": f"{i64} lmod({i64} a, {i64} b) {{ {i64} r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }}",
        "lpow": f"{i64} lpow({i64} a, {i64} b) {{ {i64} r = 1; for (; b > 0; --b) r *= a; return r; }}",
    }


HELPERS = {
    "fdiv": "int fdiv(int a, int b) { int q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }",
    "fmodi": "int fmodi(int a, int b) { int r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }",
    "imin": "int imin(int a, int b) { return a < b ? a : b; }",
    "imax": "int imax(int a, int b) { return a > b ? a : b; }",
    "iabs": "int iabs(int a) { return a < 0 ? -a : a; }",
    # bfloat16 storage as its 16 bits (C and OpenCL have no bf16 type): widening is exact (the bits
    # become fp32's top half); narrowing rounds to nearest even, as __float2bfloat16 and ml_dtypes do
    # (carry into the exponent gives inf past the largest finite value; NaN stays a quiet NaN, its sign kept).
    "bf16_f32": "float tw_bf16_f32(unsigned short b) { union { unsigned int u; float f; } v; "
                "v.u = (unsigned int)b << 16; return v.f; }",
    "f32_bf16": "unsigned short tw_f32_bf16(float f) { union { float f; unsigned int u; } v; v.f = f; "
                "const unsigned int u = v.u; return (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u) "
                ": (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }",
    "fpymod": "float fpymod(float a, float b) { float r = fmodf(a, b); return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r; }",
    # Branch-free single-precision math for the C backend (Cephes polynomials; exp/log/tanh within
    # 1.3 ulp, erf within 2e-7 absolute, pow = exp(b log|a|) with C's special cases; exp clamps its
    # argument at ln(FLT_MIN), so results below FLT_MIN read as FLT_MIN: denormal arithmetic is slow,
    # softmax masks give exp(-1e9), and a select there keeps GCC from vectorising reduction loops;
    # NaN propagates through the polynomial): unlike libm calls they inline into a loop and vectorise. Sorted by name = dependency order (c0_ before c1_).
    "c0_bits2f": "float c0_bits2f(int i) { float f; __builtin_memcpy(&f, &i, 4); return f; }",
    # a * b + c rounded once where the target has a fused multiply-add (FP_FAST_FMAF, from math.h),
    # else the plain expression: fmaf without hardware support is a slow library call.
    "c0_fmaf": "float c0_fmaf(float a, float b, float c) {\n#ifdef FP_FAST_FMAF\n    return fmaf(a, b, c);\n"
               "#else\n    return a * b + c;\n#endif\n}",
    "c0_f2bits": "int c0_f2bits(float f) { int i; __builtin_memcpy(&i, &f, 4); return i; }",
    # c0_loadnN(p, n): p[0 .. n-1] in the first n lanes of an N-float vector (C target: the direct convolutions'
    # vector types), zeros in the rest, reading nothing past p[n - 1] (a flat conv run's last pixels end the
    # tensor): AVX-512's masked load where GCC targets it, else lane by lane.
    "c0_loadn4": "c0_v4 c0_loadn4(const float* p, int n) { c0_v4 v = {0}; for (int i = 0; i < n; ++i) v[i] = p[i]; return v; }",
    "c0_loadn8": "c0_v8 c0_loadn8(const float* p, int n) { c0_v8 v = {0}; for (int i = 0; i < n; ++i) v[i] = p[i]; return v; }",
    "c0_loadn16": ("c0_v16 c0_loadn16(const float* p, int n) {\n#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)\n"
                   "    return __builtin_ia32_loadups512_mask(p, (c0_v16){0}, (unsigned short)((1u << n) - 1u));\n#else\n"
                   "    c0_v16 v = {0}; for (int i = 0; i < n; ++i) v[i] = p[i]; return v;\n#endif\n}"),
    "c0_expf": (
        "float c0_expf(float x) { const float c = x < -87.33654f ? -87.33654f : (x > 89.0f ? 89.0f : x); "
        "const float fx = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f; const int n = (int)fx; "
        "float r = c - fx * 0.693359375f; r = r - fx * -2.12194440e-4f; const float z = r * r; "
        "float y = (((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) "
        "* r + 1.6666665459e-1f) * r + 5.0000001201e-1f) * z + r + 1.0f; const int n1 = n >> 1; "
        "return y * c0_bits2f((n1 + 127) << 23) * c0_bits2f((n - n1 + 127) << 23); }"),
    "c0_logf": (
        "float c0_logf(float x) { const float sub = x < 1.17549435e-38f ? 1.0f : 0.0f; "
        "const int bits = c0_f2bits(sub != 0.0f ? x * 8388608.0f : x); "
        "float e = (float)(((bits >> 23) & 0xff) - 126) - 23.0f * sub; "
        "float m = c0_bits2f((bits & 0x807fffff) | 0x3f000000); const float lo = m < 0.707106781186547524f ? 1.0f : 0.0f; "
        "e -= lo; m = m + m * lo - 1.0f; const float z = m * m; "
        "float y = ((((((((7.0376836292e-2f * m - 1.1514610310e-1f) * m + 1.1676998740e-1f) * m - 1.2420140846e-1f) "
        "* m + 1.4249322787e-1f) * m - 1.6668057665e-1f) * m + 2.0000714765e-1f) * m - 2.4999993993e-1f) * m "
        "+ 3.3333331174e-1f) * m * z; y += -2.12194440e-4f * e; y += -0.5f * z; float r = m + y + 0.693359375f * e; "
        "r = x == 0.0f ? -__builtin_inff() : r; r = x < 0.0f ? __builtin_nanf(\"\") : r; "
        "return (x != x || x == __builtin_inff()) ? x : r; }"),
    # sin / cos: the argument reduced by pi/2 in double precision (the quotient split at 2^20 and pi/2 in
    # fdlibm's three parts, so every product is exact: accurate for |x| up to ~1e12; past 1e15, where the
    # rounding trick fails, the argument reads as 0 — bounded, not accurate), Cephes' float polynomials on
    # [-pi/4, pi/4], the quadrant chosen by selects; NaN for inf and NaN, sin(-0) = -0; `q` 1 for cos.
    "c0_sincosf": (
        "float c0_sincosf(float x, int q) { const float a = x < 0.0f ? -x : x; "
        "const double d = (double)(x * (float)(a < 1e15f)); "
        "const double j = (d * 0.63661977236758134308 + 6755399441055744.0) - 6755399441055744.0; "
        "const double jh = ((j * 9.5367431640625e-07 + 6755399441055744.0) - 6755399441055744.0) * 1048576.0; "
        "const double jl = j - jh; double t = d - jh * 1.57079632673412561417; t -= jl * 1.57079632673412561417; "
        "t -= jh * 6.07710050630396597660e-11; t -= jl * 6.07710050630396597660e-11; t -= j * 2.02226624879595063154e-21; "
        "const float r = (float)t; const int k = ((int)jl + q) & 3; const float z = r * r; "
        "const float s = r + r * z * (-1.6666654611e-1f + z * (8.3321608736e-3f + z * -1.9515295891e-4f)); "
        "const float c = 1.0f - 0.5f * z + z * z * (4.166664568298827e-2f + z * (-1.388731625493765e-3f "
        "+ z * 2.443315711809948e-5f)); const float v = (k & 1) ? c : s; const float w = (k & 2) ? -v : v; "
        "const float e = x - x; const int keep = (x == 0.0f) & (q == 0); return e != e ? e : (keep ? x : w); }"),
    "c1_tanhf": (
        "float c1_tanhf(float x) { const float a = x < 0.0f ? -x : x; const float z = x * x; "
        "const float p = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z "
        "+ 1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x; const float s = c0_expf(2.0f * a); "
        "float q = 1.0f - 2.0f / (s + 1.0f); q = x < 0.0f ? -q : q; return a < 0.625f ? p : q; }"),
    "c1_erff": (
        "float c1_erff(float x) { const float a = x < 0.0f ? -x : x; const float z = x * x; "
        "const float p = x * ((((((7.853861353153693e-5f * z - 8.010193625184903e-4f) * z + 5.188327685732524e-3f) "
        "* z - 2.685381193529856e-2f) * z + 1.128358514861418e-1f) * z - 3.761262582423300e-1f) * z "
        "+ 1.128379165726710e+0f); const float t = 1.0f / (1.0f + 0.3275911f * a); "
        "float q = 1.0f - ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t "
        "+ 0.254829592f) * t * c0_expf(-z); q = x < 0.0f ? -q : q; return a <= 1.0f ? p : q; }"),
    "c1_powf": (
        "float c1_powf(float a, float b) { const float m = a < 0.0f ? -a : a; float r = c0_expf(b * c0_logf(m)); "
        "const float bi = (b + 12582912.0f) - 12582912.0f; const float ab = b < 0.0f ? -b : b; "
        "const int isint = ab >= 8388608.0f || bi == b; const int odd = isint && ab < 8388608.0f && ((int)bi & 1); "
        "r = a < 0.0f ? (isint ? (odd ? -r : r) : __builtin_nanf(\"\")) : r; r = m == 0.0f ? (b < 0.0f ? __builtin_inff() : 0.0f) : r; r = a == 1.0f ? 1.0f : r; "
        "return b == 0.0f ? 1.0f : r; }"),
}
HELPERS.update(int64_helpers("long long"))  # C and CUDA spell int64 `long long`
_INT64_HELPERS = frozenset(int64_helpers("long"))

# Per staging type of a tensor-core GEMM: (helper the printer adds, mma function, fragment packing function).
MMA_HELPERS = {DType.F32: ("mma_m16n8k8_tf32", "tw_mma_m16n8k8_tf32", ""),
               DType.F16: ("mma_m16n8k16_f16", "tw_mma_m16n8k16_f16", "tw_pack_half2"),
               DType.BF16: ("mma_m16n8k16_bf16", "tw_mma_m16n8k16_bf16", "tw_pack_bf162")}


class Printer:
    """Spellings a target sets; hooks it may override."""

    kernel_prefix = ""
    helper_prefix = "static inline"
    table_qualifier = "static const"
    restrict = "restrict"
    global_space = ""  # address-space qualifier of a tensor parameter's pointer (OpenCL: __global)
    local_space = ""  # ... and of a pointer into a block's shared memory (OpenCL: __local)
    block_barrier = "/* block barrier */"
    grid_barrier = "/* grid barrier */"
    locals_in_kernel_scope = False
    header = ""
    f16_type = "_Float16"
    # bfloat16: the stored spelling and the functions a load (to fp32) and a store (from fp32) call, with
    # the helpers they need (HELPERS; a target's render_helper may spell them otherwise).
    bf16_type = "unsigned short"
    bf16_to_float = ("tw_bf16_f32", "bf16_f32")
    bf16_from_float = ("tw_f32_bf16", "f32_bf16")
    thread_id = "0"  # this thread's index in its block (tiled GEMM micro-tiles)
    vector_loads = False  # floatN vector loads and make_floatN (the GEMM's staging: Gemm.vec_a/vec_b)
    mma_sync = False  # warp-wide tensor-core MMA (Gemm.mma): the tw_mma_* helpers (render_helper)
    inf = "INFINITY"
    nan = "NAN"
    i64_type = "long long"  # 64-bit integers (OpenCL C: `long`; `long long` is reserved there)
    i64_suffix = "LL"  # ... and their literals' suffix
    # A global tensor's offset whose row-major sum holds k * (x // k) + x % k (a reshape splitting an axis
    # read as the axis itself: `BodyWriter.offset`) printed as the one flat affine offset, x in place of the pair
    flat_offsets = False

    def __init__(self) -> None:
        self.helpers: set[str] = set()

    # ---- types -------------------------------------------------------------------------------
    def storage_type(self, dtype: DType) -> str:
        if dtype == DType.BF16:
            return self.bf16_type
        if dtype == DType.I64:
            return self.i64_type
        return self.f16_type if dtype == DType.F16 else dtype.c_type

    def compute_type(self, dtype: DType) -> str:
        if dtype == DType.F64:
            return "double"
        return "float" if dtype.is_float else self.storage_type(dtype)

    def load_value(self, text: str, dtype: DType) -> str:
        if dtype == DType.BF16:
            return self.bf16_call(self.bf16_to_float, text)
        return f"(float){text}" if dtype == DType.F16 else text

    def store_value(self, text: str, dtype: DType) -> str:
        if dtype == DType.BF16:
            return self.bf16_call(self.bf16_from_float, text)
        return f"({self.f16_type})({text})" if dtype == DType.F16 else text

    def bf16_call(self, conversion: tuple[str, str], text: str) -> str:
        """`text` through a bf16 conversion (function, helper it needs or "")."""
        function, helper = conversion
        if helper:
            self.helpers.add(helper)
        return f"{function}({text})"

    # ---- hooks -------------------------------------------------------------------------------
    def thread_loop(self, var: str, count: str) -> str:
        raise NotImplementedError

    def reduction_pragma(self, combine: Combine, acc: str) -> str:
        """A line before the innermost loop of a serial reduction into `acc` ('' for none)."""
        return ""

    def tile_loop(self, seg: Segment) -> list[str]:
        raise NotImplementedError

    def segment_scratch(self, kernel: Kernel, seg: Segment) -> list[str]:
        """Declarations of per-tile arrays a target keeps beside the BLOCK buffers (none by default)."""
        return []

    def tile_loop_end(self, seg: Segment, last: bool) -> list[str]:
        raise NotImplementedError

    def signature(self, kernel: Kernel) -> str:
        written = {n for s in kernel.segments for p in s.phases for n in p.stores}
        args = self.leading_params(kernel)
        for b in kernel.params:
            const = "" if b.name in written else "const "
            args.append(f"{self.global_space}{const}{self.storage_type(b.dtype)}* {self.restrict} {b.name}")
        args += self.trailing_params(kernel)
        return f"{self.kernel_prefix}void {self.kernel_qualifiers(kernel)}{kernel.name}({', '.join(args)})"

    def kernel_qualifiers(self, kernel: Kernel) -> str:
        """Text between `void` and the kernel's name (CUDA: its launch bounds)."""
        return ""

    def leading_params(self, kernel: Kernel) -> list[str]:
        """Parameters before the tensors (a persistent kernel's task functions take their tile first)."""
        return []

    def trailing_params(self, kernel: Kernel) -> list[str]:
        """Parameters after the tensors (OpenCL passes a block's shared memory as one)."""
        return []

    def kernel_locals(self, kernel: Kernel) -> list[str]:
        return [self.local_decl(b) for b in kernel.locals]

    def local_decl(self, buf: Buffer) -> str:
        return f"{self.storage_type(buf.dtype)} {buf.name}[{buf.capacity}];"

    # ---- program -----------------------------------------------------------------------------
    def render_program(self, program: Program) -> str:
        bodies = [self.render_kernel(k) for k in program.kernels]
        helpers = [self.render_helper(h) for h in sorted(self.helpers)]
        return "\n".join([self.header, *helpers, "", *bodies])

    def render_units(self, program: Program, symbol: str) -> tuple[str, list[tuple[str, str]]]:
        """(prelude, [(kernel name, its unit)]): the program as render_program prints it, cut at its
        kernels, each kernel printed under the name `symbol` (its function and index tables), so a unit
        compiled alone is keyed and cached on its code, not on where it sits in the program (the C
        compile cache). prelude + the units' text under their own names is render_program's text."""
        bodies = [self.render_kernel(dataclasses.replace(k, name=symbol)) for k in program.kernels]
        helpers = [self.render_helper(h) for h in sorted(self.helpers)]
        ends = ["\n"] * (len(bodies) - 1) + [""]
        return "\n".join([self.header, *helpers, "", ""]), [(k.name, b + e) for k, b, e in
                                                            zip(program.kernels, bodies, ends)]

    def render_helper(self, name: str) -> str:
        text = int64_helpers(self.i64_type)[name] if name in _INT64_HELPERS else HELPERS[name]
        return f"{self.helper_prefix} {text}"

    def render_kernel(self, kernel: Kernel) -> str:
        kernel = kernel.stripped()
        lines = [f"// {kernel.name}: stages {', '.join(kernel.stages)}",
                 f"// onnx nodes: {', '.join(kernel.origin) or '-'}"]
        tables = [(b.name, b.region) for b in kernel.locals if b.region and b.region.table]
        tables += [(self.owned_tag(kernel, p), p.owned) for s in kernel.segments for p in s.phases
                   if p.owned is not None and p.owned.table]
        tables += [(self.phase_tag(kernel, p), p.region) for s in kernel.segments for p in s.phases
                   if p.region.table and self.phase_owner(kernel, p) is None]
        for tag, region in tables:
            rows = ", ".join("{" + ", ".join(map(str, r)) + "}" for r in region.table)
            lines.append(f"{self.table_qualifier} int tab_{kernel.name}_{tag}[{len(region.table)}]"
                         f"[{2 * region.rank}] = {{{rows}}};")
        body = ["    " + x for x in self.kernel_locals(kernel)] if self.locals_in_kernel_scope else []
        for k, seg in enumerate(kernel.segments):
            body.append(f"    // segment {k}: anchor {seg.anchor}, {seg.ntiles} tiles")
            body += ["    " + x for x in self.render_segment(kernel, seg, k == len(kernel.segments) - 1)]
        lines += self.kernel_helpers(kernel)
        lines += [self.signature(kernel) + " {", *body, "}"]
        return "\n".join(lines) + "\n"

    def kernel_helpers(self, kernel: Kernel) -> list[str]:
        """Definitions printed between a kernel's tables and its function, after its segments were
        rendered (the C target's outlined tile loops); none by default."""
        return []

    def render_segment(self, kernel: Kernel, seg: Segment, last: bool) -> list[str]:
        lines = self.tile_loop(seg)
        lines += ["    " + x for x in self.tile_coords(seg, seg.phases[-1].region)]
        mine = {n for p in seg.phases for n in p.stores}
        if not self.locals_in_kernel_scope:
            lines += ["    " + self.local_decl(b) for b in kernel.locals if b.name in mine]
        for b in kernel.locals:
            if b.name in mine:
                lines += ["    " + x for x in self.region_bounds(kernel, b.name, b.region)]
        for p in seg.phases:
            if p.owned is not None and not p.owned.flat:
                lines += ["    " + x for x in self.region_bounds(kernel, self.owned_tag(kernel, p), p.owned)]
        lines += ["    " + x for x in self.segment_scratch(kernel, seg)]
        for k, phase in enumerate(seg.phases):
            lines += ["    " + x for x in self.render_phase(kernel, phase)]
            if k < len(seg.phases) - 1:
                lines.append("    " + self.block_barrier)
        return lines + self.tile_loop_end(seg, last)

    def tile_coords(self, seg: Segment, region: Region) -> list[str]:
        """Tile coordinates tc0.. of tile t over the anchor's tile grid (row-major)."""
        out, rest = [], "t"
        for d in reversed(range(len(region.tiles))):
            out.append(f"const int tc{d} = {rest} % {region.tiles[d]};" if d else f"const int tc{d} = {rest};")
            rest = f"({rest} / {region.tiles[d]})"
        return out

    def region_bounds(self, kernel: Kernel, tag: str, region: Region) -> list[str]:
        """lo/hi of `region` for tile t as ints named {tag}_lo{d}, {tag}_hi{d}."""
        r = region.rank
        if region.table:
            # Rows are in row-major tile order; a target may walk the tiles in another (the C GEMM's
            # column tiles outermost), so the row is the tile's row-major index, not the loop counter.
            row = "tc0" if region.tiles else "0"
            for d in range(1, len(region.tiles)):
                row = f"({row}) * {region.tiles[d]} + tc{d}" if region.tiles[d] > 1 else row
            return [f"const int {tag}_lo{d} = tab_{kernel.name}_{tag}[{row}][{d}], "
                    f"{tag}_hi{d} = tab_{kernel.name}_{tag}[{row}][{r + d}];" for d in range(r)]
        out = []
        for d, span in enumerate(region.spans):
            terms = [f"{c} * tc{k}" for k, c in enumerate(span.coeffs) if c] + ([str(span.base)] if span.base else [])
            raw = " + ".join(terms) or "0"
            if span.clamp:
                self.helpers.update(("imin", "imax"))
                out.append(f"const int {tag}_lo{d} = imax({raw}, 0), "
                           f"{tag}_hi{d} = imin({raw} + {span.ext}, {region.shape[d]});")
            else:
                out.append(f"const int {tag}_lo{d} = {raw}, {tag}_hi{d} = {tag}_lo{d} + {span.ext};")
        return out

    @staticmethod
    def owned_tag(kernel: Kernel, phase: Phase) -> str:
        """Name of the bounds of the part of a phase's region its tile writes to global memory."""
        return "o_" + next(b.name for b in kernel.locals if b.tensor == phase.stage)

    def store(self, kernel: Kernel, phase: Phase, name: str, offset: str, value: str) -> str:
        """`name[offset] = value;`, guarded to the tile's own part of the region for a global buffer
        of a phase whose tiles overlap (so each element is written by one block)."""
        buf = kernel.buffer(name)
        line = f"{name}[{offset}] = {self.store_value(value, buf.dtype)};"
        if buf.scope != Scope.GLOBAL or phase.owned is None or phase.owned.flat:
            return line
        tag = self.owned_tag(kernel, phase)
        cond = " && ".join(f"i{d} >= {tag}_lo{d} && i{d} < {tag}_hi{d}" for d in range(phase.owned.rank))
        return f"if ({cond}) {line}"

    # ---- phases ------------------------------------------------------------------------------
    def render_phase(self, kernel: Kernel, phase: Phase) -> list[str]:
        if phase.gemm is not None:
            return self.render_gemm_phase(kernel, phase)
        if phase.conv is not None:
            return self.render_conv_phase(kernel, phase)
        if phase.region.flat:
            return self.render_flat_phase(kernel, phase)
        tag, lines = self.open_phase(kernel, phase, phase.stage)
        r = phase.region.rank
        sizes = [f"({tag}_hi{d} - {tag}_lo{d})" for d in range(r)]
        lines.append(f"    const int n_e = {' * '.join(sizes) or '1'};")
        lines.append("    " + self.thread_loop("e", "n_e") + " {")
        body = self.element_coords(tag, sizes)
        ssa = BodyWriter(self, kernel, self.phase_ranges(phase))
        value = self.render_value(phase, ssa)
        body += ssa.lines
        for name in phase.stores:
            idx = tuple(I.var(f"i{d}") for d in range(r))
            body.append(self.store(kernel, phase, name, ssa.offset(kernel.buffer(name), idx), value))
        lines += ["        " + x for x in body]
        lines += ["    }", "}"]
        return lines

    @staticmethod
    def phase_owner(kernel: Kernel, phase: Phase):
        """The block buffer a phase stores, whose bounds are already declared for the tile; None for a
        phase that stores global memory alone (a stage completed in chunks for global memory has its
        own region, not its block buffer's)."""
        return next((b for b in kernel.locals if b.tensor == phase.stage and b.name in phase.stores), None)

    def phase_tag(self, kernel: Kernel, phase: Phase) -> str:
        """The tag naming a phase's region bounds: its block buffer's name, else "p", declared in the
        phase's own block — "p{n}" (n: the phase's position in the kernel) where the region is a per-tile
        table, which `render_kernel` prints at file scope, one per such phase (zoo swin's h200 welder
        plan: a GEMM stored to global memory over a window reshape's clipped boxes)."""
        owner = self.phase_owner(kernel, phase)
        if owner is not None:
            return owner.name
        if not phase.region.table:
            return "p"
        phases = [q for s in kernel.segments for q in s.phases]
        n = next((n for n, q in enumerate(phases) if q is phase), None)
        return f"p{phases.index(phase) if n is None else n}"  # by equality for a phase of a copy of the kernel

    def open_phase(self, kernel: Kernel, phase: Phase, title: str) -> tuple[str, list[str]]:
        """The tag naming a phase's region bounds (`phase_tag`) and the opening lines of its block."""
        tag = self.phase_tag(kernel, phase)
        lines = [f"{{  // {title}"]
        if self.phase_owner(kernel, phase) is None:
            lines += ["    " + x for x in self.region_bounds(kernel, tag, phase.region)]
        return tag, lines

    # ---- tiled GEMM ------------------------------------------------------------------------
    def gemm_head(self, kernel: Kernel, phase: Phase) -> tuple[str, list[str]]:
        """Region bounds of a tiled phase, batch axes fixed at the tile's (one-wide) box, and the
        live row/column counts m_n, n_n."""
        g = phase.gemm
        tag, lines = self.open_phase(kernel, phase, f"{phase.stage}: {g.describe()}")
        r = phase.region.rank
        first = r - 1 - g.rows
        lines += [f"    const int i{d} = {tag}_lo{d};" for d in range(first)]
        if g.rows == 1:
            lines.append(f"    const int m_lo = {tag}_lo{r - 2}, m_n = {tag}_hi{r - 2} - m_lo;")
        else:  # rows over several axes: live counts per axis, flattened row-major
            lines += [f"    const int m_lo{d} = {tag}_lo{d}, m_n{d} = {tag}_hi{d} - m_lo{d};" for d in range(first, r - 1)]
            lines.append(f"    const int m_n = {' * '.join(f'm_n{d}' for d in range(first, r - 1))};")
        lines.append(f"    const int n_lo = {tag}_lo{r - 1}, n_n = {tag}_hi{r - 1} - n_lo;")
        return tag, lines

    @staticmethod
    def gemm_rows(phase: Phase, mm: str) -> str:
        """The declaration of the row axes' variables at flat row `mm` of a tiled phase (gemm_head)."""
        g, r = phase.gemm, phase.region.rank
        if g.rows == 1:  # `mm` may be an expression (`mm < m_n ? mm : 0`): parenthesised, it stays one term
            return f"const int i{r - 2} = m_lo + {mm if mm.isidentifier() else f'({mm})'};"
        parts, rest = [], f"({mm})"
        for d in reversed(range(r - 1 - g.rows, r - 1)):
            parts.append(f"i{d} = m_lo{d} + {rest} % m_n{d}")
            rest = f"{rest} / m_n{d}"
        return "const int " + ", ".join(reversed(parts)) + ";"

    @staticmethod
    def phase_ranges(phase: Phase, shape: tuple[int, ...] | None = None) -> dict:
        """Inclusive ranges of the phase's loop variables (output axes over `shape`, reduce axes)."""
        ranges = {f"i{k}": (0, n - 1) for k, n in enumerate(phase.region.shape if shape is None else shape)}
        ranges.update({f"r{k}": (0, n - 1) for k, n in enumerate(phase.reduce)})
        return ranges

    @staticmethod
    def element_coords(tag: str, sizes: list[str]) -> list[str]:
        """Lines turning the flat element index `e` of a region box into coordinates i0.. (row-major)."""
        lines = ["int rem = e;"]
        for d in reversed(range(len(sizes))):
            if d:
                lines.append(f"const int i{d} = {tag}_lo{d} + rem % {sizes[d]}; rem /= {sizes[d]};")
            else:
                lines.append(f"const int i{d} = {tag}_lo{d} + rem;")
        return lines

    def gemm_ranges(self, phase: Phase) -> dict:
        ranges = self.phase_ranges(phase)
        ranges.update({v: (0, n - 1) for v, n in zip(phase.gemm.vars, phase.gemm.extents)})
        return ranges

    def gemm_k_vars(self, phase: Phase, flat: str) -> list[str]:
        """The reduction variables of flat k index `flat` (row-major over the reduction extents)."""
        g = phase.gemm
        out, inner = [], 1
        for v, n in reversed(list(zip(g.vars, g.extents))):
            text = flat if inner == 1 else f"({flat} / {inner})"
            out.append(f"const int {v} = {text};" if inner * n == g.k else f"const int {v} = {text} % {n};")
            inner *= n
        return out[::-1]

    def gemm_operand(self, kernel: Kernel, phase: Phase, which: str) -> tuple[list[str], list[str], str]:
        """(lines once per staged row, lines per staged element, value) of factor a or b; the first are
        the factor's inlined reductions that do not depend on k (only factor a has any) and, where the C
        target asks (Gemm.a_row_picks), the pointers of its k-invariant picks (`invariant_picks`)."""
        g = phase.gemm
        expr = g.a if which == "a" else g.b
        outer = BodyWriter(self, kernel, self.gemm_ranges(phase))
        for node in _invariant_reductions(expr, set(g.vars)):
            outer.value(node)
        if which == "a" and g.a_row_picks:
            for node in invariant_picks(kernel, expr, set(g.vars)):
                outer.pick_pointer(node)
        inner = BodyWriter(self, kernel, self.gemm_ranges(phase), outer.counter)
        inner.memo = dict(outer.memo)
        inner.pointers = dict(outer.pointers)
        value = inner.value(expr)
        return outer.lines, inner.lines, value

    def gemm_epilogue(self, kernel: Kernel, phase: Phase, acc: str) -> list[str]:
        """The phase body at (i_m, i_n) with the contraction replaced by the accumulator; the stores
        (also the direct convolution's epilogue)."""
        return self.epilogue_lines(kernel, phase, acc)[0]

    def epilogue_lines(self, kernel: Kernel, phase: Phase, acc: str) -> tuple[list[str], int]:
        """gemm_epilogue's lines and the loops among them (inlined reductions of the epilogue)."""
        g = phase.gemm or phase.conv
        r = phase.region.rank
        ranges = {f"i{k}": (0, n - 1) for k, n in enumerate(phase.region.shape)}
        ssa = BodyWriter(self, kernel, ranges)
        lines = [f"const float accv = {acc};"]
        if g.target is None:
            value = "accv"
        else:
            ssa.memo[g.target] = "accv"
            value = ssa.value(phase.body)
        lines += ssa.lines
        for name in phase.stores:
            idx = tuple(I.var(f"i{d}") for d in range(r))
            lines.append(self.store(kernel, phase, name, ssa.offset(kernel.buffer(name), idx), value))
        return lines, ssa.loops

    def render_gemm_phase(self, kernel: Kernel, phase: Phase) -> list[str]:
        """Threads stage A (rows x bk) and B (bk x cols) tiles cooperatively, barrier, each thread
        accumulates its tm x tn micro-tile from the staged tiles in registers, barrier; after the k loop
        each thread runs the epilogue for its micro-tile's elements. Double-buffered (`gemm.buffers` 2):
        the first k tile is staged before the loop; in each step the next tile goes into the other
        buffer while this one is consumed, and one barrier ends the step (it orders this step's reads of
        the current buffer before the next step's writes to it, and this step's staging before the
        next step's reads)."""
        g = phase.gemm
        st_a, st_b = self.staging_names(g.stage_dtype)
        lines = self.gemm_prologue(kernel, phase)
        if g.buffers == 1:
            lines.append(f"    for (int k0 = 0; k0 < {g.k}; k0 += {g.bk}) {{")
            lines += ["        " + x for x in self.gemm_stage(kernel, phase, st_a, st_b)]
            lines.append(f"        {self.block_barrier}")
            lines += ["        " + x for x in self.gemm_accumulate(phase, st_a, st_b)]
            lines += [f"        {self.block_barrier}", "    }"]
            return lines + self.gemm_store(kernel, phase)
        steps, sp, st = -(-g.k // g.bk), self.local_space, self.storage_type(g.stage_dtype)
        lines += ["    {  // the first k tile into buffer 0", "        const int k0 = 0;"]
        lines += ["        " + x for x in self.gemm_stage(kernel, phase, st_a, st_b)]
        lines += ["    }", f"    {self.block_barrier}",
                  f"    for (int ks = 0; ks < {steps}; ++ks) {{",
                  f"        if (ks + 1 < {steps}) {{  // the next k tile into the other buffer",
                  f"            const int k0 = (ks + 1) * {g.bk};",
                  f"            {sp}{st}* sa = {st_a} + ((ks + 1) & 1) * {g.a_elems};",
                  f"            {sp}{st}* sb = {st_b} + ((ks + 1) & 1) * {g.b_elems};"]
        lines += ["            " + x for x in self.gemm_stage(kernel, phase, "sa", "sb")]
        lines += ["        }",
                  f"        {sp}{st}* ca = {st_a} + (ks & 1) * {g.a_elems};",
                  f"        {sp}{st}* cb = {st_b} + (ks & 1) * {g.b_elems};"]
        lines += ["        " + x for x in self.gemm_accumulate(phase, "ca", "cb")]
        lines += [f"        {self.block_barrier}", "    }"]
        return lines + self.gemm_store(kernel, phase)

    def gemm_prologue(self, kernel: Kernel, phase: Phase) -> list[str]:
        """A tiled phase's head, thread coordinates in the micro-tile grid and zeroed accumulators."""
        g = phase.gemm
        _, lines = self.gemm_head(kernel, phase)
        if g.mma and self.mma_sync:
            return lines + self.mma_prologue(g)
        return lines + [f"    const int g_tx = {self.thread_id} % {g.tx}, g_ty = {self.thread_id} / {g.tx};",
                        # A thread whose micro-tile lies wholly past the tile's rows or columns only stages.
                        f"    const bool live = g_ty < {g.ty} && g_ty * {g.tm} < m_n && g_tx * {g.tn} < n_n;",
                        f"    float acc[{g.tm * g.tn}];",
                        f"    for (int q = 0; q < {g.tm * g.tn}; ++q) acc[q] = 0.0f;"]

    def gemm_stage(self, kernel: Kernel, phase: Phase, sa: str, sb: str) -> list[str]:
        """The block's threads stage the k tile starting at `k0` of factor a into `sa` (pm rows x bk)
        and of factor b into `sb` (bk x pn), zero past the tile's live rows, columns and k (as the kernel's
        staging type: fp16 staging of fp16 loads converts back exactly)."""
        g = phase.gemm
        val = self.store_value("val", g.stage_dtype)
        r = phase.region.rank
        n = f"i{r - 1}"
        pm, pn = g.ty * g.tm, g.tx * g.tn
        a_pre, a_lines, a_val = self.gemm_operand(kernel, phase, "a")
        _, b_lines, b_val = self.gemm_operand(kernel, phase, "b")
        wa, wb = (g.vec_a, g.vec_b) if self.vector_loads else (1, 1)
        lines = []
        if wa > 1:
            lines += self.gemm_stage_vector(kernel, phase, "a", sa, wa, a_lines, a_val)
        elif a_pre:  # a thread per row: the row's k-invariant reductions once, then its bk elements
            lines += [self.thread_loop("mm", str(pm)) + " {",
                      "    " + self.gemm_rows(phase, "mm < m_n ? mm : 0")]
            lines += ["    " + x for x in a_pre]
            lines += [f"    for (int kk = 0; kk < {g.bk}; ++kk) {{",
                      "        const int kf = k0 + kk;",
                      "        float val = 0.0f;",
                      f"        if (mm < m_n && kf < {g.k}) {{"]
            lines += ["            " + x for x in self.gemm_k_vars(phase, "kf") + a_lines + [f"val = {a_val};"]]
            lines += ["        }", f"        {sa}[mm * {g.bk} + kk] = {val};", "    }", "}"]
        else:
            lines += [self.thread_loop("e", str(pm * g.bk)) + " {",
                      f"    const int mm = e / {g.bk}, kf = k0 + e % {g.bk};",
                      "    float val = 0.0f;",
                      f"    if (mm < m_n && kf < {g.k}) {{",
                      "        " + self.gemm_rows(phase, "mm")]
            lines += ["        " + x for x in self.gemm_k_vars(phase, "kf") + a_lines + [f"val = {a_val};"]]
            lines += ["    }", f"    {sa}[e] = {val};", "}"]
        if wb > 1:
            return lines + self.gemm_stage_vector(kernel, phase, "b", sb, wb, b_lines, b_val)
        lines += [self.thread_loop("e", str(g.bk * pn)) + " {",
                  f"    const int nn = e % {pn}, kf = k0 + e / {pn};",
                  "    float val = 0.0f;",
                  f"    if (nn < n_n && kf < {g.k}) {{",
                  f"        const int {n} = n_lo + nn;"]
        lines += ["        " + x for x in self.gemm_k_vars(phase, "kf") + b_lines + [f"val = {b_val};"]]
        return lines + ["    }", f"    {sb}[e] = {val};", "}"]

    def gemm_stage_vector(self, kernel: Kernel, phase: Phase, which: str, dst: str, w: int,
                          scalar_lines: list[str], scalar_val: str) -> list[str]:
        """Staging of factor `which` (a plain global load, contiguous along a's k / b's columns and
        aligned: `micro.vector_width`) `w` elements per thread and load: one vector load where all `w`
        are inside the tile and k, else each element alone under its guard; one vector store to the
        staging buffer."""
        g = phase.gemm
        r = phase.region.rank
        pm, pn = g.ty * g.tm, g.tx * g.tn
        vt = f"float{w}"
        load = g.a if which == "a" else g.b
        buf = kernel.buffer(load.tensor)
        at = BodyWriter(self, kernel, self.gemm_ranges(phase)).offset(buf, load.index)
        parts = "xyzw"[:w]
        vector = [f"const {vt} v4 = ((const {self.global_space}{vt}*)({buf.name} + {at}))[0];",
                  " ".join(f"q[{j}] = v4.{c};" for j, c in enumerate(parts))]
        zero = ", ".join(["0.0f"] * w)
        store = f"(({self.local_space}{vt}*){dst})[e] = make_{vt}({', '.join(f'q[{j}]' for j in range(w))});"
        if which == "a":
            lines = [self.thread_loop("e", str(pm * g.bk // w)) + " {",
                     f"    const int mm = e / {g.bk // w}, kf = k0 + e % {g.bk // w} * {w};",
                     f"    float q[{w}] = {{{zero}}};",
                     "    if (mm < m_n) {",
                     "        " + self.gemm_rows(phase, "mm"),
                     f"        if (kf + {w - 1} < {g.k}) {{"]
            lines += ["            " + x for x in self.gemm_k_vars(phase, "kf") + vector]
            lines += ["        } else {",
                      f"            for (int j = 0; j < {w}; ++j) {{",
                      "                const int kj = kf + j;",
                      f"                if (kj < {g.k}) {{"]
            lines += ["                    " + x for x in self.gemm_k_vars(phase, "kj") + scalar_lines
                      + [f"q[j] = {scalar_val};"]]
            return lines + ["                }", "            }", "        }", "    }", "    " + store, "}"]
        n = f"i{r - 1}"
        lines = [self.thread_loop("e", str(g.bk * pn // w)) + " {",
                 f"    const int nn = e % {pn // w} * {w}, kf = k0 + e / {pn // w};",
                 f"    float q[{w}] = {{{zero}}};",
                 f"    if (kf < {g.k}) {{"]
        lines += ["        " + x for x in self.gemm_k_vars(phase, "kf")]
        lines += [f"        if (nn + {w - 1} < n_n) {{", f"            const int {n} = n_lo + nn;"]
        lines += ["            " + x for x in vector]
        lines += ["        } else {",
                  f"            for (int j = 0; j < {w}; ++j) {{",
                  "                if (nn + j < n_n) {",
                  f"                    const int {n} = n_lo + nn + j;"]
        lines += ["                    " + x for x in scalar_lines + [f"q[j] = {scalar_val};"]]
        return lines + ["                }", "            }", "        }", "    }", "    " + store, "}"]

    def gemm_accumulate(self, phase: Phase, sa: str, sb: str) -> list[str]:
        """Each live thread's tm x tn micro-tile over the k tile staged in `sa`, `sb`."""
        g = phase.gemm
        pn = g.tx * g.tn
        if g.mma and self.mma_sync:
            return self.mma_accumulate(g, sa, sb)
        # A printer without mma.sync runs a Gemm.mma's 16-bit staging (fp16 / bf16) on this loop: widened here.
        ra = self.load_value(f"{sa}[(g_ty * {g.tm} + x) * {g.bk} + kk]", g.stage_dtype)
        rb = self.load_value(f"{sb}[kk * {pn} + g_tx * {g.tn} + y]", g.stage_dtype)
        return [f"for (int kk = 0; kk < (live ? {g.bk} : 0); ++kk) {{",
                f"    float ra[{g.tm}], rb[{g.tn}];",
                f"    for (int x = 0; x < {g.tm}; ++x) ra[x] = {ra};",
                f"    for (int y = 0; y < {g.tn}; ++y) rb[y] = {rb};",
                f"    for (int x = 0; x < {g.tm}; ++x)",
                f"        for (int y = 0; y < {g.tn}; ++y) acc[x * {g.tn} + y] += ra[x] * rb[y];",
                "}"]

    def gemm_store(self, kernel: Kernel, phase: Phase) -> list[str]:
        """After the k loop: the epilogue of each live element of the thread's micro-tile; closes the phase."""
        g = phase.gemm
        n = f"i{phase.region.rank - 1}"
        if g.mma and self.mma_sync:
            return self.mma_store(kernel, phase)
        lines = [f"    for (int x = 0; x < {g.tm}; ++x) {{",
                 f"        for (int y = 0; y < {g.tn}; ++y) {{",
                 f"            const int mm = g_ty * {g.tm} + x, nn = g_tx * {g.tn} + y;",
                 "            if (mm < m_n && nn < n_n) {",
                 "                " + self.gemm_rows(phase, "mm"), f"                const int {n} = n_lo + nn;"]
        lines += ["                " + x for x in self.gemm_epilogue(kernel, phase, f"acc[x * {g.tn} + y]")]
        return lines + ["            }", "        }", "    }", "}"]

    @staticmethod
    def staging_names(dtype: DType) -> tuple[str, str]:
        """The kernel's views of its staging tiles A and B in `dtype` (fp32: st_a / st_b; fp16, the
        m16n8k16 .f16 path: st_ha / st_hb over the same bytes; bf16, the .bf16 path: st_ba / st_bb)."""
        return {DType.F16: ("st_ha", "st_hb"), DType.BF16: ("st_ba", "st_bb")}.get(dtype, ("st_a", "st_b"))

    # ---- tiled GEMM on tensor cores (Gemm.mma, engine/codegen/mma.py) ---------------------------
    # Fragment layouts of mma.m16n8k8 with .tf32 operands (PTX ISA, "Matrix Fragments for mma.m16n8k8"),
    # lane = 4 * grp + tig: a0 (grp, tig), a1 (grp + 8, tig), a2 (grp, tig + 4), a3 (grp + 8, tig + 4) of
    # the 16x8 A tile (row, k); b0 (tig, grp), b1 (tig + 4, grp) of the 8x8 B tile (k, col); c0..c3 at
    # (grp + 8 * (i >> 1), 2 * tig + (i & 1)) of the 16x8 accumulator tile.
    # mma.m16n8k16 with .f16 operands (PTX ISA 9.7.14.5.8, "Matrix Fragments for mma.m16n8k16 with floating
    # point type"): four .f16x2 registers of A, elements a0..a7 at row grp for a0, a1, a4, a5 and grp + 8
    # for the others, k = 2 * tig + (i & 1) (+ 8 for i >= 4); two .f16x2 of B, b0..b3 at k = 2 * tig +
    # (i & 1) (+ 8 for i >= 2), column grp; the lower-numbered element in the low 16 bits. The same
    # accumulator layout as m16n8k8. Cross-checked against an independent public kernel (a codebook-
    # quantised matmul's glq_matmul_tc_kernel, which packs A as (grp, 2 tig), (grp + 8, 2 tig), (grp,
    # 2 tig + 8), (grp + 8, 2 tig + 8) with __halves2half2(lo, hi) and B as k 2 tig and 2 tig + 8 at
    # column grp); cuda-sim's warp collective (tw_simt.h) reads the fragments by the same table.
    def mma_prologue(self, g) -> list[str]:
        """Warp coordinates on the warps_m x warps_n grid, lane group / thread-in-group, zeroed fragments
        (tm*tn floats per thread: the warp's mma tiles, four accumulators each)."""
        self.helpers.add(MMA_HELPERS[g.stage_dtype][0])
        t = self.thread_id
        return [f"    const int g_warp = {t} / 32, g_grp = ({t} % 32) >> 2, g_tig = {t} & 3;",
                f"    const int g_wm = g_warp / {g.warps_n}, g_wn = g_warp % {g.warps_n};",
                # Warps past the micro-tile threads, or whose tiles lie wholly past the live rows or columns,
                # only stage (a warp-uniform test: mma.sync needs all 32 lanes).
                f"    const bool live = g_warp < {g.warps_m * g.warps_n} && g_wm * {g.mma_tiles[0] * 16} < m_n "
                f"&& g_wn * {g.mma_tiles[1] * 8} < n_n;",
                f"    float acc[{g.tm * g.tn}];",
                f"    for (int q = 0; q < {g.tm * g.tn}; ++q) acc[q] = 0.0f;"]

    def mma_accumulate(self, g, sa: str, sb: str) -> list[str]:
        """Each live warp's mma tiles over the k tile staged in `sa` (rows x bk) and `sb` (bk x cols):
        per k8 step, the A fragments of its row tiles and the B fragments of its column tiles from shared
        memory, then one mma.sync per (row tile, column tile)."""
        fm, fn = g.mma_tiles
        pn, bk = g.tx * g.tn, g.bk
        if g.stage_dtype in (DType.F16, DType.BF16):
            return self.mma_accumulate_f16(g, sa, sb)
        return [f"for (int kk = 0; kk < (live ? {bk} : 0); kk += 8) {{",
                f"    float fa[{fm}][4], fb[{fn}][2];",
                f"    for (int i = 0; i < {fm}; ++i) {{",
                f"        const int r0 = (g_wm * {fm} + i) * 16 + g_grp;",
                f"        fa[i][0] = {sa}[r0 * {bk} + kk + g_tig]; fa[i][1] = {sa}[(r0 + 8) * {bk} + kk + g_tig];",
                f"        fa[i][2] = {sa}[r0 * {bk} + kk + g_tig + 4]; fa[i][3] = {sa}[(r0 + 8) * {bk} + kk + g_tig + 4];",
                "    }",
                f"    for (int j = 0; j < {fn}; ++j) {{",
                f"        const int c0 = (g_wn * {fn} + j) * 8 + g_grp;",
                f"        fb[j][0] = {sb}[(kk + g_tig) * {pn} + c0]; fb[j][1] = {sb}[(kk + g_tig + 4) * {pn} + c0];",
                "    }",
                f"    for (int i = 0; i < {fm}; ++i)",
                f"        for (int j = 0; j < {fn}; ++j) {{",
                f"            const int q = (i * {fn} + j) * 4;",
                "            tw_mma_m16n8k8_tf32(acc[q], acc[q + 1], acc[q + 2], acc[q + 3], "
                "fa[i][0], fa[i][1], fa[i][2], fa[i][3], fb[j][0], fb[j][1]);",
                "        }",
                "}"]

    def mma_accumulate_f16(self, g, sa: str, sb: str) -> list[str]:
        """m16n8k16 .f16 / .bf16: per k16 step, each live warp packs the two-element fragments of its row
        tiles (A, four registers) and column tiles (B, two) from the 16-bit staging tiles, then one
        mma.sync per pair. bf16 operands take the same fragment layout as fp16 (PTX ISA 9.7.14.5.8 covers
        both: .f16x2 / .bf16x2 registers, the same element positions)."""
        fm, fn = g.mma_tiles
        pn, bk = g.tx * g.tn, g.bk
        mma, pack = MMA_HELPERS[g.stage_dtype][1:]

        def a(row: str, k: str) -> str:
            return f"{pack}({sa}[{row} * {bk} + {k}], {sa}[{row} * {bk} + {k} + 1])"

        def b(k: str, col: str) -> str:
            return f"{pack}({sb}[{k} * {pn} + {col}], {sb}[({k} + 1) * {pn} + {col}])"

        return [f"for (int kk = 0; kk < (live ? {bk} : 0); kk += 16) {{",
                f"    unsigned fa[{fm}][4], fb[{fn}][2];",
                "    const int kr = kk + 2 * g_tig;",
                f"    for (int i = 0; i < {fm}; ++i) {{",
                f"        const int r0 = (g_wm * {fm} + i) * 16 + g_grp;",
                f"        fa[i][0] = {a('r0', 'kr')}; fa[i][1] = {a('(r0 + 8)', 'kr')};",
                f"        fa[i][2] = {a('r0', '(kr + 8)')}; fa[i][3] = {a('(r0 + 8)', '(kr + 8)')};",
                "    }",
                f"    for (int j = 0; j < {fn}; ++j) {{",
                f"        const int c0 = (g_wn * {fn} + j) * 8 + g_grp;",
                f"        fb[j][0] = {b('kr', 'c0')}; fb[j][1] = {b('(kr + 8)', 'c0')};",
                "    }",
                f"    for (int i = 0; i < {fm}; ++i)",
                f"        for (int j = 0; j < {fn}; ++j) {{",
                f"            const int q = (i * {fn} + j) * 4;",
                f"            {mma}(acc[q], acc[q + 1], acc[q + 2], acc[q + 3], "
                "fa[i][0], fa[i][1], fa[i][2], fa[i][3], fb[j][0], fb[j][1]);",
                "        }",
                "}"]

    def mma_store(self, kernel: Kernel, phase: Phase) -> list[str]:
        """After the k loop: the epilogue of each live element of the warp's accumulator fragments."""
        g = phase.gemm
        fm, fn = g.mma_tiles
        n = f"i{phase.region.rank - 1}"
        lines = [f"    for (int q = 0; q < (live ? {g.tm * g.tn} : 0); ++q) {{",
                 "        const int f = q >> 2, c = q & 3;",
                 f"        const int mm = (g_wm * {fm} + f / {fn}) * 16 + g_grp + (c >> 1) * 8;",
                 f"        const int nn = (g_wn * {fn} + f % {fn}) * 8 + g_tig * 2 + (c & 1);",
                 "        if (mm < m_n && nn < n_n) {",
                 "            " + self.gemm_rows(phase, "mm"), f"            const int {n} = n_lo + nn;"]
        lines += ["            " + x for x in self.gemm_epilogue(kernel, phase, "acc[q]")]
        return lines + ["        }", "    }", "}"]

    # ---- direct convolution ----------------------------------------------------------------
    def conv_head(self, kernel: Kernel, phase: Phase) -> list[str]:
        """Region bounds of a convolution phase: the batch index, the first and live count of the
        block's channels (c_lo, c_n), output rows and columns, and the live window rows/columns."""
        c = phase.conv
        tag, lines = self.open_phase(kernel, phase, f"{phase.stage}: {c.describe()}")
        (sh, sw), (kh, kw), (dh, dw) = c.strides, c.taps, c.dilations
        return lines + [
            f"    const int i0 = {tag}_lo0;",
            f"    const int c_lo = {tag}_lo1, c_n = {tag}_hi1 - c_lo;",
            f"    const int oh_lo = {tag}_lo2, oh_n = {tag}_hi2 - oh_lo;",
            f"    const int ow_lo = {tag}_lo3, ow_n = {tag}_hi3 - ow_lo;",
            f"    const int wh_n = (oh_n - 1) * {sh} + {(kh - 1) * dh + 1}, ww_n = (ow_n - 1) * {sw} + {(kw - 1) * dw + 1};"]

    def conv_ranges(self, phase: Phase) -> dict:
        c = phase.conv
        ranges = self.phase_ranges(phase)
        ranges.update({v: (0, n - 1) for v, n in zip(c.chan_vars, c.chan_extents)})
        ranges.update({v: (0, n - 1) for v, n in zip(c.tap_vars, c.taps) if v})
        for v, size, s, k, d in zip(c.window_vars, phase.region.shape[2:], c.strides, c.taps, c.dilations):
            ranges[v] = (0, s * (size - 1) + d * (k - 1))
        return ranges

    def conv_operand(self, kernel: Kernel, phase: Phase, which: str, ranges: dict | None = None) -> tuple[list[str], str]:
        """(lines, value) of the input factor (at window position cwh, cww) or the weight factor;
        `ranges` narrows the variables (the window's interior, where pad checks drop out)."""
        ssa = BodyWriter(self, kernel, self.conv_ranges(phase) | (ranges or {}))
        value = ssa.value(phase.conv.x if which == "x" else phase.conv.w)
        return ssa.lines, value

    def conv_window_coords(self, phase: Phase) -> list[str]:
        """Window variables of staged row hh, column ww (the factor's index offsets stay in its loads)."""
        c = phase.conv
        (h, w), (sh, sw) = c.window_vars, c.strides
        return [f"const int {h} = oh_lo * {sh} + hh, {w} = ow_lo * {sw} + ww;"]

    def conv_chan_vars(self, phase: Phase, flat: str) -> list[str]:
        c = phase.conv
        return unflatten(c.chan_vars, c.chan_extents, flat)

    def conv_tap_vars(self, phase: Phase) -> list[str]:
        c = phase.conv
        return [f"const int {v} = {k};" for v, k in zip(c.tap_vars, ("kh", "kw")) if v]

    def render_conv_phase(self, kernel: Kernel, phase: Phase) -> list[str]:
        """Per step of bc input channels (one step of the block's own channels when depthwise) the
        threads stage the input window, halo and zero padding included, and their channels' weights,
        barrier, then each thread accumulates its tm channels x tn pixels (pixels strided by tx, so
        neighbouring threads read neighbouring window columns) in registers, barrier; the epilogue
        runs per element after the last step."""
        c = phase.conv
        (kh, kw), (dh, dw) = c.taps, c.dilations
        wh, ww = c.window
        kk, plane = kh * kw, wh * ww
        lines = self.conv_head(kernel, phase)
        x_lines, x_val = self.conv_operand(kernel, phase, "x")
        w_lines, w_val = self.conv_operand(kernel, phase, "w")
        lines += [f"    const int g_tx = {self.thread_id} % {c.tx}, g_ty = {self.thread_id} / {c.tx};",
                  # A thread whose channels or pixels lie wholly past the tile's only stages.
                  f"    const bool live = g_ty < {c.ty} && g_ty * {c.tm} < c_n && g_tx < oh_n * ow_n;",
                  f"    float acc[{c.tm * c.tn}];",
                  f"    int pix[{c.tn}];",
                  f"    for (int q = 0; q < {c.tm * c.tn}; ++q) acc[q] = 0.0f;",
                  f"    for (int y = 0; y < {c.tn}; ++y) {{",
                  f"        const int q = g_tx + y * {c.tx};",
                  f"        pix[y] = q < oh_n * ow_n ? (q / ow_n) * {c.strides[0] * ww} + (q % ow_n) * {c.strides[1]} : 0;",
                  "    }"]
        dense = not c.depthwise
        step = c.bc if dense else 1
        total = c.channels if dense else 1
        lines += [f"    for (int c0 = 0; c0 < {total}; c0 += {step}) {{",
                  "        " + self.thread_loop("e", str(c.b_elems)) + " {",
                  f"            const int cl = e / {plane}, hh = (e / {ww}) % {wh}, ww = e % {ww};",
                  "            float val = 0.0f;",
                  (f"            if (c0 + cl < {total} && hh < wh_n && ww < ww_n) {{" if dense else
                   "            if (cl < c_n && hh < wh_n && ww < ww_n) {")]
        inner = (self.conv_chan_vars(phase, "c0 + cl") if dense else ["const int i1 = c_lo + cl;"])
        inner += self.conv_window_coords(phase) + x_lines + [f"val = {x_val};"]
        lines += ["                " + x for x in inner]
        lines += ["            }", "            st_b[e] = val;", "        }",
                  "        " + self.thread_loop("e", str(c.a_elems)) + " {",
                  f"            const int col = e / {kk * step}, cl = (e / {kk}) % {step}, kh = (e % {kk}) / {kw}, "
                  f"kw = e % {kw};",
                  "            float val = 0.0f;",
                  f"            if (col < c_n && c0 + cl < {total}) {{",
                  "                const int i1 = c_lo + col;"]
        inner = (self.conv_chan_vars(phase, "c0 + cl") if dense else []) + self.conv_tap_vars(phase)
        lines += ["                " + x for x in inner + w_lines + [f"val = {w_val};"]]
        lines += ["            }", "            st_a[e] = val;", "        }",
                  f"        {self.block_barrier}",
                  f"        for (int cl = 0; cl < (live ? {step} : 0); ++cl)",
                  f"        for (int kh = 0; kh < {kh}; ++kh)",
                  f"        for (int kw = 0; kw < {kw}; ++kw) {{",
                  f"            float rw[{c.tm}];",
                  f"            for (int x = 0; x < {c.tm}; ++x) rw[x] = st_a[((g_ty * {c.tm} + x) * {step} + cl) * {kk} "
                  f"+ kh * {kw} + kw];"]
        if dense:
            lines += [f"            const int xo = cl * {plane} + kh * {dh * ww} + kw * {dw};",
                      f"            for (int y = 0; y < {c.tn}; ++y) {{",
                      "                const float xv = st_b[xo + pix[y]];",
                      f"                for (int x = 0; x < {c.tm}; ++x) acc[x * {c.tn} + y] += rw[x] * xv;",
                      "            }"]
        else:
            lines += [f"            for (int x = 0; x < {c.tm}; ++x) {{",
                      f"                const int xo = (g_ty * {c.tm} + x) * {plane} + kh * {dh * ww} + kw * {dw};",
                      f"                for (int y = 0; y < {c.tn}; ++y) acc[x * {c.tn} + y] += rw[x] * st_b[xo + pix[y]];",
                      "            }"]
        lines += ["        }", f"        {self.block_barrier}", "    }",
                  f"    for (int x = 0; x < {c.tm}; ++x) {{",
                  f"        for (int y = 0; y < {c.tn}; ++y) {{",
                  f"            const int col = g_ty * {c.tm} + x, q = g_tx + y * {c.tx};",
                  "            if (col < c_n && q < oh_n * ow_n) {",
                  "                const int i1 = c_lo + col, i2 = oh_lo + q / ow_n, i3 = ow_lo + q % ow_n;"]
        lines += ["                " + x for x in self.gemm_epilogue(kernel, phase, f"acc[x * {c.tn} + y]")]
        lines += ["            }", "        }", "    }", "}"]
        return lines

    def render_flat_phase(self, kernel: Kernel, phase: Phase) -> list[str]:
        """Block t computes flat elements [t*chunk, (t+1)*chunk) of the whole tensor."""
        chunk, shape = phase.region.flat, phase.region.shape
        size = 1
        for n in shape:
            size *= n
        lines = [f"{{  // {phase.stage}: this block's share of the whole tensor",
                 f"    const int f_lo = t * {chunk};",
                 f"    const int n_e = {size} - f_lo < {chunk} ? {size} - f_lo : {chunk};",
                 "    " + self.thread_loop("e", "n_e") + " {"]
        body = ["int rem = f_lo + e;"]
        for d in reversed(range(len(shape))):
            body.append(f"const int i{d} = rem % {shape[d]}; rem /= {shape[d]};" if d else f"const int i{d} = rem;")
        ssa = BodyWriter(self, kernel, self.phase_ranges(phase, shape))
        value = self.render_value(phase, ssa)
        body += ssa.lines
        for name in phase.stores:
            buf = kernel.buffer(name)
            body.append(f"{name}[{ssa.offset(buf, tuple(I.var(f'i{d}') for d in range(len(shape))))}] = "
                        f"{self.store_value(value, buf.dtype)};")
        return lines + ["        " + x for x in body] + ["    }", "}"]

    def render_value(self, phase: Phase, ssa: BodyWriter, lanes: int = 1, keep: str = "") -> str:
        """The phase's value; `keep` (a reduction only) is a statement run on each reduced term `{v}`."""
        if phase.combine is None:
            return ssa.value(phase.body)
        names = tuple(f"r{k}" for k in range(len(phase.reduce)))
        return ssa.reduction(phase.body, names, phase.reduce, phase.combine, phase.body.dtype, lanes, keep)

    # ---- math spellings ----------------------------------------------------------------------
    def unary(self, op: str, x: str, dtype: DType) -> str:
        if not dtype.is_float:
            return {"neg": f"(-{x})", "abs": f"({x} < 0 ? -{x} : {x})", "not": f"(!{x})",
                    "sign": f"(({x} > 0) - ({x} < 0))"}.get(op, f"({x})")
        return {
            "neg": f"(-{x})", "abs": f"fabsf({x})", "exp": f"expf({x})", "log": f"logf({x})",
            "sqrt": f"sqrtf({x})", "rsqrt": f"(1.0f / sqrtf({x}))", "recip": f"(1.0f / {x})",
            "tanh": f"tanhf({x})", "erf": f"erff({x})", "sigmoid": f"(1.0f / (1.0f + expf(-{x})))",
            "ceil": f"ceilf({x})", "floor": f"floorf({x})", "round": f"rintf({x})", "sin": f"sinf({x})",
            "cos": f"cosf({x})", "isnan": f"isnan({x})",
            "sign": f"(float)(({x} > 0.0f) - ({x} < 0.0f))",
            **{name: f"{name}f({x})" for name in LIBM_CALLS},
        }[op]

    def binary(self, op: str, a: str, b: str, dtype: DType) -> str:
        infix = {"add": "+", "sub": "-", "mul": "*", "div": "/", "eq": "==", "ne": "!=", "lt": "<",
                 "le": "<=", "gt": ">", "ge": ">=", "and": "&&", "or": "||", "xor": "!="}
        if op in infix:
            return f"({a} {infix[op]} {b})"
        if op in ("min", "max"):
            cmp = "<" if op == "min" else ">"
            return f"({a} {cmp} {b} ? {a} : {b})"
        if dtype.is_float:
            if op == "pow":
                return f"powf({a}, {b})"
            if op == "fmod":
                return f"fmodf({a}, {b})"
            self.helpers.add("fpymod")
            return f"fpymod({a}, {b})"
        if op == "pow":
            self.helpers.add("lpow")
            return f"lpow({a}, {b})"
        if op == "fmod":
            return f"({a} % {b})"
        self.helpers.add("lmod")
        return f"lmod({a}, {b})"

    def literal(self, value, dtype: DType) -> str:
        if dtype == DType.BOOL:
            return "true" if value else "false"
        if dtype.is_int:
            return f"{int(value)}{self.i64_suffix}" if dtype == DType.I64 else str(int(value))
        v = float(value)
        if math.isnan(v):
            return self.nan
        if math.isinf(v):
            return self.inf if v > 0 else f"(-{self.inf})"
        text = f"{v:.9g}"
        if "e" not in text and "." not in text:
            text += ".0"
        return f"{text}f" if v >= 0 else f"({text}f)"


def unflatten(names, extents, flat: str) -> list[str]:
    """Lines defining variables `names` (row-major over `extents`) from the flat index `flat`."""
    out, inner, total = [], 1, 1
    for n in extents:
        total *= n
    for v, n in reversed(list(zip(names, extents))):
        text = flat if inner == 1 else f"({flat} / {inner})"
        out.append(f"const int {v} = {text};" if inner * n == total else f"const int {v} = {text} % {n};")
        inner *= n
    return out[::-1]


def _limits(ct: str, p: Printer) -> tuple[str, str]:
    """Identity elements of max and min for a compute type of printer `p`."""
    if ct == "float":
        return f"(-{p.inf})", p.inf
    if ct == p.i64_type:
        return f"(-9223372036854775807{p.i64_suffix} - 1)", f"9223372036854775807{p.i64_suffix}"
    if ct == "bool":
        return "false", "true"
    return "(-2147483647 - 1)", "2147483647"


def _invariant_reductions(body, loop_vars: set[str]) -> list:
    """Inlined reductions in `body` that do not depend on `loop_vars`, outermost first; none from
    under a pad guard (hoisted out of it, their reads could leave the tensor)."""
    found, seen, stack = [], set(), [body]
    while stack:
        n = stack.pop()
        if isinstance(n, Guard) or id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, Reduce) and not (_free_vars(n) & loop_vars):
            found.append(n)
            continue
        stack.extend(reversed(E.children(n)) if not isinstance(n, Reduce) else [n.body])
    return found


def invariant_picks(kernel: Kernel, body, loop_vars: set[str]) -> list:
    """Pointer picks (`pick_chain`) in `body` whose conditions do not depend on `loop_vars`, outermost
    first: a C GEMM stages factor a choosing their tensor once per row, not per element (Gemm.a_row_picks:
    lstm's second layer reads its input sequence through a pick of one of 32 per-step h buffers, and GCC
    turned the choice into a jump per staged element). None from under a pad guard or inside an inlined
    reduction (whose own variables the conditions may read)."""
    found, seen, stack = [], set(), [body]
    while stack:
        n = stack.pop()
        if isinstance(n, (Guard, Reduce)) or id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, E.Select):
            picked = pick_chain(kernel, n)
            if picked is not None and not any(_free_vars(c) & loop_vars for c, _ in picked[0]):
                found.append(n)
                continue
        stack.extend(reversed(E.children(n)))
    return found


def invariant_values(body, loop_vars: set[str], known: set | frozenset = frozenset()) -> list:
    """Maximal subexpressions of `body` that do not depend on `loop_vars` (constants aside), outermost
    first: what a loop over those variables computes once before it. None from under a pad guard
    (hoisted out of it, their reads could leave the tensor). Hoisting by hand matters in the C
    backend: OpenMP outlining drops `restrict`, so GCC keeps a row's mean load, its sqrt and divide
    inside the column loop, behind the stores. Nodes in `known` (already computed) are skipped whole."""
    found, have, seen, stack = [], set(), set(), [(body, frozenset(loop_vars))]
    while stack:
        n, bound = stack.pop()
        if (id(n), bound) in seen:  # bodies are DAGs: visit each node once per binding
            continue
        seen.add((id(n), bound))
        if isinstance(n, (Guard, E.Imm)) or n in known:
            continue
        if not (_free_vars(n) & bound):
            if n not in have:
                have.add(n)
                found.append(n)
            continue
        if isinstance(n, Reduce):  # its own loop variables are bound inside it
            stack.append((n.body, bound | set(n.vars)))
        else:
            stack.extend((c, bound) for c in reversed(E.children(n)))
    return found


def invariant_indices(body, loop_vars: set[str], known: set | frozenset = frozenset()) -> list:
    """Gathered indices in `body` (I.Indirect atoms: an index read from a tensor, Gather's and TopK's) whose read
    does not depend on `loop_vars`, outermost first: `BodyWriter.hoist_index` reads each once before the loop.
    Left in it, GCC vectorised the loop's loads through such an index as gathers though every lane reads the
    same index — a contiguous vector load (Mixtral's experts: each token's expert weight rows read through its
    routing index, the dot products over them 3.3x their modeled time). None from under a pad guard (as
    `invariant_values`); atoms in `known` (hoisted already) are skipped."""
    found, seen, stack = [], set(), [(body, frozenset(loop_vars))]

    def visit(ix: I.Lin, bound: frozenset) -> None:
        for atom, _ in ix.terms:
            if isinstance(atom, I.Indirect):
                if not (I.atom_vars(atom) & bound):
                    if atom not in known and atom not in found:
                        found.append(atom)
                    continue
                for inner in atom.index:
                    visit(inner, bound)
            elif isinstance(atom, (I.FloorDiv, I.Mod, I.Abs)):
                visit(atom.x, bound)
            elif isinstance(atom, (I.Min, I.Max)):
                visit(atom.a, bound)
                visit(atom.b, bound)

    while stack:
        n, bound = stack.pop()
        if (id(n), bound) in seen or isinstance(n, Guard):
            continue
        seen.add((id(n), bound))
        if isinstance(n, E.Load):
            for ix in n.index:
                visit(ix, bound)
        elif isinstance(n, E.IndexVal):
            visit(n.expr, bound)
        elif isinstance(n, Reduce):
            stack.append((n.body, bound | set(n.vars)))
        else:
            stack.extend((c, bound) for c in reversed(E.children(n)))
    return found


def pick_chain(kernel: Kernel, e):
    """(chain of (condition, load), last load, its buffer) when `e` is a select chain over loads of the
    same element of several tensors — one dtype, no padding, equal offsets — that `BodyWriter` prints as
    one load through a pointer the conditions choose (and `count` counts so); None otherwise."""
    chain, cur = [], e
    while isinstance(cur, E.Select) and isinstance(cur.a, E.Load):
        chain.append((cur.cond, cur.a))
        cur = cur.b
    if not isinstance(cur, E.Load) or len(chain) < 2:
        return None
    loads = [ld for _, ld in chain] + [cur]
    bufs = [kernel.buffer(ld.tensor) for ld in loads]
    if any(ld.pad is not None or ld.dtype != e.dtype for ld in loads) or len({b.dtype for b in bufs}) != 1:
        return None
    # Equal offsets (BodyWriter.offset): a row-major offset reads every extent but the first; a block
    # buffer's offset names the buffer.
    def where(b, ld):
        dims = b.region.extent if b.scope == Scope.BLOCK else b.shape
        return b.scope, tuple(dims[1:]), b.name if b.scope == Scope.BLOCK else "", ld.index

    if len({where(b, ld) for b, ld in zip(bufs, loads)}) != 1:
        return None
    return chain, cur, bufs[-1]


class BodyWriter:
    """SSA emission of one scalar expression tree into `lines`."""

    def __init__(self, printer: Printer, kernel: Kernel, ranges: dict, counter: list | None = None):
        self.p = printer
        self.kernel = kernel
        self.ranges = ranges
        self.lines: list[str] = []
        self.memo: dict = {}
        self.counter = counter if counter is not None else [0]
        self.picks = 0  # pointer picks emitted (pick_pointer)
        self.pointers: dict = {}  # pick chain -> its pointer (BodyWriter.pick_pointer; gemm_operand hoists some)
        self.loops = 0  # loops emitted (reductions, nested ones included): a loop around these lines is not innermost
        # Fold index tests `ranges` decide (a select on an index comparison takes one arm, a guard or padded
        # load inside or outside its tensor everywhere drops its check): the C printer's split pieces
        # (ctarget.split_ranges) set it.
        self.fold = False

    def fresh(self) -> str:
        self.counter[0] += 1
        return f"v{self.counter[0]}"

    # ---- index arithmetic -------------------------------------------------------------------
    def lin(self, e: I.Lin) -> str:
        parts = []
        for atom, k in e.terms:
            a = self.atom(atom)
            parts.append(a if k == 1 else f"{k} * {a}")
        if e.const or not parts:
            parts.append(str(e.const))
        return "(" + " + ".join(parts) + ")" if len(parts) > 1 else parts[0]

    def atom(self, atom) -> str:
        if isinstance(atom, I.Var):
            return atom.name
        if isinstance(atom, (I.FloorDiv, I.Mod)):
            (lo, _), _ = I.bounds(atom.x, self.ranges)
            x = self.lin(atom.x)
            if lo >= 0:  # C truncation equals floor semantics for non-negative operands
                return f"({x} / {atom.k})" if isinstance(atom, I.FloorDiv) else f"({x} % {atom.k})"
            name = "fdiv" if isinstance(atom, I.FloorDiv) else "fmodi"
            self.p.helpers.add(name)
            return f"{name}({x}, {atom.k})"
        if isinstance(atom, (I.Min, I.Max)):
            name = "imin" if isinstance(atom, I.Min) else "imax"
            self.p.helpers.add(name)
            return f"{name}({self.lin(atom.a)}, {self.lin(atom.b)})"
        if isinstance(atom, I.Abs):
            self.p.helpers.add("iabs")
            return f"iabs({self.lin(atom.x)})"
        if isinstance(atom, I.Indirect):
            hit = self.memo.get(atom)  # read before the loop (`hoist_index`)
            if hit is not None:
                return hit
            self.p.helpers.add("widx")
            buf = self.kernel.buffer(atom.tensor)
            return f"widx({atom.tensor}[{self.offset(buf, atom.index)}], {atom.size})"
        raise TypeError(atom)

    def hoist_index(self, atom: I.Indirect) -> None:
        """Read gathered index `atom` into a name here (before a loop it does not depend on: `invariant_indices`);
        the loop's loads then index with the name, kept in `memo` with the values."""
        text = self.atom(atom)
        name = self.fresh()
        self.lines.append(f"const int {name} = {text};")
        self.memo[atom] = name

    def hoist_invariants(self, body, loop_vars: set[str]) -> None:
        """The values (`invariant_values`) and gathered indices (`invariant_indices`) of `body` that a loop over
        `loop_vars` does not change, computed here, once, before it."""
        for node in invariant_values(body, loop_vars, known=set(self.memo)):
            self.value(node)
        for atom in invariant_indices(body, loop_vars, known=set(self.memo)):
            self.hoist_index(atom)

    def offset(self, buf: Buffer, index: tuple[I.Lin, ...]) -> str:
        """Row-major offset of `index` in `buf` (relative to the tile's region for BLOCK buffers)."""
        if not index:
            return "0"
        dims = buf.region.extent if buf.scope == Scope.BLOCK else buf.shape
        if self.p.flat_offsets and buf.scope != Scope.BLOCK:
            flat = I.const(0)
            for ix, n in zip(index, dims):
                flat = flat * n + ix
            joined = I.join_divmod(flat)
            if joined != flat:
                return self.lin(joined)
        text = ""
        for d, ix in enumerate(index):
            term = self.lin(ix)
            if buf.scope == Scope.BLOCK:
                term = f"({term} - {buf.name}_lo{d})"
            text = term if not text else f"({text}) * {dims[d]} + {term}"
        return text

    def covered(self, index: tuple[I.Lin, ...], shape: tuple[int, ...]) -> bool | None:
        """Whether `index` lies inside `shape` everywhere over `ranges` (True), nowhere (False), or either."""
        inside = True
        for ix, n in zip(index, shape):
            (lo, hi), _ = I.bounds(ix, self.ranges)
            if hi < 0 or lo >= n:
                return False
            inside = inside and lo >= 0 and hi < n
        return True if inside else None

    def decided(self, cond) -> bool | None:
        """The value of `cond` where `ranges` decide it — an index value compared with a constant — else None."""
        hit = E.index_comparison(cond)
        if hit is None:
            return None
        ix, op, m = hit
        (lo, hi), _ = I.bounds(ix, self.ranges)
        if op in ("eq", "ne"):
            held = False if m < lo or m > hi else True if lo == hi == m else None
            return held if held is None or op == "eq" else not held
        # an order test of an interval against a constant: decided where its two ends agree
        at_lo, at_hi = E.COMPARE[op](lo, m), E.COMPARE[op](hi, m)
        return at_lo if at_lo == at_hi else None

    def inbounds(self, index: tuple[I.Lin, ...], shape: tuple[int, ...]) -> str:
        conds = []
        for ix, n in zip(index, shape):
            (lo, hi), _ = I.bounds(ix, self.ranges)
            s = self.lin(ix)
            if lo < 0:
                conds.append(f"{s} >= 0")
            if hi >= n:
                conds.append(f"{s} < {n}")
        return " && ".join(conds) or "true"

    # ---- values -----------------------------------------------------------------------------
    def bind(self, dtype: DType, text: str) -> str:
        name = self.fresh()
        self.lines.append(f"const {self.p.compute_type(dtype)} {name} = {text};")
        return name

    def value(self, e) -> str:
        if isinstance(e, E.Imm):
            return self.p.literal(e.value, e.dtype)
        hit = self.memo.get(e)
        if hit is not None:
            return hit
        if self.fold and isinstance(e, E.Select) and (taken := self.decided(e.cond)) is not None:
            out = self.value(e.a if taken else e.b)
        elif self.fold and isinstance(e, Guard) and (inside := self.covered(e.cond.index, e.cond.shape)) is not None:
            out = self.value(e.x if inside else e.pad)
        elif self.fold and isinstance(e, E.Load) and e.pad is not None \
                and self.covered(e.index, self.kernel.buffer(e.tensor).shape) is False:
            out = self.p.literal(e.pad, e.dtype)
        elif isinstance(e, Guard):
            out = self._guard(e)
        elif isinstance(e, Reduce):
            out = self.reduction(e.body, e.vars, e.extents, e.combine, e.dtype)
        else:
            out = self.bind(e.dtype, self._text(e))
        self.memo[e] = out
        return out

    def reduction(self, body, names, extents, combine: Combine, dtype: DType, lanes: int = 1,
                  keep: str = "") -> str:
        """Emit the loop nest of a reduction; returns the name holding the result. `keep`, a statement
        template over `{v}`, also runs on every term (a row cache storing it for a later phase)."""
        ct = self.p.compute_type(dtype if combine not in (Combine.ARGMAX, Combine.ARGMIN) else body.dtype)
        acc = self.fresh()
        arg = combine in (Combine.ARGMAX, Combine.ARGMIN)
        lowest, highest = _limits(ct, self.p)
        init = {Combine.SUM: "0", Combine.PROD: "1", Combine.MAX: lowest, Combine.MIN: highest,
                Combine.ARGMAX: lowest, Combine.ARGMIN: highest}[combine]
        self.lines.append(f"{ct} {acc} = {init};")
        if arg:
            self.lines.append(f"{self.p.i64_type} {acc}_arg = 0;")
        self.hoist_invariants(body, set(names))  # a row mean inside a GEMM's k loop, a row's max: once
        if lanes > 1:
            # Lanes of a row split the flattened reduction: lane l takes elements l, l+lanes, ...
            total = 1
            for n in extents:
                total *= n
            self.lines.append(f"for (int rf = lane; rf < {total}; rf += {lanes}) {{")
            self.loops += 1
            rest = "rf"
            for v, n in reversed(list(zip(names, extents))):
                self.lines.append(f"    const int {v} = {rest} % {n};" if v != names[0] else f"    const int {v} = {rest};")
                rest = f"({rest} / {n})"
        inner = BodyWriter(self.p, self.kernel, self.ranges | {v: (0, n - 1) for v, n in zip(names, extents)},
                      self.counter)
        inner.memo = {k: v for k, v in self.memo.items()}  # outer values are defined before the loop
        v = inner.value(body)
        if lanes <= 1:
            for k, (name, n) in enumerate(zip(names, extents)):
                pragma = self.p.reduction_pragma(combine, acc) if k == len(names) - 1 else ""
                if pragma and not inner.loops:
                    self.lines.append(pragma)  # innermost loop, no loop nested in its body
                self.lines.append(f"for (int {name} = 0; {name} < {n}; ++{name}) {{")
                self.loops += 1
        step = {Combine.SUM: f"{acc} += {v};", Combine.PROD: f"{acc} *= {v};",
                Combine.MAX: f"{acc} = {v} > {acc} ? {v} : {acc};", Combine.MIN: f"{acc} = {v} < {acc} ? {v} : {acc};",
                Combine.ARGMAX: f"if ({v} > {acc}) {{ {acc} = {v}; {acc}_arg = {names[0]}; }}",
                Combine.ARGMIN: f"if ({v} < {acc}) {{ {acc} = {v}; {acc}_arg = {names[0]}; }}"}[combine]
        kept = [keep.format(v=v)] if keep else []
        self.lines += ["    " + x for x in inner.lines + kept + [step]]
        self.loops += inner.loops
        self.lines += ["}"] * (1 if lanes > 1 else len(extents))
        return f"{acc}_arg" if arg else acc

    def _guard(self, g: Guard) -> str:
        name = self.fresh()
        inner = BodyWriter(self.p, self.kernel, self.ranges, self.counter)
        inner.memo = dict(self.memo)  # values outside the guard are safe to reuse inside it
        v = inner.value(g.x)
        self.lines.append(f"{self.p.compute_type(g.dtype)} {name} = {self.value(g.pad)};")
        self.lines.append(f"if ({self.inbounds(g.cond.index, g.cond.shape)}) {{")
        self.lines += ["    " + x for x in inner.lines + [f"{name} = {v};"]]
        self.lines.append("}")
        self.loops += inner.loops
        return name

    def _pick_tensor(self, e) -> str | None:
        """A select chain over loads of the same element of several tensors (a concatenation over
        steps: lstm's y picks one of 32 per-step h buffers) as one load through a pointer chosen by the
        conditions, instead of loading every candidate and selecting: the pointer choice does not
        depend on the element when the conditions do not (hoisted out of the loop by the compiler)."""
        picked = pick_chain(self.kernel, e)
        if picked is None:
            return None
        _, last, buf = picked
        ptr = self.pick_pointer(e, picked)
        return self.p.load_value(f"{ptr}[{self.offset(buf, last.index)}]", buf.dtype)

    def pick_pointer(self, e, picked: tuple | None = None) -> str:
        """The pointer the conditions of pick chain `e` choose, emitted once per writer (or given by the
        writer around it: `pointers`)."""
        hit = self.pointers.get(e)
        if hit is not None:
            return hit
        chain, last, buf = picked or pick_chain(self.kernel, e)
        choice = last.tensor
        for cond, ld in reversed(chain):
            choice = f"{self.value(cond)} ? {ld.tensor} : ({choice})"
        ptr = self.pointers[e] = self.fresh()
        self.picks += 1
        space = self.p.global_space if buf.scope == Scope.GLOBAL else self.p.local_space
        self.lines.append(f"{space}const {self.p.storage_type(buf.dtype)}* {ptr} = {choice};")
        return ptr

    def _text(self, e) -> str:
        if isinstance(e, E.Load):
            buf = self.kernel.buffer(e.tensor)
            text = self.p.load_value(f"{e.tensor}[{self.offset(buf, e.index)}]", buf.dtype)
            if e.pad is not None:
                cond = self.inbounds(e.index, buf.shape)
                if cond != "true":
                    text = f"({cond}) ? {text} : {self.p.literal(e.pad, e.dtype)}"
            return text
        if isinstance(e, E.IndexVal):
            return f"({self.p.compute_type(e.dtype)}){self.lin(e.expr)}"
        if isinstance(e, InBounds):
            return self.inbounds(e.index, e.shape)
        if isinstance(e, E.Unary):
            return self.p.unary(e.op, self.value(e.x), e.x.dtype)
        if isinstance(e, E.Binary):
            if E.small_pow(e):
                # Small constant exponents (x^2 in variances, x^3 in GELU): products, not a powf call.
                x = self.value(e.a)
                return {1.0: x, 2.0: f"({x} * {x})", 3.0: f"({x} * {x} * {x})", 0.5: f"sqrtf({x})"}[e.b.value]
            return self.p.binary(e.op, self.value(e.a), self.value(e.b), e.a.dtype)
        if isinstance(e, E.Select):
            picked = self._pick_tensor(e)
            if picked is not None:
                return picked
            return f"{self.value(e.cond)} ? {self.value(e.a)} : {self.value(e.b)}"
        if isinstance(e, E.Cast):
            x = self.value(e.x)
            if e.dtype == DType.BOOL:
                return f"({x} != 0)"
            return f"({self.p.compute_type(e.dtype)})({x})"
        raise TypeError(e)
