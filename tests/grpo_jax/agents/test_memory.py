"""The explicit memory (grpo_jax/agents/memory.py): grows turn by turn, oldest entries dropped within the budget."""

from grpo_jax import agents


def _update(memory, text, result, ok=True):
  return memory.update(agents.parse_action(text), agents.Observation(result, ok))


def test_grows_turn_by_turn():
  memory = agents.Memory(200)
  assert memory.render() == ""
  _update(memory, "sub 7: calc 8-7", "1")
  assert memory.render() == "1. calc 8-7 -> 1"
  _update(memory, "bad", "error: no ':'", ok=False)
  entry = _update(memory, "answer: 1", "1")
  assert entry.turn == 3
  assert memory.render() == "1. calc 8-7 -> 1\n2. bad -> error: no ':'\n3. answer -> 1"
  assert memory.results() == [(1, "1")]


def test_budget_drops_oldest_deterministically():
  memory = agents.Memory(60)
  for i in range(1, 5):
    _update(memory, f"s: calc {i}+{i}", str(2 * i))
  lines = ["1. calc 1+1 -> 2", "2. calc 2+2 -> 4", "3. calc 3+3 -> 6", "4. calc 4+4 -> 8"]
  assert memory.render(1000) == "(turns 1-2 dropped)\n" + "\n".join(lines[2:])  # self.budget = 60 caps it
  assert memory.render(36) == "(turns 1-3 dropped)\n" + lines[3]
  assert memory.render(19) == "(turns 1-4 dropped)"
  assert memory.render(5) == ""
  assert len(memory.render(40)) <= 40 and memory.render(40) == memory.render(40)


def test_token_counter_and_long_entries_cut():
  memory = agents.Memory(3, count_tokens=lambda text: len(text.split()))
  _update(memory, "s: calc " + "1+" * 40 + "1", "81")
  (entry,) = memory.entries
  assert entry.text() == "1. calc " + ("1+" * 40)[:24] + "... -> 81"
  assert memory.render() == "(turn 1 dropped)"  # 4 words of entry > 3; the summary line has 3
