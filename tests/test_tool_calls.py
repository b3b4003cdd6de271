"""Tool calling in the checkpoint's own format: rendering, parsing, and rollouts with tool turns.

The tokenizers are trained here (``chat_tokenizers``) and carry the real checkpoints' templates
(Qwen2.5-Instruct, Qwen3, Llama-3.1-Instruct); the reference is transformers'
``apply_chat_template(messages, tools=...)`` of the whole conversation, compared id for id with
what the rollout feeds piece by piece.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys

import chat_tokenizers as ct
import jax
import ml_collections
import numpy as np
import pytest
from inprocess_pool import InProcessPool

from agentrl_jax.envs import registry as env_registry
from agentrl_jax.envs.actors import StepResult
from agentrl_jax.envs.base import Observation, Task, ToolCall
from agentrl_jax.envs.swe import actions as swe_actions
from agentrl_jax.envs.swe import toy_package
from agentrl_jax.envs.swe.env import SweEnv
from agentrl_jax.envs.swe.tasks import load_jsonl
from agentrl_jax.models import registry as model_registry
from agentrl_jax.rollout import chat_append_only
from agentrl_jax.rollout import chat_checkpoint as cc
from agentrl_jax.rollout import tool_calls as tc
from agentrl_jax.rollout.chat import get_template
from agentrl_jax.rollout.chat_probe import ChatTemplateError
from agentrl_jax.rollout.rollout import RolloutConfig, RolloutWorker, render_observation
from agentrl_jax.run import build
from agentrl_jax.run.config import ConfigError, from_config_dict
from agentrl_jax.run.trainer import rollout_metrics
from agentrl_jax.sampling import SamplingParams
from agentrl_jax.sampling.sampler import TurnOutput

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM = "You are a careful software engineer."
TOOLS = swe_actions.TOOL_SCHEMAS
# Each family's template and the format its checkpoints write calls in.
FAMILIES = {"qwen2_5": "qwen", "qwen3": "qwen", "llama3_1": "llama3_json"}

FIRST = "Goal: fix the off-by-one in clamp()\nYou are in the repository minicalc."
# Ten calls as an agent makes them: multi-line strings, quotes, backslashes, unicode, integers.
CALLS = [
    ToolCall("bash", {"command": "ls -la src/ && grep -rn 'def clamp' src/"}),
    ToolCall("view", {"path": "src/minicalc/core.py", "start": 10, "end": 24}),
    ToolCall("bash", {"command": 'python -c "print(\\"a\\tb\\")"\necho done'}),
    ToolCall(
        "str_replace",
        {
            "path": "src/minicalc/core.py",
            "old_str": "    return max(lo, min(x, hi - 1))\n",
            "new_str": "    return max(lo, min(x, hi))\n",
        },
    ),
    ToolCall("view", {"path": "src/minicalc"}),
    ToolCall("create", {"path": "notes.md", "content": "# Notes\n\nÜnïcödé ∑ ≥ 😀 — “ok”\n"}),
    ToolCall("insert", {"path": "notes.md", "line": 0, "text": "<!-- top -->"}),
    ToolCall("undo", {"path": "notes.md"}),
    ToolCall("bash", {"command": "python -m pytest -q tests/test_core.py"}),
    ToolCall("submit", {}),
]
RESULTS = [
    "total 8\ndrwxr-xr-x 2 user user 4096 .\nsrc/minicalc/core.py:12:def clamp(x, lo, hi):\n"
    "[exit code 0]",
    "    10\t\n    11\t\n    12\tdef clamp(x, lo, hi):\n    13\t    return max(lo, min(x, hi - 1))",
    'a\tb\ndone\n[exit code 0]  "quoted" \\ backslash',
    "edited src/minicalc/core.py at line 13.",
    "src/minicalc\nsrc/minicalc/__init__.py\nsrc/minicalc/core.py",
    "created notes.md (4 lines).",
    "inserted 1 line(s) after line 0 of notes.md.",
    "Error: invalid tool call: missing required argument 'path' of view",
    "....                                                  [100%]\n4 passed in 0.01s\n"
    "[exit code 0]",
    "submitted. Evaluation: resolved. Reward 1.00.",
]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    out = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(family)
        out[family] = (ct.make_tokenizer_dir(family, path), path)
    return out


def _calling(family: str) -> tc.ToolCalling:
    return tc.ToolCalling(TOOLS, tc.get_format(FAMILIES[family]))


def _template(tokenizers, family):
    tok, path = tokenizers[family]
    return get_template(
        "checkpoint", tok, directory=str(path), system_prompt=SYSTEM, tools=_calling(family)
    )


def _whole_ids(tok, messages):
    return list(
        tok.apply_chat_template(
            messages,
            tools=list(TOOLS),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_ten_tool_turns_fed_piece_by_piece_are_apply_chat_template_with_tools(tokenizers, family):
    tok, _ = tokenizers[family]
    template = _template(tokenizers, family)
    calling = _calling(family)
    stop_id = template.stop_id(tok)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST}]
    ids = template.system_ids(tok, SYSTEM) + template.turn_ids(tok, FIRST, first=True)
    for call, result in zip(CALLS, RESULTS, strict=True):
        text = calling.render(call)
        assert calling.parse(text) == call  # what the policy writes parses back to the call
        ids += tok.encode(text, add_special_tokens=False) + [stop_id]
        ids += template.tool_ids(tok, result)
        messages += [tc.assistant_message(call), {"role": "tool", "content": result}]
    assert ids == _whole_ids(tok, messages)
    # The tools are in the context once (the system piece, or Llama 3.1's first user turn),
    # beside the one str_replace call; the stop token closes the system piece, the first user
    # turn, every call and every tool turn.
    assert tok.decode(ids).count('"name": "str_replace"') == 2
    assert ids.count(stop_id) == 2 + 2 * len(CALLS)


def test_where_each_template_puts_the_tools_and_the_results(tokenizers):
    qwen = _template(tokenizers, "qwen2_5")
    assert qwen.first_user_prefix is None and "# Tools" in qwen.system_suffix
    assert (qwen.tool_prefix, qwen.tool_suffix, qwen.tool_content) == (
        "\n<|im_start|>user\n<tool_response>\n",
        "\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        "verbatim",
    )
    llama = _template(tokenizers, "llama3_1")
    # Llama 3.1 renders the tools in the first user message, and a result as a JSON string.
    assert "Environment: ipython" in llama.system_prefix and llama.system_suffix == "<|eot_id|>"
    assert "Given the following functions" in llama.first_user_prefix
    assert llama.tool_prefix == "<|start_header_id|>ipython<|end_header_id|>\n\n"
    assert llama.tool_content == "json"
    assert llama.tool_text('a "b"\n') == llama.tool_prefix + '"a \\"b\\"\\n"' + llama.tool_suffix
    # The later user turns are unchanged by the tools.
    assert llama.turn_text("x", first=False) == get_template(
        "checkpoint",
        tokenizers["llama3_1"][0],
        directory=str(tokenizers["llama3_1"][1]),
        system_prompt=SYSTEM,
        actions_think=False,
    ).turn_text("x", first=False)


def test_qwen3_keeps_think_blocks_between_tool_turns(tokenizers):
    """Qwen3 drops think blocks only before the last user query; in a tool conversation every
    later turn is a tool turn, so a call written after a think block stays as written."""
    tok, _ = tokenizers["qwen3"]
    template = _template(tokenizers, "qwen3")
    calling = _calling("qwen3")
    think = "<think>\nThe bug is in clamp.\n</think>\n\n"
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST}]
    ids = template.system_ids(tok, SYSTEM) + template.turn_ids(tok, FIRST, first=True)
    for call, result in zip(CALLS[:3], RESULTS[:3], strict=True):
        ids += tok.encode(think + calling.render(call), add_special_tokens=False)
        ids += [template.stop_id(tok)] + template.tool_ids(tok, result)
        message = tc.assistant_message(call)
        messages += [{**message, "content": think}, {"role": "tool", "content": result}]
    assert ids == _whole_ids(tok, messages)


def test_fixed_layouts_cannot_render_tools():
    with pytest.raises(ValueError, match="chat template 'plain' cannot render tools"):
        get_template("plain", tools=tc.ToolCalling(TOOLS, tc.get_format("qwen")))
    with pytest.raises(ValueError, match="has no tool turns"):
        get_template("qwen").tool_text("x")


def test_a_template_that_renders_calls_otherwise_is_refused(tokenizers):
    """Llama 3.1's template with the Qwen format: the call is not how the template renders it."""
    tok, path = tokenizers["llama3_1"]
    with pytest.raises(ChatTemplateError) as e:
        get_template(
            "checkpoint",
            tok,
            directory=str(path),
            system_prompt=SYSTEM,
            tools=tc.ToolCalling(TOOLS, tc.get_format("qwen")),
        )
    assert "a call written in the 'qwen' format is not how the template renders" in str(e.value)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tool_calling_composes_with_append_only(tokenizers, family):
    """Append-only with tools: the same pieces, the tool turns checked as append-only checks user
    turns (first turn whole, each tool turn the tail of the template's rendering after the stop
    id); a ten-turn conversation fed piece by piece is still the template's, id for id."""
    tok, path = tokenizers[family]
    exact = _template(tokenizers, family)
    template = get_template(
        "checkpoint",
        tok,
        directory=str(path),
        system_prompt=SYSTEM,
        tools=_calling(family),
        append_only=True,
    )
    assert template.append_only and template.has_tools
    assert dataclasses.replace(template, append_only=False) == exact
    stop_id = template.stop_id(tok)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST}]
    ids = template.system_ids(tok, SYSTEM) + template.turn_ids(tok, FIRST, first=True)
    assert ids == _whole_ids(tok, messages)
    for call, result in zip(CALLS, RESULTS, strict=True):
        ids += tok.encode(_calling(family).render(call), add_special_tokens=False) + [stop_id]
        turn = template.tool_ids(tok, result)
        ids += turn
        messages += [tc.assistant_message(call), {"role": "tool", "content": result}]
        assert _whole_ids(tok, messages)[-len(turn) - 1 :] == [stop_id] + turn
    assert ids == _whole_ids(tok, messages)


def test_append_only_checks_the_tool_turns(tokenizers):
    """A tool turn the template renders otherwise than the pieces is refused, naming the turn."""
    tok, path = tokenizers["qwen2_5"]
    source = cc.read_chat_template(path)
    template = get_template(
        "checkpoint",
        tok,
        directory=str(path),
        system_prompt=SYSTEM,
        tools=_calling("qwen2_5"),
        append_only=True,
    )
    wrong = dataclasses.replace(template, tool_suffix=template.tool_suffix + "x")
    with pytest.raises(ChatTemplateError, match="but tool turn 1 of a conversation of 1 calls"):
        chat_append_only.check_tool_turns_append_only(
            wrong, tok, source, _calling("qwen2_5"), system_prompt=SYSTEM
        )
    # The first turn, with the tools rendered in, is held to the template's too.
    wrong = dataclasses.replace(template, system_suffix=template.system_suffix[:-1])
    with pytest.raises(ChatTemplateError, match="append-only keeps the first turn"):
        chat_append_only.check_tool_turns_append_only(
            wrong, tok, source, _calling("qwen2_5"), system_prompt=SYSTEM
        )
    # A call in a format the template does not render is refused under append-only as well.
    tok, path = tokenizers["llama3_1"]
    with pytest.raises(ChatTemplateError, match="is not how the template renders"):
        get_template(
            "checkpoint",
            tok,
            directory=str(path),
            system_prompt=SYSTEM,
            tools=tc.ToolCalling(TOOLS, tc.get_format("qwen")),
            append_only=True,
        )


QWEN_BAD = [
    ('<tool_call>["bash"]</tool_call>', "the tool call is list JSON; expected an object"),
    ("I will look at the code first.", "no tool call: write one <tool_call>"),
    ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}', "is not closed by"),
    ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>', "bad JSON"),
    ('<tool_call>\n{"name": "grep", "arguments": {}}\n</tool_call>', "unknown tool 'grep'"),
    (
        '<tool_call>\n{"name": "view", "arguments": {"start": 1}}\n</tool_call>',
        "missing required argument 'path' of view",
    ),
    (
        '<tool_call>\n{"name": "view", "arguments": {"path": "a.py", "start": "10", "end": 12}}'
        "\n</tool_call>",
        "argument 'start' of view must be integer; got \"10\" (a string)",
    ),
    (
        '<tool_call>\n{"name": "undo", "arguments": {"path": "a", "all": true}}\n</tool_call>',
        "unknown argument 'all' of undo",
    ),
    (
        '<tool_call>\n{"name": "undo", "arguments": ["a"]}\n</tool_call>',
        '"arguments" of undo is list; expected a JSON object',
    ),
    (
        '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "submit", "arguments": {}}</tool_call>',
        "2 <tool_call> blocks; expected one call per turn",
    ),
]
LLAMA_BAD = [
    ("I will look at the code first.", "no tool call: reply with one JSON object"),
    ('{"name": "bash", "parameters": {"command": "ls"}', "bad JSON in the tool call"),
    ('{"name": "grep", "parameters": {}}', "unknown tool 'grep'"),
    ('{"name": "create", "parameters": {"path": "a.py"}}', "missing required argument 'content'"),
    (
        '{"name": "insert", "parameters": {"path": "a.py", "line": 1.5, "text": "x"}}',
        "argument 'line' of insert must be integer; got 1.5 (a number)",
    ),
    ('{"name": "submit", "parameters": {}} and more', "text after the tool call's JSON object"),
    ('{"name": 3, "parameters": {}}', 'the tool call has no "name" string'),
]


@pytest.mark.parametrize(
    ("fmt", "text", "error"),
    [("qwen", t, e) for t, e in QWEN_BAD] + [("llama3_json", t, e) for t, e in LLAMA_BAD],
)
def test_malformed_calls_give_the_named_error(fmt, text, error):
    calling = tc.ToolCalling(TOOLS, tc.get_format(fmt))
    with pytest.raises(tc.ToolCallError) as e:
        calling.parse(text)
    assert error in str(e.value)


def test_calls_parse_with_text_around_them_and_string_arguments():
    qwen = tc.ToolCalling(TOOLS, tc.get_format("qwen"))
    text = 'The test fails.\n<tool_call>\n{"name":"bash","arguments":"{\\"command\\": \\"ls\\"}"}'
    assert qwen.parse(text + "\n</tool_call>") == ToolCall("bash", {"command": "ls"})
    llama = tc.ToolCalling(TOOLS, tc.get_format("llama3_json"))
    assert llama.parse('<|python_tag|>{"name": "submit", "parameters": {}}\n') == ToolCall(
        "submit", {}
    )
    # "arguments" is read where a Llama checkpoint writes it instead of "parameters".
    assert llama.parse('{"name": "undo", "arguments": {"path": "a"}}') == ToolCall(
        "undo", {"path": "a"}
    )


def test_a_user_registers_a_format():
    def parse(text):
        name, _, args = text.strip().partition(" ")
        return ToolCall(name, json.loads(args or "{}"))

    fmt = tc.register_format(
        tc.ToolFormat("test_plain_call", parse, lambda c: f"{c.name} {json.dumps(c.arguments)}")
    )
    try:
        assert tc.get_format("test_plain_call") is fmt
        calling = tc.ToolCalling(TOOLS, fmt)
        assert calling.parse('undo {"path": "a.py"}') == ToolCall("undo", {"path": "a.py"})
        with pytest.raises(tc.ToolCallError, match="unknown tool 'look'"):
            calling.parse("look")
        with pytest.raises(ValueError, match="'test_plain_call' is already registered"):
            tc.register_format(fmt)
    finally:
        del tc.FORMATS["test_plain_call"]
    with pytest.raises(ValueError, match=r"unknown tool-call format 'hermes'; registered: \["):
        tc.get_format("hermes")


def test_each_model_family_names_its_format():
    formats = {name: fam.tool_format for name, fam in model_registry.FAMILIES.items()}
    assert formats["qwen2"] == formats["qwen3"] == "qwen"
    assert formats["llama"] == "llama3_json"
    for name in filter(None, formats.values()):
        tc.get_format(name)


def test_the_swe_env_offers_its_tools_only_with_the_tools_format():
    assert env_registry.tool_schemas("swe", {"action_format": "tools"}) == TOOLS
    assert env_registry.tool_schemas("swe", {}) == ()
    assert env_registry.tool_schemas("textworld", {}) == ()
    assert tc.tool_names(TOOLS) == list(swe_actions.TOOLS)


# --------------------------------------------------------------------------- rollouts


class ScriptedSampler:
    """A policy that writes a fixed reply per turn (its text encoded, closed by the stop id),
    with the sampler's interface: what each turn was fed is kept."""

    sampling = SamplingParams(temperature=1.0)

    def __init__(self, tok, stop_id, replies):
        self.tok, self.stop_id, self.replies = tok, stop_id, replies
        self.turn = 0
        self.fed = []

    def start(self, size, max_seq_len, **kwargs):
        return None

    def step_turn(self, cache, feed, budgets, keys, sampling=None, **kwargs):
        rows = []
        for f in feed:
            self.fed.append(list(f))
            rows.append(
                self.tok.encode(self.replies[self.turn], add_special_tokens=False) + [self.stop_id]
                if f
                else []
            )
        self.turn += 1
        width = max(map(len, rows))
        tokens = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            tokens[i, : len(r)] = r
        zeros = np.zeros((len(rows), width), np.float32)
        lengths = np.asarray([len(r) for r in rows], np.int32)
        return TurnOutput(tokens, zeros, zeros, lengths, lengths * 0, None)


class CallPool:
    """An in-process actor pool over one env that takes tool calls; keeps what it saw."""

    def __init__(self, env):
        self.env, self.seen = env, []

    def reset(self, tasks):
        [task] = tasks
        obs = self.env.reset(task)
        self.seen.append(obs)
        return [StepResult(obs, info={"state_key": 7})]

    def step(self, actions):
        [action] = actions
        if action is None:
            return [None]
        assert isinstance(action, ToolCall)  # the env only ever sees a parsed, checked call
        obs, reward, done, info = self.env.step(action)
        self.seen.append(obs)
        return [StepResult(obs, reward=reward, done=done, info=info)]


@pytest.fixture(scope="module")
def swe_task(tmp_path_factory):
    """A toy SWE task built by the launcher from the generated package (as test_swe_env's)."""
    root = tmp_path_factory.mktemp("swe")
    pkg = toy_package.write(str(root / "minicalc"))
    out = root / "out"
    cmd = [
        sys.executable, "-m", "launch.make_swe_tasks", f"--package_dir={pkg}", f"--out={out}",
        "--max_mutations=4", "--max_tasks=1", "--seed=1",
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    path = str(out / "tasks.jsonl")
    return path, load_jsonl(path)[0]


def _fix(task) -> ToolCall:
    """The gold patch's one changed line as a str_replace call."""
    path = re.search(r"^\+\+\+ b/(\S+)", task.patch, re.M).group(1)
    lines = task.patch.splitlines()
    old = [ln[1:] for ln in lines if ln.startswith("-") and not ln.startswith("---")]
    new = [ln[1:] for ln in lines if ln.startswith("+") and not ln.startswith("+++")]
    return ToolCall(
        "str_replace", {"path": path, "old_str": "\n".join(old), "new_str": "\n".join(new)}
    )


@pytest.mark.parametrize("family", ["qwen2_5", "llama3_1"])
def test_a_scripted_policy_resolves_a_swe_toy_task_with_tool_calls(tokenizers, swe_task, family):
    tok, _ = tokenizers[family]
    path, task = swe_task
    template = _template(tokenizers, family)
    calling = _calling(family)
    replies = [
        "Let me look around first.",  # no call: named, counted, the episode goes on
        calling.render(ToolCall("view", {"start": 1})),  # a required argument missing
        calling.render(ToolCall("bash", {"command": "python -c 'print(6*7)'"})),
        calling.render(_fix(task)),
        calling.render(ToolCall("submit", {})),
    ]
    sampler = ScriptedSampler(tok, template.stop_id(tok), replies)
    env = SweEnv.from_jsonl(path, max_turns=10, action_format="tools")
    pool = CallPool(env)
    cfg = RolloutConfig(
        group_size=1, max_turns=8, max_new_tokens=64, max_seq_len=8192, system_prompt=SYSTEM
    )
    worker = RolloutWorker(pool, sampler, tok, template, cfg, tools=calling)
    try:
        [traj] = worker.run([Task("swe", "train", task.instance_id)], jax.random.key(0))
    finally:
        env.close()
    assert traj.won and traj.episode_return == 1.0 and len(traj.steps) == len(replies)
    assert [s.info["invalid_tool_call"] for s in traj.steps] == [True, True, False, False, False]
    assert [s.info["invalid_action"] for s in traj.steps[:4]] == [True, True, False, False]
    assert traj.steps[1].state_key == traj.steps[0].state_key == 7  # the env was not stepped
    assert len(pool.seen) == 4  # the reset and three calls: the malformed ones never reached it
    assert "42" in pool.seen[1].feedback and "edited" in pool.seen[2].feedback
    assert rollout_metrics([traj])["rollout/invalid_tool_call_rate"] == pytest.approx(2 / 5)
    # What the policy was fed is what the steps hold, and it is the template's conversation with
    # tools: the malformed replies as assistant text, the errors as tool turns naming the problem.
    fed = [i for step in traj.steps for i in step.prompt_ids + step.action_ids]
    assert [i for f in sampler.fed for i in f] == [i for s in traj.steps for i in s.prompt_ids]
    no_call = (
        'write one <tool_call>{"name": <tool name>, "arguments": {...}}</tool_call> block'
        if family == "qwen2_5"
        else 'reply with one JSON object {"name": <tool name>, "parameters": {...}}'
    )
    results = [
        f"Error: invalid tool call: no tool call: {no_call}",
        "Error: invalid tool call: missing required argument 'path' of view",
    ] + [render_observation(obs, first=False, show_admissible=True) for obs in pool.seen[1:-1]]
    first = render_observation(pool.seen[0], first=True, show_admissible=True)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}]
    for k, reply in enumerate(replies[:-1]):
        if k < 2:
            messages.append({"role": "assistant", "content": reply})
        else:
            messages.append(tc.assistant_message(calling.parse(reply)))
        messages.append({"role": "tool", "content": results[k]})
    assert fed[: -len(traj.steps[-1].action_ids)] == _whole_ids(tok, messages)


def test_the_swe_env_takes_tool_calls_and_refuses_the_other_format(swe_task):
    path, task = swe_task
    env = SweEnv.from_jsonl(path, max_turns=10, action_format="tools")
    try:
        obs = env.reset(Task("swe", "train", task.instance_id))
        assert "```bash" not in obs.text and "call submit" in obs.text
        obs, _, done, info = env.step(ToolCall("view", {"path": "no/such.py"}))
        assert info["invalid_action"] and not done and "no such file" in obs.feedback
        obs, _, _, info = env.step(
            ToolCall("view", {"path": _fix(task).arguments["path"], "start": 1})
        )
        assert info["invalid_action"] and "both start and end" in obs.feedback
        with pytest.raises(TypeError, match="steps with a ToolCall; got str"):
            env.step("```submit\n```")
        obs, reward, done, info = env.step(_fix(task))
        assert not info["invalid_action"], obs.feedback
        obs, reward, done, info = env.step(ToolCall("submit"))
        assert done and reward == 1.0 and info["won"]
    finally:
        env.close()
    with pytest.raises(ValueError, match="action_format='xml'"):
        SweEnv([], action_format="xml")


def test_the_worker_refuses_a_template_without_tool_turns():
    calling = tc.ToolCalling(TOOLS, tc.get_format("qwen"))
    with pytest.raises(ValueError, match="tool calling needs a chat template with tool turns"):
        RolloutWorker(None, None, None, get_template("qwen"), RolloutConfig(), tools=calling)
    tool_template = dataclasses.replace(get_template("qwen"), tool_content="verbatim")
    with pytest.raises(ValueError, match="expected constrain_actions=False"):
        RolloutWorker(
            None, None, None, tool_template, RolloutConfig(constrain_actions=True), tools=calling
        )


def _run_config(**sections):
    env = {"name": "swe", "kwargs": {"path": "/nonexistent/tasks.jsonl", "action_format": "tools"}}
    return from_config_dict(ml_collections.ConfigDict({"env": env, **sections}))


def test_a_run_with_a_tool_env_calls_tools_in_its_family_format(tokenizers):
    tok, path = tokenizers["qwen2_5"]
    config = _run_config(model={"tokenizer": str(path), "template": "checkpoint"})
    calling = build.tool_calling(config)
    # The tiny preset is a Qwen2 model: Qwen's <tool_call> format.
    assert calling.format.name == "qwen" and calling.tools == TOOLS
    template = build.chat_template(config, tok)
    assert template.has_tools and "# Tools" in template.system_suffix
    # rollout.tool_format names another format (Llama 3.1's template, its JSON calls).
    tok, path = tokenizers["llama3_1"]
    config = _run_config(
        model={"tokenizer": str(path), "template": "checkpoint"},
        rollout={"tool_format": "llama3_json"},
    )
    assert build.tool_calling(config).format.name == "llama3_json"
    assert build.chat_template(config, tok).tool_content == "json"
    # An env whose actions are text: no tool calling, the template as before.
    text_env = from_config_dict(ml_collections.ConfigDict({"env": {"name": "textworld"}}))
    assert build.tool_calling(text_env) is None


@pytest.mark.parametrize(
    ("sections", "error"),
    [
        ({}, "offers function tools, which the checkpoint's own chat template renders; "
             "config.model.template is 'plain'"),
        ({"model": {"tokenizer": "/tok", "template": "checkpoint"},
          "rollout": {"tool_format": "hermes"}},
         "config.rollout.tool_format: unknown tool-call format 'hermes'"),
    ],
    ids=["fixed_template", "unknown_format"],
)  # fmt: skip
def test_a_tool_env_with_settings_that_cannot_call_tools_is_a_config_error(sections, error):
    with pytest.raises(ConfigError) as e:
        build.tool_calling(_run_config(**sections))
    assert error in str(e.value)


COUNTER_TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "advance",
            "description": "Move the counter forward.",
            "parameters": {
                "type": "object",
                "properties": {"steps": {"type": "integer"}},
                "required": ["steps"],
            },
        },
    },
)


class CounterEnv:
    """Won once the counter reaches 2; each ``advance`` call adds its steps."""

    def reset(self, task):
        self.count = 0
        return Observation("reach 2", "The counter is at 0.")

    def step(self, call):
        assert isinstance(call, ToolCall) and call.name == "advance"
        self.count += call.arguments["steps"]
        text = f"The counter is at {self.count}."
        won = self.count >= 2
        info = {"won": won, "invalid_action": False, "state_key": self.count}
        return Observation("reach 2", text, feedback=text), float(won), won, info


class FeedScriptedSampler(ScriptedSampler):
    """Replies by what a row was fed: its first turn a call with a wrong argument type, after an
    error a good call, after a result another good call."""

    def step_turn(self, cache, feed, budgets, keys, sampling=None, **kwargs):
        good = self.replies[1]
        self.replies_by_row = [
            "" if not f else good if "invalid tool call" in self.tok.decode(f)
            else self.replies[0] if "Goal:" in self.tok.decode(f) else good
            for f in feed
        ]  # fmt: skip
        rows = [
            self.tok.encode(r, add_special_tokens=False) + [self.stop_id] if f else []
            for r, f in zip(self.replies_by_row, feed)
        ]
        width = max(map(len, rows))
        tokens = np.zeros((len(rows), width), np.int32)
        for i, r in enumerate(rows):
            tokens[i, : len(r)] = r
        zeros = np.zeros((len(rows), width), np.float32)
        lengths = np.asarray([len(r) for r in rows], np.int32)
        return TurnOutput(tokens, zeros, zeros, lengths, lengths * 0, None)


@pytest.mark.parametrize("batching", ["waves", "continuous"])
def test_malformed_calls_are_answered_in_waves_and_continuous_batching(tokenizers, batching):
    tok, path = tokenizers["qwen2_5"]
    calling = tc.ToolCalling(COUNTER_TOOLS, tc.get_format("qwen"))
    template = get_template(
        "checkpoint", tok, directory=str(path), system_prompt=SYSTEM, tools=calling
    )
    replies = [
        calling.render(ToolCall("advance", {"steps": "one"})),
        calling.render(ToolCall("advance", {"steps": 1})),
    ]
    sampler = FeedScriptedSampler(tok, template.stop_id(tok), replies)
    pool = InProcessPool([CounterEnv() for _ in range(4)])
    cfg = RolloutConfig(
        group_size=2, max_turns=6, max_new_tokens=64, max_seq_len=4096, batching=batching
    )
    worker = RolloutWorker(pool, sampler, tok, template, cfg, tools=calling)
    tasks = [Task("counter", "train", str(i)) for i in range(3)]
    trajs = worker.run(tasks, jax.random.key(0))
    assert len(trajs) == 6 and all(t.won for t in trajs)
    for t in trajs:
        assert [s.info["invalid_tool_call"] for s in t.steps] == [True, False, False]
        assert [s.state_key for s in t.steps] == [0, 0, 1]  # the malformed call left state 0
        assert "argument 'steps' of advance must be integer" in tok.decode(t.steps[1].obs_ids)
    assert len(pool.calls) == 12  # two good calls per episode; the malformed ones never arrived
    assert rollout_metrics(trajs)["rollout/invalid_tool_call_rate"] == pytest.approx(1 / 3)
