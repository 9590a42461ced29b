"""Shared by the tests and the doctests of src/teir."""

import os
import tempfile

# Kernels compiled by the tests go to a private disk cache, not the user's.
if "TEIR_CACHE_DIR" not in os.environ:
    os.environ["TEIR_CACHE_DIR"] = tempfile.mkdtemp(prefix="teir-test-cache-")
