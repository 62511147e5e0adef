"""Tools for testing lastword from outside: the conformance kit a platform adapter's author
runs against their adapter (`conformance`).
"""

__all__ = ["conformance"]
