"""The test runs: pytest on the host and under QEMU, the emulated matrix, repro, and what they report."""
