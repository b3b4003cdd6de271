"""SFT data: demonstrations -> exact examples -> shuffled, bucketed, resumable grain batches."""

import collections
import json

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from agentrl_jax.envs.actors import StepResult
from agentrl_jax.envs.base import Observation, Task
from agentrl_jax.models import CausalLM, preset
from agentrl_jax.models.tokenizer import build_tokenizer
from agentrl_jax.rl.learner import Learner
from agentrl_jax.rl.sft_data import (
    SftDataConfig,
    SftDataset,
    bucket_for,
    collate,
    demonstration_examples,
)
from agentrl_jax.rollout.chat import get_template
from agentrl_jax.rollout.rollout import RolloutConfig, RolloutWorker
from agentrl_jax.rollout.trajectory import Step, Trajectory

TEXTS = [
    "Goal: open the chest and take the coin. You are in a kitchen. There is a door to the north.",
    "go north | open chest | take coin | look | inventory | examine table | go south",
    "You open the chest. You take the coin. Nothing happens. That's not a verb I recognise.",
] * 20
EXPERT = ("go north", "open chest", "take coin", "go south", "look")


class ExpertPool:
    """An in-process stand-in for ActorPool: task ``k`` is won after ``length(k)`` expert steps."""

    def reset(self, tasks):
        self.t = [0] * len(tasks)
        self.lengths = [int(t.param("length")) for t in tasks]
        self.played = [[] for _ in tasks]
        return [StepResult(self._obs(i), info=self._info(i)) for i in range(len(tasks))]

    def _obs(self, i):
        t = self.t[i]
        return Observation(
            objective="take the coin",
            text=f"room {t} " + "with a table " * (t * self.lengths[i] % 3),
            feedback=f"you did step {t}",
            admissible_commands=EXPERT,
        )

    def _info(self, i):
        return {"state_key": self.t[i], "expert_action": EXPERT[self.t[i] % len(EXPERT)]}

    def step(self, actions):
        out = []
        for i, a in enumerate(actions):
            if a is None:
                out.append(None)
                continue
            self.played[i].append(a)
            self.t[i] += 1
            done = self.t[i] >= self.lengths[i]
            info = {**self._info(i), "won": done}
            out.append(StepResult(self._obs(i), reward=float(done), done=done, info=info))
        return out


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_tokenizer(TEXTS, 320, tmp_path_factory.mktemp("tok"))


def _demos(tok, mode, lengths, history_turns=1):
    cfg = RolloutConfig(
        group_size=1, max_turns=6, max_new_tokens=8, max_seq_len=512, context_mode=mode,
        history_turns=history_turns,
    )  # fmt: skip
    worker = RolloutWorker(ExpertPool(), None, tok, get_template("plain"), cfg)
    tasks = [Task("scripted", "train", str(k), (("length", n),)) for k, n in enumerate(lengths)]
    return worker.run(tasks, jax.random.key(0), expert=True)


def _expert_ids(tok, step_index):
    stop = get_template("plain").stop_id(tok)
    return tok.encode(EXPERT[step_index % len(EXPERT)], add_special_tokens=False) + [stop]


def test_episode_examples_are_the_concatenated_ids_with_loss_on_expert_actions_only(tok):
    trajs = _demos(tok, "episode", [2, 3, 5])
    examples, stats = demonstration_examples(trajs, "episode", pad_id=tok.pad_token_id)
    assert stats.examples == stats.used == 3 and stats.not_won == stats.infra_failures == 0
    for traj, ex in zip(trajs, examples):
        expected = [i for s in traj.steps for i in s.prompt_ids + s.action_ids]
        assert ex["tokens"].tolist() == expected
        assert ex["tokens"].dtype == np.int32 and ex["loss_mask"].dtype == np.float32
        # The loss falls on the expert's commands (each closed by the stop token), in order,
        # encoded independently here; nothing of the prompts is a target.
        want = [i for k in range(len(traj.steps)) for i in _expert_ids(tok, k)]
        assert ex["tokens"][ex["loss_mask"] > 0].tolist() == want
        assert stats.action_tokens >= len(want)
    assert stats.action_tokens == sum(int(e["loss_mask"].sum()) for e in examples)


def test_step_examples_hold_one_row_per_step(tok):
    trajs = _demos(tok, "step", [3, 2])
    examples, stats = demonstration_examples(trajs, "step", pad_id=tok.pad_token_id)
    steps = [s for t in trajs for s in t.steps]
    assert stats.examples == len(examples) == len(steps) == 5
    for k, (step, ex) in enumerate(zip(steps, examples)):
        assert ex["tokens"].tolist() == step.prompt_ids + step.action_ids
        n = len(step.prompt_ids)
        assert ex["loss_mask"].tolist() == [0.0] * n + [1.0] * len(step.action_ids)
        assert step.action_ids == _expert_ids(tok, k if k < 3 else k - 3)


def test_failed_and_unwon_demonstrations_are_left_out_and_counted(tok):
    good = _demos(tok, "episode", [2])[0]
    task = Task("scripted", "train", "x")
    lost = Trajectory(task, 1, steps=list(good.steps), won=False, truncated=True)
    crashed = Trajectory(task, 2, steps=list(good.steps), won=True, infra_failure=True)
    examples, stats = demonstration_examples(
        [good, lost, crashed], "episode", pad_id=tok.pad_token_id
    )
    assert (stats.trajectories, stats.used, stats.not_won, stats.infra_failures) == (3, 1, 1, 1)
    assert len(examples) == 1
    _, kept = demonstration_examples([lost], "episode", pad_id=0, require_won=False)
    assert kept.used == 1
    with pytest.raises(ValueError, match="largest bucket holds 8"):
        demonstration_examples([good], "episode", pad_id=0, max_len=8)
    with pytest.raises(ValueError, match="context_mode"):
        demonstration_examples([good], "turns", pad_id=0)


def _toy_examples(lengths):
    rng = np.random.default_rng(0)
    out = []
    for k, n in enumerate(lengths):
        tokens = np.concatenate([[k], rng.integers(3, 300, n - 1)]).astype(np.int32)  # id k first
        loss = (rng.random(n) < 0.3).astype(np.float32)
        out.append({"tokens": tokens, "loss_mask": loss})
    return out


def _row_ids(batch):
    """The example id (first token) of each real row."""
    return [int(batch["tokens"][r, 0]) for r in range(len(batch["tokens"])) if batch["mask"][r, 0]]


def test_batches_are_padded_to_a_bucket_and_cover_every_example_once_per_epoch():
    lengths = [5, 40, 70, 9, 130, 64, 65, 3, 12, 200, 33]
    examples = _toy_examples(lengths)
    cfg = SftDataConfig(batch_size=4, buckets=(16, 64, 128, 256), num_epochs=2, seed=7)
    data = SftDataset(examples, cfg, pad_id=0)
    assert data.batches_per_epoch == 3 and len(data) == 6
    batches = list(data.iterator())
    assert len(batches) == 6
    epochs = [sum((_row_ids(b) for b in batches[e * 3 : e * 3 + 3]), []) for e in range(2)]
    for ids in epochs:
        assert sorted(ids) == list(range(len(lengths)))  # each example exactly once per epoch
    assert epochs[0] != epochs[1]  # a fresh permutation each epoch
    for b in batches:
        assert set(b) == {"tokens", "mask", "loss_mask"}
        rows = _row_ids(b)
        width = b["tokens"].shape[1]
        assert b["tokens"].shape == (4, width) and b["tokens"].dtype == np.int32
        # The smallest bucket that holds the longest row, checked against the raw lengths.
        longest = max(lengths[i] for i in rows)
        assert width == min(x for x in (16, 64, 128, 256) if x >= longest)
        for r, i in enumerate(rows):
            n = lengths[i]
            np.testing.assert_array_equal(b["tokens"][r, :n], examples[i]["tokens"])
            np.testing.assert_array_equal(b["loss_mask"][r, :n], examples[i]["loss_mask"])
            assert b["mask"][r, :n].all() and not b["mask"][r, n:].any()
            assert (b["tokens"][r, n:] == 0).all() and not b["loss_mask"][r, n:].any()
        # A short last batch is filled with empty rows: same shape, nothing to learn from.
        for r in range(len(rows), 4):
            assert not b["mask"][r].any() and not b["loss_mask"][r].any()
    # The same seed gives the same order; another seed another one.
    again = [_row_ids(b) for b in SftDataset(examples, cfg, 0).iterator()]
    assert again == [_row_ids(b) for b in batches]
    other = SftDataConfig(batch_size=4, buckets=(16, 64, 128, 256), num_epochs=2, seed=8)
    assert [_row_ids(b) for b in SftDataset(examples, other, 0).iterator()] != again


def test_restoring_the_iterator_state_mid_epoch_replays_exactly_the_same_batches():
    examples = _toy_examples([7, 20, 33, 4, 90, 18, 25, 60, 11, 3])
    cfg = SftDataConfig(batch_size=3, buckets=(32, 64, 128), num_epochs=3, seed=1)
    data = SftDataset(examples, cfg, pad_id=0)
    for stop in (2, 5):  # mid first epoch; mid second epoch (4 batches per epoch)
        it = data.iterator()
        for _ in range(stop):
            next(it)
        state = json.loads(json.dumps(it.get_state()))  # what a checkpoint stores
        rest = list(it)
        resumed = list(SftDataset(examples, cfg, pad_id=0).iterator(state))
        assert len(rest) == len(resumed) == 12 - stop
        for a, b in zip(rest, resumed):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])
        fresh = data.iterator()
        fresh.set_state(state)
        np.testing.assert_array_equal(next(fresh)["tokens"], rest[0]["tokens"])


def test_length_grouping_pads_less_covers_every_example_and_resumes_exactly():
    rng = np.random.default_rng(5)
    lengths = rng.integers(3, 250, 61).tolist()
    examples = _toy_examples(lengths)
    buckets = (16, 32, 64, 128, 256)
    plain = SftDataConfig(batch_size=4, buckets=buckets, num_epochs=2, seed=2)
    grouped = SftDataConfig(
        batch_size=4, buckets=buckets, num_epochs=2, seed=2, group_by_length=4, read_threads=2
    )
    data = SftDataset(examples, grouped, pad_id=0)
    batches = list(data.iterator())
    assert data.batches_per_epoch == 16 and len(batches) == 32
    epochs = [sum((_row_ids(b) for b in batches[e * 16 : e * 16 + 16]), []) for e in range(2)]
    for ids in epochs:
        assert sorted(ids) == list(range(61))
    assert epochs[0] != epochs[1]
    for b in batches:  # rows exact, as without grouping
        for r, i in enumerate(_row_ids(b)):
            np.testing.assert_array_equal(b["tokens"][r, : lengths[i]], examples[i]["tokens"])
            assert b["mask"][r].sum() == lengths[i]

    # Within a window of 4 batches the rows are sorted by length, so padding shrinks.
    def area(ds):
        return sum(b["tokens"].size for b in ds.iterator())

    assert area(data) < 0.8 * area(SftDataset(examples, plain, pad_id=0))
    it = data.iterator()
    for _ in range(19):  # into the second epoch
        next(it)
    state = it.get_state()
    rest = [b["tokens"] for b in it]
    resumed = [b["tokens"] for b in SftDataset(examples, grouped, pad_id=0).iterator(state)]
    assert len(rest) == len(resumed) == 13
    for a, b in zip(rest, resumed):
        np.testing.assert_array_equal(a, b)
    dropped = SftDataConfig(batch_size=4, buckets=buckets, group_by_length=4, drop_remainder=True)
    assert all(len(_row_ids(b)) == 4 for b in SftDataset(examples, dropped, 0).iterator())
    with pytest.raises(ValueError, match="group_by_length is -1"):
        SftDataConfig(group_by_length=-1)


def test_drop_remainder_and_unshuffled_order():
    examples = _toy_examples([4, 5, 6, 7, 8])
    cfg = SftDataConfig(batch_size=2, buckets=(8,), shuffle=False, drop_remainder=True)
    batches = list(SftDataset(examples, cfg, pad_id=0).iterator())
    assert [_row_ids(b) for b in batches] == [[0, 1], [2, 3]]


def test_bad_configs_and_inputs_fail_clearly():
    with pytest.raises(ValueError, match="strictly increasing"):
        SftDataConfig(buckets=(64, 32))
    with pytest.raises(ValueError, match="batch_size"):
        SftDataConfig(batch_size=0)
    with pytest.raises(ValueError, match="num_epochs"):
        SftDataConfig(num_epochs=0)
    with pytest.raises(ValueError, match="prefetch=-1"):
        SftDataConfig(prefetch=-1)
    with pytest.raises(ValueError, match="no examples"):
        SftDataset([], SftDataConfig(), pad_id=0)
    with pytest.raises(ValueError, match="stop at 16"):
        SftDataset(_toy_examples([20]), SftDataConfig(buckets=(8, 16)), pad_id=0)
    with pytest.raises(ValueError, match="make no batch"):
        SftDataset(_toy_examples([4]), SftDataConfig(batch_size=2, drop_remainder=True), 0)
    with pytest.raises(ValueError, match="fits no bucket"):
        bucket_for(300, (128, 256))


def test_sft_loss_on_bucketed_batches_equals_the_unpadded_reference_and_compiles_per_bucket(tok):
    trajs = _demos(tok, "episode", [1, 2, 5, 4, 1])  # 86, 131, 270, 225 and 86 tokens
    examples, _ = demonstration_examples(trajs, "episode", pad_id=tok.pad_token_id)
    cfg = preset(
        "tiny", vocab_size=320, hidden_size=32, intermediate_size=64, num_layers=2,
        num_heads=2, num_kv_heads=1, head_dim=16,
    )  # fmt: skip
    policy = CausalLM(cfg, rngs=nnx.Rngs(0))
    data_cfg = SftDataConfig(batch_size=2, buckets=(160, 320), shuffle=False)
    data = SftDataset(examples, data_cfg, pad_id=tok.pad_token_id)
    assert data.bucket_counts() == {160: 2, 320: 1}  # the last batch: one row and a filler row
    learner = Learner(policy, None, optax.sgd(0.0))  # lr 0: every batch sees the same weights
    state = learner.init(policy)
    # Reference: each example alone, unpadded. A causal model's logits at positions < n do not
    # depend on what follows, so one forward pass at a fixed width (no mask) serves every row.
    model = learner.policy_module(state)
    width = 320
    ids = np.zeros((len(examples), width), np.int32)
    for i, e in enumerate(examples):
        ids[i, : len(e["tokens"])] = e["tokens"]
    z = np.asarray(jax.jit(lambda x: model(x)[0])(ids)[:, :-1], np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    ref = []
    for i, e in enumerate(examples):
        n = len(e["tokens"])
        on = e["loss_mask"][1:] > 0
        ref.append((-logp[i, np.arange(n - 1), e["tokens"][1:]][on].sum(), on.sum()))
    for k, batch in enumerate(data.iterator()):
        rows = range(2 * k, min(2 * k + 2, len(examples)))
        nll = sum(ref[i][0] for i in rows) / sum(ref[i][1] for i in rows)
        state, metrics = learner.sft_step(state, batch)
        np.testing.assert_allclose(float(metrics["sft/nll"]), nll, rtol=0, atol=1e-5)
        assert float(metrics["sft/tokens"]) == sum(ref[i][1] for i in rows)
    # One compile per bucket (the filler rows keep the batch size fixed), not one per batch.
    assert learner.sft_step._cache_size() == 2


def test_collate_rejects_overfull_batches():
    with pytest.raises(ValueError, match="3 examples for a batch of 2"):
        collate(_toy_examples([2, 2, 2]), batch_size=2, buckets=(8,), pad_id=0)


def test_examples_from_handmade_steps_have_exact_masks():
    # An independent, hand-written case: prompt ids, then action ids, twice.
    steps = [Step([5, 6, 7], [8, 9], [0.0, 0.0]), Step([10], [11, 12, 2], [0.0] * 3)]
    traj = Trajectory(Task("t", "train", "a"), 0, steps=steps, won=True)
    (ex,), _ = demonstration_examples([traj], "episode", pad_id=0)
    assert ex["tokens"].tolist() == [5, 6, 7, 8, 9, 10, 11, 12, 2]
    assert ex["loss_mask"].tolist() == [0, 0, 0, 1, 1, 0, 1, 1, 1]
    rows, _ = demonstration_examples([traj], "step", pad_id=0)
    assert [r["tokens"].tolist() for r in rows] == [[5, 6, 7, 8, 9], [10, 11, 12, 2]]
    assert [r["loss_mask"].tolist() for r in rows] == [[0, 0, 0, 1, 1], [0, 1, 1, 1]]
    assert collections.Counter(len(r["tokens"]) for r in rows) == {5: 1, 4: 1}


def test_real_textworld_expert_demonstrations_win_and_train_only_on_the_experts_commands(
    textworld_games, tok
):
    import textworld

    from agentrl_jax.envs.actors import ActorPool

    tasks = textworld_games["train"]
    cfg = RolloutConfig(
        group_size=1, max_turns=20, max_new_tokens=64, max_seq_len=4096, context_mode="episode"
    )
    with ActorPool("textworld", {"max_steps": 20}, num_workers=1, envs_per_worker=3) as pool:
        worker = RolloutWorker(pool, None, tok, get_template("plain"), cfg)
        trajs = worker.run(tasks, jax.random.key(0), expert=True)
    assert all(t.won and not t.truncated and not t.infra_failure for t in trajs)
    examples, stats = demonstration_examples(trajs, "episode", pad_id=tok.pad_token_id)
    assert stats.used == len(tasks) == len(examples)
    data = SftDataset(
        examples, SftDataConfig(batch_size=4, buckets=(512, 1024, 4096), shuffle=False), 0
    )
    (batch,) = list(data.iterator())
    stop = get_template("plain").stop_id(tok)
    for r, task in enumerate(tasks):
        # Reference: TextWorld's own winning plan from the start of the game, read straight
        # from the engine, each command encoded and closed with the stop token.
        env = textworld.start(
            task.param("path"), request_infos=textworld.EnvInfos(policy_commands=True)
        )
        plan = env.reset()["policy_commands"]
        env.close()
        want = [i for c in plan for i in tok.encode(c, add_special_tokens=False) + [stop]]
        got = batch["tokens"][r][batch["loss_mask"][r] > 0].tolist()
        assert got == want
        assert len(trajs[r].steps) == len(plan)
