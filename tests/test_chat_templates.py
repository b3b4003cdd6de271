"""A checkpoint's own chat template: its pieces are the conversation apply_chat_template renders.

The tokenizers are trained here (``chat_tokenizers``) and carry the real checkpoints' templates
(Qwen2.5-Instruct, Qwen3, Llama-3-Instruct, Llama-3.1-Instruct). The reference is transformers'
``apply_chat_template(tokenize=True)`` of the whole conversation, compared id for id with what
the rollout feeds piece by piece.
"""

import dataclasses
import json
import os
import sys

import chat_tokenizers as ct
import jax
import ml_collections
import pytest

from agentrl_jax.envs.actors import StepResult
from agentrl_jax.envs.base import Observation, Task
from agentrl_jax.rollout import chat_checkpoint as cc
from agentrl_jax.rollout import chat_probe as probe
from agentrl_jax.rollout.chat import TEMPLATES, get_template
from agentrl_jax.rollout.chat_probe import ChatTemplateError
from agentrl_jax.rollout.rollout import RolloutConfig, RolloutWorker, render_observation
from agentrl_jax.run.config import ConfigError, from_config_dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import tiny_textworld  # noqa: E402

SYSTEM = RolloutConfig().system_prompt
STOP = {
    "qwen2_5": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "llama3": "<|eot_id|>",
    "llama3_1": "<|eot_id|>",
}
EXACT = sorted(STOP)
# Exact for the actions constrained decoding writes (actions_think=False), refused under free
# decoding (below): Qwen3's template drops earlier turns' think blocks, Llama 3's trims the
# whitespace around an action, which a freely decoded one keeps in the rollout's context.
CONSTRAINED_ONLY = {"qwen3", "llama3", "llama3_1"}

# Ten turns as an agent plays them, written apart from the module's own probe conversation:
# observations with whitespace at either end (which Llama 3's template trims), digits, unicode.
OBSERVATIONS = [
    "Goal: take the coin\n-= Attic =-\nYou are in an attic. A chest is here.",
    "You open the chest. Inside is a coin 3 and a note.\n",
    "  The note reads: 'north, then west'.",
    "\n\nYou take the coin 3.",
    "-= Hall =-\nExits: north | west\n\n",
    "That's not a verb I recognise.",
    "You go west. A dusty café with 2 chairs — “closed”.",
    "Nothing happens.\t",
    "Inventory: a coin 3, a note",
    "\tYour score has just gone up by 1 point.",
    "*** The End ***",
]
ACTIONS = [
    "open chest",
    "read note",
    "take coin 3",
    "go north",
    "look",
    "go west",
    "sit on chair 2",
    "inventory",
    "drop note",
    "look",
]


def _conversation(observations, actions):
    messages = [{"role": "system", "content": SYSTEM}]
    for k, obs in enumerate(observations):
        messages.append({"role": "user", "content": obs})
        if k < len(actions):
            messages.append({"role": "assistant", "content": actions[k]})
    return messages


def _whole_ids(tok, messages):
    """The reference: transformers renders and encodes the whole conversation at once."""
    return list(
        tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """Each family's tokenizer directory with its checkpoint's template in chat_template.jinja."""
    out = {}
    for family in ct.FAMILIES:
        path = tmp_path_factory.mktemp(family)
        out[family] = (ct.make_tokenizer_dir(family, path), path)
    return out


@pytest.mark.parametrize("family", EXACT)
def test_pieces_concatenate_to_the_whole_conversation_over_ten_turns(tokenizers, family):
    tok, path = tokenizers[family]
    template = get_template(
        "checkpoint",
        tok,
        directory=str(path),
        system_prompt=SYSTEM,
        actions_think=family not in CONSTRAINED_ONLY,
    )
    assert template.name == "checkpoint" and template.source == str(path / "chat_template.jinja")
    # The stop token is the template's, as the tokenizer knows it: one id, the checkpoint's EOS.
    assert template.stop_token == STOP[family] == tok.eos_token
    stop_id = template.stop_id(tok)
    assert stop_id == tok.convert_tokens_to_ids(STOP[family]) == tok.eos_token_id
    # What a rollout feeds: the system piece, then per turn the user turn with the generation
    # prompt (after the previous action's closing text) and the action closed by the stop id.
    ids = template.system_ids(tok, SYSTEM)
    for k, obs in enumerate(OBSERVATIONS):
        ids += template.turn_ids(tok, obs, first=k == 0)
        if k < len(ACTIONS):
            ids += tok.encode(ACTIONS[k], add_special_tokens=False) + [stop_id]
    assert ids == _whole_ids(tok, _conversation(OBSERVATIONS, ACTIONS))
    # The stop token closes the system piece, every user turn and every action.
    assert ids.count(stop_id) == 1 + len(OBSERVATIONS) + len(ACTIONS)
    # Llama 3 trims message content; the pieces strip the system prompt, observations and
    # actions alike.
    assert template.strip_content == template.strip_actions == family.startswith("llama")


def test_qwen2_5_pieces_are_the_builtin_qwen_layout(tokenizers):
    tok, path = tokenizers["qwen2_5"]
    derived = cc.derive_template(tok, cc.read_chat_template(path))
    assert derived == dataclasses.replace(
        TEMPLATES["qwen"], name="checkpoint", source=str(path / "chat_template.jinja")
    )
    assert derived.action_suffix == "\n"  # the newline after <|im_end|> that opens each turn


def test_llama3_1_system_piece_carries_the_template_header(tokenizers):
    tok, path = tokenizers["llama3_1"]
    template = cc.derive_template(tok, cc.read_chat_template(path))
    assert template.system_prefix == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
    )
    assert (template.system_suffix, template.action_suffix) == ("<|eot_id|>", "")
    assert template.user_suffix == "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    # BOS once, from the template's text: encoded without the tokenizer's own BOS.
    ids = template.system_ids(tok, SYSTEM)
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id


class ScriptedPool:
    """An in-process stand-in for ActorPool: the expert's command at each step, won after 10."""

    STEPS = 10

    def reset(self, tasks):
        self.t = [0] * len(tasks)
        return [StepResult(self._obs(i), info=self._info(i)) for i in range(len(tasks))]

    def _obs(self, i):
        t = self.t[i]
        return Observation(
            objective="take the coin",
            text=OBSERVATIONS[t],
            feedback=OBSERVATIONS[t],
            admissible_commands=("look", ACTIONS[t % len(ACTIONS)]),
        )

    def _info(self, i):
        return {"state_key": self.t[i], "expert_action": ACTIONS[self.t[i] % len(ACTIONS)]}

    def step(self, actions):
        out = []
        for i, action in enumerate(actions):
            assert action == ACTIONS[self.t[i]]
            self.t[i] += 1
            done = self.t[i] >= self.STEPS
            info = {**self._info(i), "won": done}
            out.append(StepResult(self._obs(i), reward=float(done), done=done, info=info))
        return out


@pytest.mark.parametrize("family", EXACT)
def test_a_rollout_feeds_exactly_the_templates_conversation(tokenizers, family):
    """The rollout code, unchanged, on a checkpoint template: a 10-turn expert episode's ids are
    apply_chat_template's ids of the same conversation (the observations as the agent read them)."""
    tok, path = tokenizers[family]
    cfg = RolloutConfig(group_size=1, max_turns=12, max_new_tokens=16, max_seq_len=4096)
    template = get_template(
        "checkpoint",
        tok,
        directory=str(path),
        system_prompt=cfg.system_prompt,
        actions_think=family not in CONSTRAINED_ONLY,
    )
    worker = RolloutWorker(ScriptedPool(), None, tok, template, cfg)
    [traj] = worker.run([Task("scripted", "train", "0")], jax.random.key(0), expert=True)
    assert traj.won and len(traj.steps) == ScriptedPool.STEPS
    fed = [i for step in traj.steps for i in step.prompt_ids + step.action_ids]
    fed += traj.final_obs_ids

    pool = ScriptedPool()
    [first] = pool.reset([None])
    seen = [render_observation(first.observation, first=True, show_admissible=True)]
    for k in range(ScriptedPool.STEPS):
        [res] = pool.step([ACTIONS[k]])
        seen.append(render_observation(res.observation, first=False, show_admissible=True))
    assert fed == _whole_ids(tok, _conversation(seen, ACTIONS))


class PaddedActionsPool(ScriptedPool):
    """The expert's commands (the admissible ones too) with whitespace at either end."""

    def _obs(self, i):
        obs = super()._obs(i)
        commands = tuple(f" {c}\n" for c in obs.admissible_commands)
        return dataclasses.replace(obs, admissible_commands=commands)

    def _info(self, i):
        info = super()._info(i)
        return {**info, "expert_action": f" {info['expert_action']}\n"}


@pytest.mark.parametrize("family", ["llama3", "llama3_1"])
def test_llama3_trims_actions_so_free_decoding_is_refused(tokenizers, family):
    """Llama 3's template trims assistant content too: a freely decoded "go north\n" would stay
    whole in the rollout's context (its ids as sampled) but render trimmed, so free decoding is
    refused; constrained decoding feeds every command stripped, as the template renders it."""
    tok, path = tokenizers[family]
    source = cc.read_chat_template(path)
    template = cc.derive_template(tok, source)
    assert template.strip_content and template.strip_actions
    # What free decoding would feed for an action that ends in a newline, and what it renders as.
    stop_id = template.stop_id(tok)
    fed = template.system_ids(tok, SYSTEM) + template.turn_ids(tok, "look", first=True)
    fed += tok.encode("go north\n", add_special_tokens=False) + [stop_id]
    fed += template.turn_ids(tok, "ok", first=False)
    assert fed != _whole_ids(tok, _conversation(["look", "ok"], ["go north\n"]))
    with pytest.raises(ChatTemplateError) as e:
        get_template("checkpoint", tok, directory=str(path), system_prompt=SYSTEM)
    message = str(e.value)
    assert (
        f"chat template {source.origin} strips the whitespace around assistant content" in message
    )
    assert "free decoding" in message
    assert "constrained decoding (config.rollout.constrain_actions=True)" in message
    # Constrained (and expert) actions are fed stripped: a 10-turn expert episode whose commands
    # carry whitespace is apply_chat_template's conversation of those commands.
    template = get_template(
        "checkpoint", tok, directory=str(path), system_prompt=SYSTEM, actions_think=False
    )
    cfg = RolloutConfig(
        group_size=1, max_turns=12, max_new_tokens=16, max_seq_len=4096, constrain_actions=True
    )
    worker = RolloutWorker(PaddedActionsPool(), None, tok, template, cfg)
    [traj] = worker.run([Task("scripted", "train", "0")], jax.random.key(0), expert=True)
    assert traj.won and len(traj.steps) == ScriptedPool.STEPS
    fed = [i for step in traj.steps for i in step.prompt_ids + step.action_ids]
    fed += traj.final_obs_ids
    pool = PaddedActionsPool()
    [first] = pool.reset([None])
    seen = [render_observation(first.observation, first=True, show_admissible=True)]
    for k in range(ScriptedPool.STEPS):
        [res] = pool.step([ACTIONS[k]])
        seen.append(render_observation(res.observation, first=False, show_admissible=True))
    assert fed == _whole_ids(tok, _conversation(seen, [f" {a}\n" for a in ACTIONS]))
    assert worker._choices(first.observation) == [
        tok.encode(c.strip(), add_special_tokens=False) + [stop_id]
        for c in first.observation.admissible_commands
    ]


def _trimming(roles: str) -> str:
    """A ChatML template that trims the content of the messages whose role is in ``roles``."""
    return (
        "{%- for m in messages %}{%- set c = m.content | trim if m.role in '" + roles + "' "
        "else m.content %}{{- '<|im_start|>' + m.role + '\\n' + c + '<|im_end|>\\n' }}"
        "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


def test_whitespace_is_probed_in_assistant_turns_apart_from_the_others(tmp_path):
    """A template that trims observations but keeps actions verbatim takes free decoding; one
    that trims actions only is exact for constrained decoding alone."""
    tok = ct.make_tokenizer_dir("qwen2_5", tmp_path / "prompts", template=_trimming("system user"))
    template = get_template(
        "checkpoint", tok, directory=str(tmp_path / "prompts"), system_prompt=SYSTEM
    )
    assert template.strip_content and not template.strip_actions
    tok = ct.make_tokenizer_dir("qwen2_5", tmp_path / "actions", template=_trimming("assistant"))
    directory = str(tmp_path / "actions")
    with pytest.raises(ChatTemplateError, match="strips the whitespace around assistant"):
        get_template("checkpoint", tok, directory=directory, system_prompt=SYSTEM)
    template = get_template(
        "checkpoint", tok, directory=directory, system_prompt=SYSTEM, actions_think=False
    )
    assert template.strip_actions and not template.strip_content


def test_qwen3_is_refused_where_it_drops_earlier_think_blocks(tokenizers):
    tok, path = tokenizers["qwen3"]
    with pytest.raises(ChatTemplateError) as e:
        get_template("checkpoint", tok, directory=str(path), system_prompt=SYSTEM)
    message = str(e.value)
    assert str(path / "chat_template.jinja") in message
    assert "is not prefix-stable" in message and "first at character" in message
    # The probe's 4th action thinks; the whole conversation renders it without its think block.
    assert "(in action 4, at 0 of its" in message
    assert "turn by turn '<think>\\nThe door is locked" in message
    assert "but whole 'unlock door with brass key<|im_end|>" in message
    assert "config.model.template='qwen'" in message
    assert "constrained decoding (config.rollout.constrain_actions=True)" in message
    # Only the think blocks are in the way: Qwen3's pieces are ChatML (the 'qwen' layout, the
    # <think> tags single ids), exact for actions that do not think.
    source = cc.read_chat_template(path)
    derived = cc.derive_template(tok, source)
    assert derived == dataclasses.replace(
        TEMPLATES["qwen"], name="checkpoint", source=source.origin
    )
    plain = [a for a in probe.ACTIONS if "<think>" not in a]
    cc.check_prefix_stable(
        derived,
        tok,
        source,
        system_prompt=SYSTEM,
        observations=probe.OBSERVATIONS[: len(plain) + 1],
        actions=plain,
    )
    assert tok.encode("<think>", add_special_tokens=False) == [tok.convert_tokens_to_ids("<think>")]


def test_qwen3_without_thinking_is_refused_where_its_generation_prompt_is_dropped(tmp_path):
    """Qwen3's non-thinking mode opens every action with an empty think block, which the template
    leaves out of the assistant turns it renders before the last user message."""
    no_think = ct.template_text("qwen3").replace(
        "enable_thinking is defined and enable_thinking is false", "true"
    )
    tok = ct.make_tokenizer_dir("qwen3", tmp_path, template=no_think)
    with pytest.raises(ChatTemplateError) as e:
        get_template("checkpoint", tok, directory=str(tmp_path), system_prompt=SYSTEM)
    message = str(e.value)
    assert "is not prefix-stable: the generation prompt is not how the template renders" in message
    assert "fed '<think>\\n\\n</think>\\n\\n" in message


def test_a_newline_run_split_by_the_pre_tokenizer_is_refused_at_the_token_level(tokenizers):
    """Llama 3's generation prompt ends in "\\n\\n"; GPT-2's split keeps it whole when it is
    encoded alone, and splits it before the action's first word in the whole text."""
    tok, path = tokenizers["llama3_gpt2_split"]
    with pytest.raises(ChatTemplateError) as e:  # constrained: Llama 3 trims actions
        get_template(
            "checkpoint", tok, directory=str(path), system_prompt=SYSTEM, actions_think=False
        )
    message = str(e.value)
    assert "the text is prefix-stable but the token ids are not" in message
    assert "'ĊĊ'" in message and "'Ċ', 'Ċ'" in message and "(in user turn 1, at" in message


# A ChatML variant whose generation prompt ends in a space: "Action: " + "open" encodes as
# "Action:", " open" in the whole text but "Action:", " ", "open" piece by piece.
SPACE_PROMPT = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{- m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- if m.role == 'user' %}{{- '<|im_start|>assistant\\nAction: ' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
)


def test_a_generation_prompt_ending_in_a_space_is_refused_at_the_token_level(tmp_path):
    tok = ct.make_tokenizer_dir("qwen2_5", tmp_path, template=SPACE_PROMPT)
    with pytest.raises(ChatTemplateError) as e:
        get_template("checkpoint", tok, directory=str(tmp_path), system_prompt=SYSTEM)
    message = str(e.value)
    assert "the text is prefix-stable but the token ids are not" in message
    assert "pieces [" in message and "':', 'Ġ', 'open'" in message and "':', 'Ġopen'" in message


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        # The assistant turn ends in plain text: no token the sampler could stop on.
        (
            "{%- for m in messages %}{{- m.role + ': ' + m.content + '\\n' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}",
            "does not start with one of the tokenizer's special or added tokens",
        ),
        # Content rewritten (newlines folded): the pieces could not hold the text as given.
        (
            "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + "
            "m.content | replace('\\n', ' ') + '<|im_end|>\\n' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
            "changes system content other than by stripping its surrounding whitespace",
        ),
        # The system prompt folded into the first user message (Llama 2 style).
        (
            "{%- for m in messages %}{%- if m.role == 'user' %}{{- '<|im_start|>' }}"
            "{%- if loop.index0 == 1 %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
            "{{- m.content + '<|im_end|>' }}{%- elif m.role == 'assistant' %}"
            "{{- m.content + '<|im_end|>' }}{%- endif %}{%- endfor %}",
            "rendering [system] shows the message content 0 times",
        ),
        # The first user turn opens differently from the later ones.
        (
            "{%- for m in messages %}{%- if m.role == 'system' %}{{- m.content + '\\n' }}"
            "{%- elif m.role == 'user' %}{{- ('First: ' if loop.index0 == 1 else 'Next: ') + "
            "m.content + '\\n<|im_start|>' }}{%- else %}{{- m.content + '<|im_end|>' }}"
            "{%- endif %}{%- endfor %}",
            "the first user turn opens with 'First: '",
        ),
        # A template that refuses the system role fails to render; the error names it.
        (
            "{%- if messages[0].role == 'system' %}"
            "{{- raise_exception('System role not supported') }}{%- endif %}",
            "failed to render the conversation ['system']",
        ),
        # The system header counts the messages: adding a turn rewrites it.
        (
            "{{- '<|im_start|>system ' + messages|length|string + '\\n' + messages[0].content }}"
            "{%- for m in messages[1:] %}{{- '<|im_end|>\\n<|im_start|>' + m.role + '\\n' + "
            "m.content }}{%- endfor %}{%- if add_generation_prompt %}"
            "{{- '<|im_end|>\\n<|im_start|>assistant\\n' }}{%- endif %}",
            "adding the first user turn changes the system piece, first at character 19",
        ),
    ],
    ids=[
        "no_stop_token",
        "rewrites_content",
        "system_in_first_user",
        "first_user",
        "raises",
        "counts_messages",
    ],
)
def test_unusable_templates_are_refused_naming_the_template(tmp_path, template, expected):
    tok = ct.make_tokenizer_dir("qwen2_5", tmp_path, template=template)
    with pytest.raises(ChatTemplateError, match=r"chat template .*chat_template\.jinja") as e:
        get_template("checkpoint", tok, directory=str(tmp_path), system_prompt=SYSTEM)
    assert expected in str(e.value)


def test_the_template_is_read_from_the_jinja_file_or_tokenizer_config(tokenizers, tmp_path):
    tok, _ = tokenizers["qwen2_5"]
    tok.save_pretrained(str(tmp_path))
    ct.write_template(tmp_path, ct.template_text("qwen2_5"), "config")
    source = cc.read_chat_template(tmp_path)
    assert source.text == ct.template_text("qwen2_5")
    assert source.origin == f"{tmp_path / 'tokenizer_config.json'} (chat_template)"
    # Named templates (an older transformers layout): the 'default' one.
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "tool_use", "template": "{{ 'tools' }}"},
        {"name": "default", "template": ct.template_text("llama3")},
    ]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert cc.read_chat_template(tmp_path).text == ct.template_text("llama3")
    # chat_template.jinja beside it wins, as in transformers.
    (tmp_path / "chat_template.jinja").write_text(ct.template_text("qwen3"))
    source = cc.read_chat_template(tmp_path)
    assert (source.text, source.origin) == (
        ct.template_text("qwen3"),
        str(tmp_path / "chat_template.jinja"),
    )


def test_a_directory_without_a_template_is_an_error_naming_it(tokenizers, tmp_path):
    tok, _ = tokenizers["qwen2_5"]
    tok.save_pretrained(str(tmp_path))
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ChatTemplateError, match=f"no chat template in {tmp_path}: expected "):
        cc.read_chat_template(tmp_path)
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        cc.read_chat_template(tmp_path / "missing")
    with pytest.raises(ValueError, match="pass tokenizer= and directory="):
        get_template("checkpoint")
    with pytest.raises(ValueError, match=r"valid templates: \['checkpoint', 'plain', 'qwen'\]"):
        get_template("chatml")


def _model(**model):
    return from_config_dict(ml_collections.ConfigDict({"model": model})).model


def test_config_defaults_to_the_checkpoint_template_when_a_checkpoint_is_given():
    assert _model().template == "plain"  # no checkpoint: as before
    assert _model(checkpoint="/ckpts/Qwen2.5-0.5B-Instruct").template == "checkpoint"
    assert _model(checkpoint="/ckpts/x", template="qwen").template == "qwen"
    assert _model(tokenizer="/tok", template="checkpoint").template == "checkpoint"
    with pytest.raises(
        ConfigError, match="config.model.template is 'checkpoint' .* neither is set"
    ):
        _model(template="checkpoint")
    with pytest.raises(ConfigError, match=r"config.model.template is 'chatml'; valid choices"):
        _model(template="chatml")


def test_the_tiny_default_config_keeps_the_plain_template():
    for arg in (None, "test", "smoke", "step"):
        config = from_config_dict(tiny_textworld.get_config(arg))
        assert (config.model.checkpoint, config.model.template) == ("", "plain")
        assert get_template(config.model.template) is TEMPLATES["plain"]


@pytest.mark.parametrize(
    ("family", "refused"),
    [
        ("qwen3", "is not prefix-stable"),
        ("llama3", "strips the whitespace around assistant content"),
    ],
)
def test_a_run_takes_qwen3_and_llama3_under_constrained_decoding_only(tokenizers, family, refused):
    """The run's template (``build.chat_template``) is checked on the actions the run's decoding
    can write, so constrained decoding takes Qwen3's and Llama 3's and free decoding refuses
    them."""
    from agentrl_jax.run import build

    tok, path = tokenizers[family]
    cd = tiny_textworld.get_config()
    cd.model.tokenizer, cd.model.template = str(path), "checkpoint"
    assert cd.rollout.constrain_actions
    template = build.chat_template(from_config_dict(cd), tok)
    assert template.name == "checkpoint" and template.stop_token == STOP[family]
    cd.rollout.constrain_actions = False
    with pytest.raises(ChatTemplateError, match=refused):
        build.chat_template(from_config_dict(cd), tok)


# ----------------------------------------------------------------------- append-only templates

DEEPSEEK = "deepseek_r1_distill_qwen"


def test_deepseek_r1_distill_is_refused_naming_the_append_only_opt_in(tokenizers):
    """Its generation prompt opens <think>\\n, which the assistant turns it renders later leave out
    (with the reasoning before </think>): not prefix-stable, and the refusal names the opt-in."""
    tok, path = tokenizers[DEEPSEEK]
    for actions_think in (True, False):
        with pytest.raises(ChatTemplateError) as e:
            get_template(
                "checkpoint",
                tok,
                directory=str(path),
                system_prompt=SYSTEM,
                actions_think=actions_think,
            )
        message = str(e.value)
        assert "is not prefix-stable: the generation prompt is not how the template" in message
        assert "fed '<think>\\nACTIONxQ7'" in message
        assert "config.model.template_mode='append_only'" in message


def test_the_refusals_of_rewriting_templates_name_the_append_only_opt_in(tokenizers):
    tok, path = tokenizers["qwen3"]  # drops earlier think blocks: refused at action 4
    with pytest.raises(ChatTemplateError, match="template_mode='append_only'"):
        get_template("checkpoint", tok, directory=str(path), system_prompt=SYSTEM)
    tok, path = tokenizers["llama3_1"]  # trims actions: refused under free decoding
    with pytest.raises(ChatTemplateError, match="template_mode='append_only'"):
        get_template("checkpoint", tok, directory=str(path), system_prompt=SYSTEM)


# The pieces of the rewriting templates under append-only: DeepSeek's generation prompt opens the
# think block the policy then closes; Qwen3's (thinking) is ChatML's.
APPEND_ONLY_PIECES = {
    DEEPSEEK: ("<｜begin▁of▁sentence｜>", "", "<｜User｜>", "<｜Assistant｜><think>\n", ""),
    "qwen3": (
        "<|im_start|>system\n",
        "<|im_end|>\n",
        "<|im_start|>user\n",
        "<|im_end|>\n<|im_start|>assistant\n",
        "\n",
    ),
}
APPEND_ONLY_STOP = {DEEPSEEK: "<｜end▁of▁sentence｜>", "qwen3": "<|im_end|>"}


def _thinking(action: str, family: str) -> str:
    """An action as a thinking policy writes it after the generation prompt: DeepSeek's prompt
    has opened the think block already; Qwen3 opens its own."""
    thought = f"I should {action} now.\n</think>\n\n{action}"
    return thought if family == DEEPSEEK else "<think>\n" + thought


class ThinkingPool(ScriptedPool):
    """The expert thinks before each command; the env is sent the whole action text."""

    family = DEEPSEEK

    def _info(self, i):
        info = super()._info(i)
        return {**info, "expert_action": _thinking(info["expert_action"], self.family)}

    def step(self, actions):
        plain = [a.split("</think>")[-1].strip() for a in actions]
        assert actions == [_thinking(a, self.family) for a in plain]
        return super().step(plain)


@pytest.mark.parametrize("family", sorted(APPEND_ONLY_PIECES))
def test_append_only_keeps_each_turn_as_the_policy_saw_and_wrote_it(tokenizers, family):
    """A 10-turn episode of thinking actions through the unchanged RolloutWorker, append-only:
    the first turn is apply_chat_template's, every later turn (after the stop id that closes the
    previous action) is the tail of apply_chat_template of the conversation so far (what a
    server renders to ask for that action), and every action is its ids as written, think block
    and all, which the template's own rendering of the whole conversation rewrites."""
    tok, path = tokenizers[family]
    cfg = RolloutConfig(group_size=1, max_turns=12, max_new_tokens=64, max_seq_len=4096)
    template = get_template(
        "checkpoint", tok, directory=str(path), system_prompt=cfg.system_prompt, append_only=True
    )
    pieces = (template.system_prefix, template.system_suffix, template.user_prefix)
    pieces += (template.user_suffix, template.action_suffix)
    assert pieces == APPEND_ONLY_PIECES[family] and template.append_only
    assert template.stop_token == APPEND_ONLY_STOP[family] == tok.eos_token
    stop_id = template.stop_id(tok)

    pool = ThinkingPool()
    pool.family = family
    worker = RolloutWorker(pool, None, tok, template, cfg)
    [traj] = worker.run([Task("scripted", "train", "0")], jax.random.key(0), expert=True)
    assert traj.won and len(traj.steps) == ScriptedPool.STEPS

    replay = ScriptedPool()
    [first] = replay.reset([None])
    seen = [render_observation(first.observation, first=True, show_admissible=True)]
    for k in range(ScriptedPool.STEPS):
        [res] = replay.step([ACTIONS[k]])
        seen.append(render_observation(res.observation, first=False, show_admissible=True))
    written = [_thinking(a, family) for a in ACTIONS]

    messages = _conversation(seen[:1], [])
    assert traj.steps[0].prompt_ids == _whole_ids(tok, messages)
    prompts = [step.prompt_ids for step in traj.steps[1:]] + [traj.final_obs_ids]
    for k, step in enumerate(traj.steps):
        assert step.action_ids == tok.encode(written[k], add_special_tokens=False) + [stop_id]
        messages = _conversation(seen[: k + 2], written[: k + 1])
        tail = [stop_id] + prompts[k]
        assert _whole_ids(tok, messages)[-len(tail) :] == tail
    # The template rewrites the history the policy saw: its whole conversation is not the context.
    fed = [i for step in traj.steps for i in step.prompt_ids + step.action_ids]
    fed += traj.final_obs_ids
    whole = _whole_ids(tok, _conversation(seen, written))
    assert fed != whole and len(whole) < len(fed)
    reasoning = tok.encode(f"I should {ACTIONS[0]}", add_special_tokens=False)
    assert _contains(fed, reasoning) and not _contains(whole, reasoning)


def _contains(ids, part):
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def test_append_only_takes_qwen3_without_thinking_and_llama3_under_free_decoding(
    tokenizers, tmp_path
):
    """Qwen3's non-thinking generation prompt (an empty think block, dropped from the turns it
    renders later) and Llama 3.1's trimming of actions are rewrites that append-only keeps out of
    the context: both are taken under free decoding, their generation prompts the template's."""
    no_think = ct.template_text("qwen3").replace(
        "enable_thinking is defined and enable_thinking is false", "true"
    )
    tok = ct.make_tokenizer_dir("qwen3", tmp_path, template=no_think)
    template = get_template(
        "checkpoint", tok, directory=str(tmp_path), system_prompt=SYSTEM, append_only=True
    )
    assert template.user_suffix == "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    tok, path = tokenizers["llama3_1"]
    template = get_template(
        "checkpoint", tok, directory=str(path), system_prompt=SYSTEM, append_only=True
    )
    assert template.strip_actions and template.stop_token == "<|eot_id|>"


# A ChatML variant that renders the third and later user turns otherwise than the first two.
LATE_TURNS = (
    "{%- for m in messages %}{%- if m.role == 'user' and loop.index0 > 3 %}"
    "{{- '<|im_start|>user\\n(again) ' + m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# A system piece that ends in a space before the first user turn's plain text: " Turn" merges.
SPACED_SYSTEM = (
    "{%- for m in messages %}{%- if m.role == 'system' %}{{- m.content + ' ' }}"
    "{%- elif m.role == 'user' %}{{- 'Turn: ' + m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (LATE_TURNS, "but user turn 3 of a 3-turn conversation rendered by apply_chat_template"),
        (SPACED_SYSTEM, "the first turn's text is the template's but its ids encoded piece by"),
    ],
    ids=["late_turns", "spaced_system"],
)
def test_append_only_refuses_what_it_can_check(tmp_path, template, expected):
    tok = ct.make_tokenizer_dir("qwen2_5", tmp_path, template=template)
    with pytest.raises(ChatTemplateError) as e:
        get_template(
            "checkpoint", tok, directory=str(tmp_path), system_prompt=SYSTEM, append_only=True
        )
    assert expected in str(e.value) and str(tmp_path / "chat_template.jinja") in str(e.value)
    with pytest.raises(ValueError, match="append-only applies to a checkpoint's own"):
        get_template("qwen", append_only=True)


def test_config_template_mode_is_opt_in_and_reaches_the_run(tokenizers):
    from agentrl_jax.run import build

    assert _model().template_mode == "exact"
    assert _model(checkpoint="/ckpt", template_mode="append_only").template_mode == "append_only"
    with pytest.raises(ConfigError, match="config.model.template_mode is 'rewrite'; valid"):
        _model(checkpoint="/ckpt", template_mode="rewrite")
    with pytest.raises(ConfigError, match="'append_only' but config.model.template is 'qwen'"):
        _model(checkpoint="/ckpt", template="qwen", template_mode="append_only")
    tok, path = tokenizers[DEEPSEEK]
    cd = tiny_textworld.get_config()
    cd.model.tokenizer, cd.model.template = str(path), "checkpoint"
    cd.rollout.constrain_actions = False
    with pytest.raises(ChatTemplateError, match="template_mode='append_only'"):
        build.chat_template(from_config_dict(cd), tok)
    cd.model.template_mode = "append_only"
    template = build.chat_template(from_config_dict(cd), tok)
    assert template.append_only and template.user_suffix == "<｜Assistant｜><think>\n"
