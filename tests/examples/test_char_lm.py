"""examples/char_lm.py: the grammar's text, a short run of the transformer that learns it,
--resume giving the losses of an uninterrupted run, and sampling."""

import math
import re

import numpy as np
import pytest
from example_runs import load_example, run_eager_and_compiled, run_whole_and_resumed

# A model and a text small enough for a few seconds per run on 2 cores.
SMALL = dict(batch_size=16, context=32, dims=48, num_heads=4, num_layers=2, warmup_steps=5,
             decay_steps=60, num_sentences=300, sample_length=40)


@pytest.fixture(scope="module")
def example():
    return load_example("char_lm", "tqdm")


def test_the_text_is_fixed_by_its_seed_and_follows_the_grammar(example):
    make_text = example["make_text"]
    text = make_text(200, seed=0)
    assert text == make_text(200, seed=0) != make_text(200, seed=1)
    lines = text.split("\n")
    assert len(lines) == 201 and lines[-1] == "" and all(line.endswith(".") for line in lines[:-1])
    # Subjects agree with their verbs: no singular noun before a plural verb or vice versa.
    verbs = example["INTRANSITIVE"] + example["TRANSITIVE"]
    for singular, plural in example["NOUNS"]:
        for verb_singular, verb_plural in verbs:
            assert not re.search(rf"\b{singular} {verb_plural}\b", text)
            assert not re.search(rf"\b{plural} {verb_singular}\b", text)
    assert re.search(r"\bcats? (sleeps?|sees?)\b", text)


def test_short_run_learns_and_resume_matches_an_uninterrupted_run(example, tmp_path):
    # The warm-up and cosine schedule continue from the optimizer's step in the checkpoint.
    whole, resumed = run_whole_and_resumed(example["main"], tmp_path, epochs=3, stop=2, **SMALL)
    losses, chance = whole["losses"], math.log(whole["vocab_size"])
    assert len(losses) >= 3 * 20
    # From about ln(vocab) (uniform guessing) to well below it: the model has learned the
    # words, not only the letter frequencies.
    assert losses[0] > 0.9 * chance
    assert np.mean(losses[-10:]) < 0.6 * chance
    assert whole["validation_loss"] < 0.6 * chance
    sample = whole["sample"]
    assert len(sample) == SMALL["sample_length"] and set(sample) <= set(whole["vocabulary"])
    assert resumed["sample"] == sample


def test_eager_step_gives_the_compiled_losses(example):
    # A shorter text: 7 steps are enough to compare.
    eager, compiled = run_eager_and_compiled(example["main"], **dict(SMALL, num_sentences=120))
    np.testing.assert_allclose(np.mean(eager["losses"][-5:]), np.mean(compiled["losses"][-5:]),
                               rtol=0.05)


def test_generate_continues_a_prompt_with_characters_of_the_vocabulary(example):
    import lazyx.core as mx

    vocab = example["Vocabulary"]("abc .\n")
    mx.random.seed(0)
    model = example["CharLM"](len(vocab), 8, 16, 2, 1)
    text = example["generate"](model, vocab, "ab", 20, context=8, temperature=1.0, seed=3)
    assert len(text) == 20 and set(text) <= set("abc .\n")
    # The same key gives the same text; the window slides past the context length.
    assert text == example["generate"](model, vocab, "ab", 20, context=8, temperature=1.0, seed=3)
    assert vocab.decode(vocab.encode("a b.\n")) == "a b.\n"
