"""Regenerate ``quickstart_document.txt``: a chronicle of made-up village events (no sentence repeated: small
models copy repetitive text into their memory in loops) with one planted fact in the first chunk, the answer to
the quickstart's default question "What is the magic number?" (7481): the memory has to carry it through every
later chunk to the answer. ~1.4K SmolLM2 tokens, 3 chunks of 500."""

import random
import textwrap
from pathlib import Path

# fmt: off
PEOPLE = [
    "the old miller", "a young weaver", "the baker's daughter", "the village priest", "a travelling merchant",
    "the blacksmith", "two fishermen", "the schoolteacher", "a shepherd boy", "the mayor", "the innkeeper",
    "an elderly widow", "the ferryman", "a group of children", "the carpenter", "the midwife", "a tinker",
    "the miller's wife", "a retired sailor", "the postman", "a painter from the city", "the gardener",
]
# fmt: on
# fmt: off
ACTIONS = [
    "mended a torn net", "counted sacks of flour", "repaired the chapel roof", "sold ribbons and buttons",
    "taught the alphabet to six pupils", "carried water up the hill", "painted the harbour at sunrise",
    "argued about the price of wool", "planted a row of pear trees", "sharpened a dozen scythes",
    "lost a silver spoon in the pond", "read old letters aloud", "rebuilt a fallen stone wall",
    "tuned the church organ", "caught an eel as long as an arm", "baked bread for the wedding",
    "chased a goat through the orchard", "wrote the names of the dead in a ledger", "lit the lanterns on the pier",
    "traded a lamb for a copper kettle", "swept the steps of the town hall", "watched the herons in the reeds",
]
# fmt: on
# fmt: off
PLACES = [
    "by the river", "near the stone bridge", "in the market square", "behind the chapel", "by the mill pond",
    "under the great oak", "at the edge of the forest", "on the harbour wall", "in the crowded inn",
    "beside the old well", "in a narrow lane", "on the windy hill", "at the crossroads",
]
# fmt: on
# fmt: off
TIMES = [
    "before dawn", "one grey afternoon", "late in the evening", "on market day", "during the first snow",
    "after the harvest", "while the bells rang", "as the fog rolled in", "at midsummer", "on a quiet Sunday",
    "in the spring of the flood", "the week the comet was seen",
]
# fmt: on
# fmt: off
REMARKS = [
    "Nobody thought much of it at the time.", "People still talk about it.", "It rained for three days afterwards.",
    "The dogs would not stop barking.", "Everyone agreed it was a strange year.",
    "The story changed with every telling.", "The smell of smoke hung over the roofs.",
    "A cold wind came down from the hills.", "Later that night the river rose.", "Few remember it now.",
    "It was written down in the parish book.", "The children made a song about it.",
]
# fmt: on
FACT = (
    "That winter the innkeeper told a traveller the secret the village had kept for years: the magic number is "
    "7481. She made him promise never to repeat it."
)


def main() -> None:
    rng = random.Random(11)
    seen: set[str] = set()

    def sentence() -> str:
        while True:
            s = f"{rng.choice(TIMES).capitalize()}, {rng.choice(PEOPLE)} {rng.choice(ACTIONS)} {rng.choice(PLACES)}."
            if s not in seen:
                seen.add(s)
                return s

    paragraphs = []
    for _ in range(18):
        sentences = [sentence() for _ in range(rng.randint(3, 4))]
        if rng.random() < 0.6:
            sentences.insert(rng.randint(1, len(sentences)), rng.choice(REMARKS))
        paragraphs.append(" ".join(sentences))
    paragraphs.insert(3, FACT)
    text = "A chronicle of the village of Eastwick\n\n" + "\n\n".join(textwrap.fill(p, 100) for p in paragraphs)
    Path(__file__).with_name("quickstart_document.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
