"""Train a small character-level transformer language model, then let it write.

    python examples/char_lm.py                     # trains in about a minute, then samples
    python examples/char_lm.py --plot              # also write the loss curve (matplotlib)
    python examples/char_lm.py --epochs 3          # stop early (a checkpoint is saved) ...
    python examples/char_lm.py --resume            # ... and continue where it stopped
    python examples/char_lm.py --epochs 0 --resume --temperature 0.5   # only sample

The flow, as an MLX program writes it (only the imports say lazyx):

1. the text: ``make_text`` writes English-like sentences from a small grammar with a fixed
   seed (no download): a noun phrase agrees with its verb (``the cat sleeps`` / ``the
   cats sleep``), transitive verbs take an object, phrases and clauses are optional. Its
   characters are the vocabulary; the text is cut into windows of ``context`` characters,
   each with its next characters as the targets. A second text (another seed) is held out;
2. the model: a character embedding plus a learned position embedding, ``num_layers``
   pre-norm blocks (``RMSNorm -> MultiHeadAttention`` under a causal mask, ``RMSNorm ->
   Linear -> gelu -> Linear``, each added back to the residual stream), a final
   ``RMSNorm`` and the embedding reused as the output projection;
3. ``fit`` (``examples/training.py``): AdamW with a linear warm-up joined to a cosine decay
   and the gradients clipped to norm 1, compiled into one replayed node; a tqdm bar with the
   loss and the tokens per second; a safetensors checkpoint after each epoch that
   ``--resume`` continues from with the losses of an uninterrupted run (the schedule's
   position is the optimizer's step count, which the checkpoint holds);
4. sampling: starting from a prompt, the model's next-character logits divided by the
   temperature go to ``mx.random.categorical``, one character at a time.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

import lazyx.core as mx
import lazyx.nn as nn
import lazyx.optimizers as optim

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # training.py, also under runpy
from training import command_line, fit, plot_losses, shuffled_batches  # noqa: E402

# The grammar: nouns and verbs as (singular, plural) pairs, so that agreement is learnable.
NOUNS = [("cat", "cats"), ("dog", "dogs"), ("bird", "birds"), ("child", "children"),
         ("farmer", "farmers"), ("teacher", "teachers"), ("fox", "foxes"), ("horse", "horses")]
ADJECTIVES = ["small", "lazy", "quiet", "happy", "brown", "clever", "tired", "young"]
INTRANSITIVE = [("sleeps", "sleep"), ("runs", "run"), ("sings", "sing"), ("waits", "wait"),
                ("laughs", "laugh")]
TRANSITIVE = [("sees", "see"), ("likes", "like"), ("follows", "follow"), ("finds", "find"),
              ("watches", "watch")]
PLACES = ["in the garden", "near the river", "under a tree", "on the hill", "at the farm",
          "by the old barn"]


def make_text(num_sentences: int, seed: int = 0) -> str:
    """``num_sentences`` lines from the grammar, drawn with the NumPy generator of ``seed``."""
    rng = np.random.default_rng(seed)
    pick = lambda options: options[rng.integers(len(options))]  # noqa: E731

    def noun_phrase():
        plural = rng.random() < 0.4
        words = [pick(["the", "some"] if plural else ["the", "a"])]
        if rng.random() < 0.5:
            words.append(pick(ADJECTIVES))
        words.append(pick(NOUNS)[plural])
        return " ".join(words), plural

    def clause():
        subject, plural = noun_phrase()
        if rng.random() < 0.5:
            words = [subject, pick(INTRANSITIVE)[plural]]
        else:
            words = [subject, pick(TRANSITIVE)[plural], noun_phrase()[0]]
        if rng.random() < 0.4:
            words.append(pick(PLACES))
        return " ".join(words)

    lines = []
    for _ in range(num_sentences):
        sentence = clause()
        if rng.random() < 0.25:
            sentence += pick([" and ", " but ", " while "]) + clause()
        lines.append(sentence + ".\n")
    return "".join(lines)


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, dims: int, num_heads: int):
        super().__init__()
        self.attention_norm = nn.RMSNorm(dims)
        self.attention = nn.MultiHeadAttention(dims, num_heads)
        self.mlp_norm = nn.RMSNorm(dims)
        self.up = nn.Linear(dims, 4 * dims)
        self.down = nn.Linear(4 * dims, dims)

    def __call__(self, x, mask):
        y = self.attention_norm(x)
        x = x + self.attention(y, y, y, mask)
        return x + self.down(nn.gelu(self.up(self.mlp_norm(x))))


class CharLM(nn.Module):
    """Character and position embeddings, ``num_layers`` causal blocks, tied output layer."""

    def __init__(self, vocab_size: int, context: int, dims: int, num_heads: int, num_layers: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dims)
        self.positions = nn.Embedding(context, dims)
        self.blocks = [Block(dims, num_heads) for _ in range(num_layers)]
        self.norm = nn.RMSNorm(dims)

    def __call__(self, tokens):
        length = tokens.shape[1]
        x = self.embedding(tokens) + self.positions(mx.arange(length))
        mask = nn.MultiHeadAttention.create_additive_causal_mask(length)
        for block in self.blocks:
            x = block(x, mask)
        return self.embedding.as_linear(self.norm(x))


def loss_fn(model, tokens, targets):
    return nn.losses.cross_entropy(model(tokens), targets, reduction="mean")


class Vocabulary:
    """The characters of a text, each with its index (sorted, so the same text gives the
    same indices)."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.index[c] for c in text], np.int32)

    def decode(self, tokens) -> str:
        return "".join(self.chars[int(t)] for t in tokens)


def windows(tokens: np.ndarray, context: int):
    """``(inputs, targets)``: the text cut into ``context``-long windows, ``targets`` the
    inputs shifted by one character."""
    n = (len(tokens) - 1) // context
    return (tokens[:n * context].reshape(n, context),
            tokens[1:n * context + 1].reshape(n, context))


def generate(model, vocab: Vocabulary, prompt: str, length: int, context: int,
             temperature: float = 0.8, seed: int = 0) -> str:
    """``length`` characters after ``prompt``, each drawn from the model's next-character
    distribution at ``temperature`` given the last ``context`` characters."""
    tokens = vocab.encode(prompt).tolist()
    key = mx.random.key(seed)
    for _ in range(length):
        key, sub = mx.random.split(key)
        logits = model(mx.array([tokens[-context:]], mx.int32))[0, -1]
        tokens.append(mx.random.categorical(logits / temperature, key=sub).item())
    return vocab.decode(tokens[len(prompt):])


def main(epochs: int = 6, batch_size: int = 32, context: int = 64, dims: int = 96,
         num_heads: int = 4, num_layers: int = 2, learning_rate: float = 3e-3,
         warmup_steps: int = 30, decay_steps: int = 300, num_sentences: int = 3000,
         seed: int = 0, checkpoint: str | None = "char_lm.safetensors", resume: bool = False,
         plot: str | None = None, compile: bool = True, progress: bool = True,
         sample_length: int = 240, temperature: float = 0.8, prompt: str = "the ") -> dict:
    """Train, checkpoint, measure the held-out loss, sample. Returns ``{"losses",
    "validation_loss", "sample", "vocab_size", "vocabulary"}``.

    The learning rate rises linearly over ``warmup_steps`` and then follows a cosine down to a
    tenth of ``learning_rate`` at ``decay_steps``, whatever ``epochs`` is (so a run stopped
    early and resumed sees the schedule of an uninterrupted one)."""
    text = make_text(num_sentences, seed=0)
    vocab = Vocabulary(text)
    x_train, y_train = windows(vocab.encode(text), context)
    held_out = make_text(max(num_sentences // 10, 1), seed=1)
    x_val, y_val = windows(vocab.encode(held_out), context)

    mx.random.seed(seed)
    model = CharLM(len(vocab), context, dims, num_heads, num_layers)
    schedule = optim.join_schedules(
        [optim.linear_schedule(0.0, learning_rate, warmup_steps),
         optim.cosine_decay(learning_rate, decay_steps - warmup_steps, learning_rate / 10)],
        [warmup_steps])
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01)
    losses = fit(model, optimizer, loss_fn, shuffled_batches((x_train, y_train), batch_size, seed),
                 epochs=epochs, steps_per_epoch=len(x_train) // batch_size,
                 items_per_step=batch_size * context, unit="tokens", checkpoint=checkpoint,
                 resume=resume, compile=compile, max_grad_norm=1.0, progress=progress)

    validation_loss = loss_fn(model, mx.array(x_val), mx.array(y_val)).item()
    print(f"vocabulary {len(vocab)} characters (untrained loss ln {len(vocab)} = "
          f"{math.log(len(vocab)):.3f}); after {len(losses)} steps: training loss "
          f"{losses[-1] if losses else float('nan'):.3f}, held-out loss {validation_loss:.3f}")
    sample = generate(model, vocab, prompt, sample_length, context, temperature, seed)
    print(f"sample at temperature {temperature}:\n{prompt}{sample}")
    if plot:
        plot_losses(losses, plot, title="character transformer")
    return {"losses": losses, "validation_loss": validation_loss, "sample": sample,
            "vocab_size": len(vocab), "vocabulary": vocab.chars}


if __name__ == "__main__":
    command_line(main, __doc__)
