"""LLVM IR for a checked call: a CPython ``METH_FASTCALL`` function that checks its NumPy
array arguments against what a compiled nest was planned for and runs the nest on them.

A repeated ``teir.einsum`` spent about 2.5 us in Python (building its cache key, checking
dtypes, overlap and writability, reading addresses, calling through ctypes) around a 64^3
GEMM's 3.5 us of kernels. This function does all of that in one native call of about
0.1 us, holding the GIL (so the runtime gives it only calls of short estimated time).

``PyObject *call(PyObject *context, PyObject *const *args, Py_ssize_t nargs)`` finds its
plan in ``context``, an int64 ndarray of the words below (:data:`HEADER`); each argument is
an ndarray whose type, dtype object, dimensions, strides and (for the last, the output)
writable flag must equal the argument's record, and the output's bytes must not overlap an
input's. It returns one of the code objects: :data:`DONE`; :data:`FALLBACK` with nothing
touched (a check failed, or the pool is busy or missing); or, with the workers still owned
(the busy word of :mod:`teir.codegen.spin` held), :data:`WAKE` (a worker sleeps: the caller
wakes it and finishes the dispatch) or :data:`JOIN` (a worker had not finished when the
native join gave up).
"""

from __future__ import annotations

from dataclasses import dataclass

from teir.codegen.spin import BUSY_WORD

DONE, FALLBACK, WAKE, JOIN = 0, 1, 2, 3
# The context's header words; argument i's record starts at the word context[RECORDS + i]
# and holds: ndim, writable (0/1), span low (bytes from the data address), span length,
# then ndim sizes and ndim byte strides.
HEADER = (
    "ndarray_type",  # address of numpy.ndarray
    "incref",  # address of Py_IncRef
    "code0",  # the objects returned for DONE, FALLBACK, WAKE, JOIN
    "code1",
    "code2",
    "code3",
    "nargs",  # 2 (in0, out) or 3 (in0, in1, out)
    "descr",  # the dtype object every argument must have
    "nest",  # void nest(ptr in0, ptr in1, ptr out, i64 lo, i64 hi, ptr first, ptr last)
    "size",  # the nest's parallel index space, run whole where there is no job
    "first",
    "last",
    "job",  # the parallel job's words (0: call the nest on this thread)
    "pool",  # address of [control block address, workers] (runtime.pool.checked_state)
    "dispatch",  # the spin module's _dispatch
    "helpers",  # workers the job needs
    "record0",
    "record1",
    "record2",
)
RECORDS = HEADER.index("record0")


@dataclass(frozen=True)
class ArrayFields:
    """Byte offsets of the fields of NumPy's array object (``PyArrayObject_fields``) and of
    CPython's object header that the call reads, as verified on this interpreter."""

    ob_type: int
    data: int
    nd: int
    dimensions: int
    strides: int
    descr: int
    flags: int
    writeable: int  # the flag bit
    aligned: int  # the flag bit: data and strides whole elements apart


def _word(name: str) -> int:
    return HEADER.index(name)


def checked_call_module(fields: ArrayFields, prefix: str) -> str:
    """The module defining ``{prefix}_call`` (see the module docstring)."""
    f = fields

    def header(name: str, kind: str = "i64") -> list[str]:
        """Loads header word ``name`` into ``%ctx.name``."""
        at = f"%ctx.{name}.at"
        lines = [f"  {at} = getelementptr inbounds i64, ptr %ctx, i64 {_word(name)}"]
        lines.append(f"  %ctx.{name} = load {kind}, ptr {at}, align 8")
        return lines

    def field(name: str, obj: str, offset: int, kind: str) -> list[str]:
        return [
            f"  %{name}.at = getelementptr inbounds i8, ptr {obj}, i64 {offset}",
            f"  %{name} = load {kind}, ptr %{name}.at, align 8",
        ]

    return "\n".join(
        [
            f"define ptr @{prefix}_call(ptr %self, ptr %args, i64 %nargs) {{",
            "entry:",
            "  %datas = alloca [3 x i64], align 8",
            "  %lows = alloca [3 x i64], align 8",
            "  %counts = alloca [3 x i64], align 8",
            *field("ctx", "%self", f.data, "ptr"),
            *header("nargs"),
            *header("ndarray_type"),
            *header("descr"),
            "  %same.count = icmp eq i64 %nargs, %ctx.nargs",
            "  br i1 %same.count, label %arg, label %fallback",
            # ---- each argument: type, dtype, ndim, writable, sizes and strides
            "arg:",
            "  %i = phi i64 [0, %entry], [%i.next, %arg.done]",
            "  %i.more = icmp ult i64 %i, %nargs",
            "  br i1 %i.more, label %arg.type, label %overlap",
            "arg.type:",
            "  %obj.at = getelementptr inbounds ptr, ptr %args, i64 %i",
            "  %obj = load ptr, ptr %obj.at, align 8",
            *field("type", "%obj", f.ob_type, "i64"),
            "  %is.array = icmp eq i64 %type, %ctx.ndarray_type",
            "  br i1 %is.array, label %arg.descr, label %fallback",
            "arg.descr:",
            *field("descr.got", "%obj", f.descr, "i64"),
            f"  %rec.index = add i64 %i, {RECORDS}",
            "  %rec.index.at = getelementptr inbounds i64, ptr %ctx, i64 %rec.index",
            "  %rec.start = load i64, ptr %rec.index.at, align 8",
            "  %rec = getelementptr inbounds i64, ptr %ctx, i64 %rec.start",
            "  %ndim = load i64, ptr %rec, align 8",
            "  %nd.at = getelementptr inbounds i8, ptr %obj, i64 " + str(f.nd),
            "  %nd32 = load i32, ptr %nd.at, align 4",
            "  %nd = sext i32 %nd32 to i64",
            "  %same.descr = icmp eq i64 %descr.got, %ctx.descr",
            "  %same.nd = icmp eq i64 %nd, %ndim",
            "  %same.kind = and i1 %same.descr, %same.nd",
            "  br i1 %same.kind, label %arg.flags, label %fallback",
            "arg.flags:",
            "  %writable.at = getelementptr inbounds i64, ptr %rec, i64 1",
            "  %writable = load i64, ptr %writable.at, align 8",
            "  %flags.at = getelementptr inbounds i8, ptr %obj, i64 " + str(f.flags),
            "  %flags32 = load i32, ptr %flags.at, align 4",
            f"  %wbit = and i32 %flags32, {f.writeable}",
            "  %lacks = icmp eq i32 %wbit, 0",
            "  %needs = icmp ne i64 %writable, 0",
            "  %read.only = and i1 %needs, %lacks",
            f"  %abit = and i32 %flags32, {f.aligned}",
            "  %unaligned = icmp eq i32 %abit, 0",
            "  %refused = or i1 %read.only, %unaligned",
            "  br i1 %refused, label %fallback, label %arg.dims",
            "arg.dims:",
            *field("dims", "%obj", f.dimensions, "ptr"),
            *field("strides", "%obj", f.strides, "ptr"),
            "  %sizes.want = getelementptr inbounds i64, ptr %rec, i64 4",
            "  %strides.want = getelementptr inbounds i64, ptr %sizes.want, i64 %ndim",
            "  br label %dim",
            "dim:",
            "  %d = phi i64 [0, %arg.dims], [%d.next, %dim.body]",
            "  %d.more = icmp ult i64 %d, %ndim",
            "  br i1 %d.more, label %dim.body, label %arg.done",
            "dim.body:",
            "  %n.at = getelementptr inbounds i64, ptr %dims, i64 %d",
            "  %n = load i64, ptr %n.at, align 8",
            "  %s.at = getelementptr inbounds i64, ptr %strides, i64 %d",
            "  %s = load i64, ptr %s.at, align 8",
            "  %n.want.at = getelementptr inbounds i64, ptr %sizes.want, i64 %d",
            "  %n.want = load i64, ptr %n.want.at, align 8",
            "  %s.want.at = getelementptr inbounds i64, ptr %strides.want, i64 %d",
            "  %s.want = load i64, ptr %s.want.at, align 8",
            "  %same.n = icmp eq i64 %n, %n.want",
            "  %same.s = icmp eq i64 %s, %s.want",
            "  %same.dim = and i1 %same.n, %same.s",
            "  %d.next = add i64 %d, 1",
            "  br i1 %same.dim, label %dim, label %fallback",
            "arg.done:",
            *field("data", "%obj", f.data, "i64"),
            "  %low.at = getelementptr inbounds i64, ptr %rec, i64 2",
            "  %low = load i64, ptr %low.at, align 8",
            "  %count.at = getelementptr inbounds i64, ptr %rec, i64 3",
            "  %count = load i64, ptr %count.at, align 8",
            "  %start = add i64 %data, %low",
            "  %data.slot = getelementptr inbounds [3 x i64], ptr %datas, i64 0, i64 %i",
            "  store i64 %data, ptr %data.slot, align 8",
            "  %low.slot = getelementptr inbounds [3 x i64], ptr %lows, i64 0, i64 %i",
            "  store i64 %start, ptr %low.slot, align 8",
            "  %count.slot = getelementptr inbounds [3 x i64], ptr %counts, i64 0, i64 %i",
            "  store i64 %count, ptr %count.slot, align 8",
            "  %i.next = add i64 %i, 1",
            "  br label %arg",
            # ---- the output (the last argument) against each input: byte spans disjoint
            "overlap:",
            "  %o = sub i64 %nargs, 1",
            "  %o.low.at = getelementptr inbounds [3 x i64], ptr %lows, i64 0, i64 %o",
            "  %o.low = load i64, ptr %o.low.at, align 8",
            "  %o.count.at = getelementptr inbounds [3 x i64], ptr %counts, i64 0, i64 %o",
            "  %o.count = load i64, ptr %o.count.at, align 8",
            "  %o.high = add i64 %o.low, %o.count",
            "  br label %pair",
            "pair:",
            "  %j = phi i64 [0, %overlap], [%j.next, %pair.body]",
            "  %j.more = icmp ult i64 %j, %o",
            "  br i1 %j.more, label %pair.body, label %run",
            "pair.body:",
            "  %j.low.at = getelementptr inbounds [3 x i64], ptr %lows, i64 0, i64 %j",
            "  %j.low = load i64, ptr %j.low.at, align 8",
            "  %j.count.at = getelementptr inbounds [3 x i64], ptr %counts, i64 0, i64 %j",
            "  %j.count = load i64, ptr %j.count.at, align 8",
            "  %j.high = add i64 %j.low, %j.count",
            "  %below = icmp ult i64 %o.low, %j.high",
            "  %above = icmp ult i64 %j.low, %o.high",
            "  %overlaps = and i1 %below, %above",
            "  %j.next = add i64 %j, 1",
            "  br i1 %overlaps, label %fallback, label %pair",
            # ---- the nest, on this thread or through the pool
            "run:",
            "  %in0.at = getelementptr inbounds [3 x i64], ptr %datas, i64 0, i64 0",
            "  %in0.bits = load i64, ptr %in0.at, align 8",
            "  %in0 = inttoptr i64 %in0.bits to ptr",
            "  %binary = icmp eq i64 %nargs, 3",
            "  %in1.at = getelementptr inbounds [3 x i64], ptr %datas, i64 0, i64 1",
            "  %in1.read = load i64, ptr %in1.at, align 8",
            "  %in1.bits = select i1 %binary, i64 %in1.read, i64 0",
            "  %in1 = inttoptr i64 %in1.bits to ptr",
            "  %out.at = getelementptr inbounds [3 x i64], ptr %datas, i64 0, i64 %o",
            "  %out.bits = load i64, ptr %out.at, align 8",
            "  %out = inttoptr i64 %out.bits to ptr",
            *header("job", "ptr"),
            "  %single = icmp eq ptr %ctx.job, null",
            "  br i1 %single, label %alone, label %shared",
            "alone:",
            *header("nest", "ptr"),
            *header("size"),
            *header("first", "ptr"),
            *header("last", "ptr"),
            "  call void %ctx.nest(ptr %in0, ptr %in1, ptr %out, i64 0, i64 %ctx.size, "
            "ptr %ctx.first, ptr %ctx.last)",
            "  br label %done",
            "shared:",
            *header("pool", "ptr"),
            *header("helpers"),
            "  %control = load ptr, ptr %ctx.pool, align 8",
            "  %workers.at = getelementptr inbounds i64, ptr %ctx.pool, i64 1",
            "  %workers = load i64, ptr %workers.at, align 8",
            "  %started = icmp ne ptr %control, null",
            "  %enough = icmp uge i64 %workers, %ctx.helpers",
            "  %usable = and i1 %started, %enough",
            "  br i1 %usable, label %acquire, label %fallback",
            "acquire:",
            f"  %busy = getelementptr inbounds i64, ptr %control, i64 {BUSY_WORD}",
            "  %pair.cas = cmpxchg ptr %busy, i64 0, i64 1 seq_cst seq_cst, align 8",
            "  %got = extractvalue { i64, i1 } %pair.cas, 1",
            "  br i1 %got, label %dispatch, label %fallback",
            "dispatch:",
            *header("dispatch", "ptr"),
            "  %status = call i64 %ctx.dispatch(ptr %control, i64 %workers, ptr %ctx.job, "
            "ptr %in0, ptr %in1, ptr %out, i64 0)",
            "  %joined = icmp eq i64 %status, 0",
            "  br i1 %joined, label %release, label %pending",
            "release:",
            "  store atomic i64 0, ptr %busy release, align 8",
            "  br label %done",
            "pending:",  # status 1 (a worker sleeps) -> WAKE, 2 (join gave up) -> JOIN
            f"  %pending.code = add i64 %status, {WAKE - 1}",
            "  br label %return",
            "done:",
            "  br label %return",
            "fallback:",
            "  br label %return",
            "return:",
            f"  %code = phi i64 [{DONE}, %done], [{FALLBACK}, %fallback], "
            "[%pending.code, %pending]",
            f"  %code.word = add i64 %code, {_word('code0')}",
            "  %result.at = getelementptr inbounds i64, ptr %ctx, i64 %code.word",
            "  %result = load ptr, ptr %result.at, align 8",
            *header("incref", "ptr"),
            "  call void %ctx.incref(ptr %result)",
            "  ret ptr %result",
            "}",
        ]
    )
