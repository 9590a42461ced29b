"""A small writer of LLVM IR text: SSA names, blocks, counted loops with carried values.

Kernels are written as text because every size, stride and register block is a compile-time
constant: the IR is short, explicit and fast to produce, and LLVM does the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


def scalar_type(itemsize: int) -> str:
    return "float" if itemsize == 4 else "double"


def type_suffix(itemsize: int) -> str:
    return "f32" if itemsize == 4 else "f64"


def vector_type(lanes: int, itemsize: int) -> str:
    return f"<{lanes} x {scalar_type(itemsize)}>"


# the metadata node that marks a store non-temporal (the only metadata the kernels use)
NONTEMPORAL = 0


def mask_constant(lanes: int, active: int, first: int = 0) -> str:
    """A lane mask with lanes ``first`` to ``active - 1`` on."""
    return "<" + ", ".join(f"i1 {1 if first <= i < active else 0}" for i in range(lanes)) + ">"


def shuffle_mask(indices: Sequence[int]) -> str:
    return "<" + ", ".join(f"i32 {i}" for i in indices) + ">"


@dataclass(frozen=True)
class Vectors:
    """Loads and stores of ``lanes``-wide vectors of ``itemsize``-byte elements, a partial
    vector (``active`` < ``lanes``) through the masked intrinsics (:meth:`declare` them)."""

    lanes: int
    itemsize: int

    @property
    def t(self) -> str:
        return scalar_type(self.itemsize)

    @property
    def vt(self) -> str:
        return vector_type(self.lanes, self.itemsize)

    @property
    def suffix(self) -> str:
        return f"v{self.lanes}{type_suffix(self.itemsize)}"

    def declare(self, module: Module) -> None:
        vt, lanes, suffix = self.vt, self.lanes, self.suffix
        module.declare(
            f"masked.load.{suffix}",
            f"declare {vt} @llvm.masked.load.{suffix}.p0(ptr, i32, <{lanes} x i1>, {vt})",
        )
        module.declare(
            f"masked.store.{suffix}",
            f"declare void @llvm.masked.store.{suffix}.p0({vt}, ptr, i32, <{lanes} x i1>)",
        )

    def load(
        self, f: FunctionBuilder, base: str, offset: str | int, active: int, align: int
    ) -> str:
        """The vector at ``base + offset`` elements, zeros past ``active`` lanes."""
        pointer = f.gep(self.t, base, offset)
        if active == self.lanes:
            return f.assign(f"load {self.vt}, ptr {pointer}, align {align}", "v")
        return f.assign(
            f"call {self.vt} @llvm.masked.load.{self.suffix}.p0(ptr {pointer}, i32 {align}, "
            f"<{self.lanes} x i1> {mask_constant(self.lanes, active)}, {self.vt} "
            "zeroinitializer)",
            "v",
        )

    def store(
        self,
        f: FunctionBuilder,
        value: str,
        base: str,
        offset: str | int,
        active: int,
        align: int,
    ) -> None:
        """Store the first ``active`` lanes of ``value`` at ``base + offset`` elements."""
        pointer = f.gep(self.t, base, offset)
        if active == self.lanes:
            f.emit(f"store {self.vt} {value}, ptr {pointer}, align {align}")
            return
        f.emit(
            f"call void @llvm.masked.store.{self.suffix}.p0({self.vt} {value}, ptr {pointer}, "
            f"i32 {align}, <{self.lanes} x i1> {mask_constant(self.lanes, active)})"
        )


@dataclass
class Module:
    """Function definitions plus the intrinsic declarations they use (each once)."""

    declarations: dict[str, str] = field(default_factory=dict)
    functions: list[str] = field(default_factory=list)
    metadata: list[str] = field(default_factory=list)

    def declare(self, name: str, text: str) -> str:
        """Declare once: generators may share a module and name the same intrinsic."""
        if text not in self.declarations.values():
            self.declarations.setdefault(name, text)
        return name

    def loop_properties(self, *properties: str) -> str:
        """A new ``!llvm.loop`` node (for one loop's back edge) holding ``properties``, each
        the body of a property node, e.g. ``!"llvm.loop.interleave.count", i32 1``."""
        first = len(self.metadata)
        ids = [f"!{first + i}" for i in range(len(properties) + 1)]
        self.metadata.append(f"{ids[0]} = distinct !{{{', '.join(ids)}}}")
        self.metadata += [f"{i} = !{{{p}}}" for i, p in zip(ids[1:], properties)]
        return ids[0]

    def text(self) -> str:
        parts = [*self.declarations.values(), "", *self.functions, *self.metadata]
        return "\n".join(parts) + "\n"


class FunctionBuilder:
    """Writes one function; ``loop`` emits a counted loop whose body may nest further loops."""

    def __init__(self, module: Module, header: str) -> None:
        self.module = module
        self.lines: list[str] = [header + " {", "entry:"]
        self.block = "entry"
        self._counter = 0
        self._entry: list[str] = []  # static allocas, placed at the top of the entry block

    # ---- names and lines -------------------------------------------------------------------
    def tmp(self, hint: str = "t") -> str:
        self._counter += 1
        return f"%{hint}{self._counter}"

    def label(self, hint: str) -> str:
        self._counter += 1
        return f"{hint}{self._counter}"

    def emit(self, line: str) -> None:
        self.lines.append("  " + line)

    def assign(self, expression: str, hint: str = "t") -> str:
        name = self.tmp(hint)
        self.emit(f"{name} = {expression}")
        return name

    def start_block(self, label: str) -> None:
        self.lines.append(f"{label}:")
        self.block = label

    def entry_alloca(self, line: str) -> None:
        """Add an instruction (an ``alloca``) at the top of the entry block."""
        self._entry.append("  " + line)

    def finish(self) -> str:
        self.emit("ret void")
        self.lines.append("}")
        self.lines[2:2] = self._entry
        text = "\n".join(self.lines)
        self.module.functions.append(text)
        return text

    # ---- arithmetic helpers ----------------------------------------------------------------
    def add_i64(self, a: str | int, b: str | int) -> str | int:
        """``a + b`` folding constants (returns an int when both are ints)."""
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        if b == 0:
            return a
        if a == 0:
            return b
        return self.assign(f"add i64 {a}, {b}", "i")

    def mul_i64(self, a: str | int, b: int) -> str | int:
        if isinstance(a, int):
            return a * b
        if b == 1:
            return a
        if b == 0:
            return 0
        return self.assign(f"mul i64 {a}, {b}", "i")

    def umin_i64(self, a: str | int, b: int) -> str | int:
        """``min(a, b)`` for ``a >= 0``, folding constants."""
        if isinstance(a, int):
            return min(a, b)
        self.module.declare("umin.i64", "declare i64 @llvm.umin.i64(i64, i64)")
        return self.assign(f"call i64 @llvm.umin.i64(i64 {a}, i64 {b})", "i")

    def udiv_i64(self, a: str | int, b: int) -> str | int:
        """``a // b`` for ``a >= 0``, folding constants."""
        if isinstance(a, int):
            return a // b
        if b == 1:
            return a
        return self.assign(f"udiv i64 {a}, {b}", "i")

    def urem_i64(self, a: str | int, b: int) -> str | int:
        """``a % b`` for ``a >= 0``, folding constants."""
        if isinstance(a, int):
            return a % b
        if b == 1:
            return 0
        return self.assign(f"urem i64 {a}, {b}", "i")

    def misaligned_bytes(self, pointer: str, boundary: int) -> str:
        """``pointer``'s byte offset past the last ``boundary`` (a power of two) at run time."""
        address = self.assign(f"ptrtoint ptr {pointer} to i64", "a")
        return self.assign(f"and i64 {address}, {boundary - 1}", "a")

    def gep(self, element: str, base: str, offset: str | int) -> str:
        if offset == 0:
            return base
        return self.assign(f"getelementptr inbounds {element}, ptr {base}, i64 {offset}", "p")

    # ---- control flow ----------------------------------------------------------------------
    def loop(
        self,
        count: int | str,
        carried: Sequence[tuple[str, str]],
        body: Callable[[str, list[str]], list[str]],
        hint: str = "l",
        properties: str | None = None,
    ) -> list[str]:
        """A loop over ``i`` in ``range(count)`` (``count >= 1``: a constant, or an i64 value
        known to be) carrying values.

        ``carried`` lists (type, initial value); ``body(i, values)`` emits the body and returns
        the next values. Returns the values after the last iteration. A loop of one iteration
        is emitted straight-line with ``i = 0``. ``properties``: its ``!llvm.loop`` node
        (:meth:`Module.loop_properties`).
        """
        if isinstance(count, int) and count < 1:
            raise ValueError("loop count must be >= 1")
        if count == 1:
            return body("0", [value for _, value in carried])
        header = self.label(f"{hint}.body")
        exit_label = self.label(f"{hint}.exit")
        before = self.block
        self.emit(f"br label %{header}")
        self.start_block(header)
        phi_at = len(self.lines)
        index = self.tmp(f"{hint}.i")
        values = [self.tmp(f"{hint}.v") for _ in carried]
        results = body(index, values)
        latch = self.block
        following = self.assign(f"add nuw nsw i64 {index}, 1", "i")
        again = self.assign(f"icmp ult i64 {following}, {count}", "c")
        tail = f", !llvm.loop {properties}" if properties is not None else ""
        self.emit(f"br i1 {again}, label %{header}, label %{exit_label}{tail}")
        phis = [f"  {index} = phi i64 [0, %{before}], [{following}, %{latch}]"]
        phis += [
            f"  {value} = phi {kind} [{initial}, %{before}], [{result}, %{latch}]"
            for value, (kind, initial), result in zip(values, carried, results)
        ]
        self.lines[phi_at:phi_at] = phis
        self.start_block(exit_label)
        return list(results)

    def range_loop(
        self, start: str | int, end: str | int, body: Callable[[str], None], hint: str = "r"
    ) -> None:
        """A loop over ``i`` in ``range(start, end)`` (signed i64 bounds, possibly empty)."""
        before = self.block
        header = self.label(f"{hint}.body")
        exit_label = self.label(f"{hint}.exit")
        empty = self.assign(f"icmp sge i64 {start}, {end}", "c")
        self.emit(f"br i1 {empty}, label %{exit_label}, label %{header}")
        self.start_block(header)
        phi_at = len(self.lines)
        index = self.tmp(f"{hint}.i")
        body(index)
        latch = self.block
        following = self.assign(f"add nsw i64 {index}, 1", "i")
        again = self.assign(f"icmp slt i64 {following}, {end}", "c")
        self.emit(f"br i1 {again}, label %{header}, label %{exit_label}")
        self.lines.insert(
            phi_at, f"  {index} = phi i64 [{start}, %{before}], [{following}, %{latch}]"
        )
        self.start_block(exit_label)

    def when(
        self,
        condition: str,
        body: Callable[[], None],
        otherwise: Callable[[], None] | None = None,
        hint: str = "if",
    ) -> None:
        """``if condition: body() else: otherwise()`` (condition is an i1 value)."""
        then_label = self.label(f"{hint}.then")
        else_label = self.label(f"{hint}.else")
        done_label = self.label(f"{hint}.done")
        self.emit(f"br i1 {condition}, label %{then_label}, label %{else_label}")
        self.start_block(then_label)
        body()
        self.emit(f"br label %{done_label}")
        self.start_block(else_label)
        if otherwise is not None:
            otherwise()
        self.emit(f"br label %{done_label}")
        self.start_block(done_label)
