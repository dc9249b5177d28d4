"""Comparing encoders with each other: linear and RBF CKA, exact QRE and CKA of every pair in
blocks, stitches from one embedding space to another, the subset the costly measures compare,
and how these measures agree."""
