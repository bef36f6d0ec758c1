"""What the tests share: builders, runners, fakes and oracles, each defined once.

Import as ``from support.NAME import ...`` (pytest puts ``tests/`` on ``sys.path``).
Nothing here is a test; nothing here asserts what a test checks, only builds its
inputs, reaches the code or judges a run the way several tests need.
"""
