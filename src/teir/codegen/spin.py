"""LLVM IR for the thread pool's hand-off: workers that wait for, run and report slices of a
loop nest entirely in native code, with the GIL released.

Waking a sleeping thread through the kernel costs 20-60 us on the project VMs, per direction,
and so does handing a thread the GIL that another one holds; a parallel call of a few hundred
microseconds lost a third of its time to that. Here a worker polls a 64-bit word for a while
before it sleeps, calls the nest function it finds without going back to Python, and writes
the generation it finished into its own word, which the caller polls.

The control block is an array of i64, one 64-byte line per word group:

- line 0, word 0: the generation, raised by the caller for every parallel call;
- line 1 + 2w, word 0: the last generation worker ``w`` finished;
- line 2 + 2w: worker ``w``'s task: the nest function (0 for none) and its seven arguments.
"""

from __future__ import annotations

from teir.codegen.target import Target

LINE_WORDS = 8
NEST_ARGUMENTS = ("ptr", "ptr", "ptr", "i64", "i64", "ptr", "ptr")


def control_words(workers: int) -> int:
    """Length of the control block for ``workers`` workers."""
    return LINE_WORDS * (1 + 2 * workers)


def done_word(worker: int) -> int:
    """Index of the word holding the last generation ``worker`` finished."""
    return LINE_WORDS * (1 + 2 * worker)


def task_word(worker: int) -> int:
    """Index of ``worker``'s task: the function, then its arguments."""
    return LINE_WORDS * (2 + 2 * worker)


def _relax(target: Target) -> tuple[list[str], list[str]]:
    """(declarations, instructions) that tell the core it is spinning."""
    if target.is_x86:
        return ["declare void @llvm.x86.sse2.pause()"], ["  call void @llvm.x86.sse2.pause()"]
    if target.triple.startswith(("aarch64", "arm64")):
        return ["declare void @llvm.aarch64.hint(i32)"], ["  call void @llvm.aarch64.hint(i32 1)"]
    return [], []


def spin_module(target: Target, prefix: str) -> str:
    """Three functions, named ``prefix`` plus:

    - ``_poll(ptr word, i64 seen, i64 rounds) -> i64``: the word's value as soon as it
      differs from ``seen``, or ``seen`` after ``rounds`` polls;
    - ``_publish(ptr word, i64 value)``: a release store (the task words written before it
      are visible to whoever sees the value);
    - ``_serve(ptr control, i64 worker, i64 seen, i64 rounds) -> i64``: worker ``worker``'s
      loop; returns the last generation it saw once ``rounds`` polls found no new one.
    """
    declarations, relax = _relax(target)
    task_loads, call_arguments = [], []
    for i, kind in enumerate(NEST_ARGUMENTS):
        task_loads += [
            f"  %w{i} = getelementptr inbounds i64, ptr %task, i64 {i + 1}",
            f"  %r{i} = load i64, ptr %w{i}, align 8",
        ]
        if kind == "ptr":
            task_loads.append(f"  %a{i} = inttoptr i64 %r{i} to ptr")
            call_arguments.append(f"ptr %a{i}")
        else:
            call_arguments.append(f"i64 %r{i}")
    lines = [
        *declarations,
        f"define i64 @{prefix}_poll(ptr %word, i64 %seen, i64 %rounds) nounwind {{",
        "entry:",
        "  br label %poll",
        "poll:",
        "  %round = phi i64 [0, %entry], [%next, %wait]",
        "  %value = load atomic i64, ptr %word acquire, align 8",
        "  %changed = icmp ne i64 %value, %seen",
        "  br i1 %changed, label %done, label %wait",
        "wait:",
        *relax,
        "  %next = add i64 %round, 1",
        "  %more = icmp ult i64 %next, %rounds",
        "  br i1 %more, label %poll, label %done",
        "done:",
        "  ret i64 %value",
        "}",
        "",
        f"define void @{prefix}_publish(ptr %word, i64 %value) nounwind {{",
        "  store atomic i64 %value, ptr %word release, align 8",
        "  ret void",
        "}",
        "",
        f"define i64 @{prefix}_serve(ptr %control, i64 %worker, i64 %seen0, i64 %rounds) {{",
        "entry:",
        f"  %line = mul i64 %worker, {done_word(1) - done_word(0)}",
        f"  %done.at = add i64 %line, {done_word(0)}",
        f"  %task.at = add i64 %line, {task_word(0)}",
        "  %done = getelementptr inbounds i64, ptr %control, i64 %done.at",
        "  %task = getelementptr inbounds i64, ptr %control, i64 %task.at",
        "  br label %wait",
        "wait:",
        "  %seen = phi i64 [%seen0, %entry], [%generation, %finish]",
        f"  %generation = call i64 @{prefix}_poll(ptr %control, i64 %seen, i64 %rounds)",
        "  %idle = icmp eq i64 %generation, %seen",
        "  br i1 %idle, label %sleep, label %work",
        "work:",
        "  %fn.bits = load i64, ptr %task, align 8",
        "  %has = icmp ne i64 %fn.bits, 0",
        "  br i1 %has, label %call, label %finish",
        "call:",
        "  %fn = inttoptr i64 %fn.bits to ptr",
        *task_loads,
        f"  call void %fn({', '.join(call_arguments)})",
        "  br label %finish",
        "finish:",
        "  store atomic i64 %generation, ptr %done release, align 8",
        "  br label %wait",
        "sleep:",
        "  ret i64 %seen",
        "}",
    ]
    return "\n".join(lines) + "\n"
