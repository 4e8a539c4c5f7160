"""The word lists of the embedded model's two word families: a small sentence grammar and rhyme groups.

Grammar (the `grammar` family): every sentence is

    DET [ADJ] NOUN VERB DET [ADJ] NOUN .

over 200 words (10 determiners, 50 adjectives, 90 nouns, 50 verbs), e.g. `the red fox chased my
small cat.` A prompt is the sentence's first two or three words; a response is valid when prompt
and response together parse. Which words may follow is decided by the word before, so the model's
per-position distributions are spread over many words of different lengths: letters committed in
one forward from different words make a non-word.

Rhyme groups (the `rhyme` family): a word rhymes with another of its group (the group shares its
last letters), so `Q: rhymes with cat? A:` has eight valid answers.
"""

from __future__ import annotations

DETERMINERS = ("the", "one", "every", "my", "your", "his", "her", "our", "this", "that")
ADJECTIVES = (
    "red", "blue", "green", "black", "white", "brown", "pink", "grey", "gold", "yellow",
    "big", "small", "tall", "short", "long", "old", "young", "new", "fast", "slow",
    "happy", "sad", "angry", "calm", "brave", "shy", "quiet", "loud", "kind", "proud",
    "tiny", "huge", "soft", "warm", "cold", "wet", "dry", "clean", "dirty", "bright",
    "dark", "sleepy", "hungry", "clever", "lazy", "busy", "funny", "gentle", "wild", "lucky",
)  # fmt: skip
NOUNS = (
    "cat", "dog", "fox", "cow", "pig", "hen", "owl", "bat", "rat", "bee",
    "ant", "bird", "fish", "frog", "duck", "goat", "lamb", "lion", "bear", "wolf",
    "deer", "horse", "mouse", "sheep", "tiger", "zebra", "snake", "whale", "camel", "rabbit",
    "monkey", "turtle", "spider", "parrot", "donkey", "king", "queen", "girl", "boy", "baby",
    "child", "man", "woman", "farmer", "doctor", "teacher", "sailor", "pilot", "cook", "judge",
    "ball", "book", "cake", "hat", "box", "cup", "key", "pen", "ring", "shoe",
    "boat", "car", "bus", "train", "kite", "drum", "lamp", "chair", "table", "clock",
    "bell", "coin", "rock", "tree", "flower", "apple", "lemon", "bread", "river", "cloud",
    "star", "moon", "house", "door", "garden", "castle", "bridge", "window", "road", "hill",
)  # fmt: skip
VERBS = (
    "saw", "liked", "found", "chased", "helped", "kicked", "pushed", "pulled", "lifted", "carried",
    "painted", "washed", "followed", "watched", "visited", "greeted", "loved", "hated", "fed", "hid",
    "held", "bit", "hit", "met", "kept", "caught", "bought", "sold", "took", "made",
    "broke", "fixed", "opened", "closed", "dropped", "threw", "called", "woke", "pinched", "hugged",
    "tickled", "counted", "cleaned", "dried", "warmed", "moved", "touched", "ate", "drew", "brought",
)  # fmt: skip

WORDS_BY_TAG: dict[str, tuple[str, ...]] = {"DET": DETERMINERS, "ADJ": ADJECTIVES, "NOUN": NOUNS, "VERB": VERBS}
# Part of speech of each grammar word (no word is in two lists).
PART_OF_SPEECH: dict[str, str] = {w: tag for tag, words in WORDS_BY_TAG.items() for w in words}

# The sentence as a sequence of slots; optional adjectives are the only choice of shape.
_NOUN_PHRASE = (("DET",), ("DET", "ADJ"))


def sentence_shapes() -> list[tuple[str, ...]]:
    """The four part-of-speech sequences a sentence can have (without the final period)."""
    return [subject + ("NOUN", "VERB") + obj + ("NOUN",) for subject in _NOUN_PHRASE for obj in _NOUN_PHRASE]


def parses(words: list[str]) -> bool:
    """Whether `words` (period removed) is one whole sentence of the grammar."""
    tags = tuple(PART_OF_SPEECH.get(w, "?") for w in words)
    return tags in sentence_shapes()


def is_sentence_start(words: list[str]) -> bool:
    """Whether `words` begins some sentence of the grammar (a prompt the family can continue)."""
    tags = tuple(PART_OF_SPEECH.get(w, "?") for w in words)
    return bool(words) and any(shape[: len(tags)] == tags for shape in sentence_shapes())


RHYME_GROUPS: tuple[tuple[str, ...], ...] = (
    ("bat", "cat", "hat", "mat", "rat", "sat", "fat", "flat"),
    ("bake", "cake", "lake", "make", "rake", "take", "wake", "snake"),
    ("king", "ring", "sing", "wing", "thing", "bring", "sting", "swing"),
    ("light", "night", "might", "right", "sight", "fight", "tight", "bright"),
    ("core", "more", "shore", "store", "score", "bore", "wore", "snore"),
    ("bell", "cell", "fell", "sell", "shell", "smell", "spell", "well"),
    ("lock", "rock", "sock", "dock", "clock", "block", "shock", "knock"),
    ("rain", "pain", "gain", "main", "train", "brain", "chain", "plain"),
    ("jump", "bump", "dump", "lump", "pump", "stump", "plump", "thump"),
    ("fun", "bun", "gun", "run", "sun", "spun", "stun", "nun"),
)


def rhyme_group(word: str) -> tuple[str, ...] | None:
    for group in RHYME_GROUPS:
        if word in group:
            return group
    return None


def vocabulary_text() -> str:
    """The grammar and the rhyme words, as the app shows them to a user writing a prompt."""
    return "\n".join(
        [
            "Sentence: DET [ADJ] NOUN VERB DET [ADJ] NOUN .",
            "DET: " + ", ".join(DETERMINERS),
            "ADJ: " + ", ".join(ADJECTIVES),
            "NOUN: " + ", ".join(NOUNS),
            "VERB: " + ", ".join(VERBS),
            "Rhyme groups: " + "; ".join(", ".join(g) for g in RHYME_GROUPS),
        ]
    )
