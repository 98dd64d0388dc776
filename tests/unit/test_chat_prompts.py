"""Prompts for a target with a chat template go through it (dataset setting ``chat_template``,
on by default when the tokenizer has one); responses are stored decoded without special tokens."""

from __future__ import annotations

import copy

import pytest
from support.gguf_files import write_tiny_llama_gguf
from transformers import AutoTokenizer

from orchestrator.run.preflight import PreparedInputs, _check_chat_templates
from orchestrator.sweep.planner import plan_sweep, replay_groups
from orchestrator.sweep.spec import parse_sweep
from training.gguf_import import convert_gguf
from workers.datasets import DatasetSpec, Prompt, load_prompts
from workers.prompt_format import (
    encode_dataset,
    encode_prompt,
    response_text,
    uses_chat_template,
)

SWEEP = """\
name: chat
pairs:
  - {name: p, target: zoo:micro/target, draft: zoo:micro/draft-s}
datasets:
  - {name: "builtin:code", samples: 2, max_new_tokens: 8%s}
temperatures: [0]
policies: [{name: static}]
max_draft_lens: [2]
execution: {mode: replay}
"""


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """The tokenizer (ChatML template, EOS <|im_end|>) of a tiny GGUF converted by the importer."""
    folder = tmp_path_factory.mktemp("chat-model")
    write_tiny_llama_gguf(folder / "tiny.gguf")
    convert_gguf(folder / "tiny.gguf", folder / "model")
    return AutoTokenizer.from_pretrained(folder / "model")


def _plain(tokenizer):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    return plain


def test_default_follows_the_tokenizer(chat_tokenizer) -> None:
    assert uses_chat_template(chat_tokenizer, None)
    assert not uses_chat_template(_plain(chat_tokenizer), None)
    assert not uses_chat_template(chat_tokenizer, False)


def test_chat_prompt_is_one_user_turn_and_the_assistant_header(chat_tokenizer) -> None:
    ids = encode_prompt(chat_tokenizer, "the cat", chat=True, budget=1000)
    assert (
        chat_tokenizer.decode(ids) == "<|im_start|>user\nthe cat<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = encode_prompt(chat_tokenizer, "the cat", chat=False, budget=1000)
    assert plain == chat_tokenizer("the cat")["input_ids"] != ids


def test_a_dataset_is_encoded_prompt_by_prompt_through_the_template(chat_tokenizer) -> None:
    texts = [p.text for p in load_prompts(DatasetSpec("builtin:code", samples=3))]
    for tokenizer, chat in ((chat_tokenizer, True), (_plain(chat_tokenizer), False)):
        expected = [encode_prompt(tokenizer, text, chat=chat, budget=40) for text in texts]
        assert encode_dataset(tokenizer, "builtin:code", 3, 40) == expected
    assert len(expected) == 3 and all(0 < len(ids) <= 40 for ids in expected)


def test_long_chat_prompt_loses_the_start_of_the_user_text(chat_tokenizer) -> None:
    text = " ".join(f"w{i}" for i in range(60))
    full = encode_prompt(chat_tokenizer, text, chat=True, budget=10_000)
    budget = len(full) - 40
    ids = encode_prompt(chat_tokenizer, text, chat=True, budget=budget)
    decoded = chat_tokenizer.decode(ids)
    assert len(ids) <= budget
    assert decoded.startswith("<|im_start|>user\n")
    assert decoded.endswith("w59<|im_end|>\n<|im_start|>assistant\n")
    assert "w0 " not in decoded


def test_prepared_inputs_apply_the_dataset_setting(chat_tokenizer) -> None:
    key = ("builtin:code", None, 1, None)
    inputs = PreparedInputs(
        tokenizers={"p": chat_tokenizer},
        max_positions={"p": 256},
        prompts={key: [Prompt("a", "the cat", None, "code")]},
    )
    start = chat_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert inputs.token_ids("p", key, 8)[0][0] == start
    assert inputs.token_ids("p", key, 8, chat_template=False) == [
        chat_tokenizer("the cat")["input_ids"]
    ]


def test_response_text_drops_the_eos(chat_tokenizer) -> None:
    ids = chat_tokenizer("the cat")["input_ids"] + [chat_tokenizer.eos_token_id]
    assert response_text(chat_tokenizer, ids) == "the cat"


def test_explicit_setting_enters_trial_ids_and_trace_keys() -> None:
    plans = {
        setting: plan_sweep(parse_sweep(SWEEP % extra))
        for setting, extra in [
            (None, ""),
            (True, ", chat_template: true"),
            (False, ", chat_template: false"),
        ]
    }
    ids = {setting: {t.trial_id for t in plan.trials} for setting, plan in plans.items()}
    assert ids[None].isdisjoint(ids[True]) and ids[True].isdisjoint(ids[False])
    assert ids[None].isdisjoint(ids[False])
    traces = {s: replay_groups(plan)[0].trace_key for s, plan in plans.items()}
    assert len(set(traces.values())) == 3
    assert {t.prompts.chat_template for t in plans[False].trials} == {False}


def test_preflight_reports_a_required_template_the_target_lacks(chat_tokenizer) -> None:
    plan = plan_sweep(parse_sweep(SWEEP % ", chat_template: true"))
    problems: list[str] = []
    _check_chat_templates(plan, PreparedInputs(tokenizers={"p": chat_tokenizer}), problems)
    assert problems == []
    _check_chat_templates(plan, PreparedInputs(tokenizers={"p": _plain(chat_tokenizer)}), problems)
    assert problems == [
        "dataset builtin:code: chat_template is true but the target of pair p "
        "(zoo:micro/target) has no chat template"
    ]
