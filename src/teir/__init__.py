"""teir: a tensor compiler for the Tiled Execution IR (TEIR).

A TEIR configuration describes a tensor operation (a binary contraction over C/M/N/K axes, or a
permutation) together with its schedule: which axes loop sequentially, which run in parallel,
and which are consumed by a primitive (GEMM, BRGEMM, Copy, Zero, ReLU).

>>> import numpy as np, teir
>>> cfg = teir.Config(                       # C[m, n] = sum_k A[m, k] B[k, n], column-major
...     data_type="FP32", prim_first="Zero", prim_main="GEMM",
...     dim_types=["M", "N", "K"], exec_types=["prim", "prim", "prim"], dim_sizes=[8, 6, 4],
...     strides_in0=[1, 0, 8], strides_in1=[0, 4, 1], strides_out=[1, 8, 0])
>>> a = np.random.rand(4, 8).astype(np.float32)      # A^T stored row-major = A column-major
>>> b = np.random.rand(6, 4).astype(np.float32)      # B column-major
>>> c = np.empty((6, 8), dtype=np.float32)           # C column-major
>>> teir.reference.execute(cfg, a, b, c)
>>> bool(np.allclose(c.T, a.T @ b.T))
True
>>> teir.Config.from_json(cfg.to_json()) == cfg
True
"""

from teir import reference
from teir.errors import ExecutionError, OutOfMemoryError, TeirError, ValidationError, Violation
from teir.frontend.config_views import compile
from teir.frontend.einsum import contract_expression, einsum, einsum_plan
from teir.frontend.einsum_parse import EinsumError
from teir.ir import (
    Config,
    DataType,
    DimType,
    ExecType,
    PrimFirst,
    Primitives,
    PrimLast,
    PrimMain,
    Rest,
    Schedule,
    Tensor,
    load,
    load_all,
    save,
)
from teir.optimizer import optimize, optimize_with_log
from teir.runtime.operation import Operation
from teir.tree import CompiledTree, EinsumTree, TreeError
from teir.validate import RULES

__version__ = "0.1.0"

__all__ = [
    "RULES",
    "CompiledTree",
    "Config",
    "DataType",
    "DimType",
    "EinsumError",
    "EinsumTree",
    "ExecType",
    "ExecutionError",
    "Operation",
    "OutOfMemoryError",
    "PrimFirst",
    "PrimLast",
    "PrimMain",
    "Primitives",
    "Rest",
    "Schedule",
    "TeirError",
    "Tensor",
    "TreeError",
    "ValidationError",
    "Violation",
    "__version__",
    "compile",
    "contract_expression",
    "einsum",
    "einsum_plan",
    "load",
    "load_all",
    "optimize",
    "optimize_with_log",
    "reference",
    "save",
]
