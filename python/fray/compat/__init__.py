"""Drop-in facades for users of other operator libraries: fray.compat.fusedtok."""
