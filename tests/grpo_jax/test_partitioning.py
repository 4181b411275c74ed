"""Meshes, rule presets and placement (grpo_jax/partitioning.py), and an HF checkpoint loaded into shardings."""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from grpo_jax import models
from grpo_jax import partitioning
from grpo_jax import training
from grpo_jax.models import lora
from grpo_jax.models.config import LORA_TARGETS

P = PartitionSpec
MESH_222 = AbstractMesh((2, 2, 2), partitioning.MESH_AXES)
SMALL = models.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=8, qkv_bias=True)


@pytest.mark.parametrize("spec, sizes", [
    ("data:2,fsdp:2,tensor:2", (2, 2, 2)),
    ("tensor:2, data:-1", (4, 1, 2)),
    ("fsdp:-1", (1, 8, 1)),
    ("", (8, 1, 1)),
    ("data:8", (8, 1, 1)),
])
def test_parse_mesh_spec(spec, sizes):
  assert tuple(partitioning.parse_mesh_spec(spec, 8).values()) == sizes


@pytest.mark.parametrize("spec, message", [
    ("data:2,fsdp:2", "needs 4 devices, but there are 8"),
    ("data:-1,fsdp:-1", "only one axis may be -1"),
    ("data:3,fsdp:-1", "8 devices do not divide by the fixed axes' 3"),
    ("model:8", "'model:8' is not 'axis:size'"),
    ("data8", "'data8' is not 'axis:size'"),
    ("data:two", "size 'two' of axis 'data' is not an integer"),
    ("data:0,fsdp:-1", "must be >= 1 or -1"),
    ("data:2,data:4", "axis 'data' given twice"),
])
def test_parse_mesh_spec_errors(spec, message):
  with pytest.raises(ValueError, match=message) as err:
    partitioning.parse_mesh_spec(spec, 8)
  assert "\n" not in str(err.value)


def test_rule_presets_are_data_and_checked():
  assert set(partitioning.RULES) == {"dp", "fsdp", "fsdp_tp"}
  for rules in partitioning.RULES.values():
    assert set(rules) == set(models.LOGICAL_AXES)
  with pytest.raises(ValueError, match="unknown sharding rules 'zero3'"):
    partitioning.get_rules("zero3")
  with pytest.raises(ValueError, match="unknown logical axes"):
    partitioning.get_rules({"batch": "data", "hidden": "fsdp"})


def _specs(mesh, rules_name, tree):
  return jax.tree.map(lambda s: s.spec, partitioning.state_shardings(mesh, partitioning.get_rules(rules_name), tree))


def test_param_specs_of_the_presets():
  shapes = jax.eval_shape(models.init_params, SMALL, jax.random.key(0))
  layer = lambda specs: specs["layers_0"]
  tp = partitioning.param_shardings(MESH_222, partitioning.get_rules("fsdp_tp"), shapes)
  tp = jax.tree.map(lambda s: s.spec, tp)
  assert tp["embed"]["embedding"] == P("tensor", "fsdp")  # [vocab, embed]
  assert layer(tp)["attn"]["q_proj"]["kernel"] == P("fsdp", "tensor", None)  # [embed, heads, head_dim]
  assert layer(tp)["attn"]["q_proj"]["bias"] == P("tensor", None)
  assert layer(tp)["attn"]["k_proj"]["kernel"] == P("fsdp", None, None)  # one kv head: not split
  assert layer(tp)["attn"]["o_proj"]["kernel"] == P("tensor", None, "fsdp")  # [heads, head_dim, embed]
  assert layer(tp)["mlp"]["gate_proj"]["kernel"] == P("fsdp", "tensor")  # [embed, mlp]
  assert layer(tp)["mlp"]["down_proj"]["kernel"] == P("tensor", "fsdp")  # [mlp, embed]
  assert layer(tp)["input_norm"]["scale"] == P("fsdp")
  fsdp = _specs(MESH_222, "fsdp", shapes)
  assert fsdp["embed"]["embedding"] == P(None, "fsdp")
  assert layer(fsdp)["mlp"]["down_proj"]["kernel"] == P(None, "fsdp")
  dp = _specs(MESH_222, "dp", shapes)
  assert dp["embed"]["embedding"] == P(None, None)
  assert layer(dp)["attn"]["o_proj"]["kernel"] == P(None, None, None)


def test_lora_adapters_split_over_fsdp():
  """Every adapter of a LoRA config splits over fsdp (A by its kernel's input axis or its rank, B by its rank),
  and its Adam moments with it; under dp nothing splits. fsdp:4 on a rank 8."""
  config = lora.lora_config(SMALL, rank=8, alpha=16, targets=LORA_TARGETS)
  params = jax.eval_shape(models.init_params, config, jax.random.key(0))
  mesh = AbstractMesh((1, 4, 2), partitioning.MESH_AXES)
  for rules in ("fsdp", "fsdp_tp"):
    specs = _specs(mesh, rules, params)
    attn, mlp = specs["layers_0"]["attn"], specs["layers_0"]["mlp"]
    tp = "tensor" if rules == "fsdp_tp" else None
    assert attn["q_proj"]["lora_a"] == P("fsdp", None)  # [embed, r]: embed takes fsdp, the rank stays whole
    assert attn["q_proj"]["lora_b"] == P("fsdp", tp, None)  # [r, heads, head_dim]
    assert attn["k_proj"]["lora_b"] == P("fsdp", None, None)  # one kv head: only the rank splits
    assert attn["o_proj"]["lora_a"] == P(tp, None, "fsdp")  # [heads, head_dim, r]
    assert attn["o_proj"]["lora_b"] == P("fsdp", None)  # [r, embed]: the rank comes first and takes fsdp
    assert mlp["down_proj"]["lora_a"] == P(tp, "fsdp")  # [mlp, r]
    assert mlp["up_proj"]["lora_b"] == P("fsdp", tp)  # [r, mlp]
    flat = jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))[0]
    adapters = [s for path, s in flat if "lora_" in jax.tree_util.keystr(path)]
    assert len(adapters) == 2 * 7 and all("fsdp" in s for s in adapters)
  optimizer = training.make_optimizer(1e-3)
  trained, _ = lora.split(params)
  moments = _specs(mesh, "fsdp", jax.eval_shape(lambda p: training.init_train_state(p, optimizer), trained))
  assert moments.opt_state[1][0].mu == moments.params
  assert moments.params["layers_0"]["attn"]["v_proj"]["lora_b"] == P("fsdp", None, None)
  dp = _specs(mesh, "dp", params)
  assert dp["layers_0"]["attn"]["q_proj"]["lora_b"] == P(None, None, None)
  wide = _specs(AbstractMesh((1, 16, 1), partitioning.MESH_AXES), "fsdp", params)
  assert wide["layers_0"]["attn"]["o_proj"]["lora_b"] == P(None, "fsdp")  # 16 does not divide r = 8: embed takes it


def test_optimizer_state_follows_params_and_scalars_are_replicated():
  optimizer = training.make_optimizer(1e-3, warmup_steps=2, total_steps=10, schedule="cosine")
  params = jax.eval_shape(models.init_params, SMALL, jax.random.key(0))
  state = jax.eval_shape(lambda p: training.init_train_state(p, optimizer), params)
  specs = _specs(MESH_222, "fsdp_tp", state)
  flat = jax.tree_util.tree_flatten_with_path(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))[0]
  moments = [s for path, s in flat if "mu" in jax.tree_util.keystr(path) or "nu" in jax.tree_util.keystr(path)]
  assert len(moments) == 2 * len(jax.tree.leaves(params))
  assert specs.step == P()
  adam = [s for s in jax.tree.leaves(specs.opt_state, is_leaf=lambda x: isinstance(x, PartitionSpec))
          if s == P()]
  assert adam  # step counters
  mu = state.opt_state[1][0].mu
  mu_specs = jax.tree.map(lambda s: s.spec, partitioning.state_shardings(MESH_222, partitioning.RULES["fsdp_tp"], mu))
  assert mu_specs == specs.params
  scalar = models.init_scalar_params(SMALL, jax.random.key(1))
  head = partitioning.param_shardings(MESH_222, partitioning.RULES["fsdp"], scalar)["head"]
  assert head["kernel"].spec == P("fsdp") and head["bias"].spec == P()


def test_batch_shardings():
  batch = training.Batch(*(jax.ShapeDtypeStruct((8, 5), jnp.float32) for _ in training.Batch._fields))
  specs = jax.tree.map(lambda s: s.spec, partitioning.batch_shardings(MESH_222, partitioning.RULES["dp"], batch))
  assert specs.tokens == P(("data", "fsdp"), None)
  assert partitioning.batch_sharding(MESH_222, partitioning.RULES["fsdp_tp"]).spec == P(("data", "fsdp"))
  assert partitioning.data_parallel_size(MESH_222, partitioning.RULES["fsdp_tp"]) == 4


@pytest.mark.devices(8)
def test_make_mesh_and_sharded_init_on_8_devices():
  mesh = partitioning.make_mesh("data:2,fsdp:2,tensor:2")
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2} and mesh.devices.size == 8
  assert dict(partitioning.make_mesh("fsdp:-1").shape) == {"data": 1, "fsdp": 8, "tensor": 1}
  with pytest.raises(ValueError, match="needs 16 devices, but there are 8"):
    partitioning.make_mesh("data:4,fsdp:4")
  rules = partitioning.get_rules("fsdp_tp")
  key = jax.random.key(0)
  params = partitioning.init_params(SMALL, key, mesh, rules)
  expected = partitioning.init_params(SMALL, key, partitioning.single_device_mesh(), rules)  # the same on one device
  jax.tree.map(np.testing.assert_array_equal, params, expected)
  reference = models.init_params(SMALL, key)  # the same distribution, other draws
  jax.tree.map(lambda a, b: a.shape == b.shape and a.dtype == b.dtype or pytest.fail("layout"), params, reference)
  np.testing.assert_allclose(np.std(params["embed"]["embedding"]), 0.02, rtol=0.1)
  np.testing.assert_array_equal(params["layers_0"]["attn"]["q_proj"]["bias"], 0.0)
  np.testing.assert_array_equal(params["final_norm"]["scale"], 1.0)
  embedding = params["embed"]["embedding"]
  assert embedding.sharding == NamedSharding(mesh, P("tensor", "fsdp"))
  assert embedding.addressable_shards[0].data.shape == (32, 16)  # no device holds the whole table
  optimizer = optax.adam(1e-3)
  state, shardings = partitioning.init_train_state(params, optimizer, mesh, rules)
  assert state.opt_state[0].mu["embed"]["embedding"].sharding == embedding.sharding
  assert shardings.step == partitioning.replicated(mesh)
  jax.tree.map(lambda x, s: x.sharding.is_equivalent_to(s, x.ndim) or pytest.fail(str(x.sharding)), state,
               shardings)


@pytest.mark.devices(2)
def test_init_train_state_with_donate_leaves_the_state_the_only_copy(recwarn):
  """`donate=True` hands the params over: a leaf placed by the rules gives its buffer to the state, one placed
  otherwise (whole on every device) is resharded and deleted too, with no warning; the state holds their values."""
  mesh, rules = partitioning.make_mesh("fsdp:2"), partitioning.get_rules("fsdp")
  params = partitioning.init_params(SMALL, jax.random.key(0), mesh, rules)
  params["lm_head"]["kernel"] = jax.device_put(params["lm_head"]["kernel"], partitioning.replicated(mesh))
  expected = jax.device_get(params)
  before = jax.live_arrays()
  state, _ = partitioning.init_train_state(params, optax.adam(1e-3), mesh, rules, donate=True)
  assert all(x.is_deleted() for x in jax.tree.leaves(params)) and not recwarn.list
  kept = {id(x) for x in jax.tree.leaves(state)} | {id(x) for x in before}
  assert [x.shape for x in jax.live_arrays() if id(x) not in kept] == []  # nothing new outside the state
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params), expected)


@pytest.mark.devices(8)
def test_load_hf_into_shardings(tmp_path):
  # Here rather than in test_hf_io.py, whose torch oracle would cost this test's 8-device child process 5 s.
  config = models.ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, model_type="qwen3",
                              qk_norm=True, qkv_bias=True, o_bias=True, tie_word_embeddings=False)
  models.save_hf(models.init_params(config, jax.random.key(0)), config, tmp_path)
  expected, _ = models.load_hf(tmp_path, dtype="bfloat16")
  mesh, rules = partitioning.make_mesh("data:2,fsdp:2,tensor:2"), partitioning.get_rules("fsdp_tp")
  params, loaded = models.load_hf(tmp_path, dtype="bfloat16", shardings=lambda c: partitioning.param_shardings(
      mesh, rules, jax.eval_shape(models.init_params, c, jax.random.key(0))))
  assert loaded.param_dtype == "bfloat16"
  jax.tree.map(np.testing.assert_array_equal, params, expected)
  kernel = params["layers_0"]["mlp"]["down_proj"]["kernel"]  # [mlp, embed] = [64, 32]
  assert kernel.dtype == jnp.bfloat16 and kernel.sharding.spec == P("tensor", "fsdp")
  assert {s.data.shape for s in kernel.addressable_shards} == {(32, 16)}
  lm_head = params["lm_head"]["kernel"]  # vocab 97 does not split: only embed over fsdp
  assert lm_head.sharding.spec == P("fsdp", None)
  again, _ = partitioning.load_hf(tmp_path, mesh, rules)  # the convenience wrapper, float32
  jax.tree.map(np.testing.assert_array_equal, again, models.load_hf(tmp_path)[0])


class _Batch(NamedTuple):
  x: jax.Array
  loss_mask: jax.Array


def test_sharded_programs_keep_their_functions_names():
  """A profile or compile log names the program after the function it runs, on a mesh as on one device."""
  mesh, rules = partitioning.single_device_mesh(), partitioning.get_rules("fsdp")
  x = jnp.ones((2, 3))

  def scores(a):
    return a * 2

  assert "module @jit_scores" in partitioning.jit_with_rules(scores, mesh, rules).lower(x).as_text()
  scaled = functools.partial(lambda a, k: a * k, k=3)
  assert "module @jit__lambda" in partitioning.jit_with_rules(scaled, mesh, rules).lower(x).as_text()
  params = {"w": jnp.ones((3,))}
  objective = lambda p, batch, totals: (jnp.sum(batch.x * p["w"]) / totals["num_tokens"], {"loss": jnp.zeros(())})
  state, shardings = partitioning.init_train_state(params, optax.sgd(0.1), mesh, rules)
  step = training.make_train_step(objective, optax.sgd(0.1), state_shardings=shardings, mesh=mesh, rules=rules)
  batch = _Batch(x=jnp.ones((2, 3)), loss_mask=jnp.ones((2, 3), bool))
  assert "module @jit_step" in step.program().lower(state, batch).as_text()
