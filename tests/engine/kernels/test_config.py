"""Launch configurations: generated tiles, the split-K rule and the env-var pin."""

from __future__ import annotations

import pytest

from engine.kernels.config import ENV_PIN, TARGET_PROGRAMS, GemmConfig, gemm_config, next_pow2


def test_tiles_are_clamped_powers_of_two():
    assert [next_pow2(x) for x in (1, 2, 3, 17, 64)] == [1, 2, 4, 32, 64]
    cfg = gemm_config(1, 3, 200, 17, allow_split=False)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k) == (16, 64, 32, 1)


def test_long_reductions_split_only_when_allowed_and_the_grid_is_small():
    # dL = x^T u for 8192 rows, N = 768, r = 30: 12 x 1 tiles, far below TARGET_PROGRAMS
    assert gemm_config(1, 768, 30, 8192, allow_split=False).split_k == 1
    split = gemm_config(1, 768, 30, 8192, allow_split=True).split_k
    assert 1 < split <= -(-TARGET_PROGRAMS // 12)
    assert gemm_config(4096, 16, 48, 32, allow_split=True).split_k == 1  # many rows already
    assert gemm_config(1, 16, 16, 40, allow_split=True).split_k == 1  # short reduction


def test_env_pin_overrides_and_is_validated(monkeypatch):
    monkeypatch.setenv(ENV_PIN, "32,16,64,8,3,5")
    assert gemm_config(1, 3, 3, 3, allow_split=True) == GemmConfig(32, 16, 64, 8, 3, 5)
    assert gemm_config(1, 3, 3, 3, allow_split=False).split_k == 1
    for bad in ("32,16", "32,16,24", "a,b,c", "16,16,16,3"):
        monkeypatch.setenv(ENV_PIN, bad)
        with pytest.raises(ValueError, match=ENV_PIN):
            gemm_config(1, 3, 3, 3, allow_split=True)
