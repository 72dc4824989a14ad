"""scripts/gemm_onednn.py: our bf16 GEMMs beside PyTorch's, merged over interleaved rounds.

The merging and the table are checked on gemm_peak records written here (the measurement itself
needs the built example and a quiet machine); a missing example is one clear line and exit 2.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gemm_onednn.py"
spec = importlib.util.spec_from_file_location("gemm_onednn", SCRIPT)
gemm_onednn = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gemm_onednn)


def peak_output(amx, records):
    lines = [json.dumps({"peak": {"f32_gflops": 100.0, "f32_instruction": "x", "bf16_gflops": 50.0,
                                  "amx_bf16_gflops": amx}})]
    lines += [json.dumps(r) for r in records]
    return "one-thread peak: not JSON\n" + "\n".join(lines) + "\n"


def record(name, bf16, bf16_in):
    return {"gemm": name, "m": 64, "k": 32, "n": 16, "bf16_gflops": bf16, "bf16_operands_gflops": bf16_in}


def test_the_peak_is_the_tiles_where_there_are_tiles_else_vdpbf16ps():
    peak, gemms = gemm_onednn.parse_gemm_peak(peak_output(1000.0, [record("d8 fc1 fwd x·Wᵀ", 1, 2)]))
    assert peak == 1000.0 and [g["gemm"] for g in gemms] == ["d8 fc1 fwd x·Wᵀ"]
    peak, _ = gemm_onednn.parse_gemm_peak(peak_output(None, []))
    assert peak == 50.0


def test_each_side_keeps_its_best_round_and_shares_are_of_the_best_peak():
    name = "d8 fc1 bwd dy·W"
    rounds = [
        (800.0, [record(name, 200.0, 300.0)], {name: {"bf16_operands": 400.0, "autocast": 100.0}}),
        (1000.0, [record(name, 250.0, 280.0)], {name: {"bf16_operands": 350.0, "autocast": 150.0}}),
    ]
    peak, rows = gemm_onednn.merge(rounds)
    assert peak == 1000.0
    (row,) = rows
    assert (row["ours_bf16"], row["ours_bf16_operands"]) == (250.0, 300.0)
    assert (row["torch_bf16_operands"], row["torch_autocast"]) == (400.0, 150.0)
    text = gemm_onednn.table(peak, rows)
    # 250 against 150 on f32 operands, 300 against 400 on bf16 ones, each a share of 1000.
    assert "| 250 (25.0%) | 150 (15.0%) | 1.67x | 300 (30.0%) | 400 (40.0%) | 0.75x |" in text
    assert "ours_bf16 25.0%, torch_autocast 15.0%, ours_bf16_operands 30.0%, torch_bf16_operands 40.0%" in text


def test_the_layouts_are_the_training_codes():
    assert gemm_onednn.layout("d512 qkv fwd x·Wᵀ") == (False, True)
    assert gemm_onednn.layout("d512 qkv bwd dy·W") == (False, False)
    assert gemm_onednn.layout("d512 qkv wgrad dyᵀ·x") == (True, False)


def test_a_missing_example_is_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "gemm_peak"
    done = subprocess.run([sys.executable, str(SCRIPT), "--gemm-peak", str(missing)], capture_output=True, text=True)
    assert done.returncode == 2, done
    assert done.stderr.strip().splitlines() == [
        f"gemm_onednn.py: --gemm-peak {missing}: no such file; build it with "
        "`cargo build --release -p dualpipe-nn --example gemm_peak`"
    ]
