"""Code generation: LLVM IR text for the primitives (and, later, whole loop nests)."""
