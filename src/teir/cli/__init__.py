"""The ``teir`` command line: validate, run and explain TEIR configurations."""
