"""Lowering: a configuration into loop-nest form with a kernel chosen for every tile primitive."""
