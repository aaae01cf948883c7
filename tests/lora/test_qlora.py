"""LoRA over a quantized, frozen base (QLoRA): ``Trainer(lora=..., quant=...)`` and ``train --quant``.

The reference is PEFT + torch fp32 training the same initial adapter on the same batches over a transformers
model whose layer matrices are replaced by the values ``orion.quant`` stores for the mode (dequantized): the
function Orion's adapters are trained against. Tolerance: as the fp16 LoRA test against PEFT
(tests/lora/test_lora_train.py: 0.2% relative per step on Llama). A full fine-tune of a quantized base is
refused with the fix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_lora_train import ALL_TARGETS, CONFIGS, SEQ, _base_dir, _torch_lora_losses, tokens  # noqa: F401 (a fixture)

from orion import quant
from orion.lora.train import LoraSpec
from orion.models.llama.graphs import group_rows
from orion.train.cli import main as cli_main
from orion.train.errors import TrainError
from orion.train.trainer import Trainer, load_model, quantized_base
from support import references

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantized_hf_dir(base_dir: Path, directory: Path, mode: str) -> Path:
    """``base_dir`` with every layer matrix replaced by ``mode``'s dequantized values (transformers saves it); the
    query rows and output-projection columns of each query group are quantized on their own, as Orion does."""
    torch, transformers = references.require("torch", "transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = CONFIGS["llama"]
    for layer in model.model.layers:
        for block in (layer.self_attn, layer.mlp):
            for name in PROJECTIONS:
                if not hasattr(block, name):
                    continue
                linear = getattr(block, name)
                w = linear.weight.detach().numpy().astype(np.float64)
                values = w.copy()
                if name in ("q_proj", "o_proj"):
                    for j in range(config.group_size):
                        rows = group_rows(config, j)
                        if name == "q_proj":
                            values[rows] = quant.quantize(w[rows], mode).dequantized()
                        else:
                            values[:, rows] = quant.quantize(w[:, rows], mode).dequantized()
                else:
                    values = quant.quantize(w, mode).dequantized()
                linear.weight = torch.nn.Parameter(torch.tensor(values, dtype=torch.float32))
    model.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("mode", ["int4", "lut4"])
def test_lora_on_a_quantized_base_follows_peft_on_the_quantized_weights(mode: str, tokens: Path,  # noqa: F811
                                                                       tmp_path: Path) -> None:
    references.require("torch", "transformers", "peft")
    base_dir = _base_dir("llama", tmp_path / "base")
    spec = LoraSpec(r=4, alpha=8.0, targets=ALL_TARGETS["llama"])
    trainer = Trainer(base_dir, tokens, tmp_path / "run", steps=30, seq=SEQ, batch=2, lr=1e-2, eval_every=30,
                      checkpoint_every=30, quiet=True, prefer="ane", lora=spec, seed=3, from_scratch=True, quant=mode)
    model, loaded, _ = load_model(base_dir)
    frozen = quantized_base(model, loaded, mode)
    changed = 0
    for name, value in trainer.model.base_params.items():  # the base the adapters see: the quantized values
        assert np.array_equal(value, frozen[name]), name
        changed += not np.array_equal(value, loaded[name])
    matrices = sum(len(shape) == 2 for shape in model.layer_shapes().values())
    assert changed == matrices * model.n_layers, "every layer matrix is quantized, nothing else"
    want = _torch_lora_losses("llama", trainer, quantized_hf_dir(base_dir, tmp_path / "quantized", mode))
    got = [r["loss"] for r in trainer.train()]
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-3)
    assert want[-1] < 0.9 * want[0]


def test_full_fine_tune_of_a_quantized_base_is_refused(tokens: Path, tmp_path: Path, capsys) -> None:  # noqa: F811
    base_dir = _base_dir("llama", tmp_path / "base")
    with pytest.raises(TrainError, match="full fine-tune of a int4 base .* Fix: fine-tune LoRA adapters"):
        Trainer(base_dir, tokens, tmp_path / "run", steps=2, seq=SEQ, quiet=True, quant="int4")
    with pytest.raises(TrainError, match="TrainConfig.quant='int3'"):
        Trainer(base_dir, tokens, tmp_path / "run", steps=2, seq=SEQ, quiet=True, quant="int3")
    status = cli_main(["--model", str(base_dir), "--data", str(tokens), "--steps", "2", "--out", str(tmp_path / "cli"),
                       "--quant", "lut4", "--quiet"])
    assert status != 0 and "refused" in capsys.readouterr().err


def test_a_lut_base_is_fitted_by_its_importance_matrix(tokens: Path, tmp_path: Path, capsys) -> None:  # noqa: F811
    """``imatrix=``: the frozen base is what the quantizer makes with the importance collected on its weights."""
    from orion import importance, models

    base_dir = _base_dir("llama", tmp_path / "base")
    found = importance.collect(models.load(base_dir, progress=False), [i % 64 for i in range(3, 90)], "ids",
                               progress=False)
    path = found.save(tmp_path / "base.imatrix")
    spec = LoraSpec(r=4, alpha=8.0, targets=ALL_TARGETS["llama"])
    trainer = Trainer(base_dir, tokens, tmp_path / "run", steps=1, seq=SEQ, quiet=True, lora=spec, from_scratch=True,
                      quant="lut4", imatrix=str(path))
    model, loaded, _ = load_model(base_dir)
    weighted, plain = quantized_base(model, loaded, "lut4", found), quantized_base(model, loaded, "lut4")
    key = model.layer_param(1, "w_down")
    assert np.array_equal(trainer.model.base_params[key], weighted[key])
    assert not np.array_equal(weighted[key], plain[key])
    with pytest.raises(TrainError, match="only lut4, lut6 use an importance matrix"):
        Trainer(base_dir, tokens, tmp_path / "run2", steps=1, seq=SEQ, quiet=True, lora=spec, quant="int4",
                imatrix=str(path))
    with pytest.raises(importance.ImportanceError, match="collected on weights"):
        Trainer(_base_dir("llama", tmp_path / "other", seed=9), tokens, tmp_path / "run3", steps=1, seq=SEQ,
                quiet=True, lora=spec, quant="lut4", imatrix=str(path), from_scratch=True)
