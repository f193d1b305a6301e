"""Fray as a Bazel dependency of another repository: the package imports from @fray and an
operator runs through the reference backend (numpy in, numpy out)."""
import os
import unittest

import numpy as np


class ReferenceTest(unittest.TestCase):
    def test_rmsnorm_reference_from_a_dependency(self):
        import fray
        # In runfiles the main repository is _main; Fray is a repository beside it (fray~).
        repo = fray.__file__.split(".runfiles" + os.sep, 1)[1].split(os.sep)[0]
        self.assertTrue(repo.startswith("fray"), "fray imported from %s, not @fray" % fray.__file__)
        x = np.array([[3.0, 4.0], [1.0, -1.0]], np.float32)
        w = np.array([1.0, 2.0], np.float32)
        y = fray.rmsnorm(x, w, eps=0.0, backend="reference")
        self.assertIsInstance(y, np.ndarray)
        expected = x / np.sqrt((x ** 2).mean(axis=1, keepdims=True)) * w
        np.testing.assert_allclose(y, expected, rtol=1e-6)

    def test_error_contract_across_the_dependency(self):
        import fray
        with self.assertRaisesRegex(ValueError, "weight"):
            fray.rmsnorm(np.ones((2, 4), np.float32), np.ones(3, np.float32))


if __name__ == "__main__":
    unittest.main()
