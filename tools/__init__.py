"""Operator tools around the library: cluster launcher checks, local multi-node Ray."""
