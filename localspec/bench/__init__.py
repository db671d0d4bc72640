"""``localspec bench``: does speculation pay on this machine? The runner and its report."""
