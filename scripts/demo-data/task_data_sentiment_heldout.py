"""The `sentiment` demo data's held-out set, frozen: exactly the file version 1 of the generator
wrote (60 reviews). Its pools (H_*) and drawing code (heldout_review) are version 1's,
untouched; it draws from its own Random(SEEDS["sentiment"]) advanced by H_SKIP 32-bit words,
where version 1's 300-example training draw left that stream. The training set
(task_data_sentiment.py) has its own seed and pools, so growing them never moves a byte here."""

from __future__ import annotations

import random

from task_data_common import SEEDS

# ---- held-out (frozen) ----------------------------------------------------------------------

# product -> features it has; a sentence that needs a feature only goes with such a product
H_PRODUCTS = {
    "laptop": {"battery", "electric", "screen", "hard", "hinge"},
    "tablet": {"battery", "electric", "screen", "bluetooth", "hard"},
    "bike light": {"battery", "electric", "light", "hard"},
    "portable radio": {"battery", "electric", "sound", "hard"},
    "rice cooker": {"electric", "lid", "kitchen", "hard"},
    "saucepan": {"handle", "coating", "kitchen", "lid", "hard"},
    "thermos": {"lid", "liquid", "insulated", "hard"},
    "suitcase": {"zip", "handle", "hard"},
    "winter coat": {"zip", "fabric", "wear"},
    "bar stool": {"seat", "furniture", "hard"},
    "folding table": {"furniture", "hard", "hinge"},
    "duvet": {"sleep", "fabric"},
}
# a neutral first sentence naming the product; followed by a sentence of any label
H_OPENERS = ["Picked up this {p} in the spring sale.", "My partner chose this {p}.",
             "This is the {p} from the new range.", "Bought the {p} for our holiday flat."]
# label -> (sentence, feature it needs or None). {p} = the product; {day}/{colour} = slots
H_SENTENCES = {
    "negative": [
        ("The hinge snapped on day two.", "hinge"), ("Gave up on me after ten days.", "electric"),
        ("Two parts were missing from the box.", "hard"), ("It arrived scratched and bent.", "hard"),
        ("Went straight back to the shop.", None), ("Nobody from customer service ever got back to me.", None),
        ("Fell to pieces within a fortnight.", None), ("I regret buying the {p}.", None),
        ("Not worth half the price.", None), ("Won't hold a charge anymore.", "battery"),
        ("The {p} turns itself off at random.", "electric"),
        ("The screen has a dead stripe down the middle.", "screen"),
        ("The non-stick surface scratched on the first day.", "coating"),
        ("A wheel came off at the airport.", "suitcase"),
        ("The seams split after two weeks.", "fabric"), ("It tips over as soon as you lean on it.", "furniture"),
        ("Rust appeared after a single wash.", "coating"),
    ],
    "positive": [
        ("Does exactly what I needed, and then some.", None), ("Worth every penny.", None),
        ("Brilliant {p}, highly recommended.", None), ("I'm impressed by how solid the {p} feels.", "hard"),
        ("After six months it still looks brand new.", None), ("Ordered another one as a gift.", None),
        ("A joy to use.", None), ("Couldn't be happier with it.", None),
        ("Lasts a whole week between charges.", "battery"),
        ("The picture is superb, even outdoors.", "screen"), ("Heats up evenly and is easy to clean.", "kitchen"),
        ("Warm, light and beautifully stitched.", "fabric"), ("Rock solid and easy to fold away.", "furniture"),
        ("Rolls smoothly and fits in the overhead locker.", "suitcase"),
    ],
    "neutral": [
        ("The courier brought it on {day}.", None), ("It's the {colour} version.", None),
        ("Came wrapped in paper inside a plain box.", None), ("I went for size large.", "wear"),
        ("Shipped from a warehouse in Rotterdam.", None), ("The invoice was inside the parcel.", None),
        ("I collected the {p} from the post office on {day}.", None), ("The {p} comes with a two-year warranty.", None),
        ("It runs on mains power.", "electric"),
    ],
}
# general verdicts: stand alone, or close a review after a specific sentence
H_VERDICTS = {"Not worth half the price.", "I regret buying the {p}.", "Worth every penny.", "A joy to use.",
              "Couldn't be happier with it.", "Brilliant {p}, highly recommended."}
H_SLOTS = {"day": ["Friday", "Saturday", "Sunday"], "colour": ["beige", "yellow", "purple", "silver"]}
H_REQUIRED = {"input": "The hinge snapped on day two.", "output": "negative"}
H_SKIP = 4297  # 32-bit words version 1 drew for its training set before the held-out set
H_COUNT = 20  # per label
LABELS = ["positive", "negative", "neutral"]


def fits(product_feats: set, product: str, need: str | None) -> bool:
    return need is None or need in product_feats or need == product  # a feature, or the product itself


def heldout_review(rng: random.Random, label: str) -> str:
    """Version 1's review(), for the held-out split: one opinion sentence, a neutral opener plus
    one sentence, or two sentences of the same label."""
    products = H_PRODUCTS
    day, colour = rng.choice(H_SLOTS["day"]), rng.choice(H_SLOTS["colour"])
    p = rng.choice(sorted(products))
    fill = lambda s: s.format(p=p, day=day, colour=colour)
    ok = [s for s, need in H_SENTENCES[label] if fits(products[p], p, need)]
    r = rng.random()
    if r < 0.45:  # one sentence
        return fill(rng.choice(ok))
    if r < 0.8:  # a neutral opener + one sentence (neutral: the opener may stand alone)
        opener = fill(rng.choice(H_OPENERS))
        if label == "neutral" and rng.random() < 0.25:
            return opener
        return opener + " " + fill(rng.choice([s for s in ok if "{p}" not in s]))
    # two sentences of the same label: opinion: a specific one + a verdict; neutral: two facts
    # that share no slot (no "arrived on Monday. Delivered on Tuesday.")
    if label == "neutral":
        first = rng.choice(ok)
        clash = [k for k in ("{p}", "{day}", "{colour}") if k in first]
        second = rng.choice([s for s in ok if s != first and not any(k in s for k in clash)])
    else:
        first = rng.choice([s for s in ok if s not in H_VERDICTS])
        second = rng.choice([s for s in ok if s in H_VERDICTS and not ("{p}" in first and "{p}" in s)])
    return fill(first) + " " + fill(second)


def make_sentiment_heldout() -> list[dict]:
    rng = random.Random(SEEDS["sentiment"])
    for _ in range(H_SKIP):
        rng.getrandbits(32)
    rows = [dict(H_REQUIRED)]
    seen = {H_REQUIRED["input"]}
    for label in LABELS:
        n = sum(r["output"] == label for r in rows)
        while n < H_COUNT:
            text = heldout_review(rng, label)
            if text not in seen:
                seen.add(text)
                rows.append({"input": text, "output": label})
                n += 1
    rng.shuffle(rows)
    return rows
