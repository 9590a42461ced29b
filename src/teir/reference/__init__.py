"""NumPy oracles of TEIR semantics.

- :func:`execute`: the spec read literally, tile by tile (the oracle of every backend);
- :func:`dense_result` / :func:`einsum_execute`: a whole-tensor ``np.einsum`` evaluation, an
  independent second opinion for outputs without aliasing;
- :func:`compare`: checks an executed output against a dense result.
"""

from teir.reference.dense import Comparison, DenseResult, compare, dense_result, einsum_execute
from teir.reference.tiles import execute

__all__ = ["Comparison", "DenseResult", "compare", "dense_result", "einsum_execute", "execute"]
