"""The release: the sdist and manylinux wheel, the install test of that wheel, the CI matrices.

- ``artefacts``: building the sdist and the wheel from it (auditwheel-repaired) and checking both;
- ``install_test``: the wheel pip-installed in the emulated target and tested, at every VLEN and without V;
- ``ci_matrix``: the GitHub Actions matrices, from the VLEN table.
"""

from . import ci_matrix, install_test
from .artefacts import RELEASE_REQUIREMENTS, checked_artefacts, parse_tag_option, release_artefacts

__all__ = [
    "RELEASE_REQUIREMENTS",
    "checked_artefacts",
    "ci_matrix",
    "install_test",
    "parse_tag_option",
    "release_artefacts",
]
