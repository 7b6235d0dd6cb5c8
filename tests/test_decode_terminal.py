"""What a person sees when ``otm decode`` runs in a terminal, through a pseudo-terminal rendered by pyte
(a VT100 emulator), and what a pipe receives.

The run is seeded: ``--json`` gives its text; the same run on a 64-column terminal must show that text
intact on the screen (line breaks aside), the live figures only on the bottom line while it runs,
and the final measurements once; piped, stdout is the text alone.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios

import pyte
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

WORDS = ["the", "sky", "is", "blue", "because", "light", "scatters", "in", "air", "and", "red", "sun", "sets",
         "late", "while", "waves", "roll", "over", "sand", "."]
COLUMNS, ROWS = 64, 40


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Llama target/draft pair over a word-level vocabulary (text with spaces), saved to disk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("words")
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    paths = []
    for name, seed in (("target", 30), ("draft", 31)):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                          initializer_range=0.5, bos_token_id=None, eos_token_id=None, pad_token_id=None)
        LlamaForCausalLM(cfg).eval().save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        paths.append(str(root / name))
    return paths


def command(pair, *extra):
    target, draft = pair
    return [sys.executable, "-m", "otm.cli", "decode", "--prompt", "the sky is", "--raw", "--target", target,
            "--draft", draft, "-k", "3", "--length", "2", "--max-new-tokens", "60", "--seed", "5", "--threads", "1",
            *extra]


def run_in_terminal(argv) -> tuple[pyte.Screen, str]:
    """Run argv on a pseudo-terminal of COLUMNS x ROWS; the rendered screen and the raw bytes."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin/stdout/stderr are the terminal, of this size
        fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}  # pytest sets them
        os.execve(argv[0], argv, env)
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, b"".join(chunks).decode(errors="replace")[-2000:]
    raw = b"".join(chunks).decode()
    screen = pyte.Screen(COLUMNS, ROWS)
    pyte.Stream(screen).feed(raw.replace("\n", "\r\n"))  # the tty's onlcr, as a terminal shows it
    return screen, raw


def squeeze(text: str) -> str:
    return "".join(text.split())


@pytest.mark.slow
def test_terminal_shows_the_text_intact_and_the_figures_on_one_line(pair):
    result = subprocess.run(command(pair, "--json"), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    expected = json.loads(result.stdout)
    text = expected["text"]
    assert len(text.split()) >= 40  # enough text to wrap several times on 64 columns
    screen, raw = run_in_terminal(command(pair))
    lines = [line.rstrip() for line in screen.display]
    content = [line for line in lines if line]
    summary = [line for line in content if "block efficiency" in line]
    assert summary, "\n".join(content)
    body = "\n".join(content[: content.index(summary[0])])
    assert squeeze(body) == squeeze(text), (body, text)  # every word, in order, nothing else
    assert all(len(line) < COLUMNS for line in content[: content.index(summary[0])])  # no line ran past the edge
    assert "per target call" in raw  # the live figures were shown while it ran ...
    assert "per target call" not in body  # ... and never left on the text


@pytest.mark.slow
def test_piped_stdout_is_the_text_alone(pair):
    piped = subprocess.run(command(pair), capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0, piped.stderr
    as_json = json.loads(subprocess.run(command(pair, "--json"), capture_output=True, text=True, timeout=300).stdout)
    assert piped.stdout == as_json["text"] + "\n"
    assert "block efficiency" in piped.stderr and "\r" not in piped.stdout
    stats = as_json["stats"]
    assert stats["new_tokens"] == len(as_json["tokens"]) == 60 and stats["block_efficiency"] > 1
    quiet = subprocess.run(command(pair, "--quiet"), capture_output=True, text=True, timeout=300)
    assert quiet.stdout == piped.stdout
