"""What the tests share: servers, fakes of the outside, builders, processes and waits.

No test module imports another test module; what two of them need lives here.
"""
