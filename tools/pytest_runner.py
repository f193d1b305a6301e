"""Entry point of every fray_py_test target: pytest over the files named in args."""
import os
import sys

import pytest

if __name__ == "__main__":
    # --rootdir=.: the runfiles root, so tests/conftest.py (the gpu marker, fixtures) is found.
    args = ["-p", "no:cacheprovider", "-q", "-rs", "--rootdir=."]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args += ["--junitxml", xml]
    sys.exit(pytest.main(args + sys.argv[1:]))
