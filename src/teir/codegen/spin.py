"""LLVM IR for the thread pool's hand-off: workers that wait for, run and report slices of a
loop nest entirely in native code, with the GIL released.

Waking a sleeping thread through the kernel costs 20-60 us on the project VMs, per direction,
and so does handing a thread the GIL that another one holds; a parallel call of a few hundred
microseconds lost a third of its time to that. Here a worker polls a 64-bit word for a while
before it sleeps, calls the nest function it finds without going back to Python, and writes
the generation it finished into its own word, which the caller polls.

The control block is an array of i64, one 64-byte line per word group:

- line 0, word 0: the generation, raised by the caller for every parallel call; word 1: 1
  while a caller owns the workers (from before it publishes until its slices are joined), set
  by ``_acquire``: the pool's Python callers and the checked calls of
  :mod:`teir.codegen.checked_call`, which hold the GIL instead of a Python lock, take turns
  through it;
- line 1 + 2w, word 0: the last generation worker ``w`` finished; word 1: 1 while worker
  ``w`` has stopped polling (it sleeps, or is on its way to, and needs a wake-up call);
- line 2 + 2w: worker ``w``'s task: the nest function (0 for none) and its seven arguments.

A parallel call is one native call too (``_dispatch``): it writes the tasks, publishes the
generation, runs the caller's slice and polls for the others; from Python, writing the tasks
word by word, waking the workers and joining them took about 6 us, longer than a 64^3 GEMM's
half on one core.
"""

from __future__ import annotations

from teir.codegen.target import Target

LINE_WORDS = 8
BUSY_WORD = 1
NEST_ARGUMENTS = ("ptr", "ptr", "ptr", "i64", "i64", "ptr", "ptr")


def control_words(workers: int) -> int:
    """Length of the control block for ``workers`` workers."""
    return LINE_WORDS * (1 + 2 * workers)


def done_word(worker: int) -> int:
    """Index of the word holding the last generation ``worker`` finished."""
    return LINE_WORDS * (1 + 2 * worker)


def asleep_word(worker: int) -> int:
    """Index of the word that says ``worker`` stopped polling."""
    return done_word(worker) + 1


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


def _drain(target: Target) -> tuple[list[str], list[str]]:
    """(declarations, instructions) that make a thread's earlier non-temporal stores (streamed
    outputs) visible before its next store: x86 orders them only with ``sfence``, not with
    the release stores that publish a generation or a finished slice."""
    if target.is_x86:
        return ["declare void @llvm.x86.sse.sfence()"], ["  call void @llvm.x86.sse.sfence()"]
    return [], ["  fence seq_cst"]


def spin_module(target: Target, prefix: str) -> str:
    """Five functions, named ``prefix`` plus:

    - ``_poll(ptr word, i64 seen, i64 rounds) -> i64``: the word's value as soon as it
      differs from ``seen``, or ``seen`` after ``rounds`` polls;
    - ``_publish(ptr word, i64 value)``: a release store (the task words written before it
      are visible to whoever sees the value);
    - ``_serve(ptr control, i64 worker, i64 seen, i64 rounds) -> i64``: worker ``worker``'s
      loop; returns the last generation it saw once ``rounds`` polls found no new one;
    - ``_acquire(ptr control) -> i64``: 1 if it set the busy word (:data:`BUSY_WORD`) from 0,
      else 0 (release it with ``_publish`` of 0);
    - ``_dispatch``: a parallel call (:func:`_dispatch`).
    """
    declarations, relax = _relax(target)
    drain_declarations, drain = _drain(target)
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
        *drain_declarations,
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
        f"define i64 @{prefix}_acquire(ptr %control) nounwind {{",
        f"  %busy = getelementptr inbounds i64, ptr %control, i64 {BUSY_WORD}",
        "  %pair = cmpxchg ptr %busy, i64 0, i64 1 seq_cst seq_cst, align 8",
        "  %got = extractvalue { i64, i1 } %pair, 1",
        "  %result = zext i1 %got to i64",
        "  ret i64 %result",
        "}",
        "",
        f"define i64 @{prefix}_serve(ptr %control, i64 %worker, i64 %seen0, i64 %rounds) {{",
        "entry:",
        f"  %line = mul i64 %worker, {done_word(1) - done_word(0)}",
        f"  %done.at = add i64 %line, {done_word(0)}",
        f"  %task.at = add i64 %line, {task_word(0)}",
        "  %done = getelementptr inbounds i64, ptr %control, i64 %done.at",
        "  %asleep = getelementptr inbounds i64, ptr %done, i64 1",
        "  %task = getelementptr inbounds i64, ptr %control, i64 %task.at",
        "  store atomic i64 0, ptr %asleep seq_cst, align 8",
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
        *drain,  # the slice's output, before the done word says it is there
        "  br label %finish",
        "finish:",
        "  store atomic i64 %generation, ptr %done release, align 8",
        "  br label %wait",
        "sleep:",
        # A caller that publishes after this store sees the flag and wakes the worker; one
        # that published before is seen by the worker's check of the generation, in Python.
        "  store atomic i64 1, ptr %asleep seq_cst, align 8",
        "  ret i64 %seen",
        "}",
        "",
        *_dispatch(prefix, relax, drain),
    ]
    return "\n".join(lines) + "\n"


# The words of a parallel call's job (an i64 array the caller keeps per compiled nest).
JOB_FIELDS = ("fn", "size", "count", "first", "last", "rounds")


def _dispatch(prefix: str, relax: list[str], drain: list[str]) -> list[str]:
    """``_dispatch(ptr control, i64 workers, ptr job, ptr in0, ptr in1, ptr out, i64 mode)
    -> i64``: the job's nest ``fn`` (:data:`JOB_FIELDS`) on the index space [0, size) in
    ``count`` slices, slice ``s`` being [s * size / count, (s + 1) * size / count), the
    first one run by the caller and slice ``w + 1`` by worker ``w`` (of ``workers``; the
    others get no task). One caller at a time: the generation is the control word's plus one.

    Mode 0 writes the tasks and publishes the generation, and returns 1 at once if a worker
    that got a task is asleep (the caller wakes it and calls again in mode 1); mode 1 only runs
    the caller's slice and joins. Returns 0 once every worker finished, or 2 if one had not
    after ``rounds`` polls (the caller's slice has run; the caller waits for the rest)."""
    group = task_word(1) - task_word(0)
    job_loads = []
    for i, name in enumerate(JOB_FIELDS):
        job_loads += [
            f"  %job.{name}.at = getelementptr inbounds i64, ptr %job, i64 {i}",
            f"  %{name} = load {'ptr' if name in ('fn', 'first', 'last') else 'i64'}, "
            f"ptr %job.{name}.at, align 8",
        ]
    stores = []
    for i, value in enumerate(("fn", "in0", "in1", "out", "s.lo", "s.hi", "first", "last")):
        kind = "i64" if value in ("s.lo", "s.hi") else "ptr"
        stores += [
            f"  %t{i} = getelementptr inbounds i64, ptr %task, i64 {i}",
            f"  store {kind} %{value}, ptr %t{i}, align 8",
        ]
    return [
        f"define i64 @{prefix}_dispatch(ptr %control, i64 %workers, ptr %job, ptr %in0, "
        "ptr %in1, ptr %out, i64 %mode) {",
        "entry:",
        *job_loads,
        "  %helpers = sub i64 %count, 1",
        "  %current = load atomic i64, ptr %control acquire, align 8",
        "  %start = icmp eq i64 %mode, 0",
        "  %next.generation = add i64 %current, 1",
        "  %generation = select i1 %start, i64 %next.generation, i64 %current",
        "  br i1 %start, label %tasks, label %local",
        "tasks:",
        "  %w = phi i64 [0, %entry], [%w.next, %task.next]",
        "  %w.more = icmp ult i64 %w, %workers",
        "  br i1 %w.more, label %task.body, label %publish",
        "task.body:",
        f"  %task.line = mul i64 %w, {group}",
        f"  %task.at = add i64 %task.line, {task_word(0)}",
        "  %task = getelementptr inbounds i64, ptr %control, i64 %task.at",
        "  %slice = add i64 %w, 1",
        "  %used = icmp ult i64 %slice, %count",
        "  br i1 %used, label %task.set, label %task.none",
        "task.set:",
        "  %s.lo.n = mul i64 %slice, %size",
        "  %s.lo = udiv i64 %s.lo.n, %count",
        "  %slice.end = add i64 %slice, 1",
        "  %s.hi.n = mul i64 %slice.end, %size",
        "  %s.hi = udiv i64 %s.hi.n, %count",
        *stores,
        "  br label %task.next",
        "task.none:",
        "  store i64 0, ptr %task, align 8",
        "  br label %task.next",
        "task.next:",
        "  %w.next = add i64 %w, 1",
        "  br label %tasks",
        "publish:",
        *drain,  # what this thread streamed before (an earlier node's output), for the workers
        "  store atomic i64 %generation, ptr %control seq_cst, align 8",
        "  br label %asleep.loop",
        "asleep.loop:",
        "  %v = phi i64 [0, %publish], [%v.next, %asleep.next]",
        "  %v.more = icmp ult i64 %v, %helpers",
        "  br i1 %v.more, label %asleep.body, label %local",
        "asleep.body:",
        f"  %v.line = mul i64 %v, {group}",
        f"  %v.at = add i64 %v.line, {asleep_word(0)}",
        "  %v.word = getelementptr inbounds i64, ptr %control, i64 %v.at",
        "  %v.flag = load atomic i64, ptr %v.word seq_cst, align 8",
        "  %v.sleeps = icmp ne i64 %v.flag, 0",
        "  br i1 %v.sleeps, label %wake, label %asleep.next",
        "asleep.next:",
        "  %v.next = add i64 %v, 1",
        "  br label %asleep.loop",
        "wake:",
        "  ret i64 1",
        "local:",
        "  %hi0 = udiv i64 %size, %count",
        "  call void %fn(ptr %in0, ptr %in1, ptr %out, i64 0, i64 %hi0, ptr %first, ptr %last)",
        "  br label %join",
        "join:",
        "  %j = phi i64 [0, %local], [%j.next, %joined]",
        "  %r0 = phi i64 [0, %local], [%r, %joined]",
        "  %j.more = icmp ult i64 %j, %helpers",
        "  br i1 %j.more, label %join.body, label %all",
        "join.body:",
        f"  %j.line = mul i64 %j, {group}",
        f"  %j.at = add i64 %j.line, {done_word(0)}",
        "  %j.word = getelementptr inbounds i64, ptr %control, i64 %j.at",
        "  br label %poll",
        "poll:",
        "  %r = phi i64 [%r0, %join.body], [%r.next, %spin]",
        "  %finished = load atomic i64, ptr %j.word acquire, align 8",
        "  %is.done = icmp eq i64 %finished, %generation",
        "  br i1 %is.done, label %joined, label %spin",
        "spin:",
        *relax,
        "  %r.next = add i64 %r, 1",
        "  %r.more = icmp ult i64 %r.next, %rounds",
        "  br i1 %r.more, label %poll, label %late",
        "joined:",
        "  %j.next = add i64 %j, 1",
        "  br label %join",
        "late:",
        "  ret i64 2",
        "all:",
        "  ret i64 0",
        "}",
    ]
