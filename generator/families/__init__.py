"""Kernel families; importing this package registers each one."""
