"""The release: the sdist and manylinux wheel, the install test of that wheel, the CI matrices.

- ``artefacts``: building the sdist and the wheel from it (one library per torch line, auditwheel-repaired) and
  checking both;
- ``install_test``: the wheel pip-installed in the emulated target and tested, at every VLEN and without V;
- ``native_build``: the sdist built natively in an emulated Debian board root with its GCC and clang;
- ``ci_matrix``: the GitHub Actions matrices, from the VLEN and torch-line tables.
"""

from . import ci_matrix, install_test, native_build
from .artefacts import RELEASE_REQUIREMENTS, checked_artefacts, parse_tag_option, release_artefacts

__all__ = [
    "RELEASE_REQUIREMENTS",
    "checked_artefacts",
    "ci_matrix",
    "install_test",
    "native_build",
    "parse_tag_option",
    "release_artefacts",
]
