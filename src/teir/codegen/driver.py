"""A compiled repeat loop around a function, for timing it without Python in between."""

from __future__ import annotations

from teir.codegen.irtext import Module


def repeat_function(module: Module, name: str, callee: str, pointers: int) -> None:
    """Add ``void name(ptr p0, ..., i64 n)`` that calls ``callee(p0, ...)`` n times.

    The callee is called through a pointer read with a volatile load, so that LLVM cannot
    see that repeated calls with the same arguments write the same values and merge them.
    """
    params = ", ".join(f"ptr %p{i}" for i in range(pointers))
    args = ", ".join(f"ptr %p{i}" for i in range(pointers))
    module.functions.append(f"@{name}.callee = internal global ptr @{callee}")
    module.functions.append(f"""define void @{name}({params}, i64 %n) nounwind {{
entry:
  %none = icmp eq i64 %n, 0
  br i1 %none, label %done, label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %target = load volatile ptr, ptr @{name}.callee
  call void %target({args})
  %next = add nuw i64 %i, 1
  %again = icmp ult i64 %next, %n
  br i1 %again, label %loop, label %done
done:
  ret void
}}""")
