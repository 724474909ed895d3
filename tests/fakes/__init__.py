"""In-memory fakes of the ports, for tests that must run in seconds.

Each passes the same contract suite (``tests/contracts``) as the real adapter it
stands in for; where a fake models a behaviour the contract cannot check against
the real thing here (a VM booting, a tunnel's handshake), its docstring says so.
Fakes fail loudly: a call they do not model raises.
"""
