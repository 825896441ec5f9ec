"""Inputs and checks the operator tests share: one module per operator family, none of them a test module."""
