"""Choosing the kernel for each primitive of a configuration from the strides of its tile.

A tile primitive becomes a BRGEMM or unary kernel when its strides fit a kernel layout (a unit
stride where the kernel needs one, leading dimensions that keep columns apart), possibly inside
a few loops over tile axes the kernel does not cover; otherwise it becomes the generic scalar
primitive, and the reason is recorded for ``explain()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from teir.codegen.brgemm import lane_fill
from teir.codegen.generic import GenericAxis, GenericSpec
from teir.codegen.specs import BrgemmSpec, KernelError, UnaryOp, UnarySpec
from teir.codegen.target import Target, cache_sizes, l3_share
from teir.codegen.transpose import LINE_BYTES, crowded_columns
from teir.ir import Config, DimType, PrimLast, PrimMain, Schedule, Tensor
from teir.ir.layout import is_injective


@dataclass(frozen=True)
class TileLoop:
    """A loop inside a tile primitive, around its kernel: size and stride per tensor."""

    size: int
    strides: tuple[int, int, int]


@dataclass(frozen=True)
class TileOp:
    """One primitive applied to a tile.

    ``spec`` is the kernel; ``operands`` says which tensor's tile pointer feeds each kernel
    argument (BRGEMM: A, B, C; unary: A, B; generic: in0, in1, out); ``loops`` run around it.
    """

    spec: BrgemmSpec | UnarySpec | GenericSpec
    operands: tuple[Tensor, ...]
    loops: tuple[TileLoop, ...] = ()
    note: str = ""

    @property
    def kind(self) -> str:
        if isinstance(self.spec, BrgemmSpec):
            return "brgemm"
        return "unary" if isinstance(self.spec, UnarySpec) else "generic"

    def describe(self) -> str:
        text = self.spec.name
        if self.loops:
            text += " inside loops " + " x ".join(str(loop.size) for loop in self.loops)
        if self.operands and self.kind == "brgemm" and self.operands[0] is Tensor.IN1:
            text += " (operands swapped: out has unit stride on N)"
        return text + (f" [generic: {self.note}]" if self.note else "")


@dataclass(frozen=True)
class _Axis:
    size: int
    strides: tuple[int, int, int]
    dim_type: DimType


def _dtype(config: Config) -> str:
    return config.data_type.short


def _prim_axes(schedule: Schedule, types: tuple[DimType, ...]) -> list[_Axis]:
    return [
        _Axis(schedule.dim_sizes[a], schedule.axis_strides(a), schedule.dim_types[a])
        for a in schedule.prim_axes
        if schedule.dim_types[a] in types
    ]


def _generic(
    config: Config, op: str, axes: list[_Axis], note: str, injective: bool = True
) -> TileOp:
    """The generic scalar primitive on ``axes``. Where the output tile is ``injective``
    (no two elements alias, so the order of updates cannot matter), its loops run with the
    output's strides decreasing inward: the innermost one writes the nearest elements and a
    column of in0 is read from lines that stay in L1 for the next one. ij->ji 1024^2 FP32
    into every other element of a wider output, 2 threads, in tiles of 64 x 1024: 8.1 ms in
    the listed order (in0's unit stride innermost, every store on another line) -> 1.0 ms
    (NumPy's copyto 3.7 ms)."""
    if injective:
        axes = sorted(axes, key=lambda a: -a.strides[Tensor.OUT.value])
    generic_axes = tuple(
        GenericAxis(a.size, *a.strides, summed=a.dim_type is DimType.K) for a in axes
    )
    return TileOp(
        GenericSpec(_dtype(config), op, generic_axes),
        (Tensor.IN0, Tensor.IN1, Tensor.OUT),
        note=note,
    )


def _injective(axes: list[_Axis], tensor: Tensor) -> bool:
    return bool(is_injective([a.size for a in axes], [a.strides[tensor.value] for a in axes]))


def contraction_op(config: Config, beta: int, resident: bool = False) -> TileOp:
    """The GEMM/BRGEMM of ``config`` as a kernel on its tile (``beta=0`` fuses a Zero;
    ``resident``: the output's memory is reused call after call, see ``_streams_output``)."""
    s = config.schedule
    axes = _prim_axes(s, (DimType.M, DimType.N, DimType.K))
    m_axis = next(a for a in axes if a.dim_type is DimType.M)
    n_axis = next(a for a in axes if a.dim_type is DimType.N)
    k_axes = [a for a in axes if a.dim_type is DimType.K]  # BRGEMM: batch-reduce axis first
    if not _injective([m_axis, n_axis], Tensor.OUT):
        return _generic(config, "contract", axes, "the output tile aliases itself", False)
    for swapped in (False, True):
        op = _brgemm(config, m_axis, n_axis, k_axes, beta, swapped, resident)
        if op is not None:
            return op
    return _generic(
        config,
        "contract",
        axes,
        "no unit stride fits a kernel layout (out needs unit stride on M or N, "
        "in0/in1 on M or K / K or N)",
    )


def _unit(axis: _Axis, tensor: Tensor) -> bool:
    return axis.size == 1 or axis.strides[tensor.value] == 1


def _brgemm(
    config: Config,
    m_axis: _Axis,
    n_axis: _Axis,
    k_axes: list[_Axis],
    beta: int,
    swapped: bool,
    resident: bool,
) -> TileOp | None:
    """A BRGEMM kernel for the tile if its strides fit one of the kernel layouts."""
    # Swapped: C^T = B^T A^T, so the kernel's M is the config's N and A is in1.
    if swapped:
        m_axis, n_axis = n_axis, m_axis
        a_tensor, b_tensor = Tensor.IN1, Tensor.IN0
    else:
        a_tensor, b_tensor = Tensor.IN0, Tensor.IN1
    k_axis = k_axes[-1]
    m, n, k = m_axis.size, n_axis.size, k_axis.size
    if not _unit(m_axis, Tensor.OUT):
        return None
    ldc = n_axis.strides[Tensor.OUT.value] if n > 1 else m
    a, b = a_tensor.value, b_tensor.value
    # (transposed, leading dimension) candidates: unit stride on the row index, or on the
    # column index (a transposed operand); a size-1 dimension's stride does not matter.
    a_layouts = []
    if _unit(m_axis, a_tensor):
        a_layouts.append((False, k_axis.strides[a] if k > 1 else m))
    if _unit(k_axis, a_tensor):
        a_layouts.append((True, m_axis.strides[a] if m > 1 else k))
    b_layouts = []
    if _unit(k_axis, b_tensor):
        b_layouts.append((False, n_axis.strides[b] if n > 1 else k))
    if _unit(n_axis, b_tensor):
        b_layouts.append((True, k_axis.strides[b] if k > 1 else n))
    batch, stride_a, stride_b = 1, 0, 0
    if len(k_axes) == 2:
        batch = k_axes[0].size
        stride_a, stride_b = k_axes[0].strides[a], k_axes[0].strides[b]
    # Vectors run along M (A not transposed) or along K (A transposed): prefer the direction
    # that fills more vector lanes, e.g. a dot product (m = 1) vectorizes along K.
    lanes = Target.host().lanes(config.data_type.itemsize)

    a_layouts.sort(
        key=lambda layout: -(lane_fill(k, lanes) * 0.9 if layout[0] else lane_fill(m, lanes))
    )
    streamed = beta == 0 and _streams_output(config, resident)
    for trans_a, lda in a_layouts:
        for trans_b, ldb in b_layouts:
            if 0 in (lda, ldb, ldc):
                continue  # a zero stride (broadcast) is no leading dimension (0 means tight)
            try:
                spec = BrgemmSpec(
                    _dtype(config),
                    m,
                    n,
                    k,
                    batch,
                    trans_a,
                    trans_b,
                    lda,
                    ldb,
                    ldc,
                    stride_a,
                    stride_b,
                    beta,
                    stream_c=streamed,
                    c_beyond_caches=streamed and _output_beyond_caches(config),
                )
            except KernelError:
                continue  # leading dimensions that let columns overlap
            return TileOp(spec, (a_tensor, b_tensor, Tensor.OUT))
    return None


# Outputs summed over fewer K steps per element are written fast enough to be bound by memory,
# and one that fits in the last level is left there (FP32 outer product 2048², 16 MiB: 49 ->
# 14 GFLOP/s streamed, rewriting it in DRAM each call).
STREAM_LEAST_DEPTH = 32


def _streams_output(config: Config, resident: bool) -> bool:
    """Whether the kernel should store C around the caches: each output tile is written once
    (no K loop around the kernel, no last-touch op reading it back), and either

    - into an output of more than twice the last-level cache, which no later reader finds in
      cache anyway (the tensor-train tree's 1.35 GiB result), or
    - into a ``resident`` output (memory reused call after call: an einsum tree's arena, a
      user's ``out``) of more than twice this process's share of it (``l3_share``): FP64
      outputs of 128 MiB on 2 threads, K 1 4.3 -> 3.3 ms, K 8 6.0 -> 3.4 ms, K 40 22 -> 15
      ms, K 128 31 -> 25 ms; GETD's 95 MiB FP32 intermediate (K 40) 40 -> 7 ms. A fresh
      allocation is not resident: its pages arrive zeroed through the caches, and streaming
      past them doubles the writes (the same outputs as new arrays: 12 -> 24-26 ms). A
      product summing nothing (K 1: an outer product) writes its output at the store rate,
      and the last level keeps more of it from one call to the next than the share: it
      streams beyond ``PRODUCT_RESIDENT_SHARES`` shares (below), or
    - summed over at least ``STREAM_LEAST_DEPTH`` K steps per element, and at least a
      quarter of what the contraction reads and writes, all of which takes more than half
      the last level (shared with the other cores): there the stores' line reads
      and write-backs cost more than a later reader loses (FP64, 2 threads: 64 GEMMs of
      128³, 25 MiB, 2.9 -> 2.5 ms, then 3.0 -> 2.8 ms with a sum over the result; attention
      scores 4x8x256x256x64 84 -> 112 GFLOP/s; 16 such GEMMs, 6 MiB, 0.62 ms either way)."""
    s = config.schedule
    if config.prim_last is not PrimLast.NONE:
        return False
    outside = [a for a in range(len(s.dim_types)) if a not in s.prim_axes]
    if any(s.dim_types[a] is DimType.K for a in outside):
        return False
    if _output_beyond_caches(config):
        return True
    elements = _output_elements(config)
    itemsize = config.data_type.itemsize
    depth = prod(size for size, t in zip(s.dim_sizes, s.dim_types) if t is DimType.K)
    shares = PRODUCT_RESIDENT_SHARES if depth == 1 else 2
    if resident and output_outgrows_share(elements, itemsize, shares):
        return True
    read = sum(
        prod(size for size, stride in zip(s.dim_sizes, s.strides(tensor)) if stride)
        for tensor in (Tensor.IN0, Tensor.IN1)
    )
    moved = (read + elements) * itemsize
    return (
        depth >= STREAM_LEAST_DEPTH
        and elements * itemsize * 4 >= moved
        and moved > cache_sizes()["L3"] // 2
    )


def _output_elements(config: Config) -> int:
    s = config.schedule
    return prod(size for size, t in zip(s.dim_sizes, s.dim_types) if t is not DimType.K)


def _output_beyond_caches(config: Config) -> bool:
    return output_outgrows_cache(_output_elements(config), config.data_type.itemsize)


# A resident output of a product summing nothing streams beyond this many L3 shares: Zen 4
# (32 MiB L3, 12 MiB share), 2 threads, alternating processes, into an out, in the machine's
# two memory phases: i,j->ij FP64 2048² (32 MiB) 1.18 -> 0.42 and 0.60 -> 0.31 ms stored
# normally, 2400² (44 MiB) 1.62 -> 0.77-0.82 and 0.82 -> 0.47 ms; FP32 2896² (32 MiB) 1.18 ->
# 0.29 ms. Summing over K 2 to 8 (2048² FP64) gains in one phase what it loses in the other,
# and K 40 loses the longer row blocks (primitive.py) that streamed outputs get (3.3 -> 3.8 ms)
PRODUCT_RESIDENT_SHARES = 4


def output_outgrows_share(elements: int, itemsize: int, shares: int = 2) -> bool:
    """Whether an output of ``elements`` is more than ``shares`` times this process's share
    of the last level (``l3_share``): a VM's few CPUs see the socket's L3 (480 MiB on the
    Xeon) but find data beyond a few tens of MiB in memory."""
    return elements * itemsize > shares * l3_share()


def output_outgrows_cache(elements: int, itemsize: int) -> bool:
    """Whether an output of ``elements`` is more than twice the last-level cache: no later
    reader finds it there, so a tile written once is stored around the caches."""
    return elements * itemsize > 2 * cache_sizes()["L3"]


# columns at least this long stream even where the next tile continues them (_streams_copy):
# the transposed kernel shifts rows of 8 or more 64-byte vectors onto line boundaries
LONG_COLUMN_BYTES = 512
# transposed columns up to this long, continued by the next tile, are joined to it
# (UnarySpec.joined): 2 threads, NumPy's 16-byte offsets, ijkl->lkji 48^4 FP64 (384-byte
# columns) 31 -> 41-56 GB/s, 64^4 28 -> 35, ijklm->mlkji 24^5 28 -> 36-43, FP32 lkji 48^4
# 30-37 -> 40-41, 64^4 18-20 -> 24-25; longer ones gained nothing and lost up to 25 %
# (ijklm->ikmjl 24^5 FP64, 288-element columns in runs: 22 -> 16.5 GB/s on one thread)
JOINED_COLUMN_BYTES = 1024


def _streams_copy(config: Config, rows: int, ldb: int, transposed: bool, joinable: bool) -> bool:
    """Whether a Copy/ReLU whose tile has columns of ``rows`` elements, ``ldb`` apart (read
    from in0 ``transposed`` or not), should store its output around the caches (measured on
    the permutation suite, 2 cores):

    - input and output together fill the last-level cache, so the output would not stay
      there for a later reader anyway (and nothing reads it back: no last-touch op);
    - a column is whole cache lines, so no line is shared with the next tile's regular
      stores (24^5 ijklm->mlkji, 96-byte columns: 24 -> 21 GB/s streamed), or a long
      transposed one (below), which the kernel shifts onto lines: only its masked end
      vectors, stored normally, touch the lines it shares (ij->ji 1000 x 4096 FP64,
      250-element columns: 32 -> 54 GB/s streamed; columns no whole number of lines apart,
      each shifted on its own: ij->ji 3000^2 FP32 2.0 -> 8.9 GB/s, 1500 x 2250 2.0 -> 8.8);
    - the innermost loop does not continue short columns: a tile that extends the previous
      one's columns is written as sequential streams the caches already handle well
      (ijkl->ljki 48^4: 21 -> 18 GB/s streamed), while scattered columns gain the most
      (ijk->ikj: 34 -> 48, ijkl->lkji 48^4: 30 -> 34, 64^4: 18 -> 22 GB/s). Columns of
      LONG_COLUMN_BYTES or more stream either way: a transposed tile's are stored in
      aligned whole lines whatever the output's alignment (ijk->kji 256x256x64 FP32, one
      256-element column per tile: 22 -> 37 GB/s streamed), and so do transposed columns
      of two 64-byte vectors or more that the kernel shifts each on its own (no whole number
      of lines apart): regular stores there are scattered over partial lines, each read for
      ownership (ijk->kji 97x301x257 FP32: 3.8 -> 7.3 GB/s, ijkl->ljki 37x41x43x47: 2.8 ->
      8.5; on 32-byte vectors the kernel shifts nothing and streams only aligned vectors).
    - transposed columns that the kernel joins to the next tile's (``joinable``) stream
      whatever their length and whichever loop continues them: only the two ends of the
      run of joined tiles are stored normally (2 threads, NumPy's arrays: ijklm->mlkji 24^5
      FP32, 96-byte columns, 24 -> 31 GB/s; abcde->ebdca 20x30x24x16x40 FP64 22 -> 32-41,
      FP32 26 -> 31-33; abcdef->fedcba 12^6 FP64 31-34 -> 43; eight random permutations
      whose plans changed, 1.1-1.9x).
    """
    if config.prim_last is not PrimLast.NONE:
        return False
    s = config.schedule
    if joinable:
        elements, itemsize = prod(s.dim_sizes), config.data_type.itemsize
        return copy_outgrows_cache(elements, itemsize) or crowded_beyond_l2(
            ldb, transposed, elements, itemsize
        )
    prims = s.prim_axes
    loops = [a for a in range(len(s.dim_types)) if a not in prims and s.dim_sizes[a] > 1]
    continued = bool(loops) and abs(s.strides(Tensor.OUT)[loops[-1]]) == rows
    return streams_columns(
        rows, ldb, transposed, continued, prod(s.dim_sizes), config.data_type.itemsize
    )


def _joinable(config: Config, rows: int, ldb: int, transposed: bool) -> bool:
    """Whether a streamed tile with transposed columns of ``rows`` elements, ``ldb`` apart,
    is joined to the next tile along them (``UnarySpec.joined``): columns of a vector to
    JOINED_COLUMN_BYTES, continued by a loop, all a whole number of lines apart (shifted
    alike) or each shifted on its own (below)."""
    itemsize = config.data_type.itemsize
    aligned = (ldb * itemsize) % LINE_BYTES == 0
    if not aligned:
        # columns no whole number of lines apart, each shifted on its own (from two vectors
        # on), are joined only where in0 and out outgrow the last-level cache: 2 threads,
        # ijkl->ljki 37x41x43x47 FP64 (24 MB each) 35-45 -> 48-54 GB/s, ij->ji 2045x3411
        # FP32 36-50 -> 46-49, but abc->cba 103x111x93 FP64 (8.5 MB) 62 -> 55
        elements = prod(config.schedule.dim_sizes)
        if rows * itemsize < 2 * LINE_BYTES or 2 * elements * itemsize <= cache_sizes()["L3"]:
            return False
    return (
        transposed
        and LINE_BYTES <= rows * itemsize <= JOINED_COLUMN_BYTES
        and _continued(config, rows)
    )


def _continued(config: Config, rows: int) -> bool:
    """Whether a loop of ``config`` steps the output by ``rows`` elements: the next tile
    along it continues the tile's columns of that length (``UnarySpec.joined``)."""
    s = config.schedule
    prims = s.prim_axes
    strides = s.strides(Tensor.OUT)
    return any(
        strides[a] == rows for a in range(len(s.dim_types)) if a not in prims and s.dim_sizes[a] > 1
    )


def streams_columns(
    rows: int, ldb: int, transposed: bool, continued: bool, elements: int, itemsize: int
) -> bool:
    """``_streams_copy`` for a tile of columns of ``rows`` elements ``ldb`` apart, the next
    tile ``continued`` along them or not, of a copy of ``elements``."""
    # a long transposed column is shifted onto the lines by the kernel (all columns alike on
    # line-aligned leading dimensions, each on its own otherwise), whose masked end vectors
    # are the only stores to lines it shares
    own_shifts = (
        transposed and (ldb * itemsize) % LINE_BYTES != 0 and rows * itemsize >= 2 * LINE_BYTES
    )
    shifted = (transposed and rows * itemsize >= LONG_COLUMN_BYTES) or own_shifts
    if (rows * itemsize) % LINE_BYTES and not shifted:
        return False
    if crowded_beyond_l2(ldb, transposed, elements, itemsize):
        return True
    short = rows * itemsize < LONG_COLUMN_BYTES and not own_shifts
    if short and continued:
        return False
    return copy_outgrows_cache(elements, itemsize)


def crowded_beyond_l2(ldb: int, transposed: bool, elements: int, itemsize: int) -> bool:
    """Whether a transposed tile's columns, ``ldb`` apart, crowd an L1 set
    (``crowded_columns``) in a copy of ``elements`` that outgrows a core's L2. Its output is
    then streamed even within the last-level cache: regular stores read every line for
    ownership into the one set (1024^2 FP32 one thread in 64 x 1024 tiles: 19-30 GB/s
    stored normally, 43 streamed before the tile change; 512^2 FP32 59 -> 70)."""
    lanes = Target.host().lanes(itemsize)
    return (
        transposed
        and crowded_columns(ldb * itemsize, lanes)
        and 2 * elements * itemsize > cache_sizes()["L2"]
    )


def copy_outgrows_cache(elements: int, itemsize: int) -> bool:
    """Whether a copy of ``elements`` reads and writes more than a core's own L2 holds (or
    this process's share of the last-level cache, where that is smaller): its tensors then
    come from beyond the core, where tiles decide the traffic. A shared L3 answered a
    copy's scattered lines at about DRAM's rate on a 2-vCPU Xeon, whose 105 MiB L3 other
    tenants share (copy probe, one thread: 54 GB/s at 0.5 MiB, 18 at 3 MiB, 12-19 at 16),
    so copies planned as in memory ran faster from just past L2 on (FP32, 2 threads, in one
    process: ij->ji 724^2 4.7 -> 12.5 GB/s, 1000^2 3.2 -> 10.7, 1500^2 9.2 -> 12.5, ijk->kji
    100^3 3.3 -> 14.6, ijkl->ljki 30^4 4.1 -> 15.6; at 512^2, 2 MiB in all, 11.9 -> 9.4) and
    from 32 MiB on by 3-4x (ij->ji 2048^2 6 -> 19 GB/s, ijklm->ikmjl 24^5 3.7 -> 14).
    Where the L3 is near (``Target.near_l3``: Zen 4's answers at several times DRAM's
    rate), only this process's share of it counts: planned in memory from just past L2 on,
    copies ran at about half the rate (2 threads, alternating processes: ij->ji 724^2 FP32
    56 -> 97 GB/s, FP64 56 -> 135, 1000^2 FP32 50 -> 87, ijkl->ljki 30^4 53 -> 98)."""
    sizes = cache_sizes()
    limit = min(sizes["L3"], l3_share())
    if not Target.host().near_l3:
        limit = min(limit, sizes["L2"])
    return 2 * elements * itemsize > limit


def _fuse(axes: list[_Axis], tensors: tuple[Tensor, ...]) -> list[_Axis]:
    """Drop size-1 axes, order by out stride and merge neighbours that are stride-coherent in
    every tensor of ``tensors`` (outer stride = inner size * inner stride)."""
    out = Tensor.OUT.value
    remaining = sorted((a for a in axes if a.size > 1), key=lambda a: a.strides[out])
    fused: list[_Axis] = []
    for axis in remaining:
        if fused:
            inner = fused[-1]
            if all(axis.strides[t.value] == inner.size * inner.strides[t.value] for t in tensors):
                fused[-1] = _Axis(inner.size * axis.size, inner.strides, inner.dim_type)
                continue
        fused.append(axis)
    return fused


def _runs(fused: list[_Axis]) -> _Axis | None:
    """The transposed tile's output column when it spans two axes: the row (out's unit
    stride) and the next axis, which continues it in out but not in in0, whose unit stride
    is on the axis after them. Returned as one axis of their total size whose in0 stride is
    the outer axis's (the kernel reads in0's rows in runs of the row's size); None otherwise."""
    out, src = Tensor.OUT.value, Tensor.IN0.value
    if len(fused) < 3:
        return None
    row, outer, column = fused[0], fused[1], fused[2]
    if outer.strides[out] != row.size or column.strides[src] != 1:
        return None
    if row.strides[src] <= 1 or outer.strides[src] <= 1:
        return None
    strides = list(outer.strides)
    strides[out] = 1
    return _Axis(row.size * outer.size, (strides[0], strides[1], strides[2]), row.dim_type)


def unary_op(config: Config, op: UnaryOp, in_place: bool) -> TileOp:
    """Zero or in-place ReLU on the output tile (``in_place``), or Copy/ReLU from in0."""
    s = config.schedule
    axes = _prim_axes(s, (DimType.C, DimType.M, DimType.N))
    generic_op = {
        UnaryOp.ZERO: "zero",
        UnaryOp.COPY: "copy",
        UnaryOp.RELU: "relu_inplace" if in_place else "relu",
    }[op]
    tensors = (Tensor.OUT,) if in_place or op is UnaryOp.ZERO else (Tensor.IN0, Tensor.OUT)
    if not _injective(axes, Tensor.OUT):
        return _generic(config, generic_op, axes, "the output tile aliases itself", False)
    fused = _fuse(axes, tensors)
    out, src = Tensor.OUT.value, Tensor.IN0.value
    dtype = _dtype(config)
    if not fused:
        spec = UnarySpec(dtype, op, 1, 1, in_place=in_place and op is UnaryOp.RELU)
        return TileOp(spec, (Tensor.IN0, Tensor.OUT) if spec.reads_a else (Tensor.OUT, Tensor.OUT))
    row = fused[0]
    if row.strides[out] != 1:
        return _generic(config, generic_op, axes, "out has no unit stride in the tile")
    reads = op is not UnaryOp.ZERO and not in_place
    runs = _runs(fused) if reads else None
    if runs is not None:  # out's column spans two axes, read from in0 in runs
        fused = [runs, *fused[2:]]
    column = fused[1] if len(fused) > 1 else None
    loops = tuple(TileLoop(a.size, a.strides) for a in reversed(fused[2:]))
    m = row.size if runs is None else runs.size
    n = column.size if column else 1
    ldb = column.strides[out] if column else m
    trans_a, lda = False, 0
    if reads:
        if row.strides[src] == 1:
            lda = column.strides[src] if column else m
        elif column is not None and column.strides[src] == 1:
            trans_a, lda = True, row.strides[src]
        else:
            return _generic(config, generic_op, axes, "in0 has no unit stride in the tile")
    if ldb == 0 or (reads and lda == 0):
        return _generic(config, generic_op, axes, "a zero stride (broadcast) in the tile")
    joinable = reads and _joinable(config, m, ldb, trans_a)
    stream_b = reads and _streams_copy(config, m, ldb, trans_a, joinable)
    joined = stream_b and joinable and not loops
    try:
        spec = UnarySpec(
            dtype,
            op,
            m,
            n,
            lda,
            ldb,
            trans_a,
            in_place and op is UnaryOp.RELU,
            stream_b=stream_b,
            m_inner=0 if runs is None else row.size,
            lda_outer=0 if runs is None else fused[0].strides[src],
            joined=joined,
        )
    except KernelError:
        return _generic(config, generic_op, axes, "leading dimensions let columns overlap")
    operands = (Tensor.IN0, Tensor.OUT) if reads else (Tensor.OUT, Tensor.OUT)
    return TileOp(spec, operands, loops)


def main_op(
    config: Config, fuse_zero: bool, resident: bool = False
) -> tuple[TileOp | None, TileOp | None]:
    """The main primitive as (accumulating op, op with a fused Zero or None)."""
    main = config.prim_main
    if main.is_contraction:
        fused = contraction_op(config, 0, resident) if fuse_zero else None
        return contraction_op(config, 1), fused
    if main is PrimMain.COPY:
        return unary_op(config, UnaryOp.COPY, False), None
    if main is PrimMain.RELU:
        return unary_op(config, UnaryOp.RELU, False), None
    return None, None
