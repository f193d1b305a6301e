"""Wrong uses of Fray's API that the type check must reject (tests/packaging expects an error on
every line marked `# error`); proof that the check can fail."""
import numpy as np
import torch

import fray

x = np.ones((2, 4), np.float32)
y: torch.Tensor = fray.rmsnorm(x, x)  # error: numpy in gives numpy out
fray.softmax(torch.ones(4), backend="cudaa")  # error: not a backend
fray.rope(torch.ones(1, 1, 8), None, 0)  # error: max_position is required
out: torch.Tensor = fray.decode_attention(x, x, x, x, return_lse=True)  # error: (out, lse) is a tuple
