"""A configuration as a readable loop nest: what runs where, on which tiles."""

from __future__ import annotations

from teir.ir import Config, DimType, ExecType, PrimFirst, PrimLast, PrimMain, Tensor
from teir.ir.layout import out_tiles_distinct


def _axis(config: Config, a: int) -> str:
    return f"{config.dim_types[a].value.lower()}{a}"


def _offset(config: Config, tensor: Tensor) -> str:
    strides = config.schedule.strides(tensor)
    terms = [
        f"{strides[a]}*{_axis(config, a)}" if strides[a] != 1 else _axis(config, a)
        for a in config.loop_axes
        if strides[a] != 0
    ]
    return " + ".join(terms) or "0"


def _tile(config: Config, tensor: Tensor, axes: tuple[int, ...]) -> str:
    if not axes:
        return "a scalar"
    strides = config.schedule.strides(tensor)
    shape = " x ".join(f"{_axis(config, a)}={config.dim_sizes[a]}" for a in axes)
    return f"[{shape}] strides ({', '.join(str(strides[a]) for a in axes)})"


def _touch_condition(config: Config, which: str) -> str:
    k_loops = [a for a in config.loop_axes if config.dim_types[a] is DimType.K]
    distinct = out_tiles_distinct(config.schedule)
    if distinct and not k_loops:
        return "every iteration (each iteration has its own output tile)"
    if distinct:
        bound = "== 0" if which == "first" else "== size - 1"
        loops = " and ".join(f"{_axis(config, a)} {bound}" for a in k_loops)
        return f"when {loops} (out has no aliasing)"
    why = "out aliases" if distinct is False else "aliasing not proven absent"
    return (
        f"on the {which} iteration that touches this out tile position ({why}: a tile is "
        "identified by its base offset)"
    )


def explain(config: Config, name: str | None = None) -> str:
    """The configuration as pseudo-code: loops, tile offsets and shapes, primitives."""
    s = config.schedule
    p = config.primitives
    head = f"# {name}: " if name else "# "
    lines = [
        head + f"{p.data_type.value}, first {p.prim_first.value}, main {p.prim_main.value}, "
        f"last {p.prim_last.value}; {config.flops} FLOP",
        "# elements needed: "
        + ", ".join(f"{t.label} {config.extent(t)}" for t in Tensor if config.uses(t)),
    ]
    indent = ""
    for a in s.loop_axes:
        kind = "parallel (shared)" if s.exec_types[a] is ExecType.SHARED else "sequential"
        strides = ", ".join(f"{t.label} {s.strides(t)[a]}" for t in Tensor)
        lines.append(
            f"{indent}for {_axis(config, a)} in range({s.dim_sizes[a]}):   "
            f"# axis {a}: {s.dim_types[a].value}, {kind}; strides {strides}"
        )
        indent += "  "
    for t in Tensor:
        if config.uses(t):
            lines.append(f"{indent}{t.label}_tile = {t.label} + {_offset(config, t)}")
    prim = s.prim_axes
    out_axes = tuple(a for a in prim if s.dim_types[a] is not DimType.K)
    if p.prim_first is not PrimFirst.NONE:
        lines.append(
            f"{indent}{p.prim_first.value}(out_tile {_tile(config, Tensor.OUT, out_axes)})"
            f"   # first access: {_touch_condition(config, 'first')}"
        )
    lines += [indent + line for line in _main_lines(config, out_axes)]
    if p.prim_last is not PrimLast.NONE:
        lines.append(
            f"{indent}{p.prim_last.value}(out_tile {_tile(config, Tensor.OUT, out_axes)})"
            f"   # last access: {_touch_condition(config, 'last')}"
        )
    if not s.loop_axes:
        lines.append("# no loops: the primitives run once on the whole tensors")
    for index, rest in enumerate(config.rests):
        o0, o1, oo = rest.offsets
        lines += [
            f"# partial tiles: then rest {index} (teir's extension), on in0 + {o0}, "
            f"in1 + {o1}, out + {oo}:",
            explain(rest.config, f"rest {index}"),
        ]
    return "\n".join(lines)


def _main_lines(config: Config, out_axes: tuple[int, ...]) -> list[str]:
    s = config.schedule
    main = config.prim_main
    if main is PrimMain.NONE:
        return ["# no main primitive"]
    if main.is_unary:
        op = "copy of" if main is PrimMain.COPY else "max(0, ...) of"
        return [
            f"{main.value}: out_tile {_tile(config, Tensor.OUT, out_axes)} := {op} "
            f"in0_tile {_tile(config, Tensor.IN0, out_axes)}"
        ]
    (m,) = s.axes_of(DimType.M, ExecType.PRIM)
    (n,) = s.axes_of(DimType.N, ExecType.PRIM)
    ks = s.axes_of(DimType.K, ExecType.PRIM)
    k = ks[-1]
    names = {x: _axis(config, x) for x in (m, n, *ks)}
    lines = []
    if main is PrimMain.BRGEMM:
        br = ks[0]
        lines.append(
            f"BRGEMM: out_tile[{names[m]},{names[n]}] += sum over {names[br]} "
            f"(batch-reduce, {s.dim_sizes[br]}) of in0_tile[{names[m]},{names[k]}] "
            f"@ in1_tile[{names[k]},{names[n]}]"
        )
        lines.append(f"#   batch strides: in0 {s.strides_in0[br]}, in1 {s.strides_in1[br]}")
    else:
        lines.append(
            f"GEMM: out_tile[{names[m]},{names[n]}] += in0_tile[{names[m]},{names[k]}] "
            f"@ in1_tile[{names[k]},{names[n]}]"
        )
    lines.append(f"#   in0 tile {_tile(config, Tensor.IN0, (m, k))}")
    lines.append(f"#   in1 tile {_tile(config, Tensor.IN1, (k, n))}")
    lines.append(f"#   out tile {_tile(config, Tensor.OUT, (m, n))}")
    return lines
