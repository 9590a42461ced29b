"""LLVM IR for BRGEMM micro-kernels: ``C (+)= sum_i A_i B_i`` with every size a constant.

Three register-blocked forms, chosen by which operand has unit stride where:

- ``outer`` (A unit stride on M, either B): vectors of C along M held in registers, A loaded
  as vectors, B broadcast as scalars; one FMA per (vector, column) and k.
- ``dot`` (A and B unit stride on K): vectors along K, each (m, n) accumulated as a dot
  product and reduced once at the end.
- ``mirror`` (B unit stride on N; A unit stride on K, or on M where M fills few lanes): the
  ``outer`` form of C^T = B^T A^T, vectors along N, written back to the column-major C.

The accumulators stay in registers over the whole batch and the K loop (unrolled); M tails use
masked loads and stores, N tails a block with fewer columns. Batches are processed in chunks so
that what the sweep over all register blocks reads again of the chunk's A_i and B_i stays in
cache; the next call's tiles, where the nest says which, are prefetched a few lines per round
of the blocks' K loops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from teir.codegen.irtext import (
    NONTEMPORAL,
    FunctionBuilder,
    Module,
    mask_constant,
    scalar_type,
    shuffle_mask,
    type_suffix,
    vector_type,
)
from teir.codegen.shuffles import transpose_vectors
from teir.codegen.specs import BrgemmSpec
from teir.codegen.target import Target, cache_sizes, l2_sets, l2_ways, probe_attribute
from teir.codegen.transpose import L1_WAYS, LINE_BYTES, set_crowding

K_UNROLL = 4
K_PIECE = 8
# A register block sums at most this many products per element (per lane in the dot form)
# before adding them to C: the batch chunk is cut to fit. Rounding error grows with the
# length of a chain of additions; two levels of at most a few thousand each keep FP32 sums of
# millions of products near NumPy's pairwise ones (``ik,kj->ij`` 4 x 10^6 x 4: relative error
# 4.9e-5 summed whole per thread, NumPy 1.1e-6).
SUM_CHAIN = 4096
# Pack A when its columns are at least this far apart, into a buffer of at most this size.
PACK_LEADING_BYTES = 4096
PACK_BUFFER_BYTES = 128 * 1024
# ... and at half that distance on cores with two full-width FMA pipes, which consume A's
# row blocks twice as fast as Zen 4 (one 512-bit FMA per cycle) while the sweep streams
# them from L2 (2 threads on a Xeon: FP32 1000^3 113 -> 160 GFLOP/s, ijab,abkl->ijkl
# 140 -> 161, FP64 ijk,jkl->il 48 -> 61, abc,bcd->ad 33 -> 36, ijk,kl->ijl 44 -> 41).
PACK_LEADING_BYTES_TWO_PIPES = 2048
PACK_MIN_COLUMNS = 16
# The widest register block, in columns.
MOST_COLUMNS = 16
# Packing the whole tile at once writes out this many vectors per k step at most (unrolled).
PACK_WHOLE_VECTORS = 48
# B's packing buffer takes at most this part of L1.
PACK_B_L1_PART = 8
# A batch chunk's elements may take at most this part of an L2 set's ways (``_l2_spread``).
L2_CHUNK_WAYS_PART = 4
# Cycles per broadcast of one B element. Zen 4 retires at most one broadcast load per cycle,
# though it runs two half-width FMAs.
BROADCAST_CYCLES = 1.0
# Cycles per half-width FMA where those are "free" (Zen 4 runs two per cycle, against one
# full-width FMA), counted above half: each reads its own A vector, for half the FLOPs, and
# a block of them tied on cycles with a full-width one that pads a few rows. Measured
# (2 threads, one variant per process): FP64 F-ordered `ac,cb->ab` 1100x562x486 (M tile
# 81) 71-73 -> 95-97 GFLOP/s, `ki,jk->ji` M 36 67-90 -> 101, M 84 78-97 -> 88-107, FP32
# M 116 131-133 -> 183-195, `abc,bcd->ad` FP64 97-103 -> 109-111; FP32 M 72 220 -> 201-204.
HALF_WIDTH_FMA_CYCLES = 0.6
# On cores with two full-width FMA pipes and two loads per cycle, a value loaded or broadcast
# costs about one FMA issue slot: in-L1 FP64 kernels on a Xeon ran 1 x 8-16 blocks at 79-87 %
# of peak, 2-5 vectors x 4-12 columns at 93-103 %; the 1000^3 GEMM's 40 x 200 x 100 kernel
# 1 x 12 66 % -> 3 x 8 91 %. Up to 24 accumulators (28 spilled) and 5 vectors.
TWO_PIPE_LOAD_SLOTS = 1.1
TWO_PIPE_ACCUMULATORS = 24
# ... and where A's rows stream from L2 (as they do in most sweeps), about 25 bytes per cycle
# arrive: a vector of A per this many slots. Blocks of few columns then starve (that kernel:
# 5 x 4 67-71 %, 4 x 6 68-75 %, 3 x 8 84-87 %, batch chunks of 5-10 elements).
TWO_PIPE_L2_VECTOR_SLOTS = 5.0
TWO_PIPE_MOST_VECTORS = 5
# A kernel in a loop nest may prefetch the next call's A and B (``Prefetch``): their lines
# spread over its register blocks, at most this many before each, into L2 (a batch of FP64
# 128³ GEMMs from memory, 64 x 384 KiB: 80 -> 111 GFLOP/s with its output streamed, out
# transposed 91 -> 97). Only tiles that fill most of their extent, and no more than this
# part of L2 with the tiles in use (the attention output's 640 KiB of next tiles: 95 -> 91).
PREFETCH_BURST = 64
# ... unless the block's K loop runs a few rounds: its lines are then spread over the loop's
# rounds, at most this many per unrolled round, so that they never take the line fill
# buffers the block's own loads of A from L2 wait for (a burst of 84 before each of the
# attention output's blocks, whose A streams from L2 for every column block: 2 threads,
# bhqk,bhkd->bhqd 4 x 8 x 256² x 64 FP32 0.78 -> 0.62-0.69 ms; 64 x 128³ batched GEMM FP32
# 0.74 -> 0.64-0.66 ms, FP64 1.48-1.52 -> 1.23-1.31 ms).
PREFETCH_PER_ROUND = 4
PREFETCH_L2_PART = 4
PREFETCH_LEAST_FILL = 0.75
# ... and only kernels with this many FMAs per line to prefetch: a shorter one finds the next
# tiles in cache (lab1_gemm's 32³ FP64 kernels in a K loop, 16 FMAs per line: 93 -> 66 % of
# peak with the prefetches, address arithmetic included, before each register block).
PREFETCH_LEAST_FMAS = 32
# A register block that adds its sums to C loads C's lines only when it stores them, after
# its K loop; where C comes from memory (each call's tile touched once, its columns pages
# apart where the hardware prefetchers do not follow), every block then waited for them.
# Prefetched before the K loop (with intent to write, into L1), they arrive while it runs:
# 1600^3 FP64 on 2 threads 225-229 -> 232-235 GFLOP/s, FP32 474-485 -> 496-500; lab2's
# 32^3 x 8 BRGEMM FP64 101-105 -> 115-128. Only blocks whose K loop runs this many steps
# (over the batch) hide the prefetches behind their arithmetic.
C_PREFETCH_LEAST_STEPS = 32


@dataclass(frozen=True)
class Prefetch:
    """Which of the kernel's inputs the next call reads elsewhere: the kernel then takes their
    next tiles as two more pointers, ``void name(ptr A, ptr B, ptr C, ptr PA, ptr PB)``, and
    prefetches them while it computes (``prefetch_lines`` says how much of each)."""

    a: bool
    b: bool


def prefetch_lines(spec: BrgemmSpec, prefetch: Prefetch) -> tuple[int, int]:
    """The cache lines of the next A and B tiles the kernel prefetches (0: none of that one):
    a tile is prefetched whole when it fills most of its extent (or each of its batch
    elements fills most of its own: :func:`prefetch_blocks`) and, with the one before it,
    fits its part of L2; none where the kernel is too short for them."""
    budget = cache_sizes()["L2"] // PREFETCH_L2_PART
    full_lanes = 64 // spec.itemsize  # the FMAs of 512-bit vectors
    fmas = spec.flops // (2 * full_lanes)
    lines = [0, 0]
    used = 0
    tiles = (
        (prefetch.a, spec.extent_a(), spec.m * spec.k * spec.batch),
        (prefetch.b, spec.extent_b(), spec.k * spec.n * spec.batch),
    )
    for index, (wanted, extent, elements) in enumerate(tiles):
        if not wanted:
            continue
        blocks = prefetch_blocks(spec, index)
        if blocks is not None:
            size = spec.batch * blocks[0] * LINE_BYTES
        elif elements >= PREFETCH_LEAST_FILL * extent:
            size = extent * spec.itemsize
        else:
            continue
        if used + size <= budget:
            used += size
            lines[index] = -(-size // LINE_BYTES)
    if fmas < PREFETCH_LEAST_FMAS * (lines[0] + lines[1]):
        return 0, 0
    return lines[0], lines[1]


def prefetch_blocks(spec: BrgemmSpec, index: int) -> tuple[int, int] | None:
    """(lines per batch element, bytes from one element to the next) where the tile of A
    (``index`` 0) or B (1) is prefetched a block per batch element: its elements lie apart
    (the tile fills less than ``PREFETCH_LEAST_FILL`` of its extent) but each one fills most
    of its own. GETD's root slab reads B as 10 blocks of 8000 bytes 200 KB apart; None
    where the tile is prefetched as one run of lines (or not at all)."""
    one = replace(spec, batch=1)
    extent, element_extent, stride = (
        (spec.extent_a(), one.extent_a(), spec.stride_a)
        if index == 0
        else (spec.extent_b(), one.extent_b(), spec.stride_b)
    )
    elements = spec.m * spec.k if index == 0 else spec.k * spec.n
    if spec.batch < 2 or elements * spec.batch >= PREFETCH_LEAST_FILL * extent:
        return None
    if elements < PREFETCH_LEAST_FILL * element_extent:
        return None
    return -(-element_extent * spec.itemsize // LINE_BYTES), stride * spec.itemsize


def prefetched_lines(
    spec: BrgemmSpec, blocking: Blocking, prefetch: Prefetch | None
) -> tuple[int, int]:
    """The lines of the next A and B tiles a kernel of this blocking prefetches: those of
    :func:`prefetch_lines`, spread over the register blocks of every chunk of the batch (a
    chunked kernel in a panel nest, ``abcd,dbef->acef`` 32^6 FP64 in chunks of 16, gains as
    much as an unchunked one); none where K is swept in pieces."""
    if prefetch is None or blocking.k_piece:
        return 0, 0
    return prefetch_lines(spec, prefetch)


@dataclass(frozen=True)
class _ChunkAhead:
    """The part of A the next chunk of the batch packs: ``runs`` runs of ``run_bytes``
    contiguous bytes, ``per_element`` of them ``run_stride`` elements apart in each batch
    element, the elements ``element_stride`` apart, from ``base``; ``lines``: the most cache
    lines one run touches."""

    base: str
    runs: int
    per_element: int
    run_stride: int
    element_stride: int
    run_bytes: int

    @property
    def lines(self) -> int:
        # from the last byte of a line, a run's last byte lies run_bytes - 1 further
        return (LINE_BYTES - 1 + self.run_bytes - 1) // LINE_BYTES + 1


@dataclass(frozen=True)
class Blocking:
    """A register block: ``vectors`` vector registers along the vectorized dimension, each of
    ``lanes`` elements, times ``columns`` of the other dimension; batches in ``chunk`` steps."""

    form: str
    lanes: int
    vectors: int
    columns: int
    chunk: int
    # Copy each row block's A (for the chunk) into a contiguous, lane-padded buffer first:
    # for A columns far apart in memory (many pages per block) that every column block reuses.
    pack_a: bool = False
    # Pack all row blocks of the chunk in one pass before the sweep (when they fit the
    # buffer): each column of A is then read as one run of the tile's rows, not one line per
    # row block, and the sweep runs column blocks outside so that B's block stays in L1
    # while every row block uses it (row-major FP64 97 x 1601 x 1000 on one core: 79 -> 85 %
    # of peak, 256 x 1024 x 1024: 81 -> 93 %, 64 x 4096 x 256: 79 -> 86 %; FP32 alike).
    pack_whole: bool = False
    # Sweep K in pieces of this many steps (0: all of K at once), C accumulating between them.
    k_piece: int = 0
    # Copy each column block's B (for the chunk) into a contiguous buffer first, one run of
    # ``b_row`` values per K step: for a B stored transposed whose K steps lie so far apart
    # that the lines one column block reads crowd an L1 set, while every row block rereads
    # them (see ``choose_blocking``).
    pack_b: bool = False

    @property
    def b_row(self) -> int:
        """Values per K step in B's packing buffer: the block's columns, in whole vectors."""
        return -(-self.columns // self.lanes) * self.lanes

    def a_buffer_bytes(self, spec: BrgemmSpec) -> int:
        if not self.pack_a:
            return 0
        padded = self.vectors * self.lanes
        # a shifted sweep (a streamed C) packs up to a vector's rows more, before the tile
        rows = spec.m + (self.lanes - 1 if spec.stream_c else 0)
        blocks = -(-rows // padded) if self.pack_whole else 1
        return self.chunk * spec.k * padded * blocks * spec.itemsize

    def b_buffer_bytes(self, spec: BrgemmSpec) -> int:
        return self.chunk * spec.k * self.b_row * spec.itemsize if self.pack_b else 0

    def stack_bytes(self, spec: BrgemmSpec) -> int:
        """The packing buffers' size: the kernel keeps them on the calling thread's stack."""
        return self.a_buffer_bytes(spec) + self.b_buffer_bytes(spec)


def pack_leading_bytes(target: Target) -> int:
    """How far apart A's columns must lie for the kernel to pack A (``Blocking.pack_a``)."""
    return PACK_LEADING_BYTES if target.half_width_is_free else PACK_LEADING_BYTES_TWO_PIPES


def _l2_spread(spec: BrgemmSpec, a_reused: bool, b_reused: bool) -> int:
    """The most batch elements whose reused A_i or B_i do not crowd L2's sets. Elements whose
    starts lie a multiple of L2's set period apart (batch strides of 1-2 MiB) fall into the
    same sets, and a chunk of more of them than ``l2_ways() // L2_CHUNK_WAYS_PART`` per set
    evicts itself while the sweep runs (FP32 ``trus,pqtu->pqrs`` kernel, A_i 16 KiB 1 MiB
    apart: 43 % of peak in chunks of 32, 71 % in 16, 85-86 % in 4-8; FP64, 2 MiB apart: 70 %
    in chunks of 8, 86 % in 4)."""
    period = l2_sets() * LINE_BYTES
    allowed = max(1, l2_ways() // L2_CHUNK_WAYS_PART)
    most = spec.batch
    for stride, reused in ((spec.stride_a, a_reused), (spec.stride_b, b_reused)):
        if reused and stride:
            # every `apart`-th element starts in the same set
            apart = period // math.gcd(stride * spec.itemsize, period)
            most = min(most, allowed * apart)
    return most


def _chunk_within(batch: int, chunk: int, limit: int) -> int:
    """The largest divisor of ``batch`` (one loop covers it) at most ``chunk`` and ``limit``."""
    return max(d for d in range(1, max(1, min(chunk, limit)) + 1) if batch % d == 0)


# A plain A runs the mirror form where N fills at least this many times the share of the
# vector lanes that M fills (see mirrors_plain_a).
MIRROR_FILL_GAIN = 2.0


def mirrors_plain_a(spec: BrgemmSpec, lanes: int) -> bool:
    """Whether a plain A (unit stride on M) runs the mirror form: B stored transposed (unit
    stride on N) and N filling at least twice the share of its vectors that M fills of the
    outer form's (M of 1 with N of 48: one lane of each FMA, against all of them; 2 threads,
    ecd,ceda->ad, its kernel 1 x 48 x 256 x 16: FP32 1.52 -> 0.49 ms, FP64 2.42 -> 1.10)."""
    return (
        spec.trans_b
        and not spec.trans_a
        and lane_fill(spec.n, lanes) >= MIRROR_FILL_GAIN * lane_fill(spec.m, lanes)
    )


# FMAs in flight that a dot product keeps the FMA pipes busy with (two pipes of four cycles'
# latency): a block of fewer dot products sums each over this many accumulator chains, or
# every FMA waits for the one before (FP64 i,i-> of 2M elements on one core, from L3: 52 GB/s
# against NumPy's 87).
DOT_FMAS_IN_FLIGHT = 8


def dot_chains(rows: int, cols: int, steps: int, registers: int) -> int:
    """Accumulator chains per dot product of a dot-form block of ``rows x cols`` products
    over ``steps`` vectors of K per batch element (step s of every element goes to chain
    s mod chains, so more chains than steps would stay empty), that fit ``registers`` with
    one step's loads."""
    block = rows * cols
    room = (registers - rows - cols) // block
    return max(1, min(-(-DOT_FMAS_IN_FLIGHT // block), steps, room))


def lane_fill(extent: int, lanes: int) -> float:
    """The share of the lanes that ``extent`` elements fill in vectors of ``lanes``."""
    return extent / (-(-extent // lanes) * lanes)


def b_steps_far_apart(spec: BrgemmSpec) -> bool:
    """Whether B is stored transposed (unit stride on N) with its K steps so far apart that
    the lines one column block reads crowd an L1 set."""
    return (
        spec.trans_b
        and spec.ldb * spec.itemsize >= PACK_LEADING_BYTES
        and set_crowding(spec.ldb * spec.itemsize, spec.k) > L1_WAYS
    )


# A tile of an output beyond the caches whose columns are not vector-aligned (stored normally,
# not around the caches) with more columns than this is swept column block by column block,
# A packed whole: a sweep row block by row block writes a run into every column in turn, more
# streams than the hardware prefetchers follow, and each store waits for its line (FP64
# km,kn->mn 3000 x 2796 x 16 into an out: 4.2 -> 2.1 ms, the same with N 2800, aligned, 1.7;
# mk,nk->mn 6.8 -> 2.1 ms; FP32 N 5593 4.4 -> 2.1 ms). Aligned, streamed columns lose instead
# (FP32 mk,nk->mn 4096^2 x 32 3.1 -> 3.7 ms), and so do a few columns (FP32 N 19: 2.2 -> 2.8).
UNALIGNED_COLUMN_STREAMS = 32


def columns_aligned(spec: BrgemmSpec, lanes: int) -> bool:
    """Whether every column of C starts on a vector boundary of ``lanes`` when its first one
    does (only then can C's vectors go around the caches)."""
    return spec.ldc % lanes == 0


def _stores_many_unaligned_columns(spec: BrgemmSpec, lanes: int) -> bool:
    return spec.stream_c and spec.n > UNALIGNED_COLUMN_STREAMS and not columns_aligned(spec, lanes)


def choose_blocking(spec: BrgemmSpec, target: Target, pack_transposed: bool = True) -> Blocking:
    """The register block for ``spec`` on ``target`` (``pack_transposed``: an A stored
    transposed may be packed, see below)."""
    full_lanes = target.lanes(spec.itemsize)
    registers = target.vector_registers
    # A stored transposed (unit stride on K): where M fills vectors and enough column blocks
    # reuse the packing (not a matrix-vector product), A's row blocks are transposed into
    # the packing buffer and the outer form runs on them; otherwise dot products along K (B
    # unit on K) or the mirror form (B unit on N: vectors along N, each C block transposed
    # once per call). Short K packs as well (masked loads; FP32, 2 threads, gc,ac->ag
    # 512 x 2560 x K 14 410 -> 194 us, bgc,bac->bag 64 x 96 x 128 x K 12 477 -> 172 us).
    # With B stored transposed, packing (its cost grows with M x K, its gain with N)
    # against the mirror form (its transposes cost M x N, repaid over K x batch steps) pays
    # where N exceeds K x batch: gc,ca->ag K 14 383 -> 174 us, ea,ce->ac 1200^2 x 62 669 ->
    # 538 us; random einsums whose kernels changed, alternating processes: FP32 29 cases
    # 1.15-1.18x, FP64 19 cases 1.21-1.48x by geometric mean (eaf,hae->fah 1.18 -> 0.07 ms),
    # slowest 0.85x. Packing at every size lost as often as it won (eda,cbde->acb,
    # 62x54x63x131x9: 1.35 -> 2.48 ms).
    packs_transposed = (
        pack_transposed
        and spec.trans_a
        and (not spec.trans_b or spec.n > spec.k * spec.batch)
        and spec.m >= full_lanes
        and spec.n >= PACK_MIN_COLUMNS
    )
    if spec.trans_a and not packs_transposed:
        form = "mirror" if spec.trans_b else "dot"
    elif mirrors_plain_a(spec, full_lanes):
        form = "mirror"
    else:
        form = "outer"
    # B stored transposed with its K steps pages apart: one column block reads one line per
    # K step, those lines crowd an L1 set (and the TLB), and every row block fetches them
    # again from further out. Copied into a buffer that stays in L1, small enough to share
    # it with A's rows (FP64 1024^3 `ki,kj->ij` on 2 cores of a Xeon, kernel B 8 KiB per K
    # step: 22 -> 45 GFLOP/s, NumPy 50; 1 KiB apart measured alike with and without), one
    # vector per K step: wider blocks measured no faster there (2 x 12 47-51 % of peak,
    # 2 x 8 and 3 x 8 54-55 %) and their buffer takes twice the room.
    b_far_apart = form == "outer" and b_steps_far_apart(spec)
    if form == "dot":
        # Small blocks of dot products: rows of A and columns of B feed r*c accumulators.
        lanes = full_lanes
        vectors, columns = (4, 4) if registers >= 32 else (3, 3)
    else:
        rows, cols = (spec.n, spec.m) if form == "mirror" else (spec.m, spec.n)
        # The broadcast operand's columns (B's, or A's rows in the mirror form) lie this far
        # apart; 1 element: along one line.
        if form == "mirror":
            column_stride = spec.lda if spec.trans_a else 1
        else:
            column_stride = 1 if spec.trans_b else spec.ldb
        problem = _BlockProblem(
            rows,
            cols,
            spec.k * spec.batch,
            full_lanes,
            registers,
            column_stride * spec.itemsize,
            full_lanes if b_far_apart else MOST_COLUMNS,
        )
        block = _outer_block if target.half_width_is_free else _two_pipe_block
        lanes, vectors, columns = block(problem)
    # Chunks of the batch whose reused parts fill at most half of L2 stay there while every
    # register block sweeps them. Only an operand that several blocks read counts: A_i is
    # read once per block along N, B_i once per block along M (a matrix-vector product
    # reads A once, and a whole-batch chunk streams each row of A in one run: gemv 4096²
    # 1.52 -> 1.33 ms). The sweep runs its column blocks outside its row blocks (rows
    # outside only where it packs A a row block at a time, below): every column block reads
    # the vector operand's whole chunk again, every row block only the column block of the
    # broadcast one. Counting all of the broadcast operand cut the 1600³ GEMM's 80 x 160 x
    # 64 x 25 kernel (3 x 8 blocks, a row tail) into chunks of 5, C loaded and stored after
    # each: 2 threads 418 -> 436 GFLOP/s whole. The chunk divides the batch, so one loop
    # covers it.
    if form == "dot":
        m_step, n_step = vectors, columns
    elif form == "mirror":
        m_step, n_step = columns, vectors * lanes
    else:
        m_step, n_step = vectors * lanes, columns
    a_reused = spec.n > n_step
    b_reused = spec.m > m_step
    if form == "mirror":  # vectors of B along N, A's rows broadcast
        swept = spec.k * spec.n * b_reused + m_step * spec.k * a_reused
    else:
        swept = spec.m * spec.k * a_reused + spec.k * n_step * b_reused
    per_batch = spec.itemsize * swept
    limit = max(1, cache_sizes()["L2"] // 2 // max(per_batch, 1))
    chunk = _chunk_within(spec.batch, limit, _l2_spread(spec, a_reused, b_reused))
    # A vector operand that one column block reads whole (a matrix-vector product), its K
    # steps apart as a register block sees them, is streamed a few K steps at a time: one
    # batch element per sweep, in pieces of K_PIECE steps where K is longer, so that every
    # row block reads only a few runs along the rows (x @ A, A row-major 4096² FP64: K 8 per
    # element, whole batch 5.2 -> 3.4 ms; K 1009 unsplit, one thread: 462 -> 246 us). Only
    # for up to K_PIECE columns: each piece loads and stores every vector of C again, which
    # a wider C pays for more than the runs save (N 12-13, `cda,bcd->ba` 213 x N x 37·40
    # FP64, 2 threads: 27-41 GFLOP/s in pieces, 38-78 without; N 2 and 4 gain 11-23 %).
    # In the mirror form C's vectors run along N: whole vectors only where ldc is 1 (a row
    # of C), otherwise C is gathered and scattered again every piece (one thread, FP64
    # deac,cb->baed, 2 x 124 x 64 tiles of ldc 384: 2.1 -> 0.55 ms without pieces; FP32
    # deac,cdb->bdae, 5 x 48 x 200: 0.83-1.04 -> 0.33-0.38 ms).
    k_piece = 0
    if (
        form == "outer"
        and not spec.trans_a
        and spec.n <= min(n_step, K_PIECE)
        and spec.lda > m_step
    ) or (
        form == "mirror"
        and spec.trans_a
        and spec.trans_b
        and spec.m <= min(m_step, K_PIECE)
        and spec.ldc == 1
        and spec.ldb > n_step
    ):
        chunk = 1
        if spec.k > 2 * K_PIECE:
            k_piece = K_PIECE
    pack_a = pack_whole = False
    if form == "outer" and (packs_transposed or (spec.m >= lanes and spec.n >= 2 * columns)):
        packed = spec.k * vectors * lanes * spec.itemsize  # bytes per batch element
        far_apart = spec.lda * spec.itemsize >= pack_leading_bytes(target) or packs_transposed
        if packs_transposed and packed > PACK_BUFFER_BYTES:
            return choose_blocking(spec, target, pack_transposed=False)
        blocks = -(-spec.m // (vectors * lanes))
        whole = packed * blocks
        if (
            far_apart
            and whole <= PACK_BUFFER_BYTES
            and (
                (_stores_many_unaligned_columns(spec, lanes) and whole * chunk <= PACK_BUFFER_BYTES)
                or (not packs_transposed and blocks * vectors <= PACK_WHOLE_VECTORS)
            )
        ):
            packed, pack_whole = whole, True
        if far_apart and packed <= PACK_BUFFER_BYTES:
            chunk = _chunk_within(spec.batch, chunk, PACK_BUFFER_BYTES // packed)
            if not pack_whole and b_reused:  # row blocks outside: each reads all of B_i
                whole_b = spec.itemsize * spec.k * spec.n
                chunk = _chunk_within(spec.batch, chunk, cache_sizes()["L2"] // 2 // whole_b)
            pack_a = True
    pack_b = b_far_apart and not pack_a and b_reused
    blocking = Blocking(form, lanes, vectors, columns, chunk, pack_a, pack_whole, k_piece, pack_b)
    if pack_b:
        per_element = blocking.b_buffer_bytes(spec) // chunk
        limit = max(1, cache_sizes()["L1"] // PACK_B_L1_PART // per_element)
        blocking = replace(blocking, chunk=_chunk_within(spec.batch, chunk, limit))
    per_element = -(-spec.k // lanes) if form == "dot" else spec.k
    chained = _chunk_within(spec.batch, blocking.chunk, SUM_CHAIN // per_element)
    return replace(blocking, chunk=chained) if chained != blocking.chunk else blocking


@dataclass(frozen=True)
class _BlockProblem:
    """What an outer-product register block is chosen for: ``rows`` along the vectors,
    ``cols`` broadcast, ``depth`` K steps over the batch, the target's vector width and
    registers, the broadcast columns' distance in bytes (0 or 1: along one line) and the
    most columns a block may take."""

    rows: int
    cols: int
    depth: int
    full_lanes: int
    registers: int
    column_bytes: int
    most_columns: int

    def crowds_l1(self, columns: int) -> bool:
        """Whether one step's lines of ``columns`` broadcast columns crowd an L1 set beyond
        its ways: FP64 80 x 60 x 64 with B's columns 4 KiB apart ran at 52 % of peak in a
        1 x 15 block (all 15 lines in one set) and at 95 % in 2 x 6."""
        return self.column_bytes > LINE_BYTES and set_crowding(self.column_bytes, columns) > L1_WAYS


def _outer_block(problem: _BlockProblem) -> tuple[int, int, int]:
    """(lanes, vectors, columns) of an outer-product block on Zen 4, by a cost model in
    cycles.

    Each block does ``depth`` steps of vectors * columns FMAs (padding lanes included), needs
    at least 8 FMAs in flight to hide their latency, and pays a fixed overhead plus the load
    and store of its accumulators. Blocks must fit the registers with their operands
    (accumulators + A vectors + broadcasts), else LLVM spills, and must not crowd an L1 set
    (:meth:`_BlockProblem.crowds_l1`). Ties go to fewer accumulators. Half-width vectors
    cost ``HALF_WIDTH_FMA_CYCLES`` per FMA: Zen 4 runs 512-bit FMAs on two 256-bit pipes.
    """
    p = problem
    best: tuple[float, int, int, int, int] | None = None
    widths = [p.full_lanes]
    if p.full_lanes >= 4:
        widths.append(p.full_lanes // 2)
    for lanes in widths:
        fma_cost = 1.0 if lanes == p.full_lanes else HALF_WIDTH_FMA_CYCLES
        for vectors in (1, 2, 3, 4):
            if (vectors - 1) * lanes >= p.rows:
                continue
            for columns in range(2, p.most_columns + 1):
                accumulators = vectors * columns
                if accumulators > 16 or accumulators + vectors + columns > p.registers:
                    continue
                if p.crowds_l1(columns):
                    continue
                row_blocks = -(-p.rows // (vectors * lanes))
                col_full, col_tail = divmod(p.cols, columns)
                cost = 0.0
                for block_cols, count in ((columns, col_full), (col_tail, 1 if col_tail else 0)):
                    if count == 0:
                        continue
                    fmas = vectors * block_cols
                    step = max(
                        fmas * fma_cost,
                        (vectors + block_cols) / 2,
                        block_cols * BROADCAST_CYCLES,
                        8 * fma_cost,
                    )
                    cost += count * row_blocks * (p.depth * step + 20 + 2 * fmas)
                key = (cost, accumulators, vectors, lanes, columns)
                if best is None or key < best:
                    best = key
    assert best is not None
    return best[3], best[2], best[4]


def _two_pipe_block(problem: _BlockProblem) -> tuple[int, int, int]:
    """(lanes, vectors, columns) of an outer-product block on a core with two full-width FMA
    pipes (Intel's AVX-512 cores, AVX2 cores), by a cost model in FMA issue slots.

    Two FMAs and about two loads retire per cycle there, so a step of ``vectors x columns``
    FMAs reads ``vectors + columns`` values at ``TWO_PIPE_LOAD_SLOTS`` each: one-vector
    blocks, whose every FMA waits for its own broadcast, are load-bound, and wider blocks
    of up to ``TWO_PIPE_ACCUMULATORS`` accumulators pay. A tail block of rows costs its own
    vectors, and each vector of A takes ``TWO_PIPE_L2_VECTOR_SLOTS`` to arrive from L2.
    Otherwise as :func:`_outer_block` (latency, per-block overhead, L1 sets).
    """
    p, lanes = problem, problem.full_lanes
    best: tuple[float, int, int, int] | None = None
    for vectors in range(1, TWO_PIPE_MOST_VECTORS + 1):
        if (vectors - 1) * lanes >= p.rows:
            continue
        for columns in range(2, p.most_columns + 1):
            accumulators = vectors * columns
            if accumulators > TWO_PIPE_ACCUMULATORS or accumulators + vectors + 2 > p.registers:
                continue
            if p.crowds_l1(columns):
                continue
            row_full, row_tail = divmod(p.rows, vectors * lanes)
            row_parts = ((vectors, row_full), (-(-row_tail // lanes), 1 if row_tail else 0))
            col_full, col_tail = divmod(p.cols, columns)
            col_parts = ((columns, col_full), (col_tail, 1 if col_tail else 0))
            cost = 0.0
            for block_vectors, row_count in row_parts:
                for block_cols, col_count in col_parts:
                    if row_count == 0 or col_count == 0:
                        continue
                    fmas = block_vectors * block_cols
                    step = max(
                        fmas,
                        (block_vectors + block_cols) * TWO_PIPE_LOAD_SLOTS,
                        block_vectors * TWO_PIPE_L2_VECTOR_SLOTS,
                        8.0,
                    )
                    cost += row_count * col_count * (p.depth * step + 20 + 2 * fmas)
            key = (cost, accumulators, vectors, columns)
            if best is None or key < best:
                best = key
    assert best is not None
    return lanes, best[2], best[3]


class _Emitter:
    """Writes one BRGEMM kernel function."""

    def __init__(
        self,
        spec: BrgemmSpec,
        blocking: Blocking,
        module: Module,
        name: str,
        linkage: str,
        attributes: str,
        prefetch: Prefetch | None = None,
    ) -> None:
        self.spec = spec
        self.b = blocking
        self.prefetch = prefetch
        # the lines a register block spreads over its K loop (``prefetch_next``,
        # ``prefetch_next_chunk``): per run, the address of its line i, and its line count
        self.pending_prefetch: list[tuple[Callable[[str | int], str], int]] = []
        self.module = module
        self.t = scalar_type(spec.itemsize)
        self.vt = vector_type(blocking.lanes, spec.itemsize)
        suffix = f"v{blocking.lanes}{type_suffix(spec.itemsize)}"
        self.fma = module.declare(
            f"fmuladd.{suffix}",
            f"declare {self.vt} @llvm.fmuladd.{suffix}({self.vt}, {self.vt}, {self.vt})",
        )
        self.fma_name = f"@llvm.fmuladd.{suffix}"
        module.declare(
            f"masked.load.{suffix}",
            f"declare {self.vt} @llvm.masked.load.{suffix}.p0(ptr, i32, <{blocking.lanes} x i1>, "
            f"{self.vt})",
        )
        module.declare(
            f"masked.store.{suffix}",
            f"declare void @llvm.masked.store.{suffix}.p0({self.vt}, ptr, i32, "
            f"<{blocking.lanes} x i1>)",
        )
        self.suffix = suffix
        self.buffer: str | None = None  # A's packing buffer, once allocated
        self.seam_buffer: str | None = None  # the seam's vectors (see outer_block), once allocated
        self.b_buffer: str | None = None  # B's
        # Vectors in the 64-byte aligned packing buffer start at multiples of their own size.
        self.vector_align = min(64, blocking.lanes * spec.itemsize)
        self.f = FunctionBuilder(
            module, _kernel_header(name, linkage, attributes, prefetch is not None)
        )

    # ---- memory helpers -------------------------------------------------------------------
    def lane_pointer(self, base: str, offset: str | int, first: int) -> str:
        """The address of element ``offset``; a vector whose first ``first`` lanes are masked
        off may start before the tensor, so its address is not assumed in bounds."""
        if not first:
            return self.f.gep(self.t, base, offset)
        return self.f.assign(f"getelementptr {self.t}, ptr {base}, i64 {offset}", "p")

    def load_vector(self, base: str, offset: str | int, active: int, first: int = 0) -> str:
        """Lanes ``first`` to ``active - 1`` of the vector at ``offset`` (zeros elsewhere)."""
        f = self.f
        pointer = self.lane_pointer(base, offset, first)
        if active == self.b.lanes and not first:
            return f.assign(f"load {self.vt}, ptr {pointer}, align {self.spec.itemsize}", "v")
        mask = mask_constant(self.b.lanes, active, first)
        return f.assign(
            f"call {self.vt} @llvm.masked.load.{self.suffix}.p0(ptr {pointer}, "
            f"i32 {self.spec.itemsize}, <{self.b.lanes} x i1> {mask}, {self.vt} zeroinitializer)",
            "v",
        )

    def store_vector(
        self,
        value: str,
        base: str,
        offset: str | int,
        active: int,
        streamed: bool = False,
        first: int = 0,
    ) -> None:
        """Store lanes ``first`` to ``active - 1``; ``streamed`` full vectors (at
        vector-aligned addresses) go around the caches."""
        f = self.f
        pointer = self.lane_pointer(base, offset, first)
        if first:
            mask = mask_constant(self.b.lanes, active, first)
            f.emit(
                f"call void @llvm.masked.store.{self.suffix}.p0({self.vt} {value}, "
                f"ptr {pointer}, i32 {self.spec.itemsize}, <{self.b.lanes} x i1> {mask})"
            )
            return
        if active == self.b.lanes and streamed:
            f.emit(
                f"store {self.vt} {value}, ptr {pointer}, "
                f"align {self.b.lanes * self.spec.itemsize}, !nontemporal !{NONTEMPORAL}"
            )
            return
        if active == self.b.lanes:
            f.emit(f"store {self.vt} {value}, ptr {pointer}, align {self.spec.itemsize}")
            return
        mask = mask_constant(self.b.lanes, active)
        f.emit(
            f"call void @llvm.masked.store.{self.suffix}.p0({self.vt} {value}, ptr {pointer}, "
            f"i32 {self.spec.itemsize}, <{self.b.lanes} x i1> {mask})"
        )

    def broadcast(self, base: str, offset: str | int) -> str:
        f = self.f
        pointer = f.gep(self.t, base, offset)
        scalar = f.assign(f"load {self.t}, ptr {pointer}, align {self.spec.itemsize}", "s")
        vector = f.assign(f"insertelement {self.vt} poison, {self.t} {scalar}, i64 0", "s")
        zeros = f"<{self.b.lanes} x i32> zeroinitializer"
        return f.assign(f"shufflevector {self.vt} {vector}, {self.vt} poison, {zeros}", "s")

    def fmuladd(self, a: str, b: str, c: str) -> str:
        vt = self.vt
        return self.f.assign(f"call {vt} {self.fma_name}({vt} {a}, {vt} {b}, {vt} {c})", "acc")

    # ---- structure ------------------------------------------------------------------------
    def emit(self) -> None:
        spec, b = self.spec, self.b
        count = spec.batch // b.chunk  # the chunk divides the batch

        f = self.f
        pieces = _parts(spec.k, b.k_piece) if b.k_piece else [(1, spec.k, 0)]
        # how far one K step moves in A and in B
        a_step = 1 if spec.trans_a else spec.lda
        b_step = spec.ldb if spec.trans_b else 1

        def chunk_body(index: str, _: list[str]) -> list[str]:
            first = f.mul_i64(index, b.chunk)
            a = f.gep(self.t, "%A", f.mul_i64(first, spec.stride_a))
            bb = f.gep(self.t, "%B", f.mul_i64(first, spec.stride_b))
            for piece_count, size, start in pieces:

                def piece_body(
                    piece: str,
                    _: list[str],
                    size: int = size,
                    start: int = start,
                    single: bool = piece_count == 1,
                ) -> list[str]:
                    k0 = start if single else f.add_i64(start, f.mul_i64(piece, size))
                    # beta 0 overwrites C in the first chunk's first piece only; the rest
                    # accumulates onto it.
                    overwrite: bool | str = spec.beta == 0
                    if overwrite and (count > 1 or b.k_piece):
                        at_start = f.assign(f"or i64 {index}, {k0}", "at")
                        overwrite = f.assign(f"icmp eq i64 {at_start}, 0", "first")
                    self.spec = replace(spec, k=size) if size != spec.k else spec
                    self.sweep(
                        f.gep(self.t, a, f.mul_i64(k0, a_step)),
                        f.gep(self.t, bb, f.mul_i64(k0, b_step)),
                        b.chunk,
                        overwrite,
                        (index, count),
                    )
                    self.spec = spec
                    return []

                f.loop(piece_count, [], piece_body, "piece")
            return []

        f.loop(count, [], chunk_body, "chunk")
        f.finish()

    def sweep(
        self, a: str, b: str, batch: int, overwrite: bool | str, chunk: tuple[str, int]
    ) -> None:
        """All register blocks of C for one chunk of the batch (``chunk``: its ordinal and
        the number of chunks)."""
        spec, blk = self.spec, self.b
        rows_total, cols_total = (spec.n, spec.m) if blk.form == "mirror" else (spec.m, spec.n)
        if blk.form == "dot":
            row_step, col_step = blk.vectors, blk.columns
        else:
            row_step, col_step = blk.vectors * blk.lanes, blk.columns
        row_parts = _parts(rows_total, row_step)
        col_parts = _parts(cols_total, col_step)
        col_blocks = -(-cols_total // col_step)
        # the blocks of all the call's sweeps (one per chunk) share the next call's prefetches
        lines = prefetched_lines(spec, blk, self.prefetch)
        chunk_index, chunks = chunk
        ahead = self.chunk_ahead(a, rows_total, batch, chunk, next_call_a=not lines[0])
        prefetching = any(lines) or ahead is not None

        def prefetch(row: str | int, c0: str | int, rows_inside: bool, rows: int) -> None:
            """Before the register block in row block ``row`` (its ordinal) at column ``c0``,
            of ``rows`` x ``col_blocks`` blocks counted in sweep order."""
            if prefetching:
                self.pending_prefetch = []
                col = self.f.udiv_i64(c0, col_step)
                if rows_inside:
                    block = self.f.add_i64(self.f.mul_i64(col, rows), row)
                else:
                    block = self.f.add_i64(self.f.mul_i64(row, col_blocks), col)
                blocks = rows * col_blocks
                if ahead is not None:
                    self.prefetch_next_chunk(ahead, block, blocks)
                block = self.f.add_i64(self.f.mul_i64(chunk_index, blocks), block)
                self.prefetch_next(block, chunks * blocks, lines)

        def over(parts: list[tuple[int, int, int]], step: int, body, hint: str) -> None:  # type: ignore[no-untyped-def]
            for count, size, start in parts:

                def loop_body(
                    index: str, _: list[str], size: int = size, start: int = start
                ) -> list[str]:
                    body(self.f.add_i64(start, self.f.mul_i64(index, step)), size)
                    return []

                self.f.loop(count, [], loop_body, hint)

        def row_layout(shift: int) -> tuple[int, list[tuple[int, int, int]]]:
            """The row blocks from row 0 or, C starting ``shift`` elements past a vector
            boundary, from -shift: the rows of a first block holding the ``shift`` rows
            before the tile (0: none), and the blocks after it."""
            if not shift:
                return 0, row_parts
            first_rows = min(row_step, rows_total + shift)
            return first_rows, _parts(rows_total + shift - first_rows, row_step)

        def row_count(shift: int) -> int:
            first_rows, parts = row_layout(shift)
            return (1 if first_rows else 0) + sum(count for count, _, _ in parts)

        def over_rows(shift: int, body) -> None:  # type: ignore[no-untyped-def]
            """Call ``body(r0, rows, head, row)`` for each row block of :func:`row_layout`
            (``row`` its ordinal, while prefetching): shifted, every vector of C is aligned
            and goes around the caches, the first block's ``head`` lanes before the tile
            and the last one's past it masked off."""
            first_rows, parts = row_layout(shift)
            if first_rows:
                body(-shift, first_rows, shift, 0)

            def block(r0: str | int, rows: int) -> None:
                row = self.f.udiv_i64(r0, row_step) if prefetching else 0
                if first_rows:
                    r0, row = self.f.add_i64(r0, first_rows - shift), self.f.add_i64(row, 1)
                body(r0, rows, 0, row)

            over(parts, row_step, block, "row")

        def seam_of(shift: int) -> tuple[int, int, int] | None:
            """The seam where C's columns follow each other (ldc = m) in a shifted sweep
            with column blocks outside: (shift, col_step, cols_total)."""
            if shift and blk.form == "outer" and spec.ldc == rows_total:
                return shift, col_step, cols_total
            return None

        def swept_block(
            vectors_from: str,
            columns_from: str,
            r0: str | int,
            c0: str | int,
            rows: int,
            cols: int,
            shift: int,
            head: int,
            packed: bool = False,
            packed_b: bool = False,
            seam: tuple[int, int, int] | None = None,
        ) -> None:
            """One register block of a sweep (shifted: C overwritten, every vector aligned)."""
            self.outer_block(
                vectors_from,
                columns_from,
                r0,
                c0,
                rows,
                cols,
                batch,
                True if shift else overwrite,
                packed=packed,
                head=head,
                aligned=bool(shift),
                packed_b=packed_b,
                seam=seam,
            )

        def whole_sweep(shift: int) -> None:
            # A's rows (from -shift, shifted) packed at once, then column blocks outside
            if spec.trans_a:
                whole = self.pack_transposed_rows(a, rows_total + shift, batch, -shift, shift)
            else:
                whole = self.pack_rows(a, rows_total + shift, batch, -shift, shift)
            seam = seam_of(shift)

            def packed_col_block(c0: str | int, cols: int) -> None:
                def packed_block(r0: str | int, rows: int, head: int, row: str | int) -> None:
                    prefetch(row, c0, rows_inside=True, rows=row_count(shift))
                    start = self.f.mul_i64(self.f.add_i64(r0, shift), batch * spec.k)
                    buffer = self.f.gep(self.t, whole, start)
                    swept_block(buffer, b, r0, c0, rows, cols, shift, head, True, seam=seam)

                over_rows(shift, packed_block)

            over(col_parts, col_step, packed_col_block, "col")

        def packed_sweep(shift: int) -> None:
            # Row blocks outside: pack the block's A once, then every column block uses it.
            def row_block(r0: str | int, rows: int, head: int, row: str | int) -> None:
                buffer = self.pack(a, r0, rows, batch, head)

                def packed_block(c0: str | int, cols: int) -> None:
                    prefetch(row, c0, rows_inside=False, rows=row_count(shift))
                    swept_block(buffer, b, r0, c0, rows, cols, shift, head, packed=True)

                over(col_parts, col_step, packed_block, "col")

            over_rows(shift, row_block)

        def plain_sweep(shift: int) -> None:
            seam = seam_of(shift)

            def col_block(c0: str | int, cols: int) -> None:
                # every row block below reads the column block's B from the buffer
                columns = self.pack_b(b, c0, cols, batch, col_step) if blk.pack_b else b

                def row_block(r0: str | int, rows: int, head: int, row: str | int) -> None:
                    prefetch(row, c0, rows_inside=True, rows=row_count(shift))
                    if shift or blk.pack_b:
                        swept_block(
                            a,
                            columns,
                            r0,
                            c0,
                            rows,
                            cols,
                            shift,
                            head,
                            packed_b=blk.pack_b,
                            seam=seam,
                        )
                    else:
                        self.block(a, b, r0, c0, rows, cols, batch, overwrite)

                over_rows(shift, row_block)

            over(col_parts, col_step, col_block, "col")

        sweep = plain_sweep
        if blk.pack_a:
            sweep = whole_sweep if blk.pack_whole else packed_sweep
        shifts = self.c_shifts()
        if not shifts:
            sweep(0)
            return
        assert overwrite is True  # streamed C is written once, by the only chunk
        misaligned = self.f.misaligned_bytes("%C", blk.lanes * spec.itemsize)

        def choose(remaining: list[int]) -> None:
            if not remaining:
                sweep(0)
                return
            shift = remaining[0]
            is_shift = self.f.assign(f"icmp eq i64 {misaligned}, {shift * spec.itemsize}", "c")
            self.f.when(is_shift, lambda: sweep(shift), lambda: choose(remaining[1:]))

        choose(shifts)

    def chunk_ahead(
        self, a: str, rows_total: int, batch: int, chunk: tuple[str, int], next_call_a: bool
    ) -> _ChunkAhead | None:
        """What the next chunk of the batch packs of A where the sweep packs A: after the
        last chunk, the next call's first (where the nest passes the next call's A and
        nothing prefetches it whole: ``next_call_a``, no lines of it in ``prefetched_lines``),
        or else the last chunk's own, in cache by then. None where there is no next chunk or
        the packing is too short to hide those lines behind."""
        spec, blk, f = self.spec, self.b, self.f
        index, chunks = chunk
        if not blk.pack_a or blk.k_piece or blk.form == "mirror":
            return None
        next_call = self.prefetch is not None and self.prefetch.a and next_call_a
        if chunks < 2 and not next_call:
            return None
        if spec.trans_a:  # rows of A along K
            per_element, run_stride, run_bytes = rows_total, spec.lda, spec.k * spec.itemsize
        else:  # each K step's values of the rows
            per_element, run_stride, run_bytes = spec.k, spec.lda, rows_total * spec.itemsize
        base = "%PA"
        if chunks > 1:
            remaining = f.assign(f"sub i64 {chunks - 1}, {index}", "i")
            base = f.gep(self.t, a, f.mul_i64(f.umin_i64(remaining, 1), batch * spec.stride_a))
            if next_call:
                last = f.assign(f"icmp eq i64 {remaining}, 0", "c")
                base = f.assign(f"select i1 {last}, ptr %PA, ptr {base}", "p")
        ahead = _ChunkAhead(
            base, batch * per_element, per_element, run_stride, spec.stride_a, run_bytes
        )
        fmas = batch * spec.m * spec.n * spec.k // (64 // spec.itemsize)
        if fmas < PREFETCH_LEAST_FMAS * ahead.runs * ahead.lines:
            return None
        return ahead

    def prefetch_next(self, block: str | int, blocks: int, lines_ab: tuple[int, int]) -> None:
        """Prefetch register block ``block``'s share (of ``blocks``) of the next call's A and B
        lines (``prefetch_lines``) into L2: spread over the blocks, the prefetches overlap the
        sweep's arithmetic. Where the block's K loop runs rounds enough
        (:meth:`spreads_prefetches`) the runs wait in ``pending_prefetch`` for it
        (:meth:`k_loop`); otherwise they go out at once, before the block."""
        spread = self.spreads_prefetches()
        for index, (base, lines) in enumerate(zip(("%PA", "%PB"), lines_ab)):
            if not lines:
                continue
            share = -(-lines // blocks)
            if not spread:
                share = min(share, PREFETCH_BURST)
            # a run of `share` lines from the block's first; the last blocks' runs end at the
            # tile's last line (they repeat lines, past the tile they would read nothing)
            first = self.f.umin_i64(self.f.mul_i64(block, share), lines - share)
            per_element = prefetch_blocks(self.spec, index)
            if per_element is None:
                run = self.f.gep("i8", base, self.f.mul_i64(first, LINE_BYTES))
                self.prefetch_run(self.line_of_run(run), share, spread)
            else:
                address = self.line_of_blocks(base, first, index, per_element)
                self.prefetch_run(address, share, spread)

    def line_of_blocks(
        self, base: str, first: str | int, index: int, blocks: tuple[int, int]
    ) -> Callable[[str | int], str]:
        """The address of line ``first + i`` of the tile of A (``index`` 0) or B (1) at
        ``base``, prefetched a block per batch element (``blocks``: :func:`prefetch_blocks`).
        A block's last line is addressed by its last byte at most, never past it."""
        f, spec = self.f, self.spec
        block_lines, block_bytes = blocks
        one = replace(spec, batch=1)
        last = (one.extent_a() if index == 0 else one.extent_b()) * spec.itemsize - 1

        def address(line: str | int) -> str:
            index = f.add_i64(first, line)
            element, within = f.udiv_i64(index, block_lines), f.urem_i64(index, block_lines)
            byte = f.umin_i64(f.mul_i64(within, LINE_BYTES), last)
            return f.gep("i8", base, f.add_i64(f.mul_i64(element, block_bytes), byte))

        return address

    def line_of_run(self, run: str) -> Callable[[str | int], str]:
        """The address of line i of the contiguous lines from ``run``."""
        return lambda line: self.f.gep("i8", run, self.f.mul_i64(line, LINE_BYTES))

    def prefetch_run(self, address: Callable[[str | int], str], share: int, spread: bool) -> None:
        """Prefetch lines ``address(0 : share)``: in the register block's K loop (``spread``),
        or at once, at most ``PREFETCH_BURST`` of them."""
        if spread:
            self.pending_prefetch.append((address, share))
            return
        for j in range(min(share, PREFETCH_BURST)):
            self.prefetch_line(address(j))

    def prefetch_next_chunk(self, ahead: _ChunkAhead, block: str | int, blocks: int) -> None:
        """Prefetch register block ``block``'s share (of ``blocks``) of the lines of A the
        next chunk packs (:class:`_ChunkAhead`) into L2, so that its packing, which reads
        each K step's row pages apart where the hardware prefetchers do not follow, finds
        them there instead of waiting on memory for them row after row."""
        f = self.f
        spread = self.spreads_prefetches()
        total = ahead.runs * ahead.lines
        share = -(-total // blocks)
        if not spread:
            share = min(share, PREFETCH_BURST)
        first = f.umin_i64(f.mul_i64(block, share), total - share)

        def address(line: str | int) -> str:
            index = f.add_i64(first, line)
            run = f.udiv_i64(index, ahead.lines)
            element, within = f.udiv_i64(run, ahead.per_element), f.urem_i64(run, ahead.per_element)
            start = f.add_i64(
                f.mul_i64(element, ahead.element_stride), f.mul_i64(within, ahead.run_stride)
            )
            # a run of `run_bytes` from any alignment touches at most `lines` lines; the
            # last is addressed by the run's last byte, never past it
            byte = f.umin_i64(
                f.mul_i64(f.urem_i64(index, ahead.lines), LINE_BYTES), ahead.run_bytes - 1
            )
            return f.gep("i8", f.gep(self.t, ahead.base, start), byte)

        self.prefetch_run(address, share, spread)

    def spreads_prefetches(self) -> bool:
        """Whether a register block's prefetches go into its K loop: blocks of the outer
        form (and its mirror) whose K loop, over the batch, runs two unrolled rounds or more."""
        rounds = self.spec.k // K_UNROLL
        return self.b.form != "dot" and rounds >= 1 and rounds * self.spec.batch >= 2

    def prefetch_c_block(
        self, r0: str | int, c0: str | int, rows: int, cols: int, batch: int
    ) -> None:
        """Prefetch the lines of C a block adds its sums to into L1 for writing, where its K
        loop is long enough to hide them (``C_PREFETCH_LEAST_STEPS``): an outer-form block's
        ``rows`` from r0 in each of ``cols`` columns from c0 (each vector's first element and
        the last row), a mirror-form block's ``cols`` rows of C from c0 in each of its
        ``rows`` columns from r0 (their first and last elements); all inside the block. The
        mirror form's opt2_fctn FP32 (a 20 x 60 x 8 x 8 BRGEMM in a K loop, 2 threads,
        alternating processes): 9.35-9.63 -> 9.11-9.38 ms per call, faster in 12 of 14
        pairs (about 1.5 %)."""
        if self.spec.k * batch < C_PREFETCH_LEAST_STEPS:
            return
        f, lanes = self.f, self.b.lanes
        if self.b.form == "mirror":  # the block's rows are columns of C
            columns, first_column, first_row = rows, r0, c0
            starts = sorted({0, cols - 1})
        else:
            columns, first_column, first_row = cols, c0, r0
            starts = [v * lanes for v in range(-(-rows // lanes))] + [rows - 1]
        self.module.declare("prefetch", "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
        for column in range(columns):
            base = f.add_i64(first_row, f.mul_i64(f.add_i64(first_column, column), self.spec.ldc))
            for start in starts:
                pointer = f.gep(self.t, "%C", f.add_i64(base, start))
                f.emit(f"call void @llvm.prefetch.p0(ptr {pointer}, i32 1, i32 3, i32 1)")

    def prefetch_line(self, pointer: str) -> None:
        """Fetch the line at ``pointer`` into L2 (not L1, where the block's operands live)."""
        self.module.declare("prefetch", "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
        self.f.emit(f"call void @llvm.prefetch.p0(ptr {pointer}, i32 0, i32 2, i32 1)")

    def allocate_buffer(self) -> str:
        """A's packing buffer, allocated on first use."""
        if self.buffer is None:
            self.buffer = "%pack"
            size = self.b.a_buffer_bytes(self.spec) // self.spec.itemsize
            self.f.entry_alloca(f"%pack = alloca {self.t}, i64 {size}, align 64")
        return self.buffer

    def pack_b(self, b: str, c0: str | int, cols: int, batch: int, col_step: int) -> str:
        """Copy columns ``c0 : c0 + cols`` of B, stored transposed (unit stride on N), of
        every batch element of the chunk into B's packing buffer: per (element, k) one run
        of ``b_row`` values, zero past ``cols``.

        Each K step's lines lie pages apart, where the hardware prefetchers do not follow,
        so the copy also prefetches the next column block's lines (the last block its own)
        into L1: they arrive while the row blocks compute on this one, instead of the next
        copy waiting for each of them in turn from L3 (FP64 ``ki,kj->ij`` 1024^3's kernel,
        B 8 KiB per K step and 8 MiB per call, from L3: 47-55 -> 62-65 % of peak)."""
        spec, blk, f = self.spec, self.b, self.f
        self.module.declare("prefetch", "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
        # the next block's first and last values, within the tile
        next_c0 = f.umin_i64(f.add_i64(c0, col_step), (spec.n - 1) // col_step * col_step)
        next_last = f.umin_i64(f.add_i64(next_c0, col_step - 1), spec.n - 1)
        if self.b_buffer is None:
            self.b_buffer = "%packb"
            size = blk.b_buffer_bytes(spec) // spec.itemsize
            f.entry_alloca(f"%packb = alloca {self.t}, i64 {size}, align 64")
        buffer, lanes, row = self.b_buffer, blk.lanes, blk.b_row

        def copy_step(source: str, target: str, k: str | int) -> None:
            row_start = f.gep(self.t, source, f.mul_i64(k, spec.ldb))
            for column in dict.fromkeys((next_c0, next_last)):
                ahead = f.gep(self.t, row_start, column)
                f.emit(f"call void @llvm.prefetch.p0(ptr {ahead}, i32 0, i32 3, i32 1)")
            line = f.gep(self.t, row_start, c0)
            for v in range(row // lanes):
                active = min(lanes, cols - v * lanes)
                value = (
                    self.load_vector(line, v * lanes, active) if active > 0 else "zeroinitializer"
                )
                pointer = f.gep(self.t, target, f.add_i64(f.mul_i64(k, row), v * lanes))
                f.emit(f"store {self.vt} {value}, ptr {pointer}, align {self.vector_align}")

        def element(index: str, _: list[str]) -> list[str]:
            source = f.gep(self.t, b, f.mul_i64(index, spec.stride_b))
            target = f.gep(self.t, buffer, f.mul_i64(index, spec.k * row))

            def step(values: list[str], k: str | int) -> list[str]:
                copy_step(source, target, k)
                return values

            return self.k_loop([], [], step)

        f.loop(batch, [], element, "qb")
        return buffer

    def pack(self, a: str, r0: str | int, rows: int, batch: int, head: int = 0) -> str:
        """Copy A[r0 : r0 + rows, :] of every batch element of the chunk into the packing
        buffer: per (element, k) one run of vectors * lanes values, zero beyond ``rows``
        and, in a shifted sweep, in the ``head`` rows before the tile (r0 = -head)."""
        buffer = self.allocate_buffer()
        if self.spec.trans_a:
            self.pack_transposed(a, r0, rows, batch, head)
        else:
            self.pack_rows(a, rows, batch, r0, head)
        return buffer

    def pack_rows(self, a: str, rows: int, batch: int, r0: str | int = 0, head: int = 0) -> str:
        """Copy ``rows`` of A from ``r0`` (the first ``head`` of them before the tile, packed
        as zeros) of every batch element of the chunk into the packing buffer in one pass,
        row block after row block, each as :meth:`pack` lays out one: with several row
        blocks, each column of A is read as one run."""
        spec, blk, f = self.spec, self.b, self.f
        lanes, padded = blk.lanes, blk.vectors * blk.lanes
        blocks = -(-rows // padded)
        block_elements = batch * spec.k * padded
        buffer = self.allocate_buffer()
        vectors = -(-rows // lanes)

        def element(index: str, _: list[str]) -> list[str]:
            source = f.gep(self.t, a, f.mul_i64(index, spec.stride_a))
            target = f.gep(self.t, buffer, f.mul_i64(index, spec.k * padded))

            def step(k: str, _: list[str]) -> list[str]:
                row = f.gep(self.t, source, f.mul_i64(k, spec.lda))
                to = f.gep(self.t, target, f.mul_i64(k, padded))
                for v in range(blocks * blk.vectors):
                    value = (
                        "zeroinitializer"
                        if v >= vectors
                        else self.load_vector(
                            row,
                            f.add_i64(r0, v * lanes),
                            min(lanes, rows - v * lanes),
                            head if v == 0 else 0,
                        )
                    )
                    block, within = divmod(v, blk.vectors)
                    pointer = f.gep(self.t, to, block * block_elements + within * lanes)
                    f.emit(f"store {self.vt} {value}, ptr {pointer}, align {self.vector_align}")
                return []

            f.loop(spec.k, [], step, "pk")
            return []

        f.loop(batch, [], element, "pb")
        return buffer

    def pack_transposed_rows(self, a: str, rows: int, batch: int, r0: int, head: int) -> str:
        """:meth:`pack_rows` for an A stored transposed: row block after row block, each
        packed by :meth:`pack_transposed` (the first with the ``head`` rows before the tile,
        the full ones after it in a loop, a partial last one on its own)."""
        spec, blk, f = self.spec, self.b, self.f
        padded = blk.vectors * blk.lanes
        block_elements = batch * spec.k * padded
        buffer = self.allocate_buffer()
        first = min(padded, rows)
        self.pack_transposed(a, r0, first, batch, head)
        full, tail = divmod(rows - first, padded)

        def body(index: str, _: list[str]) -> list[str]:
            block = f.add_i64(index, 1)
            start = f.add_i64(r0, f.mul_i64(block, padded))
            self.pack_transposed(a, start, padded, batch, 0, f.mul_i64(block, block_elements))
            return []

        if full:
            f.loop(full, [], body, "pr")
        if tail:
            block = 1 + full
            start = f.add_i64(r0, block * padded)
            self.pack_transposed(a, start, tail, batch, 0, block * block_elements)
        return buffer

    def pack_transposed(
        self,
        a: str,
        r0: str | int,
        rows: int,
        batch: int,
        head: int = 0,
        offset: str | int = 0,
    ) -> None:
        """The packing of :meth:`pack` from an A stored transposed (A[m, k] at m * lda + k):
        lanes x lanes blocks go through registers and are transposed there, into the buffer
        from ``offset`` elements."""
        spec, blk, f = self.spec, self.b, self.f
        lanes, padded = blk.lanes, blk.vectors * blk.lanes
        full_chunks, tail = divmod(spec.k, lanes)

        def chunk(source: str, target: str, k0: str | int, width: int) -> None:
            for g in range(blk.vectors):
                valid = min(lanes, rows - g * lanes)
                vectors = [
                    self.load_vector(
                        source,
                        f.add_i64(f.mul_i64(f.add_i64(r0, g * lanes + rr), spec.lda), k0),
                        width,
                    )
                    if (g or rr >= head) and rr < valid
                    else "zeroinitializer"
                    for rr in range(lanes)
                ]
                columns = transpose_vectors(f, vectors, lanes, spec.itemsize)
                for kk in range(width):
                    offset = f.add_i64(f.mul_i64(f.add_i64(k0, kk), padded), g * lanes)
                    pointer = f.gep(self.t, target, offset)
                    f.emit(
                        f"store {self.vt} {columns[kk]}, ptr {pointer}, align {self.vector_align}"
                    )

        def element(index: str, _: list[str]) -> list[str]:
            source = f.gep(self.t, a, f.mul_i64(index, spec.stride_a))
            buffer = f.gep(self.t, self.allocate_buffer(), offset)
            target = f.gep(self.t, buffer, f.mul_i64(index, spec.k * padded))
            if full_chunks:

                def body(c: str, _: list[str]) -> list[str]:
                    chunk(source, target, f.mul_i64(c, lanes), lanes)
                    return []

                f.loop(full_chunks, [], body, "pt")
            if tail:
                chunk(source, target, full_chunks * lanes, tail)
            return []

        f.loop(batch, [], element, "pb")

    def block(
        self,
        a: str,
        b: str,
        r0: str | int,
        c0: str | int,
        rows: int,
        cols: int,
        batch: int,
        overwrite: bool | str,
    ) -> None:
        if self.b.form == "dot":
            self.dot_block(a, b, r0, c0, rows, cols, batch, overwrite)
        else:
            self.outer_block(a, b, r0, c0, rows, cols, batch, overwrite)

    # ---- the outer-product form (and its mirror) ------------------------------------------
    def outer_block(
        self,
        a: str,
        b: str,
        r0: str | int,
        c0: str | int,
        rows: int,
        cols: int,
        batch: int,
        overwrite: bool | str,
        packed: bool = False,
        head: int = 0,
        aligned: bool = False,
        packed_b: bool = False,
        seam: tuple[int, int, int] | None = None,
    ) -> None:
        """``rows`` x ``cols`` of C (of C^T in the mirror form) starting at (r0, c0). With
        ``packed``, ``a`` is the packing buffer of this row block; with ``packed_b``, ``b``
        is B's packing buffer of this column block. ``head``: the first
        ``head`` rows lie before the tile (masked off; r0 is negative). ``aligned``: every
        vector of C starts on a vector boundary (the shifted sweep). ``seam``: see
        :meth:`store_seamed`."""
        spec, blk, f = self.spec, self.b, self.f
        mirror = blk.form == "mirror"
        assert not head or (not mirror and overwrite is True)
        lanes = blk.lanes
        vectors = -(-rows // lanes)
        active = [min(lanes, rows - v * lanes) for v in range(vectors)]
        firsts = [head if v == 0 else 0 for v in range(vectors)]
        # the packing buffer holds whole vectors, zero in the lanes masked off C
        load_active = [lanes] * vectors if packed else active
        load_firsts = [0] * vectors if packed else firsts
        row_offset: str | int = 0 if packed else r0
        # Where the vector operand and the broadcast operand live: element (row, col, k).
        if mirror:  # vectors along N from B^T (unit stride on N), broadcasts of A
            vec_base, vec_k, bc_base = b, spec.ldb, a
            bc_col, bc_k = (spec.lda, 1) if spec.trans_a else (1, spec.lda)
        else:
            vec_base, vec_k, bc_base = a, spec.lda, b
            bc_col, bc_k = (1, spec.ldb) if spec.trans_b else (spec.ldb, 1)
        vec_batch = spec.stride_b if mirror else spec.stride_a
        bc_batch = spec.stride_a if mirror else spec.stride_b
        if packed:
            vec_k, vec_batch = blk.vectors * lanes, spec.k * blk.vectors * lanes
        first_col: str | int = c0
        if packed_b:
            bc_col, bc_k, bc_batch, first_col = 1, blk.b_row, spec.k * blk.b_row, 0

        # The sums start from zero and are added to C when stored, not loaded from C first:
        # each call's (chunk's) sum then adds to C as one term, so that no element's sum is a
        # single chain of rounded additions over all of K (``ij,ji->`` 3000² FP32: relative
        # error 2.5e-3, NumPy's 3.6e-6). K swept in pieces of a few steps carries C instead:
        # an add per piece costs an eighth more vector operations (4 x 512 x 2048 FP32, 2
        # threads: 0.106 -> 0.125 ms), and split_reduction.chain_length counts those chains
        # product by product.
        carried = bool(blk.k_piece) and not mirror
        kinds = [
            (
                self.vt,
                self.loaded_c(r0, c0, v, col, active[v], overwrite)
                if carried
                else "zeroinitializer",
            )
            for col in range(cols)
            for v in range(vectors)
        ]
        stored_over: bool | str = True if carried else overwrite
        if overwrite is False and not carried:
            self.prefetch_c_block(r0, c0, rows, cols, batch)

        def step(accs: list[str], vb: str, bb: str, k: str | int) -> list[str]:
            vec = [
                self.load_vector(
                    vb,
                    f.add_i64(f.add_i64(row_offset, v * lanes), f.mul_i64(k, vec_k)),
                    load_active[v],
                    load_firsts[v],
                )
                for v in range(vectors)
            ]
            out = list(accs)
            k_offset = f.mul_i64(k, bc_k)
            for col in range(cols):
                col_offset = f.mul_i64(f.add_i64(first_col, col), bc_col)
                scalar = self.broadcast(bb, f.add_i64(col_offset, k_offset))
                for v in range(vectors):
                    position = col * vectors + v
                    out[position] = self.fmuladd(vec[v], scalar, out[position])
            return out

        def batch_body(index: str, accs: list[str]) -> list[str]:
            vb = f.gep(self.t, vec_base, f.mul_i64(index, vec_batch))
            bb = f.gep(self.t, bc_base, f.mul_i64(index, bc_batch))
            return self.k_loop(
                accs,
                kinds,
                lambda accs, k: step(accs, vb, bb, k),
                self.pending_prefetch,
                index,
                batch,
            )

        acc = f.loop(batch, kinds, batch_body, "br")
        self.pending_prefetch = []
        if mirror:
            self.store_mirror(acc, r0, c0, vectors, cols, active, overwrite)
            return

        def store(streamed: bool) -> None:
            for col in range(cols):
                for v in range(vectors):
                    value = acc[col * vectors + v]
                    self.store_outer(
                        value, r0, c0, v, col, active[v], stored_over, streamed, firsts[v]
                    )

        if seam is not None:
            self.store_seamed(acc, r0, c0, vectors, cols, active, firsts, seam)
        elif aligned:
            store(True)
        elif self.streams_c():
            f.when(self.c_vector_aligned(), lambda: store(True), lambda: store(False))
        else:
            store(False)

    def store_seamed(
        self,
        acc: list[str],
        r0: str | int,
        c0: str | int,
        vectors: int,
        cols: int,
        active: list[int],
        firsts: list[int],
        seam: tuple[int, int, int],
    ) -> None:
        """Store a register block of a shifted sweep over columns that follow each other
        (ldc = m), column blocks outside: the line where column j ends and j + 1 begins holds
        j's last ``shift`` rows and j + 1's first rows, the tail vector of j's last row
        block and the head vector of j + 1's first. Joined (a select on the lanes), it is
        one whole aligned vector streamed like the rest, where masked halves stored apart
        would each read the line first. The first row block keeps its heads in a stack
        buffer, the last joins them to its tails; the column block's last tail waits there
        for the next block's first head. Only the tile's first head and last tail are
        stored masked (their lines continue into other tiles).

        FP32 tensor-train root (384-row columns) into an out 16 bytes off a line, 2 threads:
        85-88 ms with masked halves, 67-69 into an aligned out."""
        f, lanes, t = self.f, self.b.lanes, self.vt
        shift, col_step, cols_total = seam
        tail_lanes = mask_constant(lanes, shift)  # lanes 0 .. shift - 1: the tail's rows
        if self.seam_buffer is None:
            self.seam_buffer = "%seam"
            f.entry_alloca(f"%seam = alloca {t}, i64 {col_step + 1}, align 64")
        align = lanes * self.spec.itemsize

        def slot(index: int) -> str:
            return f.gep(t, "%seam", index)

        def keep(value: str, index: int) -> None:
            f.emit(f"store {t} {value}, ptr {slot(index)}, align {align}")

        def kept(index: int) -> str:
            return f.assign(f"load {t}, ptr {slot(index)}, align {align}", "s")

        def joined(tail: str, head: str, v: int, col: int) -> None:
            value = f.assign(f"select <{lanes} x i1> {tail_lanes}, {t} {tail}, {t} {head}", "s")
            self.store_outer(value, r0, c0, v, col, lanes, True, True, 0)

        def alone(value: str, v: int, col: int) -> None:
            self.store_outer(value, r0, c0, v, col, active[v], True, True, firsts[v])

        def when(predicate: str, bound: int, then, otherwise) -> None:  # type: ignore[no-untyped-def]
            """``c0 <predicate> bound`` (``eq`` or ``sge``), folded where c0 is known."""
            if isinstance(c0, int):
                holds = c0 == bound if predicate == "eq" else c0 >= bound
                (then if holds else otherwise)()
            else:
                f.when(f.assign(f"icmp {predicate} i64 {c0}, {bound}", "c"), then, otherwise)

        last = vectors - 1
        heads = firsts[0] > 0  # the block's first vectors begin before the tile
        tails = active[last] < lanes  # its last ones end past it
        # heads first: with a single row block, the tails below join the heads of this block
        if heads:
            for col in range(cols):
                value = acc[col * vectors]
                if col:
                    keep(value, col)
                    continue
                when(
                    "eq",
                    0,
                    lambda value=value: alone(value, 0, 0),
                    lambda value=value: joined(kept(col_step), value, 0, 0),
                )
        for col in range(cols):
            for v in range(1 if heads else 0, vectors):
                value = acc[col * vectors + v]
                if not (tails and v == last):
                    self.store_outer(value, r0, c0, v, col, lanes, True, True, 0)
                elif col < cols - 1:
                    joined(value, kept(col + 1), v, col)
                else:
                    when(
                        "sge",
                        cols_total - cols,
                        lambda value=value, v=v, col=col: alone(value, v, col),
                        lambda value=value: keep(value, col_step),
                    )

    def streams_c(self) -> bool:
        return streams_c(self.spec, self.b)

    def c_shifts(self) -> list[int]:
        return c_shifts(self.spec, self.b)

    def c_vector_aligned(self) -> str:
        f, vector_bytes = self.f, self.b.lanes * self.spec.itemsize
        self.module.declare("nontemporal", f"!{NONTEMPORAL} = !{{i32 1}}")
        return f.assign(f"icmp eq i64 {f.misaligned_bytes('%C', vector_bytes)}, 0", "c")

    def store_mirror(
        self,
        acc: list[str],
        r0: str | int,
        c0: str | int,
        vectors: int,
        cols: int,
        active: list[int],
        overwrite: bool | str,
    ) -> None:
        """Add the mirror form's block of C^T to the column-major C: transpose it in registers
        (lanes x lanes at a time) so that every column of C gets one contiguous update; a
        single row of C of unit stride takes the block's vectors as they are."""
        f, lanes, spec = self.f, self.b.lanes, self.spec
        if cols == 1 and spec.ldc == 1:
            # C is one row (M of one) of unit stride: each vector of the block is a run of it,
            # added whole instead of lane by lane (FP64 `cb,cba->a` 61440 x 248 summed 8 rows
            # at a time, one thread: 11.8-11.9 -> 9.5-9.9 ms, NumPy 9.1-9.4)
            for v in range(vectors):
                offset = f.add_i64(c0, f.add_i64(r0, v * lanes))
                self.update_vector(acc[v], offset, active[v], overwrite)
            return
        for v in range(vectors):
            for start in range(0, cols, lanes):
                width = min(lanes, cols - start)
                block = [acc[(start + i) * vectors + v] for i in range(width)]
                block += ["zeroinitializer"] * (lanes - width)
                columns = transpose_vectors(f, block, lanes, spec.itemsize)
                for lane in range(active[v]):
                    n_index = f.add_i64(r0, v * lanes + lane)
                    offset = f.add_i64(f.add_i64(c0, start), f.mul_i64(n_index, spec.ldc))
                    self.update_column(
                        [(columns[lane], i) for i in range(width)], offset, overwrite
                    )

    def loaded_c(
        self, r0: str | int, c0: str | int, v: int, col: int, active: int, overwrite: bool | str
    ) -> str:
        """The vector of C a register block starts from (zeros where C is overwritten)."""
        if overwrite is True:
            return "zeroinitializer"
        offset = self.f.add_i64(
            self.f.add_i64(r0, v * self.b.lanes),
            self.f.mul_i64(self.f.add_i64(c0, col), self.spec.ldc),
        )
        loaded = self.load_vector("%C", offset, active)
        if overwrite is False:
            return loaded
        return self.f.assign(
            f"select i1 {overwrite}, {self.vt} zeroinitializer, {self.vt} {loaded}", "v"
        )

    def store_outer(
        self,
        value: str,
        r0: str | int,
        c0: str | int,
        v: int,
        col: int,
        active: int,
        overwrite: bool | str,
        streamed: bool = False,
        first: int = 0,
    ) -> None:
        """Vector ``v`` of column ``col`` of an outer-form block into C (the mirror form's
        blocks go through :meth:`store_mirror`)."""
        assert self.b.form == "outer"
        f, lanes = self.f, self.b.lanes
        offset = f.add_i64(f.add_i64(r0, v * lanes), f.mul_i64(f.add_i64(c0, col), self.spec.ldc))
        self.update_vector(value, offset, active, overwrite, streamed, first)

    def update_vector(
        self,
        value: str,
        offset: str | int,
        active: int,
        overwrite: bool | str,
        streamed: bool = False,
        first: int = 0,
    ) -> None:
        """C's vector at ``offset`` (lanes ``first`` to ``active - 1``) = ``value`` when
        overwriting, else += ``value``."""
        f = self.f
        if overwrite is not True:
            total = f.assign(
                f"fadd {self.vt} {self.load_vector('%C', offset, active, first)}, {value}", "v"
            )
            value = (
                total
                if overwrite is False
                else f.assign(f"select i1 {overwrite}, {self.vt} {value}, {self.vt} {total}", "v")
            )
        self.store_vector(value, "%C", offset, active, streamed, first)

    def update_scalar(self, pointer: str, element: str, overwrite: bool | str) -> None:
        """``*pointer = element`` when overwriting, else ``*pointer += element``."""
        f = self.f
        align = self.spec.itemsize
        if overwrite is not True:
            old = f.assign(f"load {self.t}, ptr {pointer}, align {align}", "s")
            total = f.assign(f"fadd {self.t} {old}, {element}", "s")
            element = (
                total
                if overwrite is False
                else f.assign(f"select i1 {overwrite}, {self.t} {element}, {self.t} {total}", "s")
            )
        f.emit(f"store {self.t} {element}, ptr {pointer}, align {align}")

    def k_loop(  # type: ignore[no-untyped-def]
        self,
        accs: list[str],
        kinds: list[tuple[str, str]],
        step,
        runs: list[tuple[Callable[[str | int], str], int]] | None = None,
        element: str | int = 0,
        elements: int = 1,
    ) -> list[str]:
        """Run ``step(accs, k)`` for every k, the loop unrolled ``K_UNROLL`` times; the
        prefetch ``runs`` (pointer, lines) are spread over the rounds of the loops of all
        ``elements`` batch elements (this one is ``element``)."""
        f = self.f
        full, rest = divmod(self.spec.k, K_UNROLL)
        runs = runs or []
        if full:

            def body(index: str, values: list[str]) -> list[str]:
                base = f.mul_i64(index, K_UNROLL)
                round_ = f.add_i64(f.mul_i64(element, full), index) if runs else index
                for address, share in runs:
                    per = min(-(-share // (full * elements)), PREFETCH_PER_ROUND)
                    for j in range(per):
                        line = f.umin_i64(f.add_i64(f.mul_i64(round_, per), j), share - 1)
                        self.prefetch_line(address(line))
                for u in range(K_UNROLL):
                    values = step(values, f.add_i64(base, u))
                return values

            accs = f.loop(full, [(kind, value) for (kind, _), value in zip(kinds, accs)], body, "k")
        for r in range(rest):
            accs = step(accs, full * K_UNROLL + r)
        return accs

    # ---- the dot-product form ------------------------------------------------------------
    def dot_block(
        self,
        a: str,
        b: str,
        r0: str | int,
        c0: str | int,
        rows: int,
        cols: int,
        batch: int,
        overwrite: bool | str,
    ) -> None:
        """C[r0 : r0 + rows, c0 : c0 + cols] from rows of A and columns of B (unit K)."""
        spec, blk, f = self.spec, self.b, self.f
        lanes = blk.lanes
        steps = -(-spec.k // lanes)
        last_active = spec.k - (steps - 1) * lanes
        block = rows * cols
        # (no more registers than the full block takes)
        full = blk.vectors * blk.columns + blk.vectors + blk.columns
        chains = dot_chains(rows, cols, steps, full)
        kinds = [(self.vt, "zeroinitializer")] * (block * chains)

        def batch_body(index: str, accs: list[str]) -> list[str]:
            ab = f.gep(self.t, a, f.mul_i64(index, spec.stride_a))
            bb = f.gep(self.t, b, f.mul_i64(index, spec.stride_b))

            def step(values: list[str], s: str | int, active: int, chain: int = 0) -> list[str]:
                """One K step into the accumulators of ``chain``."""
                k = f.mul_i64(s, lanes)
                av = [
                    self.load_vector(
                        ab, f.add_i64(f.mul_i64(f.add_i64(r0, r), spec.lda), k), active
                    )
                    for r in range(rows)
                ]
                bv = [
                    self.load_vector(
                        bb, f.add_i64(f.mul_i64(f.add_i64(c0, c), spec.ldb), k), active
                    )
                    for c in range(cols)
                ]
                out = list(values)
                for c in range(cols):
                    for r in range(rows):
                        at = chain * block + c * rows + r
                        out[at] = self.fmuladd(av[r], bv[c], out[at])
                return out

            def group(g: str, vals: list[str]) -> list[str]:
                for j in range(chains):
                    vals = step(vals, f.add_i64(f.mul_i64(g, chains), j), lanes, j)
                return vals

            values = accs
            groups, rest = divmod(steps - 1, chains)
            if groups:
                values = f.loop(groups, [(self.vt, v) for v in values], group, "kv")
            for j in range(rest):
                values = step(values, groups * chains + j, lanes, j)
            return step(values, steps - 1, last_active, rest % chains)

        acc = f.loop(batch, kinds, batch_body, "br")
        for j in range(1, chains):
            acc[:block] = [
                f.assign(f"fadd {self.vt} {x}, {y}", "x")
                for x, y in zip(acc[:block], acc[j * block : (j + 1) * block])
            ]
        sums = self.reduce_all(acc[:block])
        for c in range(cols):
            column = [sums[c * rows + r] for r in range(rows)]
            offset = f.add_i64(r0, f.mul_i64(f.add_i64(c0, c), spec.ldc))
            self.update_column(column, offset, overwrite)

    def reduce_all(self, vectors: list[str]) -> list[tuple[str, int]]:
        """Horizontal sums of all ``vectors``, as (final vector, lane) per input vector.

        A tree of shuffles and adds: while every input still spans w > 1 lanes, pairs of
        vectors are combined so that each input spans w/2 lanes (its two halves added) —
        about 3 operations per pair instead of log2(lanes) per vector.
        """
        f, lanes, vt = self.f, self.b.lanes, self.vt
        # Each working vector: its SSA name and, per lane, the input it belongs to.
        work: list[tuple[str, list[int | None]]] = [(v, [i] * lanes) for i, v in enumerate(vectors)]
        width = lanes
        while width > 1:
            half = width // 2
            if len(work) % 2:
                work.append(("zeroinitializer", [None] * lanes))
            low_mask, high_mask = [], []
            for t in range(lanes // width):
                base = t * width
                low_mask += [base + i for i in range(half)] + [
                    lanes + base + i for i in range(half)
                ]
                high_mask += [base + half + i for i in range(half)] + [
                    lanes + base + half + i for i in range(half)
                ]
            paired = []
            for (a, la), (b, lb) in zip(work[0::2], work[1::2]):
                both = la + lb
                low = f.assign(
                    f"shufflevector {vt} {a}, {vt} {b}, <{lanes} x i32> {shuffle_mask(low_mask)}",
                    "x",
                )
                high = f.assign(
                    f"shufflevector {vt} {a}, {vt} {b}, <{lanes} x i32> {shuffle_mask(high_mask)}",
                    "x",
                )
                total = f.assign(f"fadd reassoc {vt} {low}, {high}", "x")
                paired.append((total, [both[k] for k in low_mask]))
            work = paired
            width = half
        where: dict[int, tuple[str, int]] = {}
        for name, labels in work:
            for lane, label in enumerate(labels):
                if label is not None:
                    where[label] = (name, lane)
        return [where[i] for i in range(len(vectors))]

    def update_column(
        self, column: list[tuple[str, int]], offset: str | int, overwrite: bool | str
    ) -> None:
        """C[offset : offset + len(column)] (+)= the sums (contiguous rows of one column)."""
        f, t = self.f, self.t
        rows = len(column)
        sources = list(dict.fromkeys(name for name, _ in column))
        pointer = f.gep(t, "%C", offset)
        if rows == 1 or len(sources) > 2:
            for r, (name, lane) in enumerate(column):
                element = f.assign(f"extractelement {self.vt} {name}, i64 {lane}", "e")
                self.update_scalar(f.gep(t, pointer, r), element, overwrite)
            return
        second = sources[1] if len(sources) == 2 else "poison"
        mask = [lane + (self.b.lanes if name != sources[0] else 0) for name, lane in column]
        small = f"<{rows} x {t}>"
        values = f.assign(
            f"shufflevector {self.vt} {sources[0]}, {self.vt} {second}, "
            f"<{rows} x i32> {shuffle_mask(mask)}",
            "x",
        )
        align = self.spec.itemsize
        if overwrite is not True:
            old = f.assign(f"load {small}, ptr {pointer}, align {align}", "x")
            total = f.assign(f"fadd {small} {old}, {values}", "x")
            values = (
                total
                if overwrite is False
                else f.assign(f"select i1 {overwrite}, {small} {values}, {small} {total}", "x")
            )
        f.emit(f"store {small} {values}, ptr {pointer}, align {align}")


def kernel_stack_bytes(spec: BrgemmSpec, target: Target) -> int:
    """The stack the kernel for ``spec`` needs for its packing buffer (0 without one)."""
    if spec.one_element:
        return 0
    return choose_blocking(spec, target).stack_bytes(spec)


def brgemm_function(
    spec: BrgemmSpec,
    target: Target,
    module: Module,
    name: str,
    linkage: str = "",
    blocking: Blocking | None = None,
    attributes: str = "",
    prefetch: Prefetch | None = None,
) -> Blocking:
    """Add the kernel ``void name(ptr A, ptr B, ptr C)`` for ``spec`` to ``module``.

    ``linkage`` ``internal`` lets a loop nest in the same module inline it; ``attributes``
    are function attributes such as ``noinline``. With ``prefetch`` the kernel also takes the
    next call's A and B (``Prefetch``).
    """
    blocking = blocking or choose_blocking(spec, target)
    if spec.one_element:
        _scalar_function(spec, module, name, linkage, attributes, prefetch is not None)
        return blocking
    attributes += probe_attribute(target, blocking.stack_bytes(spec))
    emitter = _Emitter(spec, blocking, module, name, linkage, attributes, prefetch)
    emitter.emit()
    return blocking


def _kernel_header(name: str, linkage: str, attributes: str, prefetch: bool = False) -> str:
    """The signature every BRGEMM kernel shares: ``void name(ptr A, ptr B, ptr C)``, with the
    next call's A and B after them where the kernel prefetches those."""
    following = ", ptr %PA, ptr %PB" if prefetch else ""
    return (
        f"define {linkage} void @{name}(ptr noalias readonly %A, ptr noalias readonly %B, "
        f"ptr noalias %C{following}) nounwind {attributes}"
    )


def _scalar_function(
    spec: BrgemmSpec, module: Module, name: str, linkage: str, attributes: str, prefetch: bool
) -> None:
    """The one-element kernel ``C = A * B`` (``C += A * B`` with beta 1) in scalar code: a loop
    nest around it (an elementwise product) is then plain scalar code that LLVM's loop
    vectorizer widens, which it does not do for a loop around one-lane masked vectors."""
    t = scalar_type(spec.itemsize)
    f = FunctionBuilder(module, _kernel_header(name, linkage, attributes, prefetch))
    a = f.assign(f"load {t}, ptr %A, align {spec.itemsize}", "a")
    b = f.assign(f"load {t}, ptr %B, align {spec.itemsize}", "b")
    if spec.beta:
        fma = f"@llvm.fmuladd.{type_suffix(spec.itemsize)}"
        module.declare(f"fmuladd.{t}", f"declare {t} {fma}({t}, {t}, {t})")
        c = f.assign(f"load {t}, ptr %C, align {spec.itemsize}", "c")
        value = f.assign(f"call {t} {fma}({t} {a}, {t} {b}, {t} {c})", "v")
    else:
        value = f.assign(f"fmul {t} {a}, {b}", "v")
    f.emit(f"store {t} {value}, ptr %C, align {spec.itemsize}")
    f.finish()


# A C tile gets the shifted sweeps only with at least this many vectors per column (a partial
# one counted): the shift adds one (FP32 C 16 bytes past a boundary, streamed: M 96 60 -> 75 %
# of peak, M 32 63 -> 50 %; trus,pqtu->pqrs 32x64x64x64 by 48x48x32x64 into a np.zeros out,
# M 64, on the Xeon: 57 % shifted, 82 % stored normally) ...
SHIFT_LEAST_VECTORS = 5
# ... and where the output does not outgrow the last level (not ``c_beyond_caches``), only
# while its K steps per vector of a column (k x batch / vectors) are at most this: the normal
# stores' line reads mostly hit the last level there, and the shift's extra vector costs K
# FMAs per column against the v line reads streaming saves. Zen 4, 2 threads, into outs of
# 8-60 MiB 16 bytes off, both rules built in one process and timed interleaved: efc,jbc->fjeb
# FP32 (M 96 and 128, 28-38 MiB) K 128 1.23x and 1.13x stored normally (77 -> 85-87 % of
# peak; 97 % into an aligned out), K 16-64 shifted as before; 48 random contractions whose
# kernels have 5-15 vectors per column: those with K/v above this 1.00-1.40x (cda,cdjg->ajg
# FP32 1.40x, hjcg,dcbjh->jdbg 1.28x), geomean 1.04x and 1.02x over the two sets, none below
# 0.97x. (Separate processes, three rounds, had shown losses at small K/v that the same
# cases did not repeat.) Beyond the caches (113-150 MiB) the shift paid even at K/v 5.3
# (1.25x) and 16 (1.00x).
SHIFT_MOST_DEPTH_PER_VECTOR = 8


def streams_c(spec: BrgemmSpec, blk: Blocking) -> bool:
    """Whether C's full vectors go around the caches: asked for, written exactly once
    (overwritten in one pass over the batch), and every register block's vectors aligned
    when C is (register blocks start at multiples of the vector width)."""
    return (
        spec.stream_c
        and spec.beta == 0
        and blk.chunk == spec.batch
        and not blk.k_piece
        and blk.form == "outer"
        and columns_aligned(spec, blk.lanes)
    )


def c_shifts(spec: BrgemmSpec, blk: Blocking) -> list[int]:
    """The misalignments of C (in elements) that get a sweep of their own, shifted onto
    vector boundaries so that C still goes around the caches: the multiples of 16 bytes,
    the alignment NumPy gives large arrays (FP32 with C 16 bytes past a boundary:
    60 % of peak with regular stores, 94 % shifted)."""
    if not streams_c(spec, blk):  # (the outer form only)
        return []
    vectors = -(-spec.m // blk.lanes)
    if vectors < SHIFT_LEAST_VECTORS:
        return []  # the extra vector per column costs more than the streaming saves
    if not spec.c_beyond_caches and spec.k * spec.batch > SHIFT_MOST_DEPTH_PER_VECTOR * vectors:
        return []
    step = 16 // spec.itemsize
    return list(range(step, blk.lanes, step))


def _parts(total: int, step: int) -> list[tuple[int, int, int]]:
    """Blocks of ``step`` over ``total``: (count, size, first index) for full and tail."""
    full, tail = divmod(total, step)
    parts = [(full, step, 0)] if full else []
    return parts + ([(1, tail, full * step)] if tail else [])
