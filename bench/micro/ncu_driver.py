"""Run one fray.cuda benchmark callable a few times, for `ncu` (standalone; not a Bazel target).

    python bench/micro/ncu_driver.py FAMILY OP SHAPE [IMPL] [REPS]

FAMILY is a fray.bench module (sampling, softmax, ...), SHAPE one of its shape strings, IMPL
defaults to fray.cuda. Profile the last launch with e.g.
    ncu --clock-control none -k regex:topk --launch-skip 2 --launch-count 1 python ... 
"""
import importlib
import sys

import torch

fam, op, shape = sys.argv[1:4]
impl = sys.argv[4] if len(sys.argv) > 4 else "fray.cuda"
reps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
mod = importlib.import_module("fray.bench." + fam)
(spec, dtype), = mod.parse_shapes(op, shape)
inp = mod.inputs(op, spec, dtype, "cuda")
fn = mod.impls(op, spec, inp, compile_fn=lambda f, **kw: f)[impl]
for _ in range(reps):
    fn()
torch.cuda.synchronize()
print("ran", fam, op, shape, impl, reps)
