"""The prompts the benchmarks against llama.cpp share (a given text, and a task that mostly repeats or
extracts from it), how a prompt is put to a model as one chat turn, and a tool's reply without its
end-of-turn text: one place for bench_vs_llamacpp.py, bench_mtp_vs_llamacpp.py, bench_prefill.py and
replay_ngram.py."""

from __future__ import annotations

CODE = '''\
import csv
from dataclasses import dataclass


@dataclass
class Item:
    name: str
    quantity: int
    price: float


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, quantity, price):
        if name in self.items:
            self.items[name].quantity += quantity
        else:
            self.items[name] = Item(name, quantity, price)

    def remove(self, name, quantity):
        item = self.items[name]
        if item.quantity < quantity:
            raise ValueError("not enough " + name)
        item.quantity -= quantity
        if item.quantity == 0:
            del self.items[name]

    def total_value(self):
        total = 0
        for item in self.items.values():
            total += item.quantity * item.price
        return total

    def load(self, path):
        with open(path) as f:
            for row in csv.DictReader(f):
                self.add(row["name"], int(row["quantity"]), float(row["price"]))

    def save(self, path):
        with open(path, "w") as f:
            writer = csv.writer(f)
            writer.writerow(["name", "quantity", "price"])
            for item in self.items.values():
                writer.writerow([item.name, item.quantity, item.price])
'''

DOCUMENT = '''\
Minutes of the project meeting, 14 March

Present: Alice Martin (project lead, alice.martin@example.org), Bob Chen (backend developer,
bob.chen@example.org), Carla Rossi (designer, carla.rossi@example.org), David Okafor (QA engineer,
david.okafor@example.org) and Eva Novak (product owner, eva.novak@example.org).

1. Release 2.3 is planned for 28 March. Bob reported that the new export API is finished and
   documented; two endpoints still need rate limits. Owner: Bob Chen, due 21 March.
2. Carla presented the redesigned settings page. The team agreed to ship it behind a feature flag.
   Owner: Carla Rossi, due 25 March.
3. David found 14 regressions in the nightly run, 3 of them blocking. Owner: David Okafor, due 18 March.
4. Eva asked for a migration guide for customers on version 1.x. Owner: Alice Martin, due 27 March.
5. The next meeting is on 21 March at 10:00 in room B2.
'''

PROMPTS = {
    "code-rewrite": ("Rewrite the following Python module: add type hints to every method and a one-line "
                     "docstring to every method. Output the complete module.\n\n```python\n" + CODE + "```\n"),
    "code-rename": ("In the following Python module, rename the class Inventory to Stock and the method "
                    "total_value to value. Output the complete module, unchanged otherwise.\n\n```python\n"
                    + CODE + "```\n"),
    "extract-actions": ("From the meeting minutes below, list every action item as a line "
                        "'owner | task | due date', then list every person as 'name | role | email'.\n\n"
                        + DOCUMENT),
    "doc-rewrite": ("Rewrite the meeting minutes below as a Markdown document with a heading per numbered "
                    "item, keeping every sentence.\n\n" + DOCUMENT),
}


def prompt_text(engine, prompt: str) -> str:
    """The prompt as one user turn in the model's chat template, as text llama.cpp's tools tokenize
    the same way (special tokens parsed, BOS added by the tokenizer, so not written out); a model
    without a template gets the question-and-answer frame of ``localspec bench``."""
    from localspec.chat import render_chat

    target = engine.target
    if target.chat_template() is None:
        return f"Question: {prompt}\n\nAnswer:\n"
    bos = target.token_text(target.bos) if target.bos >= 0 else ""
    eos = target.token_text(target.eos) if target.eos >= 0 else ""
    text = render_chat(target.chat_template(), [{"role": "user", "content": prompt}], bos_token=bos,
                       eos_token=eos, model_name=target.name)
    return text[len(bos):] if bos and text.startswith(bos) else text


END_TEXTS = ("<|im_end|>", "<end_of_turn>", "<eos>", "</s>")


def plain_reply(text: str) -> str:
    """A tool's reply without the end-of-turn text and trailing blank lines it prints."""
    text = text.rstrip()
    for end in END_TEXTS:
        if text.endswith(end):
            text = text[: -len(end)].rstrip()
    return text
