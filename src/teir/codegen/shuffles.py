"""Shuffle sequences shared by the kernels: an in-register transpose of a square block."""

from __future__ import annotations

from teir.codegen.irtext import FunctionBuilder, shuffle_mask, vector_type


def transpose_vectors(f: FunctionBuilder, rows: list[str], lanes: int, itemsize: int) -> list[str]:
    """Transpose lanes x lanes values given as rows (vectors); returns the columns.

    Stage b exchanges bit b of the row index with bit b of the lane index. Within a 128-bit
    chunk this is an unpack (interleave) of rows i and i + 2**b, which x86 and NEON do in one
    cheap instruction; across chunks it is a swap of 2**b-lane blocks. The unpacks leave the
    outputs in a permuted order, which a symbolic run of the same shuffles (on (row, lane)
    labels) undoes.
    """
    vt = vector_type(lanes, itemsize)
    chunk = max(1, 16 // itemsize)  # elements in 128 bits
    labels = [[(r, c) for c in range(lanes)] for r in range(lanes)]
    rows = list(rows)
    d = 1
    while d < lanes:
        first, second = _stage_masks(lanes, d, chunk)
        for i in range(lanes):
            if i & d:
                continue
            low, high = rows[i], rows[i | d]
            rows[i] = f.assign(
                f"shufflevector {vt} {low}, {vt} {high}, <{lanes} x i32> {shuffle_mask(first)}", "x"
            )
            rows[i | d] = f.assign(
                f"shufflevector {vt} {low}, {vt} {high}, <{lanes} x i32> {shuffle_mask(second)}",
                "x",
            )
            pair = labels[i] + labels[i | d]
            labels[i] = [pair[k] for k in first]
            labels[i | d] = [pair[k] for k in second]
        d *= 2
    columns: list[str] = [""] * lanes
    for vector, label in zip(rows, labels):
        column = label[0][1]
        assert label == [(r, column) for r in range(lanes)], "not a transpose"
        columns[column] = vector
    return columns


def _stage_masks(lanes: int, d: int, chunk: int) -> tuple[list[int], list[int]]:
    """Shuffle masks (over the concatenation a ++ b) of one transpose stage for rows a and
    b = a's partner at distance d."""
    if d < chunk:
        # unpack-low / unpack-high of d-element groups inside each 128-bit chunk
        low, high = [], []
        for q in range(lanes // chunk):
            for p in range(chunk):
                t, rest = divmod(p, 2 * d)
                source, u = divmod(rest, d)
                base = source * lanes + q * chunk + t * d + u
                low.append(base)
                high.append(base + chunk // 2)
        return low, high
    first = [j if not j & d else lanes + (j ^ d) for j in range(lanes)]
    second = [(j ^ d) if not j & d else lanes + j for j in range(lanes)]
    return first, second
