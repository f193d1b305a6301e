"""A small typed program over Fray's public API; tests/packaging type-checks it with mypy against
the installed wheel (py.typed + fray/__init__.pyi)."""
from typing import Optional, Tuple

import numpy as np
import numpy.typing as npt
import torch

import fray


def norm_numpy(x: npt.NDArray[np.float32], w: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    y = fray.rmsnorm(x, w, eps=1e-6, backend="reference")
    return y.astype(np.float32)


def norm_residual(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    return fray.add_rmsnorm(x, r, w, inplace=False)


def rotate(q: torch.Tensor, k: Optional[torch.Tensor], pos: torch.Tensor) -> torch.Tensor:
    q_out, _ = fray.rope(q, k, pos, max_position=4096, style="gptj")
    return q_out


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    out = fray.decode_attention(q, k, v, lens, kv_layout="NHD")
    out2, lse = fray.decode_attention(q, k, v, lens, return_lse=True)
    return out + out2, lse


def draw(logits: torch.Tensor, seeds: torch.Tensor, step: int) -> Tuple[torch.Tensor, torch.Tensor]:
    tokens = fray.sample(logits, temperature=0.8, top_p=0.9, seeds=seeds, offsets=step)
    tokens2, logprobs = fray.sample(logits, temperature=0.0, seeds=seeds, offsets=step, return_logprobs=True)
    values, indices = fray.topk(logits, 50, sorted=False)
    return tokens + tokens2 + indices[:, 0], logprobs + values[:, 0]


def timed() -> float:
    return fray.bench_kineto(lambda: None, "rmsnorm") + len(fray.OPS) + len(fray.__version__)


if __name__ == "__main__":
    x = np.ones((2, 4), np.float32)
    print(norm_numpy(x, np.ones(4, np.float32)))
