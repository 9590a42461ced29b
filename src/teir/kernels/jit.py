"""Compiling LLVM IR text to object code, and loading object code for execution.

One MCJIT engine per process holds every loaded object; symbols are looked up by name. Object
code is what the disk cache stores, so loading a cached kernel skips LLVM's optimizer and
code generator entirely.
"""

from __future__ import annotations

import threading
from functools import cache

import llvmlite.binding as llvm  # type: ignore[import-untyped]

from teir.codegen.target import Target, initialize_llvm

OPT_LEVEL = 3
# The large code model, with absolute relocations: every reference between sections is a
# 64-bit address. MCJIT maps an object's code and constants separately, and once the process
# holds tens of GiB of address space (large arrays, even untouched) they can land more than
# 2 GiB apart, where the default model's 32-bit PC-relative references overflow and LLVM
# aborts the interpreter while loading the kernel. (Position-independent code in the large
# model addresses through GOT offsets that MCJIT resolved wrongly: a kernel crashed.) Same
# speed as before on kernels and einsums (in-process alternation, one thread).
CODE_MODEL = "large"
RELOCATION = "static"
_lock = threading.Lock()


@cache
def target_machine(target: Target) -> llvm.TargetMachine:
    initialize_llvm()
    machine = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu,
        features=target.features,
        opt=OPT_LEVEL,
        reloc=RELOCATION,
        codemodel=CODE_MODEL,
    )
    return machine


def compile_object(module_text: str, target: Target) -> bytes:
    """Optimize ``module_text`` for ``target`` and return its object code."""
    machine = target_machine(target)
    with _lock:  # LLVM's global context is not safe to use from several threads at once
        module = llvm.parse_assembly(module_text)
        module.triple = target.triple
        module.data_layout = str(machine.target_data)
        module.verify()
        tuning = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
        builder = llvm.create_pass_builder(machine, tuning)
        builder.getModulePassManager().run(module, builder)
        return bytes(machine.emit_object(module))


def assembly(module_text: str, target: Target) -> str:
    """The machine code of ``module_text`` as assembly text (for inspection)."""
    machine = target_machine(target)
    with _lock:
        module = llvm.parse_assembly(module_text)
        module.triple = target.triple
        module.data_layout = str(machine.target_data)
        tuning = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
        builder = llvm.create_pass_builder(machine, tuning)
        builder.getModulePassManager().run(module, builder)
        return str(machine.emit_assembly(module))


class _Engine:
    def __init__(self) -> None:
        initialize_llvm()
        host = Target.host()
        backing = llvm.parse_assembly("")
        backing.triple = host.triple
        self.engine = llvm.create_mcjit_compiler(backing, target_machine(host))
        self.engine.finalize_object()  # pays MCJIT's one-time setup here, not in a kernel load
        self.objects: list[llvm.ObjectFileRef] = []

    def load(self, code: bytes, symbols: list[str]) -> dict[str, int]:
        with _lock:
            obj = llvm.ObjectFileRef.from_data(code)
            self.engine.add_object_file(obj)
            self.objects.append(obj)
            self.engine.finalize_object()
            addresses = {name: self.engine.get_function_address(name) for name in symbols}
        missing = [name for name, address in addresses.items() if not address]
        if missing:
            raise RuntimeError(f"object code does not define {', '.join(missing)}")
        return addresses


@cache
def _engine() -> _Engine:
    return _Engine()


def load_object(code: bytes, symbols: list[str]) -> dict[str, int]:
    """Load object code into the process and return the addresses of ``symbols``."""
    return _engine().load(code, symbols)
