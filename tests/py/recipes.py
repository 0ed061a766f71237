"""A small model recipe the tests make quickly: one layer of each family's
kind (Shfl-BW with its permutation, 2:4, blocks) and a dense one."""
SMALL = """seed = 1
dtype = "fp16"
[[layer]]
name = "q"
shape = [128, 64]
pattern = "shflbw:32"
sparsity = 0.75
[[layer]]
name = "up"
shape = [96, 64]
pattern = "nm24"
[[layer]]
name = "down"
shape = [64, 96]
pattern = "bsr:32x32"
sparsity = 0.5
[[layer]]
name = "o"
shape = [64, 64]
"""
