"""CPU references: the ground truth every backend is tested against (float64 math, numpy)."""
