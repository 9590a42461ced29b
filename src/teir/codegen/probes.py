"""LLVM IR for the machine probe: an FMA-throughput loop and a vector copy loop."""

from __future__ import annotations

from teir.codegen.irtext import scalar_type, type_suffix, vector_type
from teir.codegen.target import Target

# Independent accumulators the probe keeps in registers: more than the FMA latency times the
# FMA pipes on any x86 or aarch64 core, and, with the two multiplicands, within the registers
# (24 of AVX-512's 32, 12 of AVX2's 16).
MAX_ACCUMULATORS = 24


def probe_accumulators(target: Target) -> int:
    return min(MAX_ACCUMULATORS, target.vector_registers - 4)


def fma_probe(target: Target, itemsize: int, name: str) -> str:
    """``T name(i64 n)``: n iterations of independent vector FMAs in registers.

    Each iteration does one FMA on ``lanes`` elements per accumulator. Every FMA adds into its
    accumulator (``acc += a * b``, as the GEMM kernels do) with two multiplicands held in
    registers, and the loop is not unrolled: accumulators carried through the multiplicand
    with one constant each needed a register more than there were, and LLVM's unrolled and
    interleaved copy of that read 84 % of the rate the kernels reached on Zen 4 (99 against
    117 GFLOP/s FP32 on one core), so every "of peak" figure read too high.
    """
    lanes = target.lanes(itemsize)
    accumulators = probe_accumulators(target)
    t, vt = scalar_type(itemsize), vector_type(lanes, itemsize)
    intrinsic = f"llvm.fmuladd.v{lanes}{type_suffix(itemsize)}"
    lines = [
        f"declare {vt} @{intrinsic}({vt}, {vt}, {vt})",
        f"define {t} @{name}(i64 %n) nounwind {{",
        "entry:",
        "  br label %loop",
        "loop:",
        "  %i = phi i64 [0, %entry], [%i1, %loop]",
    ]
    lines += [
        f"  %a{a} = phi {vt} [zeroinitializer, %entry], [%b{a}, %loop]" for a in range(accumulators)
    ]
    lines += [
        f"  %b{a} = call {vt} @{intrinsic}({vt} splat ({t} 0.5), {vt} splat ({t} {a % 2 + 1}.0), "
        f"{vt} %a{a})"
        for a in range(accumulators)
    ]
    lines += [
        "  %i1 = add i64 %i, 1",
        "  %c = icmp ult i64 %i1, %n",
        "  br i1 %c, label %loop, label %done, !llvm.loop !0",
        "done:",
    ]
    previous = "%b0"
    for a in range(1, accumulators):
        lines.append(f"  %s{a} = fadd {vt} {previous}, %b{a}")
        previous = f"%s{a}"
    lines += [f"  %r = extractelement {vt} {previous}, i32 0", f"  ret {t} %r", "}"]
    lines += ["!0 = distinct !{!0, !1}", '!1 = !{!"llvm.loop.unroll.disable"}']
    return "\n".join(lines) + "\n"


def flops_per_iteration(target: Target, itemsize: int) -> int:
    return 2 * probe_accumulators(target) * target.lanes(itemsize)


def copy_probe(target: Target, name: str, streamed: bool = False) -> str:
    """``void name(ptr src, ptr dst, i64 blocks, i64 reps)``: copy ``blocks`` blocks of four
    vector registers from src to dst, ``reps`` times; ``streamed``: stored around the caches
    (non-temporal, dst vector-aligned), as copies between buffers in memory are."""
    lanes = target.lanes(4)
    vt = vector_type(lanes, 4)
    store = f"align {lanes * 4}, !nontemporal !0" if streamed else "align 4"
    body = []
    for u in range(4):
        body += [
            f"  %o{u} = add i64 %base, {u * lanes}",
            f"  %s{u} = getelementptr inbounds float, ptr %src, i64 %o{u}",
            f"  %v{u} = load {vt}, ptr %s{u}, align 4",
            f"  %d{u} = getelementptr inbounds float, ptr %dst, i64 %o{u}",
            f"  store {vt} %v{u}, ptr %d{u}, {store}",
        ]
    return (
        "\n".join(
            [
                f"define void @{name}(ptr noalias %src, ptr noalias %dst, i64 %blocks, i64 %reps) "
                "nounwind {",
                "entry:",
                "  br label %rep",
                "rep:",
                "  %r = phi i64 [0, %entry], [%r1, %rep.end]",
                "  br label %block",
                "block:",
                "  %b = phi i64 [0, %rep], [%b1, %block]",
                f"  %base = mul i64 %b, {4 * lanes}",
                *body,
                "  %b1 = add i64 %b, 1",
                "  %more = icmp ult i64 %b1, %blocks",
                "  br i1 %more, label %block, label %rep.end",
                "rep.end:",
                "  %r1 = add i64 %r, 1",
                "  %again = icmp ult i64 %r1, %reps",
                "  br i1 %again, label %rep, label %done",
                "done:",
                "  ret void",
                "}",
                *(["!0 = !{i32 1}"] if streamed else []),
            ]
        )
        + "\n"
    )


def copy_block_bytes(target: Target) -> int:
    """Bytes one block of :func:`copy_probe` copies."""
    return 4 * target.vector_bits // 8
