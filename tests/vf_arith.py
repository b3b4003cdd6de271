"""A verifiers (0.4, ``verifiers.v1``) taskset for the adapter tests: sums of two digits, one
answer each, scored by the taskset's own ``@vf.reward`` function (tests/test_adapters.py)."""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf

__all__ = ["ArithTask", "ArithTaskset"]


class ArithData(vf.TaskData):
    answer: str


class ArithTask(vf.Task[ArithData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: ArithData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == task.answer)


class ArithTaskset(vf.Taskset[ArithTask, vf.TasksetConfig]):
    def load(self) -> Iterator[ArithTask]:
        for a in range(10):
            for b in range(10):
                yield ArithTask(
                    ArithData(
                        name=f"{a}+{b}",
                        prompt=f"What is {a} + {b}? Answer with the number only.",
                        answer=str(a + b),
                    ),
                    self.config.task,
                )
