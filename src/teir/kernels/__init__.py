"""Native primitives: BRGEMM/GEMM and unary Zero/Copy/ReLU kernels, compiled with LLVM.

Kernels are generated for this machine's vector width with every size a constant, compiled
once and cached in memory and on disk (``TEIR_CACHE_DIR``; empty disables the disk cache).
"""

from teir.codegen.specs import BrgemmSpec, KernelError, UnaryOp, UnarySpec
from teir.codegen.target import Target
from teir.kernels.api import (
    BrgemmKernel,
    Kernel,
    UnaryKernel,
    brgemm,
    brgemm_kernel,
    gemm,
    unary,
    unary_kernel,
)
from teir.kernels.cache import cache_dir

__all__ = [
    "BrgemmKernel",
    "BrgemmSpec",
    "Kernel",
    "KernelError",
    "Target",
    "UnaryKernel",
    "UnaryOp",
    "UnarySpec",
    "brgemm",
    "brgemm_kernel",
    "cache_dir",
    "gemm",
    "unary",
    "unary_kernel",
]
