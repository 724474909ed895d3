"""Contract suites: what every implementation of a port must do.

Each suite is a class whose tests take the implementation from a fixture the
subclass provides; the real adapters run them in ``tests/integration`` or
``tests/lab``, the in-memory fakes in ``tests/unit``. A fake that passes its
contract may stand in for the real thing in fast tests.
"""
