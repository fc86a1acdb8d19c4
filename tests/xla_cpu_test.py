"""Precision chosen by CPU: which CPUs compute in bfloat16 under ``auto``."""

import dataclasses
import json
import os

import jax
import pytest

from jaxtl.runtime import xla_cpu

INTEL_AMX = xla_cpu.Cpu("Intel(R) Xeon(R) Processor", "GenuineIntel",
                        frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}),
                        "family 6 model 207")
INTEL_AMX_167 = dataclasses.replace(INTEL_AMX, generation="family 6 model 167")
INTEL_OLD = xla_cpu.Cpu("Intel(R) Xeon(R) CPU @ 2.20GHz", "GenuineIntel",
                        frozenset({"avx2", "avx512f"}))
AMD = xla_cpu.Cpu("AMD EPYC 9B14", "AuthenticAMD", frozenset({"avx2", "avx512f"}))
AMD_BF16 = xla_cpu.Cpu("AMD EPYC", "AuthenticAMD",
                       frozenset({"avx2", "avx512f", "avx512_bf16"}), "family 25 model 17")
ZEN3 = xla_cpu.Cpu("AMD EPYC", "AuthenticAMD", frozenset({"avx2"}), "family 25 model 1")
ZEN2 = xla_cpu.Cpu("AMD EPYC", "AuthenticAMD", frozenset({"avx2"}), "family 23 model 49")


def test_bf16_matmuls_pay_only_where_measured():
  assert xla_cpu.bf16_matmuls(AMD_BF16, {}).needs == {"avx512_bf16"}
  assert xla_cpu.bf16_matmuls(INTEL_AMX, {}).needs == {"amx_bf16"}
  # Not a CPU without bf16 arithmetic (nor one that cannot be read).
  for cpu in (INTEL_OLD, AMD, ZEN3, ZEN2, None):
    assert xla_cpu.bf16_matmuls(cpu, {}) is None
  for cpu in (AMD_BF16, INTEL_AMX):
    assert xla_cpu.bf16_matmuls(cpu, {"JAXTL_CPU_FLAGS": "0"}) is None


def test_auto_precision_is_bf16_where_it_pays_float32_on_other_cpus(monkeypatch, caplog):
  monkeypatch.delenv("JAXTL_CPU_FLAGS", raising=False)  # the suite opts out
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: AMD_BF16)
  with caplog.at_level("INFO"):
    assert xla_cpu.auto_precision("cpu", "--keep=f32") == "bfloat16"
  assert "computing in bfloat16 (auto): this CPU (AMD EPYC, avx512_bf16)" in caplog.text
  assert "--keep=f32 computes in float32" in caplog.text
  with caplog.at_level("INFO"):  # tensor cores
    assert xla_cpu.auto_precision("gpu", "--keep=f32") == "bfloat16"
  assert "computing in bfloat16 (auto) on GPU; --keep=f32 computes in float32" in caplog.text
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: INTEL_AMX)
  assert xla_cpu.auto_precision("cpu", None) == "bfloat16"
  for cpu in (AMD, INTEL_OLD, ZEN3, None):
    monkeypatch.setattr(xla_cpu, "read_cpu", lambda: cpu)
    assert xla_cpu.auto_precision("cpu", "") == "float32"


def test_row_major_dots_for_bfloat16_where_it_pays_and_float32_where_measured(monkeypatch):
  from jaxtl.models import TransformerConfig
  from jaxtl.models.config import computing_in
  monkeypatch.delenv("JAXTL_CPU_FLAGS", raising=False)
  for cpu, pays in ((INTEL_AMX, True), (INTEL_AMX_167, True), (AMD_BF16, True),
                    (AMD, False), (ZEN3, False), (ZEN2, False), (None, False)):
    monkeypatch.setattr(xla_cpu, "read_cpu", lambda: cpu)
    float32_pays = cpu in (INTEL_AMX, INTEL_AMX_167, ZEN3, AMD_BF16)  # measured faster there
    assert xla_cpu.row_major_dots("cpu", "bfloat16") == pays
    assert xla_cpu.row_major_dots("cpu", "float32") == float32_pays
    # w.T to XLA; the Xeon of model 207 wrote it out faster
    assert xla_cpu.folds_float32_dx("cpu") == (cpu in (ZEN3, AMD_BF16, INTEL_AMX_167))
    assert not xla_cpu.folds_float32_dx("gpu")
    assert not xla_cpu.row_major_dots("gpu", "bfloat16")
    assert not xla_cpu.row_major_dots("gpu", "float32")
    cfg = TransformerConfig.from_mapping({"dtype": "bfloat16", "vocab_size": 64})
    assert cfg.row_major_dots == pays  # asked for by name, not through auto
    assert computing_in(TransformerConfig(), "bfloat16").row_major_dots == pays
    assert computing_in(TransformerConfig(), "float32").row_major_dots == float32_pays
    assert computing_in(TransformerConfig(dtype="bfloat16"), "").row_major_dots == pays
    auto = computing_in(TransformerConfig(), "auto", None)  # this machine decides both
    assert (auto.dtype, auto.row_major_dots) == (("bfloat16", True) if pays
                                                 else ("float32", float32_pays))
  asked = TransformerConfig(dtype="bfloat16", row_major_dots=True)
  assert computing_in(asked, "float32").row_major_dots  # asked for stays on
  monkeypatch.setenv("JAXTL_CPU_FLAGS", "0")  # the opt-out turns the choice off
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: INTEL_AMX)
  assert not xla_cpu.row_major_dots("cpu", "bfloat16")
  assert not xla_cpu.row_major_dots("cpu", "float32")


def test_a_flipped_table_puts_this_cpu_in_or_out_for_the_block_alone(monkeypatch):
  """What ``jaxtl benchmark --versus=cpu_rule=TABLE`` measures against."""
  monkeypatch.delenv("JAXTL_CPU_FLAGS", raising=False)
  for cpu, was_in in ((ZEN3, True), (ZEN2, False), (INTEL_AMX, False)):
    monkeypatch.setattr(xla_cpu, "read_cpu", lambda: cpu)
    with xla_cpu.flipped("FLOAT32_FOLDED_DX_RULES") as inside:
      assert inside == (not was_in) == xla_cpu.folds_float32_dx("cpu")
    assert xla_cpu.folds_float32_dx("cpu") == was_in
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: ZEN3)  # auto's bf16, by its table too
  with xla_cpu.flipped("BF16_RULES") as inside:
    assert inside and xla_cpu.auto_precision("cpu", None) == "bfloat16"
    assert xla_cpu.row_major_dots("cpu", "bfloat16")
  assert xla_cpu.auto_precision("cpu", None) == "float32"
  with pytest.raises(ValueError, match="no rule table 'NOPE'; tables: BF16_RULES"):
    with xla_cpu.flipped("NOPE"):
      pass
  monkeypatch.setenv("JAXTL_CPU_FLAGS", "0")
  with pytest.raises(ValueError, match="JAXTL_CPU_FLAGS=0.*nothing to flip"):
    with xla_cpu.flipped("BF16_RULES"):
      pass


def test_a_recipes_model_computes_in_auto_precision(monkeypatch):
  from jaxtl.configs import models
  from jaxtl.models import TransformerConfig
  values = {**models.get_model_config("bert_tiny"), "vocab_size": 64}
  assert values["dtype"] == "auto" and not values["row_major_dots"]
  monkeypatch.delenv("JAXTL_CPU_FLAGS", raising=False)
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: AMD_BF16)
  cfg = TransformerConfig.from_mapping(values)
  assert (cfg.dtype, cfg.row_major_dots) == ("bfloat16", True)
  cfg = TransformerConfig.from_mapping({**values, "dtype": "float32"})  # asked for
  assert (cfg.dtype, cfg.row_major_dots) == ("float32", True)  # faster there too
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: AMD)
  cfg = TransformerConfig.from_mapping(values)
  assert (cfg.dtype, cfg.row_major_dots) == ("float32", False)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  cfg = TransformerConfig.from_mapping(values)
  assert (cfg.dtype, cfg.row_major_dots) == ("bfloat16", False)
  with pytest.raises(ValueError, match="config.model.dtype='bf16'; expected one of auto"):
    TransformerConfig.from_mapping({**values, "dtype": "bf16"})


def test_a_workdir_pretrained_under_auto_decides_precision_where_it_is_loaded(
    tmp_path, monkeypatch):
  from jaxtl.configs import models
  from jaxtl.models import TransformerConfig
  from jaxtl.pretraining import pretrained
  monkeypatch.delenv("JAXTL_CPU_FLAGS", raising=False)
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: AMD_BF16)  # pretrained where bf16 pays
  asked = {**models.get_model_config("bert_tiny"), "vocab_size": 64}
  cfg = TransformerConfig.from_mapping(asked)
  workdir = str(tmp_path)
  pretrained.save_model_config(cfg, workdir, generator=cfg.replace(num_layers=1),
                               asked=asked)
  with open(tmp_path / "model_config.json") as f:
    recorded = json.load(f)
  for record in (recorded, recorded["generator"]):
    assert (record["dtype"], record["row_major_dots"]) == ("auto", False)
  assert pretrained.load_model_config(workdir) == cfg  # the same machine: the same
  monkeypatch.setattr(xla_cpu, "read_cpu", lambda: AMD)  # `jaxtl generate` on AVX2
  for loaded in (pretrained.load_model_config(workdir),
                 pretrained.load_generator_config(workdir)):
    assert (loaded.dtype, loaded.row_major_dots) == ("float32", False)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert pretrained.load_model_config(workdir).dtype == "bfloat16"
  # A dtype asked for by name is recorded as it is.
  pretrained.save_model_config(cfg.replace(dtype="float32", row_major_dots=False), workdir,
                               asked={**asked, "dtype": "float32"})
  assert pretrained.load_model_config(workdir).dtype == "float32"


def test_describe_names_the_xla_cpu_flags_a_process_runs_with():
  environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_cpu_use_onednn=true"}
  assert xla_cpu.describe(environ) == "XLA:CPU flags: --xla_cpu_use_onednn=true"
  assert xla_cpu.describe({}) == "XLA:CPU flags: default"


def test_the_suite_keeps_only_the_speed_flags_this_xla_knows(monkeypatch):
  # A jaxlib that drops a flag (0.11 dropped --xla_cpu_use_fusion_emitters)
  # would otherwise abort every test worker at start.
  import runs  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv("JAXTL_TEST_XLA_FLAGS")
  flags = ("--xla_backend_optimization_level=0", "--xla_cpu_no_such_flag=1")
  assert runs._known_flags(flags) == flags[:1]  # pylint: disable=protected-access
  assert os.environ["JAXTL_TEST_XLA_FLAGS"] == flags[0]  # what workers inherit
