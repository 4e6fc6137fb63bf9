"""Readable PyTorch references: the specification every backend must match token for token."""
