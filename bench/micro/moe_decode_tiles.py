"""fused_moe at decode (T 1 and 16) under CUDA-graph replay: the Triton grouped GEMMs' decode tile
(BLOCK_N x BLOCK_K x stages, fray.ops.moe_gemm.gemm_config's block_m <= 32 branch) swept at the
benchmark's model shapes, beside the CUDA path; GB/s of the hit experts' weights (bench/moe's
gbps). The 3.0 TB/s decode bar (issue 20) is a graph-replay figure; a DeepSeek-V3 rank at T1 hits
about one local expert, so its 64-wide tiles give few programs: the narrow tiles are for it.
Run on the GPU machine with the bundle's PYTHONPATH:  python3 bench/micro/moe_decode_tiles.py [MODEL...]
"""
import itertools
import sys

import torch

import fray
from fray.bench import graph_us
from fray.bench import moe as bm
from fray.ops import moe_gemm as MG

MODELS = ("mixtral", "qwen3", "dsv2lite", "dsv3ep8")
# 8 tiles x 8 (model, T) rows, each a Triton compile and a graph timing: a few minutes
TILES = [dict(BLOCK_N=n, BLOCK_K=k, num_stages=4) for n, k in itertools.product((16, 32, 64, 128), (128, 256))]


def main(models=MODELS):
    shipped = MG.gemm_config
    for model in models:
        spec = bm.model_spec(model)
        weights = bm.fused_weights(spec, "cuda")
        for t in (1, 16):
            inp = bm.fused_inputs(bm.Fused(model, t, True), "cuda", weights)
            _, hit = bm.route_counts(inp["ids"], inp["emap"])
            gb = bm.fused_bytes(spec, t, hit) / 1e3

            def call(backend):
                return fray.fused_moe(inp["x"], inp["w13"], inp["w2"], topk_weights=inp["tw"], topk_ids=inp["ids"],
                                      expert_map=inp["emap"], backend=backend)
            rows = [("shipped", lambda: call("triton")), ("cuda", lambda: call("cuda"))]
            for tile in TILES:
                def swept(block_m, n, k, gated=False, rows_contiguous=False, tile=tile):
                    cfg = shipped(block_m, n, k, gated, rows_contiguous)
                    return dict(cfg, **tile) if block_m <= 32 else cfg
                rows.append(("n%d k%d s%d" % (tile["BLOCK_N"], tile["BLOCK_K"], tile["num_stages"]),
                             lambda swept=swept: _with_config(swept, call)))
            for name, fn in rows:
                try:
                    us = graph_us(fn)
                    print("%-9s T%-3d %-14s %9.2f us %7.0f GB/s" % (model, t, name, us, gb / us), flush=True)
                except Exception as exc:  # a tile that does not compile or fit: say so, go on
                    print("%-9s T%-3d %-14s error: %s" % (model, t, name, str(exc).splitlines()[0][:120]), flush=True)


def _with_config(config_fn, call):
    """One call with gemm_config replaced (graph capture records the launches the call makes)."""
    shipped, MG.gemm_config = MG.gemm_config, config_fn
    try:
        return call("triton")
    finally:
        MG.gemm_config = shipped


if __name__ == "__main__":
    main(tuple(sys.argv[1:]) or MODELS)
