"""The release: the sdist and manylinux wheel, the install test of that wheel, the CI matrices."""
