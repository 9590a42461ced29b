"""Front ends on top of the IR: NumPy-compatible einsum (and, later, einsum trees)."""
