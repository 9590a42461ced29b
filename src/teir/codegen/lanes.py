"""LLVM IR for the lane-batched contraction: a batch (C) axis with unit stride in in0, in1 and
the output becomes the vector lanes, so that ``out[m, n, c] (+)= sum_k in0[m, k, c] *
in1[k, n, c]`` runs on whole vectors although no GEMM layout fits (``ijb,jkb->ikb``: every
GEMM operand needs a unit stride on M, N or K, and all three have it on the batch).

Both operands are whole vectors here, so unlike a GEMM neither is broadcast: a register block
of ``MR`` x ``NR`` accumulators loads ``MR + NR`` vectors per K step. Read where they lie,
the operands' rows sit a multiple of 4 KiB apart in typical shapes (one L1 set for a whole
block) and NumPy's 16-byte alignment splits every vector over two lines (96^3 x 32 FP32:
52-72 % of one core's peak). So, as BLIS does for GEMM, both are packed first, one batch
vector (``lanes`` elements) at a time, into aligned contiguous buffers on the stack: a block
of in0 (``MC`` x ``KC`` vectors, kept in L2) and of in1 (``KC`` x ``NC`` vectors), whose
``KC`` x ``NR`` micro-panels are read again by every row panel of in0 while it streams past
them from L2. The operand whose rows lie further apart in the output is taken as in0 (see
``swapped``); where half-width vectors are as fast (Zen 4), a batch that fills them better
runs on them. Measured on one core (perf, 96^3 x 32 FP32): the FMA loop takes 88 % of the
time at about 95 % of its rate, packing 8 %, storing the results 4 %.

The function has the nest signature (``in0, in1, out, lo, hi, first, last``; the flag
pointers unused) and runs jobs ``[lo, hi)``: each job is one batch vector of one block of
``MC`` rows (of one index of the outer C axes), so threads take slices of jobs and never
write the same output element. Tails are compile-time: rows, columns and K steps beyond the
sizes are packed as zeros and never stored; a batch tail shorter than a vector is loaded and
stored under a mask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod

from teir.codegen.irtext import (
    FunctionBuilder,
    Module,
    Vectors,
)
from teir.codegen.target import Target

# Register block: 24 accumulators, 6 + 1 operand vectors of 32 registers. Blocks and block
# sizes measured on 96^3 x 32 FP32, one core, same process (fraction of its peak): (4, 6) and
# (6, 4) with K in blocks of 48 (C read and written twice) 73 %; all 96 of K at once 80-86 %,
# with in1 in blocks of 24 columns 86 % against 84 % for 96; (5, 5) 72 %, (8, 3) 70 %.
MR, NR = 4, 6
# K steps per block: a KC x NR micro-panel of in1 is 36 KiB, a little over L1, yet one block
# over all of K beat blocks of 32-64 that fit it (those read and write C once per block)
KC_MAX = 96
NC_MAX = 24  # columns per in1 block
# The packing buffers live on the stack (probed page by page): in0's block is kept under this.
# Each job packs all of in1's block for its rows, so more rows per job pack in1 less often:
# 96^3 x 32 on 2 threads, 96 rows (576 KiB) against 48: FP32 0.80-0.82 vs 0.78, FP64 0.79-0.81
# vs 0.76-0.77 of peak (same process, two runs).
A_BLOCK_BYTES = 640 * 1024
K_UNROLL = 4  # K steps per loop iteration; packed K is padded with zeros to a multiple


@dataclass(frozen=True)
class LaneSpec:
    """``out[o, m, n, c] (+)= sum_k in0[o, m, k, c] * in1[o, k, n, c]`` with ``c`` (``batch``
    elements) of unit stride in all three tensors. ``outer`` lists the other C axes as
    (size, in0 stride, in1 stride, out stride); ``beta`` 0 overwrites the output, 1 adds to
    it; ``relu`` applies ``max(., 0)`` to the result. Strides are in elements."""

    itemsize: int
    lanes: int
    batch: int
    m: int
    n: int
    k: int
    m_in0: int
    m_out: int
    n_in1: int
    n_out: int
    k_in0: int
    k_in1: int
    outer: tuple[tuple[int, int, int, int], ...] = ()
    beta: int = 0
    relu: bool = False
    mc: int = 0  # rows per job (the last one may have fewer); 0: as many as fit the stack
    # in0 and in1 of this spec are the caller's in1 and in0 (the function's pointers are
    # taken in the caller's order and exchanged)
    swapped: bool = False

    def __post_init__(self) -> None:
        if self.mc <= 0:
            rows = A_BLOCK_BYTES // (_padded(self.kc) * self.lanes * self.itemsize)
            object.__setattr__(self, "mc", max(MR, min(self.m, rows // MR * MR)))

    @property
    def groups(self) -> int:
        """Batch vectors (the last one partial when ``lanes`` does not divide the batch)."""
        return -(-self.batch // self.lanes)

    @property
    def m_blocks(self) -> int:
        return -(-self.m // self.mc)

    @property
    def jobs(self) -> int:
        """The parallel index space: outer index x batch vector x row block."""
        return prod(size for size, *_ in self.outer) * self.groups * self.m_blocks

    @property
    def kc(self) -> int:
        """K steps per block: K in equal blocks of at most KC_MAX."""
        return -(-self.k // -(-self.k // KC_MAX))

    @property
    def nc(self) -> int:
        """Columns per in1 block: N in equal blocks of at most NC_MAX, each a whole number
        of register blocks (a block of 22 put a 4-column tail in every one)."""
        per_block = -(-self.n // -(-self.n // NC_MAX))
        return min(self.n, -(-per_block // NR) * NR)

    @property
    def name(self) -> str:
        outer = "_".join(f"{s}s{a}s{b}s{o}" for s, a, b, o in self.outer)
        return (
            f"lanes_f{self.itemsize * 8}x{self.lanes}_c{self.batch}_m{self.m}s{self.m_in0}s"
            f"{self.m_out}_n{self.n}s{self.n_in1}s{self.n_out}_k{self.k}s{self.k_in0}s"
            f"{self.k_in1}_o{outer}_b{self.beta}{'_relu' if self.relu else ''}_mc{self.mc}"
            f"{'_swapped' if self.swapped else ''}"
        )

    def stack_bytes(self) -> int:
        """The packing buffers' size on the stack."""
        kcp = _padded(self.kc)
        rows = -(-min(self.mc, self.m) // MR) * MR
        cols = -(-self.nc // NR) * NR
        return (rows + cols) * kcp * self.lanes * self.itemsize


def _padded(k: int) -> int:
    return -(-k // K_UNROLL) * K_UNROLL


def _parts(total: int, step: int) -> list[tuple[int, int, int]]:
    """Blocks of ``step`` over ``total``: (count, size, first index) for full and tail."""
    full, tail = divmod(total, step)
    parts = [(full, step, 0)] if full else []
    return parts + ([(1, tail, full * step)] if tail else [])


def _each(f: FunctionBuilder, count: int, body: Callable[[str | int], None], hint: str) -> None:
    """``body(i)`` for i in range(count) (nothing for 0; straight-line for 1)."""
    if count:

        def step(index: str, _: list[str]) -> list[str]:
            body(index)
            return []

        f.loop(count, [], step, hint)


class _LaneEmitter:
    def __init__(self, spec: LaneSpec, module: Module, name: str) -> None:
        self.spec = spec
        self.module = module
        self.name = name
        self.lanes = spec.lanes
        self.vectors = Vectors(spec.lanes, spec.itemsize)
        self.t, self.vt, self.suffix = self.vectors.t, self.vectors.vt, self.vectors.suffix
        self.vector_bytes = spec.lanes * spec.itemsize
        # generated functions by key: micro-kernels (rows, cols, beta, relu, active lanes)
        # and job bodies (rows, active lanes)
        self.functions: dict[tuple[object, ...], str] = {}
        suffix, vt = self.suffix, self.vt
        module.declare(
            f"fmuladd.{suffix}", f"declare {vt} @llvm.fmuladd.{suffix}({vt}, {vt}, {vt})"
        )
        self.vectors.declare(module)
        if spec.relu:
            module.declare(f"maxnum.{suffix}", f"declare {vt} @llvm.maxnum.{suffix}({vt}, {vt})")

    # ---- functions ---------------------------------------------------------------------------
    def function(self, key: tuple[object, ...], params: str) -> tuple[str, FunctionBuilder | None]:
        """The internal function for ``key`` (its first element names the kind): its name,
        and a builder for its body when it is new (None when it was generated before)."""
        found = self.functions.get(key)
        if found is not None:
            return found, None
        name = f"{self.name}.{key[0]}{len(self.functions)}"
        self.functions[key] = name
        header = f"define internal void @{name}({params}) nounwind"
        return name, FunctionBuilder(self.module, header)

    # ---- the micro-kernel -------------------------------------------------------------------
    def micro(self, rows: int, cols: int, beta: int, relu: bool, active: int) -> str:
        """``void (ptr a, ptr b, ptr c, i64 steps)``: the rows x cols block of C (+)= the
        packed panels' product over ``steps`` x K_UNROLL K steps."""
        name, built = self.function(
            ("micro", rows, cols, beta, relu, active),
            "ptr noalias %a, ptr noalias %b, ptr noalias %c, i64 %steps",
        )
        if built is None:
            return name
        f, spec, vt, lanes = built, self.spec, self.vt, self.lanes
        align = self.vector_bytes
        c_offsets = [
            [f.add_i64(f.mul_i64(r, spec.m_out), q * spec.n_out) for q in range(cols)]
            for r in range(rows)
        ]
        # from zero, added to C when stored: each K block's sum adds to C as one term, so that
        # no element's sum is one chain of rounded additions over all of K
        accs = ["zeroinitializer"] * (rows * cols)
        fma = f"@llvm.fmuladd.{self.suffix}"

        def step(values: list[str], a_panel: str, b_panel: str, k: int) -> list[str]:
            bs = [
                self.vectors.load(f, b_panel, (k * NR + q) * lanes, lanes, align)
                for q in range(cols)
            ]
            out = list(values)
            for r in range(rows):
                a = self.vectors.load(f, a_panel, (k * MR + r) * lanes, lanes, align)
                for q in range(cols):
                    i = r * cols + q
                    out[i] = f.assign(
                        f"call {vt} {fma}({vt} {a}, {vt} {bs[q]}, {vt} {out[i]})", "acc"
                    )
            return out

        a_step = K_UNROLL * MR * lanes
        b_step = K_UNROLL * NR * lanes

        def unrolled(index: str, values: list[str]) -> list[str]:
            a = f.gep(self.t, "%a", f.mul_i64(index, a_step))
            b = f.gep(self.t, "%b", f.mul_i64(index, b_step))
            for k in range(K_UNROLL):
                values = step(values, a, b, k)
            return values

        results = f.loop("%steps", [(vt, acc) for acc in accs], unrolled, "k")
        for r in range(rows):
            for q in range(cols):
                value = results[r * cols + q]
                if beta:
                    old = self.vectors.load(f, "%c", c_offsets[r][q], active, spec.itemsize)
                    value = f.assign(f"fadd {vt} {old}, {value}", "v")
                if relu:
                    value = f.assign(
                        f"call {vt} @llvm.maxnum.{self.suffix}({vt} {value}, {vt} zeroinitializer)",
                        "v",
                    )
                self.vectors.store(f, value, "%c", c_offsets[r][q], active, spec.itemsize)
        f.finish()
        return name

    # ---- packing ----------------------------------------------------------------------------
    def pack(
        self,
        f: FunctionBuilder,
        target: str,
        source: str,
        count: int,
        width: int,
        along: int,
        k_stride: int,
        k0: str | int,
        kc: int,
        active: int,
    ) -> None:
        """Vectors ``source[i * along + (k0 + k) * k_stride]`` for i < count, k < kc into
        ``target`` as panels of ``width``: [i // width][k][i % width], zeros past ``count``
        and ``kc`` (up to the padded K)."""
        lanes, spec = self.lanes, self.spec
        align = self.vector_bytes
        kcp = _padded(kc)
        full, partial = divmod(count, width)
        panels = full + (1 if partial else 0)

        def vector(i: str | int, k: str | int) -> str:
            offset = f.add_i64(f.mul_i64(i, along), f.mul_i64(f.add_i64(k0, k), k_stride))
            return self.vectors.load(f, source, offset, active, spec.itemsize)

        def place(value: str, p: str | int, w: int, k: str | int) -> None:
            offset = f.add_i64(f.mul_i64(p, width * kcp * lanes), f.mul_i64(k, width * lanes))
            self.vectors.store(f, value, target, f.add_i64(offset, w * lanes), lanes, align)

        if along <= abs(k_stride):
            # the source read in its memory order: along the rows (i) for each k
            def at_k(k: str | int) -> None:
                def at_panel(p: str | int) -> None:
                    for w in range(width):
                        place(vector(f.add_i64(f.mul_i64(p, width), w), k), p, w, k)

                _each(f, full, at_panel, "pp")
                for w in range(width) if partial else ():
                    value = vector(full * width + w, k) if w < partial else "zeroinitializer"
                    place(value, full, w, k)

            _each(f, kc, at_k, "pk")
        else:
            # along K for each row
            def at_panel(p: str | int, valid: int) -> None:
                for w in range(width):
                    if w < valid:
                        i = f.add_i64(f.mul_i64(p, width), w)

                        def copy(k: str | int, i: str | int = i, w: int = w) -> None:
                            place(vector(i, k), p, w, k)

                        _each(f, kc, copy, "pk")
                    else:

                        def zero(k: str | int, w: int = w) -> None:
                            place("zeroinitializer", p, w, k)

                        _each(f, kc, zero, "pz")

            def full_panel(p: str | int) -> None:
                at_panel(p, width)

            _each(f, full, full_panel, "pp")
            if partial:
                at_panel(full, partial)
        for p in range(panels):  # K padding (compile-time panels: few)
            for k in range(kc, kcp):
                for w in range(width):
                    place("zeroinitializer", p, w, k)

    # ---- one job ----------------------------------------------------------------------------
    def body(self, mc: int, active: int) -> str:
        """``void (ptr a, ptr b, ptr c, ptr ap, ptr bp)``: one job of ``mc`` rows, batch
        vector of ``active`` lanes, at the given bases."""
        name, f = self.function(
            ("job", mc, active),
            "ptr noalias %a, ptr noalias %b, ptr noalias %c, ptr noalias %ap, ptr noalias %bp",
        )
        if f is None:
            return name
        k = self.spec.k
        # K blocks: the first one writes (beta), the last one applies ReLU
        for count, kc, first in _parts(k, self.spec.kc):
            if count <= 2:
                for index in range(count):
                    k0 = first + index * kc
                    self.k_block(f, mc, active, k0, kc, k0 == 0, k0 + kc == k)
                continue
            self.k_block(f, mc, active, first, kc, first == 0, False)

            def middle(i: str | int, kc: int = kc, first: int = first) -> None:
                k0 = f.add_i64(first + kc, f.mul_i64(i, kc))
                self.k_block(f, mc, active, k0, kc, False, False)

            _each(f, count - 2, middle, "kb")
            last = first + (count - 1) * kc
            self.k_block(f, mc, active, last, kc, False, last + kc == k)
        f.finish()
        return name

    def k_block(
        self,
        f: FunctionBuilder,
        mc: int,
        active: int,
        k0: str | int,
        kc: int,
        first: bool,
        last: bool,
    ) -> None:
        """Pack in0's rows for K steps [k0, k0 + kc), then every block of in1's columns."""
        spec = self.spec
        self.pack(f, "%ap", "%a", mc, MR, spec.m_in0, spec.k_in0, k0, kc, active)
        micro = (spec.beta if first else 1, spec.relu and last, active)
        for count, nc, first_n in _parts(spec.n, spec.nc):

            def n_block(j: str | int, nc: int = nc, first_n: int = first_n) -> None:
                n0 = f.add_i64(first_n, f.mul_i64(j, spec.nc))
                b = f.gep(self.t, "%b", f.mul_i64(n0, spec.n_in1))
                self.pack(f, "%bp", b, nc, NR, spec.n_in1, spec.k_in1, k0, kc, active)
                c = f.gep(self.t, "%c", f.mul_i64(n0, spec.n_out))
                self.panels(f, mc, nc, kc, c, micro)

            _each(f, count, n_block, "nb")

    def panels(
        self, f: FunctionBuilder, mc: int, nc: int, kc: int, c: str, micro: tuple[int, bool, int]
    ) -> None:
        """The micro-kernel over every (row panel, column panel) of the packed blocks, column
        panels outermost: each of in1's micro-panels stays in L1 while in0's stream past."""
        spec, lanes = self.spec, self.lanes
        panel_a, panel_b = MR * _padded(kc) * lanes, NR * _padded(kc) * lanes
        steps = _padded(kc) // K_UNROLL
        for count_q, cols, first_q in _parts(nc, NR):

            def column(q: str | int, cols: int = cols, first_q: int = first_q) -> None:
                index = f.add_i64(first_q // NR, q)
                b = f.gep(self.t, "%bp", f.mul_i64(index, panel_b))
                c_column = f.gep(self.t, c, f.mul_i64(f.mul_i64(index, NR), spec.n_out))
                for count_r, rows, first_r in _parts(mc, MR):
                    kernel = self.micro(rows, cols, *micro)

                    def row(r: str | int, first_r: int = first_r, kernel: str = kernel) -> None:
                        index = f.add_i64(first_r // MR, r)
                        a = f.gep(self.t, "%ap", f.mul_i64(index, panel_a))
                        c_block = f.gep(
                            self.t, c_column, f.mul_i64(f.mul_i64(index, MR), spec.m_out)
                        )
                        f.emit(f"call void @{kernel}(ptr {a}, ptr {b}, ptr {c_block}, i64 {steps})")

                    _each(f, count_r, row, "rp")

            _each(f, count_q, column, "cp")

    # ---- the nest function ------------------------------------------------------------------
    def emit(self, target: Target) -> None:
        spec, t = self.spec, self.t
        probes = ' "probe-stack"="inline-asm"' if target.is_x86 else ""
        f = FunctionBuilder(
            self.module,
            f"define void @{self.name}(ptr noalias %in0, ptr noalias %in1, "
            f"ptr noalias %out, i64 %lo, i64 %hi, ptr %first, ptr %last) nounwind{probes}",
        )
        kcp = _padded(spec.kc)
        rows = -(-min(spec.mc, spec.m) // MR) * MR
        cols = -(-spec.nc // NR) * NR
        f.entry_alloca(f"%ap = alloca {t}, i64 {rows * kcp * self.lanes}, align 64")
        f.entry_alloca(f"%bp = alloca {t}, i64 {cols * kcp * self.lanes}, align 64")
        groups, m_blocks = spec.groups, spec.m_blocks
        full_groups = spec.batch // self.lanes
        tail_rows = spec.m - (m_blocks - 1) * spec.mc

        def job(index: str) -> None:
            # batch vectors fastest: consecutive jobs (one thread's slice) share in0's lines
            rest = index
            group = f.assign(f"urem i64 {rest}, {groups}", "j")
            rest = f.assign(f"udiv i64 {rest}, {groups}", "j")
            block = f.assign(f"urem i64 {rest}, {m_blocks}", "j")
            rest = f.assign(f"udiv i64 {rest}, {m_blocks}", "j")
            offsets: list[str | int] = [
                f.mul_i64(group, self.lanes),
                f.mul_i64(group, self.lanes),
                f.mul_i64(group, self.lanes),
            ]
            row = f.mul_i64(block, spec.mc)
            offsets[0] = f.add_i64(offsets[0], f.mul_i64(row, spec.m_in0))
            offsets[2] = f.add_i64(offsets[2], f.mul_i64(row, spec.m_out))
            for size, s0, s1, so in reversed(spec.outer):
                position = f.assign(f"urem i64 {rest}, {size}", "j")
                rest = f.assign(f"udiv i64 {rest}, {size}", "j")
                for i, stride in enumerate((s0, s1, so)):
                    offsets[i] = f.add_i64(offsets[i], f.mul_i64(position, stride))
            pointers = ("%in1", "%in0", "%out") if spec.swapped else ("%in0", "%in1", "%out")
            bases = [f.gep(t, base, offsets[i]) for i, base in enumerate(pointers)]

            def run(mc: int, active: int) -> Callable[[], None]:
                def call() -> None:
                    body = self.body(mc, active)
                    f.emit(
                        f"call void @{body}(ptr {bases[0]}, ptr {bases[1]}, ptr {bases[2]}, "
                        "ptr %ap, ptr %bp)"
                    )

                return call

            def by_rows(active: int) -> Callable[[], None]:
                def choose() -> None:
                    if tail_rows == spec.mc or m_blocks == 1:
                        run(min(spec.mc, spec.m), active)()
                        return
                    last = f.assign(f"icmp eq i64 {block}, {m_blocks - 1}", "c")
                    f.when(last, run(tail_rows, active), run(spec.mc, active))

                return choose

            if full_groups == groups:
                by_rows(self.lanes)()
            elif full_groups == 0:
                by_rows(spec.batch)()
            else:
                partial = f.assign(f"icmp eq i64 {group}, {full_groups}", "c")
                f.when(partial, by_rows(spec.batch - full_groups * self.lanes), by_rows(self.lanes))

        f.range_loop("%lo", "%hi", job, "job")
        f.finish()


def lane_function(spec: LaneSpec, target: Target, module: Module, name: str) -> None:
    """Add ``void name(in0, in1, out, lo, hi, first, last)`` running jobs [lo, hi) of
    ``spec`` (the flag pointers are unused)."""
    _LaneEmitter(spec, module, name).emit(target)
