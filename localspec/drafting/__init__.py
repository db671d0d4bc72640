"""Drafters: everything that proposes tokens for the target to verify."""
