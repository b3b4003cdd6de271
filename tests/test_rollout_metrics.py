"""The per-iteration rollout summary the trainer logs, on hand-built episodes."""

from agentrl_jax.envs.base import Task
from agentrl_jax.rollout.trajectory import Step, Trajectory
from agentrl_jax.run.trainer import rollout_metrics


def episode(group: int, *, won=False, failed=False) -> Trajectory:
    task = Task("scripted", "train", f"t{group}", ())
    steps = [Step([1, 2], [3], [-0.5], reward=float(won))]
    return Trajectory(task, group, steps=steps, won=won, infra_failure=failed)


def test_groups_left_with_one_episode_are_counted():
    trajs = [
        # group 0: 3 played, 2 lost to the pool -> one left: counted
        episode(0, won=True),
        episode(0, failed=True),
        episode(0, failed=True),
        # group 1: 3 played, 1 lost -> two left: not counted
        episode(1),
        episode(1, won=True),
        episode(1, failed=True),
        # group 2: a group of one by configuration (group_size 1): not counted
        episode(2),
        # group 3: every episode lost: nothing to train on, not a singleton
        episode(3, failed=True),
        episode(3, failed=True),
    ]
    metrics = rollout_metrics(trajs)
    assert metrics["rollout/singleton_groups"] == 1.0
    assert metrics["rollout/infra_failures"] == 5.0
    assert metrics["rollout/episodes"] == 9.0
    assert metrics["rollout/success_rate"] == 0.5


def test_refused_commands_are_a_share_of_the_counted_steps():
    """``rollout/invalid_action_rate``: refused steps over the steps of the episodes the pool did
    not lose, for envs whose step info says; absent for envs that do not."""
    trajs = [episode(0), episode(0), episode(1, failed=True)]
    assert "rollout/invalid_action_rate" not in rollout_metrics(trajs)
    trajs[0].steps = [
        Step([1], [2], [-0.1], info={"invalid_action": flag}) for flag in (True, False, True)
    ]
    trajs[1].steps[0].info["invalid_action"] = False
    trajs[2].steps[0].info["invalid_action"] = True  # lost to the pool: not counted
    assert rollout_metrics(trajs)["rollout/invalid_action_rate"] == 0.5
