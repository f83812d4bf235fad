"""Test configuration: hypothesis profiles (choose with --hypothesis-profile=NAME)."""

from hypothesis import settings

settings.register_profile("default", max_examples=100)
settings.register_profile("thorough", max_examples=2000)
settings.load_profile("default")
