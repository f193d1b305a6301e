"""Shared main for benchmark binaries: absl flags, JSON-lines output, the printed table."""
import importlib

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "append JSON-lines records to this file")
flags.DEFINE_bool("graph", True, "also time CUDA-graph replay for shapes under 50 us")
flags.DEFINE_string("impls", None, "regex: time only the impls whose names match (fray.bench.IMPLS)")
flags.DEFINE_string("shapes", None, "comma list of ROWSxCOLS[:dtype] overriding the default shapes "
                    "(attention and sampling: shape names as recorded, see their parse_shapes)")
flags.DEFINE_integer("steps", 20000, "`bench soak`: decode steps to replay")
flags.DEFINE_integer("check_every", 1000, "`bench soak`: run every this many-th step eagerly too and compare")


def run_op(family, op, recorder=None):
    """Run one op's benchmark (used by the bench binaries and by `fray bench <op>`, which passes a
    Recorder of its own to report each record as it comes)."""
    import torch

    from fray.bench import Recorder
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks need a CUDA GPU; none is visible")
    module = importlib.import_module("fray.bench." + family)
    shapes = None
    if FLAGS.shapes and hasattr(module, "parse_shapes"):  # families whose shapes are not ROWSxCOLS
        shapes = module.parse_shapes(op, FLAGS.shapes)
    elif FLAGS.shapes:
        dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
        shapes = []
        for item in FLAGS.shapes.split(","):
            dims, _, dt = item.partition(":")
            rows, cols = (int(v) for v in dims.split("x"))
            shapes.append((rows, cols, dtypes[dt or "bf16"]))
    if FLAGS.impls:
        import re

        import fray.bench
        fray.bench.IMPLS = re.compile(FLAGS.impls)
    rec = Recorder(FLAGS.out) if recorder is None else recorder
    with torch.no_grad():
        module.run(op, rec, shapes=shapes, graph=FLAGS.graph)
    rec.table()
    return rec


def main_for(family, op):
    def _main(argv):
        del argv
        run_op(family, op)
    app.run(_main)
