"""LoRA (grpo_jax.models.lora): exactly the base model at B = 0, gradients and optimiser state for the adapters only,
the merged export equal to the adapted model, PEFT loading our adapters in torch with the same logits."""

import json
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax import models
from grpo_jax import training
from grpo_jax.training import update as update_lib
from grpo_jax.models import lora
from grpo_jax.models.config import LORA_TARGETS
from tests.known_answers import known_answers  # noqa: F401  (a fixture)

_SIZES = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, qkv_bias=True, tie_word_embeddings=False)
ALL = ("q", "k", "v", "o", "gate", "up", "down")


def _base(scan_layers=False):
  config = models.ModelConfig(**_SIZES, scan_layers=scan_layers)
  return models.init_params(config, jax.random.PRNGKey(0)), config


def _batch():
  tokens = np.random.RandomState(0).randint(0, _SIZES["vocab_size"], (3, 10))
  mask = np.ones(tokens.shape, bool)
  mask[1, :4] = False
  return jnp.asarray(tokens), jnp.asarray(mask)


def _logits(params, config):
  tokens, mask = _batch()
  return np.asarray(models.apply(params, config, tokens, attention_mask=mask)[0])


def _perturbed(params):
  """Adapters with nonzero B, so that the adapted model differs from the base; each adapter seeded by its own path
  (a hash of it), so that no two are alike and an export or merge that swaps two (k and v, two layers) shows."""
  return jax.tree_util.tree_map_with_path(
      lambda p, x: 0.05 * jax.random.normal(jax.random.PRNGKey(zlib.crc32(jax.tree_util.keystr(p).encode())),
                                            x.shape) if lora.is_adapter(p) else x, params)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_perturbed_adapters_all_differ(scan_layers):
  """The merge and PEFT tests below tell swapped adapters apart only if no two of the same shape are equal (issue
  55: seeded by the length of their path, k's and v's, and layers_0's and layers_1's, were bit-identical)."""
  base, config = _base(scan_layers)
  params = _perturbed(lora.add_adapters(base, lora.lora_config(config, rank=4, alpha=8.0, targets=ALL),
                                        jax.random.PRNGKey(1)))
  leaves = [np.asarray(x) for _, x in jax.tree_util.tree_flatten_with_path(lora.adapters(params))[0]]
  if scan_layers:  # the stacked layers: one slice per layer
    leaves = [x[i] for x in leaves for i in range(x.shape[0])]
  for i, a in enumerate(leaves):
    for b in leaves[i + 1:]:
      assert a.shape != b.shape or not np.array_equal(a, b)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_zero_b_is_exactly_the_base_model(scan_layers):
  base, config = _base(scan_layers)
  config_r = lora.lora_config(config, rank=4, alpha=8.0, targets=ALL)
  params = lora.add_adapters(base, config_r, jax.random.PRNGKey(1))
  adapters = lora.adapters(params)
  leaves = jax.tree_util.tree_flatten_with_path(adapters)[0]
  assert len(leaves) == 2 * 7 * (1 if scan_layers else 2)
  assert all(float(jnp.abs(x).max()) > 0 for p, x in leaves if p[-1].key == "lora_a")  # A random, B zero
  assert all(float(jnp.abs(x).max()) == 0 for p, x in leaves if p[-1].key == "lora_b")
  np.testing.assert_array_equal(_logits(params, config_r), _logits(base, config))
  # the base arrays are shared, not copied
  assert params["embed"]["embedding"] is base["embed"]["embedding"]


def test_adapter_shapes_and_scale():
  base, config = _base()
  config_r = lora.lora_config(config, rank=3, alpha=6.0, targets=("q", "o", "down"))
  params = lora.add_adapters(base, config_r, jax.random.PRNGKey(1))
  attn, mlp = params["layers_0"]["attn"], params["layers_0"]["mlp"]
  assert attn["q_proj"]["lora_a"].shape == (32, 3) and attn["q_proj"]["lora_b"].shape == (3, 4, 8)
  assert attn["o_proj"]["lora_a"].shape == (4, 8, 3) and attn["o_proj"]["lora_b"].shape == (3, 32)
  assert mlp["down_proj"]["lora_a"].shape == (48, 3) and mlp["down_proj"]["lora_b"].shape == (3, 32)
  assert "lora_a" not in attn["k_proj"] and "lora_a" not in mlp["up_proj"]
  # Kaiming-uniform A: |A| <= 1/sqrt(fan_in)
  assert float(jnp.abs(attn["o_proj"]["lora_a"]).max()) <= 1 / np.sqrt(32)
  # one adapted projection by hand: q's delta is (x·A)·B·α/r
  x = jax.random.normal(jax.random.PRNGKey(2), (2, 5, 32))
  a, b = jax.random.normal(jax.random.PRNGKey(3), (32, 3)), jax.random.normal(jax.random.PRNGKey(4), (3, 4, 8))
  w = attn["q_proj"]["kernel"]
  model = models.CausalLM(config_r, rngs=__import__("flax").nnx.Rngs(0))
  proj = model.layers_0.attn.q_proj
  proj.kernel[...], proj.bias[...] = w, jnp.zeros((4, 8))
  proj.lora_a[...], proj.lora_b[...] = a, b
  want = np.einsum("ble,ehd->blhd", x, w) + np.einsum("ble,er,rhd->blhd", x, a, b) * 2.0
  np.testing.assert_allclose(proj(x), want, rtol=1e-5, atol=1e-5)


def test_bad_targets_are_one_clear_error():
  _, config = _base()
  with pytest.raises(ValueError, match="each one of"):
    lora.lora_config(config, rank=4, alpha=8, targets=("q", "qkv"))
  with pytest.raises(ValueError, match="rank must be > 0"):
    lora.lora_config(config, rank=0, alpha=8, targets=("q",))


def test_split_join_disabled():
  base, config = _base()
  config_r = lora.lora_config(config, rank=2, alpha=2.0, targets=("v", "up"))
  params = _perturbed(lora.add_adapters(base, config_r, jax.random.PRNGKey(1)))
  trained, frozen = lora.split(params)
  assert all(lora.is_adapter(p) for p, _ in jax.tree_util.tree_flatten_with_path(trained)[0])
  assert not any(lora.is_adapter(p) for p, _ in jax.tree_util.tree_flatten_with_path(frozen)[0])
  assert jax.tree.structure(lora.join(trained, frozen)) == jax.tree.structure(params)
  assert not np.allclose(_logits(params, config_r), _logits(base, config), atol=1e-3)
  off = lora.disabled(params)  # adapters switched off: the base arrays alone, which the adapted config applies
  assert jax.tree.structure(off) == jax.tree.structure(base) and all(
      a is b for a, b in zip(jax.tree.leaves(off), jax.tree.leaves(base)))  # no copy
  np.testing.assert_array_equal(_logits(off, config_r), _logits(base, config))
  with pytest.raises(ValueError, match="in both trees"):
    lora.join(trained, params)


def test_trained_part():
  """With LoRA the adapters and a value head train and the rest is frozen; without it the whole tree, the same
  arrays (no copies either way)."""
  base, config = _base()
  params = lora.add_adapters(base, lora.lora_config(config, rank=2, alpha=2.0, targets=("q",)), jax.random.PRNGKey(1))
  tree = {"policy": params, "value": {"head": jnp.ones((32, 1)), "model": base}}  # PPO's trained pytree
  part = lora.TrainedPart(enabled=True)
  trained, frozen = part.split(tree)
  paths = lambda t: {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(t)[0]}
  assert paths(trained) == {p for p in paths(tree) if "lora_" in p or "['head']" in p} != set()
  assert paths(frozen) == paths(tree) - paths(trained)
  assert all(a is b for a, b in zip(jax.tree.leaves(part.trained(tree)), jax.tree.leaves(trained)))
  joined = part.join(trained, frozen)
  assert jax.tree.structure(joined) == jax.tree.structure(tree)
  assert all(a is b for a, b in zip(jax.tree.leaves(joined), jax.tree.leaves(tree)))
  whole = lora.TrainedPart(enabled=False)
  assert whole.split(tree)[0] is tree and whole.split(tree)[1] is None
  assert whole.trained(tree) is tree and whole.join(tree, None) is tree


@pytest.mark.parametrize("scan_layers", [False, True])
def test_merged_model_equals_adapted(scan_layers):
  base, config = _base(scan_layers)
  config_r = lora.lora_config(config, rank=4, alpha=16.0, targets=ALL)
  params = _perturbed(lora.add_adapters(base, config_r, jax.random.PRNGKey(1)))
  merged, merged_config = lora.merge(params, config_r)
  assert merged_config == config and jax.tree.structure(merged) == jax.tree.structure(base)
  adapted = _logits(params, config_r)
  assert np.abs(adapted - _logits(base, config)).max() > 1e-2  # the adapters matter
  np.testing.assert_allclose(_logits(merged, merged_config), adapted, rtol=1e-5, atol=1e-5)


def test_gradients_and_optimiser_state_only_for_adapters():
  base, config = _base()
  config_r = lora.lora_config(config, rank=4, alpha=8.0, targets=ALL)
  params = lora.add_adapters(base, config_r, jax.random.PRNGKey(1))
  trained, frozen = lora.split(params)
  tokens, mask = _batch()
  batch = training.Batch(tokens=tokens, attention_mask=mask, loss_mask=mask, old_logp=jnp.zeros(tokens.shape),
                         ref_logp=jnp.zeros(tokens.shape), advantages=jnp.zeros(tokens.shape))
  objective = update_lib.bind(update_lib.sft_objective, config=config_r, chunk_size=4)
  optimizer = optax.adam(1e-2)
  state = training.init_train_state(trained, optimizer)
  # Adam's moments exist for the adapters only
  moments = jax.tree_util.tree_flatten_with_path(state.opt_state)[0]
  assert all(lora.is_adapter(p) for p, x in moments if np.ndim(x) > 0)
  assert sum(np.size(x) for _, x in moments) == 1 + 2 * sum(x.size for x in jax.tree.leaves(trained))
  # the gradient of the whole model's loss reaches the base weights, but the step differentiates the adapters
  full_grads = jax.grad(lambda p: objective(p, batch, {"num_sequences": 3.0, "num_tokens": float(mask.sum())})[0])(
      params)
  step = training.make_train_step(objective, optimizer, combine=lora.join)
  before = jax.tree.map(np.asarray, trained)  # the step donates the state
  new_state, metrics = step(state, batch, frozen)
  assert jax.tree.structure(new_state.params) == jax.tree.structure(trained)
  assert float(metrics["grad_norm"]) > 0
  grads_b = [np.abs(x).max() for p, x in jax.tree_util.tree_flatten_with_path(lora.adapters(full_grads))[0]
             if p[-1].key == "lora_b"]
  assert min(grads_b) > 0  # every B gets a gradient at B = 0 (A's is zero there)
  moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), new_state.params, before)
  assert all(v > 0 for p, v in jax.tree_util.tree_flatten_with_path(moved)[0] if p[-1].key == "lora_b")
  # the frozen base is not an output of the step, and is not donated: it still holds its values
  np.testing.assert_array_equal(frozen["embed"]["embedding"], base["embed"]["embedding"])


@pytest.mark.parametrize("scan_layers", [False, True])
def test_peft_loads_the_exported_adapters_with_the_same_logits(tmp_path, scan_layers):
  peft = pytest.importorskip("peft")
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  base, config = _base(scan_layers)
  config_r = lora.lora_config(config, rank=4, alpha=12.0, targets=("q", "k", "v", "o", "up", "down"))
  params = _perturbed(lora.add_adapters(base, config_r, jax.random.PRNGKey(1)))
  models.save_hf(base, config, tmp_path / "base")
  lora.save_peft(params, config_r, tmp_path / "adapter", base_model_name_or_path=str(tmp_path / "base"))
  saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
  assert saved["r"] == 4 and saved["lora_alpha"] == 12.0
  assert saved["target_modules"] == ["down_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
  model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", torch_dtype=torch.float32)
  model = peft.PeftModel.from_pretrained(model, tmp_path / "adapter").eval()
  tokens, mask = (np.asarray(x) for x in _batch())
  positions = np.maximum(mask.cumsum(-1) - 1, 0)
  with torch.no_grad():
    want = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
                 position_ids=torch.tensor(positions)).logits.numpy()
  ours = _logits(params, config_r)
  assert np.abs(ours - _logits(base, config)).max() > 1e-2  # the adapters change the logits...
  np.testing.assert_allclose(ours[mask], want[mask], rtol=1e-4, atol=1e-4)  # ...as PEFT applies them


# A tiny GRPO run with LoRA through the runner, on completions made right and wrong by construction.
_TINY_RUN = dict(max_prompt_len=16, max_new_tokens=24, num_train=200, num_test=8, batch_size=2, group_size=4,
                 eval_batch_size=8, tiny_layers=1, tiny_hidden_size=32, sft_steps=0, steps=8, eval_every=0,
                 tensorboard=False, learning_rate=5e-2, beta=0.04, lora_rank=4, lora_alpha=8.0,
                 lora_export_peft=True)


def _answer_logprobs(params, config, work_dir, prompts: int = 16) -> tuple[float, float]:
  """Mean over the run's training prompts (8 steps x 2) of log π per token of the right completion
  `#### <answer><eos>` and of the wrong one `#### <answer + 1><eos>`: the rows the known_answers fixture injects,
  with GRPO advantages +1.5 and −0.5 in their groups of 4 (the policy's own samples there are wrong too)."""
  from experiments.runner import config as config_lib
  from experiments.runner import task as task_lib
  cfg = config_lib.Config().replace(**_TINY_RUN)
  tok = models.load_tokenizer(work_dir / "base_model")
  task = task_lib.Task(cfg.task, tok, sft_lineage=False, seed=cfg.run.seed)
  out = []
  for i in range(prompts):
    example = task.train_example(i)
    prompt = tok.encode(task.prompt(example), add_special_tokens=False)
    for answer in (example.answer, str(int(example.answer) + 1)):
      completion = tok.encode(f"#### {answer}", add_special_tokens=False) + [tok.eos_token_id]
      tokens = jnp.asarray([prompt + completion])
      logits = models.apply(params, config, tokens)[0][0, len(prompt) - 1:-1]
      out.append(float(jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(completion)), tokens[0, len(prompt):]])))
  return float(np.mean(out[0::2])), float(np.mean(out[1::2]))


def _checkpoint_paths(step_dir):
  """The leaf paths a train-state checkpoint holds (orbax's tree metadata)."""
  return list(json.loads((step_dir / "state" / "_METADATA").read_text())["tree_metadata"])


def test_grpo_with_lora_learns_and_resumes_exactly(tmp_path, known_answers):
  from experiments.runner import config as config_lib
  from experiments.trainer import loop
  from grpo_jax.training import checkpointing
  straight = tmp_path / "straight"
  summary = loop.run(config_lib.Config().replace(**_TINY_RUN, work_dir=str(straight)))
  assert summary["config"]["lora_rank"] == 4
  base, config = models.load_hf(straight / "base_model")
  final, final_config = models.load_hf(straight / "final_policy")  # the merged model: a plain checkpoint
  assert final_config == config
  # Only the adapters moved: the merged kernels of adapted projections changed, embeddings and norms did not.
  np.testing.assert_array_equal(final["embed"]["embedding"], base["embed"]["embedding"])
  np.testing.assert_array_equal(final["layers_0"]["input_norm"]["scale"], base["layers_0"]["input_norm"]["scale"])
  assert np.abs(final["layers_0"]["mlp"]["down_proj"]["kernel"] - base["layers_0"]["mlp"]["down_proj"]["kernel"]
                ).max() > 1e-4
  # GRPO's objective on the fixed injected completions improved: the right ones (advantage +1.5) are far more
  # likely (the random base's per-token log π is about −ln(vocab) = −4.4; 8 steps add ~0.12).
  (right_before, _), (right_after, _) = (_answer_logprobs(p, config, straight) for p in (base, final))
  assert right_after > right_before + 0.05, (right_before, right_after)
  # The checkpoint holds the adapters and their Adam moments only, and names the base it goes with.
  paths = _checkpoint_paths(straight / "checkpoints" / "8")
  arrays = [p for p in paths if "'params'" in p or "'mu'" in p or "'nu'" in p]
  assert arrays and all("lora_a" in p or "lora_b" in p for p in arrays), paths
  ckpt = checkpointing.Checkpointer(straight / "checkpoints")
  try:
    recorded = ckpt.metadata(8)["lora_base"]
  finally:
    ckpt.close()
  assert recorded["path"] == str((straight / "base_model").resolve()) and len(recorded["sha256"]) == 64
  # The PEFT adapters: applied to the base they give the merged model.
  peft_tensors = __import__("safetensors.numpy").numpy.load_file(str(straight / "final_adapter" /
                                                                     "adapter_model.safetensors"))
  a = peft_tensors["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"]
  b = peft_tensors["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"]
  np.testing.assert_allclose(base["layers_0"]["mlp"]["down_proj"]["kernel"] + (b @ a).T * 8.0 / 4,
                             final["layers_0"]["mlp"]["down_proj"]["kernel"], rtol=1e-5, atol=1e-6)

  # Stopped after step 1 and resumed: the same merged policy and adapters, bit for bit.
  stopped = tmp_path / "stopped"
  config_run = config_lib.Config().replace(**_TINY_RUN, work_dir=str(stopped), stop_after=1)
  assert loop.run(config_run) == {}
  loop.run(config_run.replace(stop_after=0, resume=True))
  resumed, _ = models.load_hf(stopped / "final_policy")
  jax.tree.map(np.testing.assert_array_equal, final, resumed)
  for name in ("adapter_model.safetensors", "adapter_config.json"):
    assert (stopped / "final_adapter" / name).read_bytes().replace(bytes(stopped), bytes(straight)) == (
        straight / "final_adapter" / name).read_bytes()


def test_resume_on_another_base_is_refused(tmp_path):
  from experiments.runner import config as config_lib
  from experiments.trainer import loop
  config_run = config_lib.Config().replace(**{**_TINY_RUN, "steps": 2}, work_dir=str(tmp_path), stop_after=1)
  loop.run(config_run)
  base, config = models.load_hf(tmp_path / "base_model")
  base["final_norm"]["scale"] = base["final_norm"]["scale"] * 2  # the base changed under the adapters
  models.save_hf(base, config, tmp_path / "base_model")
  with pytest.raises(config_lib.RunError, match="go with the base"):
    loop.run(config_run.replace(stop_after=0, resume=True))


def test_runner_flags_are_checked():
  from experiments.runner import config as config_lib
  assert config_lib.LORA_TARGETS == LORA_TARGETS
  with pytest.raises(config_lib.ConfigError, match="--lora_targets must be"):
    config_lib.Config().replace(lora_rank=4, lora_targets="q,qkv")
  with pytest.raises(config_lib.ConfigError, match="--lora_alpha > 0"):
    config_lib.Config().replace(lora_rank=4, lora_alpha=0.0)
  with pytest.raises(config_lib.ConfigError, match="--lora_export_peft writes LoRA adapters"):
    config_lib.Config().replace(lora_export_peft=True)


@pytest.mark.devices(8)
def test_lora_update_on_a_mesh_equals_one_device():
  """Under a data x fsdp x tensor mesh the adapters take their kernels' shardings (A: the input axes, B: the output
  axes) and their rank takes fsdp where those leave it free, the frozen base keeps its own, and one update step
  gives the one-device result."""
  from experiments.runner import placement as placement_lib
  from grpo_jax import partitioning
  base, config = _base()
  config_r = lora.lora_config(config, rank=4, alpha=8.0, targets=ALL)
  params = _perturbed(lora.add_adapters(base, config_r, jax.random.PRNGKey(1)))
  tokens, mask = (jnp.tile(x, (4, 1)) for x in _batch())  # 12 rows over the 4 data shards
  batch = training.Batch(tokens=tokens, attention_mask=mask, loss_mask=mask, old_logp=jnp.zeros(tokens.shape),
                         ref_logp=jnp.zeros(tokens.shape), advantages=jnp.zeros(tokens.shape))
  objective = update_lib.bind(update_lib.sft_objective, config=config_r, chunk_size=4)
  results = []
  for placement in (placement_lib.Placement(), placement_lib.Placement(
      partitioning.make_mesh("data:2,fsdp:2,tensor:2"), partitioning.get_rules("fsdp_tp"))):
    placed = placement.put_params(jax.tree.map(jnp.copy, params))
    trained, frozen = lora.split(placed)
    state, step = placement.train(trained, optax.adam(1e-2), objective, 2, frozen=frozen)
    if placement.mesh is not None:
      q = state.params["layers_0"]["attn"]["q_proj"]
      assert q["lora_a"].sharding.spec == jax.sharding.PartitionSpec("fsdp", None)
      assert q["lora_b"].sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
      down = state.opt_state[0].mu["layers_0"]["mlp"]["down_proj"]  # Adam's moments sharded alike
      assert down["lora_a"].sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
      assert frozen["layers_0"]["mlp"]["down_proj"]["kernel"].sharding.spec == jax.sharding.PartitionSpec(
          "tensor", "fsdp")
    state, metrics = step(state, batch)
    results.append((jax.device_get(state.params), float(metrics["loss"])))
  (one, loss_one), (mesh, loss_mesh) = results
  np.testing.assert_allclose(loss_mesh, loss_one, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), mesh, one)
  assert max(float(np.abs(x).max()) for x in jax.tree.leaves(lora.adapters(one))) > 0


def test_ppo_value_model_shares_the_policys_frozen_base():
  """PPO with LoRA: the value model is the policy's base arrays (not a copy) with its own adapters and a trained
  head; the split trains both models' adapters and the head, and freezes one base."""
  import types
  from experiments.methods import ppo
  from experiments.runner import config as config_lib
  from experiments.runner import placement as placement_lib
  base, config = _base()
  config_r = lora.lora_config(config, rank=2, alpha=4.0, targets=("v", "gate"))
  policy = lora.add_adapters(base, config_r, jax.random.PRNGKey(1))
  method = ppo.PPO(config_lib.Config().replace(algo="ppo", lora_rank=2, lora_targets="v,gate"), config_r, None,
                   types.SimpleNamespace(placement=placement_lib.Placement(), logprobs=None), None)
  params = method.init_params(policy, jax.random.PRNGKey(2))
  value = params["value"]["backbone"]
  assert value["layers_1"]["mlp"]["gate_proj"]["kernel"] is policy["layers_1"]["mlp"]["gate_proj"]["kernel"]
  assert value["embed"]["embedding"] is base["embed"]["embedding"] and "lm_head" not in value
  a_value, a_policy = value["layers_0"]["attn"]["v_proj"]["lora_a"], policy["layers_0"]["attn"]["v_proj"]["lora_a"]
  assert a_value is not a_policy  # its own adapters (they train apart), starting from the policy's
  np.testing.assert_array_equal(a_value, a_policy)
  trained, frozen = lora.split(params)
  names = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(trained)[0]}
  assert "['value']['head']['kernel']" in names and len(names) == 2 + 2 * 2 * 2 * 2  # head + A, B x 2 x 2 layers x 2
  assert all("lora" not in jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(frozen)[0])


def test_iterative_rl_with_lora_resumes_exactly(tmp_path):
  """Iterative RL (π_ref ← π_θ each iteration: the base plus a copy of the adapters; the reward model retrained)
  with LoRA, stopped inside iteration 2 and resumed, ends bit-equal to the run that never stopped."""
  from experiments.runner import config as config_lib
  from experiments.trainer import loop
  from grpo_jax import reward_models
  policy_dir = models.build_default_checkpoint(tmp_path / "policy", seed=1, num_hidden_layers=1, hidden_size=64,
                                               intermediate_size=128)
  params, config = models.load_hf(policy_dir)
  reward_models.save_reward_model(reward_models.init_reward_params(params, config, jax.random.key(0), head_scale=3.0),
                                  config, tmp_path / "orm", kind="orm")
  run = config_lib.Config().replace(
      **{**_TINY_RUN, "steps": 4, "batch_size": 4, "lora_export_peft": False}, init_checkpoint=str(policy_dir),
      reward="orm", reward_model=str(tmp_path / "orm"), iterations=2, steps_per_iteration=2, rm_update_prompts=4,
      rm_update_steps=3, rm_update_batch_size=8, save_every=1)
  loop.run(run.replace(work_dir=str(tmp_path / "straight")))
  loop.run(run.replace(work_dir=str(tmp_path / "stopped"), stop_after=3))  # in iteration 2, π_ref = step 2's π_θ
  loop.run(run.replace(work_dir=str(tmp_path / "stopped"), resume=True))
  straight, resumed = (models.load_hf(tmp_path / d / "final_policy")[0] for d in ("straight", "stopped"))
  jax.tree.map(np.testing.assert_array_equal, straight, resumed)
  assert np.abs(straight["layers_0"]["mlp"]["up_proj"]["kernel"] - params["layers_0"]["mlp"]["up_proj"]["kernel"]
                ).max() > 1e-4


def test_the_reference_under_lora_is_the_base_model(tmp_path, known_answers, monkeypatch):
  """π_ref under LoRA is the base model, the adapters off (issue 55: only a program-shape comparison noticed a π_ref
  computed with them on): the k3 KL's π_ref log-probs of the last step's batch, after the adapters have moved,
  are the base checkpoint's log-probs of those tokens, and not the trained policy's."""
  from experiments.methods import grpo
  from experiments.runner import config as config_lib
  from experiments.trainer import loop
  from grpo_jax import logprobs as logprobs_lib
  batches = []
  collect = grpo.GRPO.collect

  def recording(self, params, position, key):
    batch, stats, position = collect(self, params, position, key)
    batches.append(jax.tree.map(np.asarray, batch))
    return batch, stats, position

  monkeypatch.setattr(grpo.GRPO, "collect", recording)
  cfg = config_lib.Config().replace(**{**_TINY_RUN, "steps": 3, "lora_export_peft": False}, work_dir=str(tmp_path))
  loop.run(cfg)
  base, config = models.load_hf(tmp_path / "base_model")
  final, _ = models.load_hf(tmp_path / "final_policy")
  last = batches[-1]
  mask = last.loss_mask
  assert mask.sum() > 0
  t = cfg.rollout.temperature
  base_logp, final_logp = (np.asarray(logprobs_lib.token_logprobs(p, config, jnp.asarray(last.tokens),
                                                                  jnp.asarray(last.attention_mask), temperature=t))
                           for p in (base, final))
  assert np.abs(final_logp - base_logp)[mask].max() > 1e-2  # the adapters moved the policy
  np.testing.assert_allclose(last.ref_logp[mask], base_logp[mask], atol=1e-4)
