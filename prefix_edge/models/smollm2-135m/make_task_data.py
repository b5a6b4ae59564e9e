"""Write train and held-out data for the three demo text tasks of tasks.toml (`sentiment`,
`translate`, `support`), so `prefix-edge eval` can score each task and `prefix-edge train` can
train a prefix for each. Every line is {"input": str, "output": str}; the input is what fills the
task's template, the output is the one correct answer.

    python prefix_edge/models/smollm2-135m/make_task_data.py   # rewrites data/<task>.{train,heldout}.jsonl

(The `order_json` data, data/order_json.train.jsonl and data/order_json.heldout.jsonl, is written by
make_data.py; this script does not touch it.)

Reproducible: fixed seeds (one per task, plus a second one for the sentiment training set), no
other source of randomness. Every held-out input differs from every training input, and the
held-out sets are built from separate pools (below), so a model must generalise rather than recall.

sentiment  (data/sentiment.*.jsonl: 900 train, 60 held-out; a third per label in both)
  input   a short product review, one to three sentences
  output  exactly one of: positive, negative, neutral
  neutral  factual statements with no opinion: delivery and courier details, packaging and gift
           wrapping, what is in the box, colour, size, weight, material, specifications, how
           and why it was bought, receipts ("Arrived in a brown box.", "It came by Royal Mail.",
           "The frame is steel.", "I paid with PayPal.")
  negative mostly *implicit* problems, a defect or a failure without a judgement word: broke,
           leaked, stopped working, missing parts, returned or refunded, poor fit, smell, noise,
           late delivery, unhelpful seller ("The zip broke on the first day.", "Sent it back and
           bought a different brand."), plus explicit verdicts ("Waste of money.")
  positive praise, explicit or implicit: durability, buying again, recommending it to friends,
           beating expectations, value, comfort ("Still going strong after a year.", "Liked it so
           much I bought the same one for my brother.", "Ten out of ten.")
  Products carry features (battery, zip, lid, ...) and a sentence that needs a feature, or names
  a product, only goes with a product that has it.
  Training (its own seed, T_* pools: 43 products, 20 openers, ~116 facts in 10 topics, ~140
  negative and ~120 positive opinions): a review is one sentence, or a neutral opener naming the
  product and/or neutral facts mixed with one or two opinions (fact + opinion, opinion + fact,
  opener + opinion, specific opinion + verdict, two specific opinions, opener or fact + opinion +
  verdict), or for neutral one to three facts and openers. Its label is that of its opinions;
  two sentences of one review never share a topic or a slot. No training sentence repeats or
  rewords a held-out one, and no held-out product, opener, day or colour appears in training.
  Held-out (frozen; the H_* pools and heldout_review are this script's first version, drawn from
  its own stream, see the sentiment section): different products, openers, opinion and fact
  sentences, days and colours; it contains "The hinge snapped on day two." (negative).

translate  (data/translate.*.jsonl: 300 train, 50 held-out)
  input   a short English sentence
  output  its French translation, as the task's examples write it: a space before ? and !,
          straight apostrophes, "heures" after a number ("à huit heures", "à une heure")
  Built from 17 patterns ("Where is the station?" -> "Où est la gare ?", "I would like two
  coffees, please." -> "Je voudrais deux cafés, s'il vous plaît.", "The museum opens at nine
  o'clock." -> "Le musée ouvre à neuf heures.", "My sister lives in Lyon." -> "Ma sœur habite
  à Lyon.", ...). Every noun carries its gender, plural and elision, so the articles (le/la/l'/les,
  un/une, ce/cet/cette/ces, mon/ma/mes), the contractions (à + le = au, de + le = du, ...), je ->
  j', ne -> n' and adjective agreement are derived, never typed per sentence. Only cities without
  an article are used (à Lyon), and adjectives are paired only with nouns they fit.
  Held-out: same patterns but disjoint nouns, places, names, cities, numbers, languages and time
  words, plus three patterns not in training ("There is a pharmacy near the school.", "Alice is
  34 years old.", "Is the zoo far from here?"), a third of the set.

support  (data/support.*.jsonl: 240 train, 40 held-out)
  input   a customer question to Ada about Nimbus Cloud Storage
  output  a short, polite answer (one or two sentences) that states the fact(s) of the support
          system prompt explicitly; nothing outside those facts
  13 fact types: price, storage, devices (by plan), family sharing, annual billing, Trash
  retention (by plan: 30 days Free, 180 days Plus and Family), sync on metered connections,
  password reset, staff and passwords, cancelling, refunds, outages, and hand-off to a human
  (billing dispute, legal request, lost access without a recovery e-mail: ask for the ticket
  number). The answer depends only on the fact type and its slot (the plan, the hand-off reason),
  never on the wording, so every phrasing of one question has the identical answer.
  Held-out: question phrasings (and hand-off situations) never used in training, and
  "How long do deleted files stay in the Trash on the Plus plan?".
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
SEEDS = {"sentiment": 31001, "translate": 31002, "support": 31003}


def write(name: str, rows: list[dict]) -> None:
    DATA.mkdir(exist_ok=True)
    with open(DATA / name, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    print(f"data/{name}: {len(rows)} examples")


def cap(s: str) -> str:
    return s[0].upper() + s[1:]


# ---------------------------------------------------------------------------------------------
# sentiment
#
# The held-out set is frozen: it is exactly the file version 1 of this script wrote (60 reviews).
# Its pools below (H_*) and its drawing code (heldout_review) are version 1's, untouched, and it
# draws from its own Random(SEEDS["sentiment"]) advanced by H_SKIP 32-bit words, which is where
# version 1's 300-example training draw left that stream. The training set has its own seed and
# its own, much larger pools (T_*), so growing them never moves a byte of the held-out file.

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


# ---- training -------------------------------------------------------------------------------
# Nothing here names a held-out product, day or colour, and no sentence repeats or rewords a
# held-out one (make_sentiment checks the inputs, the sentences and the product names).

T_SEED = 31004
T_COUNT = 300  # per label
# product -> features (a sentence needing a feature, or naming the product, only goes with it)
T_PRODUCTS = {
    "power bank": {"battery", "electric", "hard", "small"},
    "smartwatch": {"battery", "electric", "screen", "strap", "bluetooth", "hard", "wrist", "small"},
    "fitness tracker": {"battery", "electric", "screen", "strap", "bluetooth", "hard", "wrist", "small"},
    "wireless speaker": {"battery", "electric", "bluetooth", "sound", "hard"},
    "headset": {"battery", "electric", "bluetooth", "sound", "hard"},
    "e-reader": {"battery", "electric", "screen", "hard", "small"},
    "electric toothbrush": {"battery", "electric", "hard", "small"},
    "wireless keyboard": {"battery", "electric", "bluetooth", "hard"},
    "baby monitor": {"electric", "screen", "sound", "hard"},
    "electric kettle": {"electric", "lid", "handle", "liquid", "hard", "kitchen"},
    "blender": {"electric", "lid", "liquid", "hard", "kitchen", "motor"},
    "toaster": {"electric", "hard", "kitchen"},
    "coffee grinder": {"electric", "hard", "kitchen", "motor"},
    "vacuum cleaner": {"electric", "hard", "motor"},
    "hair dryer": {"electric", "hard", "motor"},
    "desk lamp": {"electric", "light", "hard"},
    "floor lamp": {"electric", "light", "hard"},
    "frying pan": {"handle", "coating", "kitchen", "hard", "hob"},
    "wok": {"handle", "coating", "kitchen", "hard", "hob"},
    "teapot": {"lid", "handle", "liquid", "hard", "kitchen"},
    "lunch box": {"lid", "hard", "kitchen"},
    "water bottle": {"lid", "liquid", "insulated", "hard"},
    "backpack": {"zip", "strap", "fabric"},
    "laptop bag": {"zip", "strap", "fabric"},
    "duffel bag": {"zip", "strap", "fabric"},
    "rain jacket": {"zip", "fabric", "wear", "waterproof"},
    "wool jumper": {"fabric", "wear"},
    "hoodie": {"fabric", "wear"},
    "pair of running shoes": {"shoes"},
    "pair of hiking boots": {"shoes", "waterproof"},
    "umbrella": {"waterproof"},
    "tent": {"zip", "fabric", "waterproof"},
    "office chair": {"seat", "furniture", "hard"},
    "garden chair": {"seat", "furniture", "hard"},
    "bookshelf": {"furniture", "hard", "shelf"},
    "shoe rack": {"furniture", "hard", "shelf"},
    "standing desk": {"furniture", "hard", "electric", "motor"},
    "pillow": {"sleep", "fabric"},
    "mattress": {"sleep"},
    "bath towel": {"fabric"},
    "yoga mat": set(),
    "phone case": {"hard", "small"},
    "wallet": {"small"},
}
# neutral first sentences that name the product (topic "purchase"); a review may open with one
T_OPENERS = [
    "Bought this {p} for my son.", "I ordered the {p} online.", "Ordered the {p} for work.",
    "Got this {p} as a birthday present.", "Bought the {p} for my mother.", "I bought the {p} to replace my old one.",
    "This {p} was a present from my aunt.", "We got the {p} when we moved house.", "I ordered the {p} for my office.",
    "My sister sent me this {p}.", "I ordered the {p} for the spare room.",
    "We bought the {p} along with a few other things.",
    "I chose this {p} after reading the reviews.", "Got the {p} for my student son.",
    "My dad asked me to order the {p}.", "I ordered the {p} for our new home.", "The {p} is for my brother.",
    "I bought the {p} before a trip abroad.", "My boss ordered the {p} for the team.",
    "I needed a new {p} quickly.",
]
# neutral facts by topic: (sentence, feature needed or None). Two facts in a review never share
# a topic or a slot, so no "Arrived on Monday. Delivered on Tuesday."
T_FACTS = {
    "delivery": [
        ("It arrived on {day}.", None), ("The {p} arrived on {day}.", None), ("Delivered on {day} morning.", None),
        ("Ordered last week, delivered on {day}.", None), ("The parcel was left with my neighbour.", None),
        ("It came by Royal Mail.", None), ("DPD delivered it to my office.", None),
        ("The driver left it in the porch.", None), ("Tracking showed it leaving the depot on {day}.", None),
        ("The parcel was sent from Manchester.", None), ("Delivery took four working days.", None),
        ("I paid extra for next-day delivery.", None), ("It came in two separate parcels.", None),
        ("The delivery needed a signature.", None), ("I picked it up from a parcel locker.", None),
        ("It was dispatched the day after I ordered.", None), ("The package had a customs label on it.", None),
        ("The seller is based in Glasgow.", None), ("The van came at about six in the evening.", None),
    ],
    "packaging": [
        ("Arrived in a brown box.", None), ("The {p} came in a cardboard box with the receipt.", None),
        ("The box is printed in German and English.", None), ("It was packed with brown paper padding.", None),
        ("The outer box has the shop's logo on it.", None), ("It came in a padded envelope.", "small"),
        ("It came flat-packed in one long box.", "furniture"), ("I asked for gift wrapping.", None),
        ("It came gift-wrapped with a card from the sender.", None),
    ],
    "contents": [
        ("It came with a charging cable.", "battery"), ("It comes with a USB-C cable and a short manual.", "battery"),
        ("The box contained the {p}, a manual and a plug.", "electric"),
        ("There is a bag of spare screws in the box.", "furniture"), ("It comes with an Allen key.", "furniture"),
        ("A UK plug adapter is included.", "electric"), ("It comes with two spare brush heads.", "electric toothbrush"),
        ("A storage bag is included.", "fabric"), ("The manual is in five languages.", None),
        ("There's a quick-start leaflet under the lid of the box.", None), ("It comes with a spare strap.", "strap"),
        ("A pump and a repair patch are in the bag.", "tent"),
    ],
    "colour": [
        ("The {p} is {colour}.", None), ("I ordered the {colour} one.", None),
        ("The only colour left was {colour}.", None),
        ("It also comes in {colour}.", None), ("I chose {colour} to match my kitchen.", "kitchen"),
        ("The {p} has a {colour} handle.", "handle"), ("It has a {colour} strap.", "strap"),
        ("The {p} is {colour} with a matt finish.", "hard"),
    ],
    "size": [
        ("I ordered a medium.", "wear"), ("I usually wear a small.", "wear"), ("It's a size 12.", "wear"),
        ("I ordered the UK size 8.", "shoes"), ("I wear a 42 in most brands.", "shoes"),
        ("It is about a metre tall.", "furniture"), ("It is forty centimetres deep.", "furniture"),
        ("It holds 1.7 litres.", "electric kettle"), ("It holds 750 ml.", "water bottle"),
        ("The screen measures six inches.", "e-reader"), ("The pan is 28 centimetres across.", "hob"),
        ("It sleeps two people.", "tent"), ("It's a double.", "mattress"),
        ("The mat is six millimetres thick.", "yoga mat"), ("It's a king size.", "pillow"),
    ],
    "weight": [
        ("The listing gives the weight as 300 grams.", "small"), ("It weighs about eight kilos.", "furniture"),
        ("The {p} weighs about the same as a bag of sugar.", "kitchen"), ("It weighs just under a kilo.", "shoes"),
        ("Packed, it weighs about three kilos.", "tent"),
    ],
    "material": [
        ("The {p} is made of cotton.", "wear"), ("The frame is steel.", "furniture"),
        ("The shelves are oak veneer.", "shelf"), ("The body is stainless steel.", "liquid"),
        ("The cover is cotton.", "sleep"), ("The outer layer is nylon.", "zip"), ("The lining is polyester.", "fabric"),
        ("The case is plastic with a metal back.", "wrist"), ("The upper is mesh.", "shoes"),
        ("It's made of leather.", "wallet"), ("The base is aluminium.", "hob"),
        ("The canopy is polyester.", "umbrella"),
    ],
    "specs": [
        ("It has three speed settings.", "motor"), ("It charges over USB-C.", "battery"),
        ("It has five brightness levels.", "light"), ("The cover is removable.", "sleep"),
        ("It has two side pockets.", "zip"), ("The zip is on the left side.", "zip"), ("It has a hood.", "rain jacket"),
        ("It is machine washable at thirty degrees.", "fabric"),
        ("It needs two screws to fix it to the wall.", "shelf"),
        ("The model number is printed on the base.", "hard"), ("It uses Bluetooth 5.", "bluetooth"),
        ("It has an aux input.", "sound"), ("It is rated at 1200 watts.", "motor"),
        ("It has six browning settings.", "toaster"), ("It needs assembling before use.", "furniture"),
    ],
    "purchase": [
        ("This is my second order from this shop.", None), ("I paid by card.", None), ("I paid with PayPal.", None),
        ("I used a discount code at checkout.", None), ("I bought it with birthday money.", None),
        ("I ordered it through the app.", None), ("It was the last one in stock.", None),
        ("I ordered two, one for each bedroom.", None), ("It's for my son's university room.", None),
        ("I bought it to use at the office.", None), ("It replaces one I had for ten years.", None),
        ("I ordered it on {day} night.", None), ("The receipt was emailed to me.", None),
        ("A paper receipt was taped to the box.", None), ("I asked the seller for a VAT invoice.", None),
    ],
    "usage": [
        ("I read the manual before using it.", None), ("It lives in the hall cupboard.", None),
        ("My husband set it up.", None),
        ("It's the 2024 model.", None), ("This is the larger of the two sizes.", None),
        ("My daughter mostly uses it.", None),
    ],
}
# label -> specific opinions: (sentence, feature needed or None[, "delivery"]). Mostly implicit
# (what happened, no judgement word); "delivery" ones never sit next to a delivery fact.
T_OPINIONS = {
    "negative": [
        ("Broke after three days.", None), ("It fell apart within a month.", None),
        ("The {p} broke the second time I used it.", None), ("Returned it after two days.", None),
        ("Looks nothing like the photos.", None), ("Support never replied to my emails.", None),
        ("Still waiting for a replacement after a month.", None), ("The {p} is much smaller than described.", None),
        ("Smells of chemicals even after a week.", None), ("I asked for a refund the same evening.", None),
        ("Sent it back and bought a different brand.", None),
        ("The order turned up three weeks late.", None, "delivery"),
        ("The first one never arrived, and the replacement came broken.", None, "delivery"),
        ("Came with a piece missing, so I couldn't use it.", None),
        ("The box was soaked and the {p} inside was damaged.", None, "delivery"),
        ("The seller stopped answering once I mentioned a refund.", None),
        ("Had to throw it away after a month.", None),
        ("It's already in the bin.", None), ("My old one from years ago still works better.", None),
        ("It came used, with someone else's hair on it.", None),
        ("Three replacements so far and every one has had the same fault.", None),
        ("The refund took two months and four phone calls.", None), ("It feels cheap and flimsy.", None),
        ("I've had to glue it back together twice.", None),
        ("The seller sent the wrong model and won't swap it.", None),
        ("Half the features in the listing don't exist.", None), ("The helpline hung up on me twice.", None),
        ("Every part of it feels like it's about to snap.", None),
        ("The colour is completely different from the picture.", None),
        ("Stopped working a week after the return window closed.", None),
        ("Arrived on time, but it was the wrong size.", None, "delivery"),
        ("Looks lovely, but it broke within a week.", None),
        ("The smell was so strong I had to leave it outside.", None),
        ("Arrived with a crack down the side.", "hard"), ("Half the screws were missing.", "furniture"),
        ("Cracked after a short drop onto carpet.", "hard"),
        ("The corner was smashed when I opened the parcel.", "hard"),
        ("Rattles when I shake it, so something inside is loose.", "hard"),
        ("There was a chip on the edge when I unpacked it.", "hard"), ("The paint chipped off within days.", "hard"),
        ("It stopped working after a week.", "electric"), ("The {p} was dead on arrival.", "electric"),
        ("Wouldn't even switch on out of the box.", "electric"),
        ("Trips the fuse every time I plug it in.", "electric"),
        ("The plug sparked the first time I used it.", "electric"),
        ("The power button stopped responding.", "electric"),
        ("Overheats after ten minutes of use.", "electric"), ("Kept me awake with its constant hum.", "electric"),
        ("Stopped charging after a week.", "battery"), ("The battery dies in under an hour.", "battery"),
        ("Gets so hot I can't touch it.", "battery"), ("Goes from full to empty in an afternoon.", "battery"),
        ("Only charges if the cable is held at an angle.", "battery"),
        ("The battery swelled up after a month.", "battery"),
        ("Needs charging twice a day.", "battery"),
        ("The {p} keeps disconnecting from my phone.", "bluetooth"),
        ("Drops the connection every few minutes.", "bluetooth"),
        ("Refuses to pair with my phone.", "bluetooth"),
        ("The screen went black after two days.", "screen"), ("The screen froze and never came back.", "screen"),
        ("The touchscreen ignores half my taps.", "screen"), ("The display is too dim to read indoors.", "screen"),
        ("The strap left a rash on my wrist.", "wrist"), ("Counts steps when I'm sitting on the sofa.", "wrist"),
        ("The strap snapped on day three.", "strap"), ("The strap buckle came off in my hand.", "strap"),
        ("The handle came loose after a few uses.", "handle"), ("The handle wobbles and gets scorching hot.", "handle"),
        ("It leaks all over the counter.", "liquid"), ("Leaked all over my bag the first time I filled it.", "liquid"),
        ("Everything tastes of plastic.", "liquid"), ("Mould grew inside within a week.", "liquid"),
        ("The lid doesn't close properly.", "lid"), ("The lid pops open in my bag.", "lid"),
        ("The coating flaked off into our food.", "coating"),
        ("Food sticks to it no matter how much oil I use.", "coating"),
        ("Warped the first time I put it on the hob.", "hob"),
        ("Coffee is lukewarm within an hour.", "insulated"), ("The outside gets wet with condensation.", "insulated"),
        ("The zip broke on the first day.", "zip"), ("The zip jams every single time.", "zip"),
        ("The zip pull came off in my hand.", "zip"), ("Looks lovely, but the zip broke within a week.", "zip"),
        ("The stitching came apart within a week.", "fabric"), ("The fabric bobbled after one wash.", "fabric"),
        ("A hole appeared in the lining within a week.", "fabric"), ("Sheds fluff over everything.", "fabric"),
        ("The colour ran in the first wash.", "wear"), ("Shrank two sizes in the wash.", "wear"),
        ("Way too tight across the shoulders.", "wear"), ("The sleeves are ridiculously short.", "wear"),
        ("Too itchy to wear for more than an hour.", "wear"), ("The print faded after two washes.", "wear"),
        ("Soaked through in light rain.", "waterproof"),
        ("Lets water in the moment it starts to drizzle.", "waterproof"),
        ("My clothes underneath were wet after ten minutes outside.", "rain jacket"),
        ("The ribs bent in the first gust of wind.", "umbrella"),
        ("The pegs bent the first time I pitched it.", "tent"),
        ("Only lasted one camping trip.", "tent"),
        ("Blisters after a short walk.", "shoes"), ("The sole peeled away within a month.", "shoes"),
        ("The laces snapped on the first run.", "shoes"), ("Pinches my toes no matter how I lace them.", "shoes"),
        ("One leg is shorter than the others, so it wobbles.", "furniture"),
        ("The holes didn't line up, so I couldn't build it.", "furniture"),
        ("The shelves bow under a few paperbacks.", "shelf"),
        ("The seat cracked after a month.", "seat"), ("The cushion has already sagged.", "seat"),
        ("Squeaks every time I move.", "seat"), ("Sinks lower every hour until I'm at knee height.", "office chair"),
        ("The bulb flickers constantly.", "light"),
        ("The light is a harsh blue-white that gives me a headache.", "light"),
        ("Went completely flat after a couple of nights.", "sleep"), ("Gave me a stiff neck every morning.", "sleep"),
        ("Lumpy after a few nights.", "sleep"),
        ("The sound crackles at any volume.", "sound"), ("Hisses constantly, even with nothing playing.", "sound"),
        ("The bass distorts at half volume.", "sound"),
        ("So loud I have to leave the room when it's on.", "motor"),
        ("The motor burned out after a few uses.", "motor"),
        ("Smells of burning rubber every time I use it.", "motor"),
        ("Loses suction after a few minutes.", "vacuum cleaner"), ("Takes ages to boil a litre.", "electric kettle"),
        ("Burns one side of the bread and leaves the other pale.", "toaster"),
        ("The keys stick and double-type.", "wireless keyboard"),
        ("The mat slides about on a wooden floor.", "yoga mat"),
        ("The towel leaves fluff all over me.", "bath towel"),
        ("The card slots stretched and cards fall out.", "wallet"),
        ("My phone cracked inside it after one drop.", "phone case"),
    ],
    "positive": [
        ("Works perfectly and looks great.", None), ("The {p} is excellent value for money.", None),
        ("Love it, I use it every day.", None), ("Sturdy, well made and arrived quickly.", None),
        ("Much better than the one I had before.", None), ("My wife loves the {p}.", None),
        ("Still going strong after a year.", None), ("Bought a second one for my parents.", None),
        ("The {p} does its job brilliantly.", None), ("I've already recommended it to three friends.", None),
        ("Told my friends about it, and two of them bought one.", None),
        ("Better than I expected for the price.", None),
        ("Far better than the pricier one I had before.", None),
        ("Two years in and it works like the first day.", None),
        ("Used it almost daily for a year and it has never let me down.", None),
        ("It has survived two house moves without a mark.", None),
        ("Liked it so much I bought the same one for my brother.", None),
        ("Already on my second, because my daughter took my first.", None), ("I'd happily pay double.", None),
        ("Half the price of the big brands and just as good.", None), ("You won't find better at this price.", None),
        ("Exceeded my expectations in every way.", None), ("Nicer in person than in the photos.", None),
        ("Arrived early and works like a dream.", None, "delivery"),
        ("The seller sorted out a small issue within hours.", None), ("Easy to set up, even for me.", None),
        ("Set up in five minutes, no manual needed.", None), ("My mum uses it without any help.", None),
        ("I'll never go back to my old one.", None), ("Gets used every single morning.", None),
        ("Still my favourite after all this time.", None), ("Does everything the listing promised.", None),
        ("Looks far more expensive than it was.", None), ("Everyone who visits asks where I got it.", None),
        ("Feels like it will last for years.", None), ("Simple, reliable and does the job.", None),
        ("The {p} has made my mornings so much easier.", None), ("Pleasantly surprised by the quality.", None),
        ("Still the first thing I reach for.", None), ("I use it far more than I expected to.", None),
        ("The kids use it daily and it has survived them.", None),
        ("Lovely finish, it feels like a premium product.", None),
        ("The box was battered, but the {p} inside was perfect.", None, "delivery"),
        ("A bit heavy, but it does everything well.", None), ("Two of my colleagues have ordered one since.", None),
        ("Has survived being dropped more times than I can count.", "hard"),
        ("Strong, and lighter than it looks.", "hard"),
        ("Switches on instantly and hasn't missed a beat.", "electric"),
        ("The battery lasts for days.", "battery"), ("Charges quickly and holds it all week.", "battery"),
        ("One charge covers my commute for days.", "battery"),
        ("Battery life is far longer than advertised.", "battery"),
        ("Goes from empty to full in under an hour.", "battery"),
        ("Connects to my phone instantly every time.", "bluetooth"),
        ("Pairs in seconds and never drops out.", "bluetooth"),
        ("The screen is sharp and bright.", "screen"), ("Colours on the screen really pop.", "screen"),
        ("The display is crisp and responsive.", "screen"),
        ("Tracks my runs accurately.", "wrist"), ("So comfortable I forget it's on my wrist.", "wrist"),
        ("The strap is comfortable all day.", "strap"),
        ("Crystal clear sound and easy to pair.", "sound"), ("Rich, full sound even at low volume.", "sound"),
        ("Loud enough to fill the garden.", "sound"),
        ("Cleans up easily and nothing sticks.", "coating"), ("Fried eggs slide right off.", "coating"),
        ("Sits flat on the hob and gets hot quickly.", "hob"),
        ("Keeps drinks cold all day.", "insulated"), ("Tea poured at breakfast is still hot at teatime.", "insulated"),
        ("Not a drop has escaped, even upside down in my bag.", "lid"),
        ("The handle stays cool and feels secure.", "handle"),
        ("Fits perfectly and feels really soft.", "wear"), ("Kept me completely dry in a downpour.", "rain jacket"),
        ("Fits like it was made for me.", "wear"), ("True to size and very flattering.", "wear"),
        ("Washed it a dozen times and the colour hasn't faded.", "wear"),
        ("Stays soft after dozens of washes.", "fabric"), ("Thick, soft and dries quickly.", "bath towel"),
        ("Plenty of pockets and the zip runs smoothly.", "zip"),
        ("The zip glides and the pockets hold everything.", "zip"),
        ("Survived a week of heavy rain without a drop getting in.", "waterproof"),
        ("Stayed up through a proper storm.", "tent"), ("Doesn't turn inside out even in strong wind.", "umbrella"),
        ("Cushioned enough for a half marathon.", "shoes"), ("No blisters, even on the first long walk.", "shoes"),
        ("Grips well on wet pavements.", "shoes"),
        ("Comfortable from the very first day.", "seat"), ("I can sit in it all day without back pain.", "seat"),
        ("Went together in ten minutes and feels solid.", "furniture"),
        ("Assembly was quick and every screw was there.", "furniture"),
        ("Holds all my books without bending.", "shelf"),
        ("Gives a lovely warm light.", "light"), ("Bright enough to read by and easy on the eyes.", "light"),
        ("Best night's sleep I've had in months.", "sleep"), ("I wake up without a sore neck now.", "sleep"),
        ("Stays cool all night.", "sleep"),
        ("Powerful and surprisingly quiet.", "motor"), ("Quieter than any {p} I've owned.", "motor"),
        ("Toast comes out evenly golden every time.", "toaster"), ("Picks up every bit of dog hair.", "vacuum cleaner"),
        ("Typing on it is a pleasure.", "wireless keyboard"), ("Grinds beans evenly in seconds.", "coffee grinder"),
        ("Dries my hair in half the time.", "hair dryer"),
        ("My dentist noticed the difference.", "electric toothbrush"),
        ("Boils in no time and switches off by itself.", "electric kettle"),
        ("Smoothies come out silky with no lumps.", "blender"), ("Hears the baby's every murmur.", "baby monitor"),
        ("Grippy even in a hot yoga class.", "yoga mat"), ("Slim, and my phone has survived every drop.", "phone case"),
        ("Holds all my cards and still slips into a pocket.", "wallet"),
        ("Goes up and down smoothly at the touch of a button.", "standing desk"),
    ],
}
# general verdicts: stand alone, or close a review after a specific opinion
T_VERDICTS = {
    "negative": ["Waste of money.", "Really disappointed with the {p}.", "Would not buy again.",
                 "Terrible quality for the price.", "I wouldn't recommend it to anyone.", "Avoid this one.",
                 "One star, and only because zero isn't an option.", "Complete rubbish.",
                 "More trouble than it's worth.", "Save your money and buy something else.", "A total letdown.",
                 "I expected much better."],
    "positive": ["Exactly as described, very happy.", "Great quality, I'd buy it again.",
                 "Five stars, no complaints at all.", "Really pleased with this purchase.",
                 "Would buy again without hesitation.", "Ten out of ten.", "Absolutely love it.",
                 "So glad I bought it.", "Best purchase I've made this year.", "Can't fault it.",
                 "I've told all my friends to get one.", "Really happy with the {p}."],
}
T_SLOTS = {"day": ["Monday", "Tuesday", "Wednesday", "Thursday"],
           "colour": ["black", "white", "grey", "navy", "red", "green", "blue", "pink", "orange", "brown"]}
SLOT_KEYS = ("{p}", "{day}", "{colour}")


def train_review(rng: random.Random, label: str) -> str:
    """One training review of `label`, in one of these shapes:
    neutral           a fact | an opener | opener + fact | fact + fact | opener + fact + fact
    positive/negative an opinion | opener + opinion | fact + opinion | opinion + fact |
                      specific opinion + verdict | two specific opinions | opener or fact +
                      specific opinion + verdict
    An opinion is a specific one or a verdict; openers and facts are neutral, so the label is the
    opinion's. No two sentences share a slot or a topic."""
    p = rng.choice(sorted(T_PRODUCTS))
    feats = T_PRODUCTS[p]
    day, colour = rng.choice(T_SLOTS["day"]), rng.choice(T_SLOTS["colour"])
    facts = [(s, topic) for topic, pool in T_FACTS.items() for s, need in pool if fits(feats, p, need)]
    taken: list[tuple[str, str | None]] = []  # (sentence, topic) chosen so far

    def clashes(s: str, topic: str | None) -> bool:
        return any((topic and topic == t) or any(k in s and k in u for k in SLOT_KEYS) for u, t in taken)

    def pick(pool: list[tuple[str, str | None]]) -> str:
        choice = rng.choice([(s, t) for s, t in pool if not clashes(s, t)])
        taken.append(choice)
        return choice[0]

    def opener() -> str:
        return pick([(s, "purchase") for s in T_OPENERS])

    r = rng.random()
    if label == "neutral":
        if r < 0.3:
            parts = [pick(facts)]
        elif r < 0.4:
            parts = [opener()]
        elif r < 0.6:
            parts = [opener(), pick(facts)]
        elif r < 0.9:
            parts = [pick(facts), pick(facts)]
        else:
            parts = [opener(), pick(facts), pick(facts)]
    else:
        specific = [(e[0], e[2] if len(e) > 2 else None) for e in T_OPINIONS[label] if fits(feats, p, e[1])]
        verdicts = [(s, None) for s in T_VERDICTS[label]]
        if r < 0.25:
            parts = [pick(specific + verdicts)]
        elif r < 0.4:
            parts = [opener(), pick(specific + verdicts)]
        elif r < 0.6:
            parts = [pick(facts), pick(specific + verdicts)]
        elif r < 0.7:
            first = pick(specific + verdicts)
            parts = [first, pick(facts)]
        elif r < 0.82:
            parts = [pick(specific), pick(verdicts)]
        elif r < 0.9:
            parts = [pick(specific), pick([(s, t) for s, t in specific if s != taken[0][0]])]
        else:
            parts = [opener() if rng.random() < 0.5 else pick(facts), pick(specific), pick(verdicts)]
    return " ".join(s.format(p=p, day=day, colour=colour) for s in parts)


def check_train_pools(heldout: list[dict]) -> None:
    """Training text never repeats a held-out sentence or names a held-out product, day or colour."""
    h_sents = {s.lower() for pool in H_SENTENCES.values() for s, _ in pool} | {s.lower() for s in H_OPENERS}
    t_sents = ([s for pool in T_FACTS.values() for s, _ in pool] + T_OPENERS
               + [e[0] for pool in T_OPINIONS.values() for e in pool] + [s for v in T_VERDICTS.values() for s in v])
    assert len(t_sents) == len(set(t_sents)), "a training sentence is listed twice"
    banned = [w.lower() for w in H_SLOTS["day"] + H_SLOTS["colour"]]
    banned += [p for p in H_PRODUCTS if p != "laptop"] + ["laptop "]  # "laptop bag" is a training product
    words = " ".join(t_sents + sorted(T_PRODUCTS) + T_SLOTS["day"] + T_SLOTS["colour"]).lower()
    for s in t_sents:
        assert s.lower() not in h_sents, f"held-out sentence in the training pools: {s}"
    for b in banned:
        assert b not in words.replace("laptop bag", ""), f"held-out name in the training pools: {b}"
    for row in heldout:  # held-out sentences and whole inputs never occur inside training text
        assert row["input"].lower() not in words


def make_sentiment() -> None:
    heldout = make_sentiment_heldout()
    check_train_pools(heldout)
    rng = random.Random(T_SEED)
    seen = {r["input"] for r in heldout}
    train = []
    for label in LABELS:
        n = 0
        while n < T_COUNT:
            text = train_review(rng, label)
            if text not in seen:
                seen.add(text)
                train.append({"input": text, "output": label})
                n += 1
    rng.shuffle(train)
    h_sents = {s.format(p=p, day=d, colour=c) for pool in H_SENTENCES.values() for s, _ in pool
               for p in H_PRODUCTS for d in H_SLOTS["day"] for c in H_SLOTS["colour"]}
    assert not any(s in r["input"] for r in train for s in h_sents), "a held-out sentence in a training input"
    for split, rows in (("train", train), ("heldout", heldout)):
        write(f"sentiment.{split}.jsonl", rows)
        print("   ", ", ".join(f"{label} {sum(r['output'] == label for r in rows)}" for label in LABELS))


# ---------------------------------------------------------------------------------------------
# translate

VOWELS = "aeiouyàâéèêëîïôûœAEIOUYÉ"


class N:
    """A noun: English singular/plural, French singular/plural, gender, elision, uses, split."""

    def __init__(self, en, fr, g, split, tags, en_pl=None, fr_pl=None, elide=None, adjs=(), mass=False):
        self.en, self.fr, self.g, self.split, self.tags = en, fr, g, split, set(tags.split())
        self.en_pl = en_pl or en + "s"
        self.fr_pl = fr_pl or fr + "s"
        self.elide = fr[0] in VOWELS if elide is None else elide  # l'hôtel, cet hôtel
        self.adjs = adjs.split() if isinstance(adjs, str) else list(adjs)
        self.mass = mass  # no plural in "describe" sentences (le café, la soupe)


def the(n: N, pl: bool = False) -> str:
    if pl:
        return "les " + n.fr_pl
    return ("l'" if n.elide else "le " if n.g == "m" else "la ") + n.fr


def a_fr(n: N) -> str:
    return ("un " if n.g == "m" else "une ") + n.fr


def to_the(n: N, pl: bool = False) -> str:  # à + le = au, à + les = aux
    if pl:
        return "aux " + n.fr_pl
    return ("à l'" if n.elide else "au " if n.g == "m" else "à la ") + n.fr


def of_the(n: N, pl: bool = False) -> str:  # de + le = du, de + les = des
    if pl:
        return "des " + n.fr_pl
    return ("de l'" if n.elide else "du " if n.g == "m" else "de la ") + n.fr


def this_fr(n: N, pl: bool = False) -> str:
    if pl:
        return "ces " + n.fr_pl
    return ("cet " if n.g == "m" and n.elide else "ce " if n.g == "m" else "cette ") + n.fr


def my_fr(n: N, pl: bool = False) -> str:
    if pl:
        return "mes " + n.fr_pl
    return ("mon " if n.g == "m" or n.elide else "ma ") + n.fr


def a_en(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


T = "train"
H = "heldout"
NOUNS = [
    # places: where / going / looking for (place), opening hours (hours), works at (work)
    N("station", "gare", "f", T, "place work"),
    N("museum", "musée", "m", T, "place hours work"),
    N("bank", "banque", "f", T, "place hours work indef"),
    N("pharmacy", "pharmacie", "f", T, "place hours work indef"),
    N("library", "bibliothèque", "f", T, "place hours work indef"),
    N("airport", "aéroport", "m", T, "place work"),
    N("hospital", "hôpital", "m", T, "place work indef", fr_pl="hôpitaux", elide=True),
    N("market", "marché", "m", T, "place hours work indef"),
    N("bakery", "boulangerie", "f", T, "place hours work indef"),
    N("post office", "poste", "f", T, "place hours work"),
    N("beach", "plage", "f", T, "place indef", en_pl="beaches"),
    N("park", "parc", "m", T, "place hours indef"),
    N("cinema", "cinéma", "m", T, "place work indef"),
    N("church", "église", "f", T, "place indef", en_pl="churches"),
    N("supermarket", "supermarché", "m", T, "place hours work indef"),
    N("swimming pool", "piscine", "f", T, "place hours work indef"),
    N("hotel", "hôtel", "m", T, "place work indef", elide=True),
    N("castle", "château", "m", H, "place hours", fr_pl="châteaux"),
    N("school", "école", "f", H, "place work indef"),
    N("theatre", "théâtre", "m", H, "place hours work indef"),
    N("zoo", "zoo", "m", H, "place hours work"),
    N("bookshop", "librairie", "f", H, "place hours work indef"),
    N("town hall", "mairie", "f", H, "place hours work"),
    N("cathedral", "cathédrale", "f", H, "place hours"),
    N("restaurant", "restaurant", "m", H, "place hours work indef"),
    N("tourist office", "office de tourisme", "m", H, "place hours work indef", fr_pl="offices de tourisme"),
    N("harbour", "port", "m", H, "place work"),
    # things to order
    N("coffee", "café", "m", T, "order describe", adjs="hot cold strong", mass=True),
    N("tea", "thé", "m", T, "order"),
    N("croissant", "croissant", "m", T, "order"),
    N("beer", "bière", "f", T, "order"),
    N("ticket", "billet", "m", T, "order have"),
    N("baguette", "baguette", "f", T, "order"),
    N("orange juice", "jus d'orange", "m", T, "order", fr_pl="jus d'orange"),
    N("bottle of water", "bouteille d'eau", "f", T, "order", en_pl="bottles of water", fr_pl="bouteilles d'eau"),
    N("glass of wine", "verre de vin", "m", T, "order", en_pl="glasses of wine", fr_pl="verres de vin"),
    N("hot chocolate", "chocolat chaud", "m", H, "order", fr_pl="chocolats chauds"),
    N("lemonade", "limonade", "f", H, "order"),
    N("postcard", "carte postale", "f", H, "order", fr_pl="cartes postales"),
    N("stamp", "timbre", "m", H, "order"),
    N("apple tart", "tarte aux pommes", "f", H, "order", fr_pl="tartes aux pommes"),
    # things to buy (price, do you have)
    N("umbrella", "parapluie", "m", T, "price"),
    N("hat", "chapeau", "m", T, "price", fr_pl="chapeaux"),
    N("shirt", "chemise", "f", T, "price"),
    N("dress", "robe", "f", T, "price", en_pl="dresses"),
    N("lamp", "lampe", "f", T, "price"),
    N("watch", "montre", "f", T, "price", en_pl="watches"),
    N("jacket", "veste", "f", T, "price"),
    N("scarf", "écharpe", "f", T, "price", en_pl="scarves"),
    N("coat", "manteau", "m", H, "price object", fr_pl="manteaux"),
    N("belt", "ceinture", "f", H, "price"),
    N("wallet", "portefeuille", "m", H, "price"),
    N("skirt", "jupe", "f", H, "price"),
    N("mirror", "miroir", "m", H, "price"),
    N("armchair", "fauteuil", "m", H, "price furniture"),
    # things to describe (adjectives they fit)
    N("house", "maison", "f", T, "describe", adjs="big small old beautiful expensive quiet"),
    N("room", "chambre", "f", T, "describe", adjs="big small clean quiet dark noisy"),
    N("garden", "jardin", "m", T, "describe", adjs="big small beautiful quiet"),
    N("car", "voiture", "f", T, "describe", adjs="old expensive fast red black small"),
    N("street", "rue", "f", T, "describe", adjs="quiet noisy long dark empty"),
    N("book", "livre", "m", T, "describe object price", adjs="long interesting old expensive heavy"),
    N("dog", "chien", "m", T, "describe have", adjs="big small black old friendly"),
    N("cat", "chat", "m", T, "describe have object", adjs="black white small old friendly"),
    N("apartment", "appartement", "m", T, "describe", adjs="big small expensive quiet clean dark"),
    N("kitchen", "cuisine", "f", T, "describe", adjs="small clean big dark"),
    N("bag", "sac", "m", T, "describe object price", adjs="heavy black small expensive"),
    N("soup", "soupe", "f", T, "describe", adjs="hot cold", mass=True),
    N("bike", "vélo", "m", H, "describe have", adjs="old expensive blue fast"),
    N("bed", "lit", "m", H, "describe furniture", adjs="comfortable big small"),
    N("road", "route", "f", H, "describe", adjs="long dangerous dark quiet"),
    N("bread", "pain", "m", H, "describe", adjs="fresh", mass=True),
    N("village", "village", "m", H, "describe", adjs="small quiet beautiful"),
    N("shop", "magasin", "m", H, "describe", adjs="closed open big small"),
    N("sea", "mer", "f", H, "describe notoo", adjs="cold calm blue", mass=True),
    # where things are
    N("phone", "téléphone", "m", T, "object"),
    N("key", "clé", "f", T, "object"),
    N("cup", "tasse", "f", T, "object"),
    N("letter", "lettre", "f", T, "object"),
    N("newspaper", "journal", "m", T, "object", fr_pl="journaux"),
    N("bottle", "bouteille", "f", T, "object"),
    N("table", "table", "f", T, "furniture"),
    N("chair", "chaise", "f", T, "furniture"),
    N("desk", "bureau", "m", T, "furniture", fr_pl="bureaux"),
    N("shelf", "étagère", "f", T, "furniture", en_pl="shelves"),
    N("sofa", "canapé", "m", T, "furniture"),
    N("pen", "stylo", "m", H, "object"),
    N("notebook", "cahier", "m", H, "object"),
    N("remote control", "télécommande", "f", H, "object"),
    N("plate", "assiette", "f", H, "object"),
    N("wardrobe", "armoire", "f", H, "furniture"),
    N("bench", "banc", "m", H, "furniture", en_pl="benches"),
    # people and animals one has
    N("brother", "frère", "m", T, "rel have"),
    N("sister", "sœur", "f", T, "rel have"),
    N("mother", "mère", "f", T, "rel"),
    N("father", "père", "m", T, "rel"),
    N("aunt", "tante", "f", T, "rel have"),
    N("uncle", "oncle", "m", T, "rel have"),
    N("grandmother", "grand-mère", "f", T, "rel"),
    N("son", "fils", "m", T, "rel have", fr_pl="fils"),
    N("child", "enfant", "m", T, "have", en_pl="children"),
    N("suitcase", "valise", "f", T, "have"),
    N("parents", "parents", "m", T, "relpl", en_pl="parents", fr_pl="parents"),  # plural only
    N("daughter", "fille", "f", H, "rel have"),
    N("husband", "mari", "m", H, "rel"),
    N("wife", "femme", "f", H, "rel", en_pl="wives"),
    N("grandfather", "grand-père", "m", H, "rel"),
    N("niece", "nièce", "f", H, "rel have"),
    N("nephew", "neveu", "m", H, "rel have", fr_pl="neveux"),
    N("rabbit", "lapin", "m", H, "have"),
    N("horse", "cheval", "m", H, "have", fr_pl="chevaux"),
    N("grandparents", "grands-parents", "m", H, "relpl", en_pl="grandparents", fr_pl="grands-parents"),
    # vehicles
    N("train", "train", "m", T, "vehicle"),
    N("bus", "bus", "m", T, "vehicle"),
    N("boat", "bateau", "m", T, "vehicle"),
    N("plane", "avion", "m", T, "vehicle"),
    N("ferry", "ferry", "m", H, "vehicle"),
    N("tram", "tram", "m", H, "vehicle"),
    N("shuttle", "navette", "f", H, "vehicle"),
    # food one likes (plural: countable, else mass with le/la/l')
    N("tomato", "tomate", "f", T, "food", en_pl="tomatoes"),
    N("carrot", "carotte", "f", T, "food"),
    N("mushroom", "champignon", "m", T, "food"),
    N("apple", "pomme", "f", T, "food"),
    N("strawberry", "fraise", "f", T, "food", en_pl="strawberries"),
    N("cheese", "fromage", "m", T, "foodmass"),
    N("chocolate", "chocolat", "m", T, "foodmass"),
    N("fish", "poisson", "m", T, "foodmass"),
    N("rice", "riz", "m", T, "foodmass"),
    N("onion", "oignon", "m", H, "food"),
    N("oyster", "huître", "f", H, "food", elide=True),  # l'huître (h muet)
    N("pear", "poire", "f", H, "food"),
    N("honey", "miel", "m", H, "foodmass"),
    N("garlic", "ail", "m", H, "foodmass"),
]

# English -> French forms: masc. sg, fem. sg, masc. pl, fem. pl; too: fits "too <adj>"
ADJ = {
    "big": ("grand", "grande", "grands", "grandes", True),
    "small": ("petit", "petite", "petits", "petites", True),
    "old": ("vieux", "vieille", "vieux", "vieilles", True),
    "beautiful": ("beau", "belle", "beaux", "belles", False),
    "expensive": ("cher", "chère", "chers", "chères", True),
    "quiet": ("calme", "calme", "calmes", "calmes", False),
    "calm": ("calme", "calme", "calmes", "calmes", False),
    "clean": ("propre", "propre", "propres", "propres", False),
    "empty": ("vide", "vide", "vides", "vides", False),
    "noisy": ("bruyant", "bruyante", "bruyants", "bruyantes", True),
    "long": ("long", "longue", "longs", "longues", True),
    "dark": ("sombre", "sombre", "sombres", "sombres", True),
    "interesting": ("intéressant", "intéressante", "intéressants", "intéressantes", False),
    "heavy": ("lourd", "lourde", "lourds", "lourdes", True),
    "black": ("noir", "noire", "noirs", "noires", False),
    "white": ("blanc", "blanche", "blancs", "blanches", False),
    "red": ("rouge", "rouge", "rouges", "rouges", False),
    "blue": ("bleu", "bleue", "bleus", "bleues", False),
    "hot": ("chaud", "chaude", "chauds", "chaudes", True),
    "cold": ("froid", "froide", "froids", "froides", True),
    "strong": ("fort", "forte", "forts", "fortes", True),
    "friendly": ("gentil", "gentille", "gentils", "gentilles", False),
    "fast": ("rapide", "rapide", "rapides", "rapides", False),
    "comfortable": ("confortable", "confortable", "confortables", "confortables", False),
    "dangerous": ("dangereux", "dangereuse", "dangereux", "dangereuses", True),
    "fresh": ("frais", "fraîche", "frais", "fraîches", False),
    "closed": ("fermé", "fermée", "fermés", "fermées", False),
    "open": ("ouvert", "ouverte", "ouverts", "ouvertes", False),
}


def adj_fr(adj: str, n: N, pl: bool) -> str:
    return ADJ[adj][(2 if pl else 0) + (1 if n.g == "f" else 0)]


NUM_EN = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight",
          9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}
NUM_FR = {2: "deux", 3: "trois", 4: "quatre", 5: "cinq", 6: "six", 7: "sept", 8: "huit", 9: "neuf",
          10: "dix", 11: "onze", 12: "douze"}
T_VOCAB = {
    "train": {
        "counts": [1, 2, 3, 4, 6, 8, 10],
        "hours": [1, 2, 3, 4, 6, 8, 10, 11],
        "names": ["Marie", "Paul", "Sophie", "Lucas", "Claire", "Thomas", "Emma", "Julie", "Louis",
                  "Anna", "David", "Sarah", "Nina", "Laura", "Martin"],
        # English -> French; only cities that take no article (à Lyon)
        "cities": {"Lyon": "Lyon", "Paris": "Paris", "Marseille": "Marseille", "Lille": "Lille",
                   "Nantes": "Nantes", "Bordeaux": "Bordeaux", "Toulouse": "Toulouse", "Nice": "Nice",
                   "Strasbourg": "Strasbourg", "London": "Londres", "Brussels": "Bruxelles",
                   "Geneva": "Genève", "Rome": "Rome", "Berlin": "Berlin", "Madrid": "Madrid"},
        "langs": {"English": "anglais", "Spanish": "espagnol", "German": "allemand",
                  "Italian": "italien", "Japanese": "japonais"},
        "when": {"tomorrow": "demain", "today": "aujourd'hui", "this evening": "ce soir",
                 "on Saturday": "samedi", "on Sunday": "dimanche"},
    },
    "heldout": {
        "counts": [5, 7, 9, 12],
        "hours": [5, 7, 9],
        "names": ["Alice", "Victor", "Jules", "Manon", "Pierre", "Julien", "Lucie", "Rose"],
        "cities": {"Rennes": "Rennes", "Grenoble": "Grenoble", "Montpellier": "Montpellier",
                   "Dijon": "Dijon", "Lisbon": "Lisbonne", "Vienna": "Vienne", "Venice": "Venise",
                   "Edinburgh": "Édimbourg"},
        "langs": {"Portuguese": "portugais", "Dutch": "néerlandais", "Chinese": "chinois",
                  "Russian": "russe"},
        "when": {"on Monday": "lundi", "on Friday": "vendredi", "this afternoon": "cet après-midi",
                 "next week": "la semaine prochaine"},
    },
}


def hour_fr(h: int) -> str:
    return "une heure" if h == 1 else NUM_FR[h] + " heures"


def qty(n: N, k: int) -> tuple[str, str]:  # "two coffees" / "deux cafés"; k == 1: "a coffee" / "un café"
    if k == 1:
        return a_en(n.en), a_fr(n)
    return f"{NUM_EN[k]} {n.en_pl}", f"{NUM_FR[k]} {n.fr_pl}"


class Ctx:
    def __init__(self, rng: random.Random, split: str):
        self.rng, self.split, self.v = rng, split, T_VOCAB[split]

    def noun(self, tag: str, exclude: N | None = None) -> N:
        return self.rng.choice([n for n in NOUNS if n.split == self.split and tag in n.tags and n is not exclude])

    def pick(self, key: str):
        vals = self.v[key]
        if isinstance(vals, dict):
            k = self.rng.choice(sorted(vals))
            return k, vals[k]
        return self.rng.choice(vals)

    def subject(self, kinds: str) -> tuple[str, str, str]:
        """(English, French, person) for one of the kinds: I we they he she name rel relpl."""
        kind = self.rng.choice(kinds.split())
        fixed = {"I": ("I", "je", "1s"), "we": ("we", "nous", "1p"), "they": ("they", "ils", "3p"),
                 "he": ("he", "il", "3s"), "she": ("she", "elle", "3s")}
        if kind in fixed:
            return fixed[kind]
        if kind == "name":
            name = self.pick("names")
            return name, name, "3s"
        if kind == "rel":
            n = self.noun("rel")
            return "my " + n.en, my_fr(n), "3s"
        n = self.noun("relpl")
        return "my " + n.en, "mes " + n.fr_pl, "3p"


EN_BE = {"1s": "am", "1p": "are", "3s": "is", "3p": "are"}


def en_verb(verb: str, person: str) -> str:  # "live" -> "lives" for he/she/it
    if person != "3s":
        return verb
    return verb + ("es" if verb.endswith(("ch", "sh", "s", "x", "o")) else "s")


def fr_er(subj: str, stem: str, person: str, neg: bool = False) -> str:
    """Subject + present tense of a regular -er verb: j'habite, nous parlons, il n'aime pas."""
    verb = stem + {"1s": "e", "1p": "ons", "3s": "e", "3p": "ent"}[person]
    if neg:
        verb = ("n'" if verb[0] in VOWELS + "h" else "ne ") + verb + " pas"
    if subj == "je" and verb[0] in VOWELS + "h":  # h muet in the verbs used here (habiter)
        return "j'" + verb
    return subj + " " + verb


# each pattern: Ctx -> (English, French)

def p_where(c: Ctx):
    n = c.noun("place")
    if c.rng.random() < 0.3:
        return f"Excuse me, where is the {n.en}?", f"Excusez-moi, où est {the(n)} ?"
    return f"Where is the {n.en}?", f"Où est {the(n)} ?"


def p_order(c: Ctx):
    n = c.noun("order")
    en, fr = qty(n, c.pick("counts"))
    form = c.rng.randrange(3)
    if form == 0:
        return f"I would like {en}, please.", f"Je voudrais {fr}, s'il vous plaît."
    if form == 1:
        return f"{cap(en)}, please.", f"{cap(fr)}, s'il vous plaît."
    return f"Could I have {en}, please?", f"Pourrais-je avoir {fr}, s'il vous plaît ?"


def p_hours(c: Ctx):
    n = c.noun("hours")
    h = c.pick("hours")
    en_v, fr_v = c.rng.choice([("opens", "ouvre"), ("closes", "ferme")])
    return f"The {n.en} {en_v} at {NUM_EN[h]} o'clock.", f"{cap(the(n))} {fr_v} à {hour_fr(h)}."


def p_lives(c: Ctx):
    en_s, fr_s, person = c.subject("I we name name rel rel relpl")
    city_en, city_fr = c.pick("cities")
    return (cap(f"{en_s} {en_verb('live', person)} in {city_en}."),
            cap(f"{fr_er(fr_s, 'habit', person)} à {city_fr}."))


def p_works(c: Ctx):
    en_s, fr_s, person = c.subject("I he she name name rel rel relpl")
    n = c.noun("work")
    return (cap(f"{en_s} {en_verb('work', person)} at the {n.en}."),
            cap(f"{fr_er(fr_s, 'travaill', person)} {to_the(n)}."))


def p_describe(c: Ctx):
    n = c.noun("describe")
    adj = c.rng.choice(n.adjs)
    pl = not n.mass and c.rng.random() < 0.3
    if pl:
        return f"The {n.en_pl} are {adj}.", f"Les {n.fr_pl} sont {adj_fr(adj, n, True)}."
    return f"The {n.en} is {adj}.", f"{cap(the(n))} est {adj_fr(adj, n, False)}."


def p_too(c: Ctx):
    n = c.rng.choice([n for n in NOUNS if n.split == c.split and "describe" in n.tags
                      and "notoo" not in n.tags and any(ADJ[a][4] for a in n.adjs)])
    adj = c.rng.choice([a for a in n.adjs if ADJ[a][4]])
    pl = not n.mass and c.rng.random() < 0.3
    if pl:
        return f"These {n.en_pl} are too {adj}.", f"Ces {n.fr_pl} sont trop {adj_fr(adj, n, True)}."
    return f"This {n.en} is too {adj}.", f"{cap(this_fr(n))} est trop {adj_fr(adj, n, False)}."


def p_location(c: Ctx):
    obj, furn = c.noun("object"), c.noun("furniture")
    pl = c.rng.random() < 0.3
    prep_en, prep_fr = c.rng.choice([("on", "sur " + the(furn)), ("under", "sous " + the(furn)),
                                     ("behind", "derrière " + the(furn)),
                                     ("next to", "à côté " + of_the(furn))])
    if pl:
        return f"The {obj.en_pl} are {prep_en} the {furn.en}.", f"Les {obj.fr_pl} sont {prep_fr}."
    return f"The {obj.en} is {prep_en} the {furn.en}.", f"{cap(the(obj))} est {prep_fr}."


def p_going(c: Ctx):
    en_s, fr_s, person = c.subject("I we they he she name")
    n = c.noun("place")
    aller = {"1s": "vais", "1p": "allons", "3s": "va", "3p": "vont"}[person]
    en, fr = f"{en_s} {EN_BE[person]} going to the {n.en}", f"{fr_s} {aller} {to_the(n)}"
    if c.rng.random() < 0.6:
        w_en, w_fr = c.pick("when")
        en, fr = f"{en} {w_en}", f"{fr} {w_fr}"
    return cap(en) + ".", cap(fr) + "."


def p_leaves(c: Ctx):
    n = c.noun("vehicle")
    h = c.pick("hours")
    if c.rng.random() < 0.4:
        nxt = "le prochain " if n.g == "m" else "la prochaine "
        return f"The next {n.en} leaves at {NUM_EN[h]} o'clock.", f"{cap(nxt)}{n.fr} part à {hour_fr(h)}."
    return f"The {n.en} leaves at {NUM_EN[h]} o'clock.", f"{cap(the(n))} part à {hour_fr(h)}."


def p_time(c: Ctx):
    h = c.pick("hours")
    it_is = c.rng.choice(["It is", "It's"])
    return f"{it_is} {NUM_EN[h]} o'clock.", f"Il est {hour_fr(h)}."


def p_have(c: Ctx):
    en_s, fr_s, person = c.subject("I I we she name")
    n = c.noun("have")
    k = c.pick("counts")
    if "rel" in n.tags and c.split == "train":  # "we have three sisters", not "eight sons"
        k = c.rng.choice([x for x in c.v["counts"] if x <= 4])
    en, fr = qty(n, k)
    avoir = {"1s": "ai", "1p": "avons", "3s": "a", "3p": "ont"}[person]
    subj_fr = "j'" if fr_s == "je" else fr_s + " "
    return cap(f"{en_s} {'has' if person == '3s' else 'have'} {en}."), cap(f"{subj_fr}{avoir} {fr}.")


def p_price(c: Ctx):
    n = c.noun("price")
    if c.rng.random() < 0.3:
        return f"How much are the {n.en_pl}?", f"Combien coûtent les {n.fr_pl} ?"
    return f"How much is the {n.en}?", f"Combien coûte {the(n)} ?"


def p_do_you_have(c: Ctx):
    n = c.noun("price")
    return f"Do you have {a_en(n.en)}?", f"Avez-vous {a_fr(n)} ?"


def p_like(c: Ctx):
    en_s, fr_s, person = c.subject("I I we she he name")
    n = c.noun(c.rng.choice(["food", "foodmass"]))
    en_food, fr_food = (n.en_pl, the(n, pl=True)) if "food" in n.tags else (n.en, the(n))
    kind = c.rng.choice(["like", "dislike", "love"])
    if kind == "dislike":
        en_v = "doesn't like" if person == "3s" else "don't like"
        fr = fr_er(fr_s, "aim", person, neg=True)
    else:
        en_v = en_verb(kind, person)
        fr = fr_er(fr_s, "aim" if kind == "like" else "ador", person)
    return cap(f"{en_s} {en_v} {en_food}."), cap(f"{fr} {fr_food}.")


def p_speak(c: Ctx):
    l_en, l_fr = c.pick("langs")
    form = c.rng.randrange(3)
    if form == 0:
        return f"Do you speak {l_en}?", f"Parlez-vous {l_fr} ?"
    en_s, fr_s, person = c.subject("I we she name rel")
    en, fr = f"{en_s} {en_verb('speak', person)} {l_en}", f"{fr_er(fr_s, 'parl', person)} {l_fr}"
    if form == 2:
        l2_en, l2_fr = c.pick("langs")
        if l2_en != l_en:
            en, fr = f"{en} and {l2_en}", f"{fr} et {l2_fr}"
    return cap(en) + ".", cap(fr) + "."


def p_looking(c: Ctx):
    n = c.noun("indef")
    if c.rng.random() < 0.7:
        return f"I am looking for {a_en(n.en)}.", f"Je cherche {a_fr(n)}."
    return f"We are looking for {a_en(n.en)}.", f"Nous cherchons {a_fr(n)}."


# held-out only

def p_near(c: Ctx):
    a = c.noun("indef")
    b = c.noun("place", exclude=a)
    return f"There is {a_en(a.en)} near the {b.en}.", f"Il y a {a_fr(a)} près {of_the(b)}."


def p_age(c: Ctx):
    if c.rng.random() < 0.5:
        name = c.pick("names")
        age = c.rng.randint(16, 70)
        return f"{name} is {age} years old.", f"{name} a {age} ans."
    n = c.noun("rel")
    lo, hi = {"daughter": (3, 30), "niece": (3, 30), "nephew": (3, 30), "grandfather": (70, 95)}.get(n.en, (30, 65))
    age = c.rng.randint(lo, hi)
    return f"My {n.en} is {age} years old.", cap(f"{my_fr(n)} a {age} ans.")


def p_far(c: Ctx):
    n = c.noun("place")
    return f"Is the {n.en} far from here?", f"Est-ce que {the(n)} est loin d'ici ?"


T_PATTERNS = [p_where, p_order, p_hours, p_lives, p_works, p_describe, p_too, p_location, p_going,
              p_leaves, p_time, p_have, p_price, p_do_you_have, p_like, p_speak, p_looking]
T_NEW_PATTERNS = [p_near, p_age, p_far]
T_COUNTS = {"train": 300, "heldout": 50}


def make_translate() -> None:
    rng = random.Random(SEEDS["translate"])
    seen: set[str] = set()
    out: dict[str, list] = {}
    counts: dict[str, dict[str, int]] = {"train": {}, "heldout": {}}
    for split in ("train", "heldout"):
        c = Ctx(rng, split)
        rows = []
        while len(rows) < T_COUNTS[split]:
            i = len(rows)
            if split == "heldout" and i % 3 == 2:  # a third: patterns never seen in training
                pattern = T_NEW_PATTERNS[(i // 3) % len(T_NEW_PATTERNS)]
            else:
                pattern = T_PATTERNS[rng.randrange(len(T_PATTERNS))]
            en, fr = pattern(c)
            if en not in seen:
                seen.add(en)
                rows.append({"input": en, "output": fr})
                counts[split][pattern.__name__[2:]] = counts[split].get(pattern.__name__[2:], 0) + 1
        out[split] = rows
    for split in ("train", "heldout"):
        write(f"translate.{split}.jsonl", out[split])
        print("   ", ", ".join(f"{k} {v}" for k, v in sorted(counts[split].items())))


# ---------------------------------------------------------------------------------------------
# support

PLAN_ANSWERS = {
    "price": {
        "Free": "The Free plan costs nothing and includes 5 GB on one device.",
        "Plus": "The Plus plan costs $4 per month and includes 200 GB on up to five devices.",
        "Family": "The Family plan costs $12 per month and includes 2 TB shared by up to six people.",
    },
    "storage": {
        "Free": "The Free plan gives you 5 GB of storage on one device.",
        "Plus": "The Plus plan gives you 200 GB of storage on up to five devices.",
        "Family": "The Family plan gives you 2 TB of storage, shared by up to six people.",
    },
    "devices": {  # the facts give no device count for Family, so it is not asked
        "Free": "The Free plan works on one device; the Plus plan covers up to five devices for $4 per month.",
        "Plus": "The Plus plan works on up to five devices.",
    },
    "trash": {
        "Free": "On the Free plan, deleted files stay in the Trash for 30 days; after that they are gone for good.",
        "Plus": "On the Plus plan, deleted files stay in the Trash for 180 days; after that they are gone for good.",
        "Family": "On the Family plan, deleted files stay in the Trash for 180 days; after that they are gone for "
                  "good.",
    },
}
HANDOFF_ANSWERS = {
    "billing": "I'm sorry about that. A billing dispute needs a person, so I will hand your ticket to a "
               "human colleague; could you please tell me your ticket number?",
    "legal": "Legal requests are handled by a person, so I will hand your ticket to a human colleague. "
             "Could you please tell me your ticket number?",
    "access": "I'm sorry you are locked out. Since there is no recovery e-mail, I will hand your ticket "
              "to a human colleague; could you please tell me your ticket number?",
}
PLAIN_ANSWERS = {
    "family": "The Family plan can be shared by up to six people, with 2 TB of storage for $12 per month.",
    "annual": "Annual billing is available and saves you two months compared with paying monthly.",
    "sync": "Sync pauses automatically on metered connections; you can resume it from Settings > Network.",
    "password_reset": "You can reset your password yourself at nimbus.example/reset.",
    "password_staff": "Support staff can never see or change a password, but you can reset it yourself at "
                      "nimbus.example/reset.",
    "cancel": "You can cancel a paid plan at any time, and if you paid annually, the unused part is refunded "
              "within 14 days.",
    "refund": "When you cancel an annual plan, the unused part is refunded within 14 days.",
    "outage": "Outages are posted at status.nimbus.example, so please check there for the current status.",
}
# fact -> split -> question phrasings ({plan} = the slot for plan facts)
QUESTIONS = {
    "price": {
        "train": ["How much does the {plan} plan cost?", "What's the monthly price of the {plan} plan?",
                  "What does the {plan} plan cost per month?", "How much would I pay for the {plan} plan?",
                  "Price of the {plan} plan, please?", "What do I get with the {plan} plan and how much is it?",
                  "I'm thinking about the {plan} plan. What's the price?", "Is the {plan} plan expensive?"],
        "heldout": ["Can you tell me the cost of the {plan} plan?", "How much do you charge for the {plan} plan?",
                    "What is the fee for the {plan} plan?"],
    },
    "storage": {
        "train": ["How much storage do I get with the {plan} plan?", "How many GB come with the {plan} plan?",
                  "What's the storage limit on the {plan} plan?", "How much space does the {plan} plan give me?",
                  "Storage size of the {plan} plan?", "I'm on the {plan} plan. How much can I store?",
                  "What is the capacity of the {plan} plan?"],
        "heldout": ["How big is the {plan} plan in terms of space?",
                    "If I sign up for the {plan} plan, how much room will I have for files?",
                    "What's the maximum amount of data on the {plan} plan?"],
    },
    "devices": {
        "train": ["How many devices can I use with the {plan} plan?", "What's the device limit on the {plan} plan?",
                  "On how many computers and phones can I use the {plan} plan?",
                  "I'm on the {plan} plan. How many devices can I connect?",
                  "Does the {plan} plan work on more than one device?",
                  "How many devices are allowed with the {plan} plan?",
                  "Can I install Nimbus on several devices with the {plan} plan?"],
        "heldout": ["I have a phone, a tablet and a laptop. Can they all use the {plan} plan?",
                    "Is there a maximum number of devices for the {plan} plan?"],
    },
    "trash": {
        "train": ["I'm on the {plan} plan. How long are deleted files kept?",
                  "How many days does the Trash keep my files on the {plan} plan?",
                  "If I delete something on the {plan} plan, how long can I still get it back?",
                  "What's the Trash retention period for {plan} accounts?",
                  "{plan} user here: when does the Trash get emptied?",
                  "How long before deleted files are removed permanently on the {plan} plan?",
                  "I accidentally deleted a folder. I have the {plan} plan; how long do I have to restore it?",
                  "On the {plan} plan, how long until files in the Trash are gone for good?",
                  "My account is on the {plan} plan. For how many days can I recover deleted files?"],
        "heldout": ["How long do deleted files stay in the Trash on the {plan} plan?",
                    "We use the {plan} plan. Is there a time limit on getting files back from the Trash?",
                    "With a {plan} account, how much time do I get to undo a deletion?",
                    ("I removed some photos from my laptop by mistake and I'm on the {plan} plan. "
                     "How long will they sit in the Trash?")],
    },
    "family": {
        "train": ["How many people can share the Family plan?", "Can I share my plan with my family?",
                  "Who can use the Family plan?", "How many members can join a Family plan?",
                  "Is there a plan for my whole household?", "Can my kids and my partner use my Nimbus storage?",
                  "What's the maximum number of users on the Family plan?",
                  "Does the Family plan allow several people?"],
        "heldout": ["My family has five people. Will the Family plan work for all of us?",
                    "What is the user limit for the Family plan?",
                    "Is there a way for relatives to share one storage plan?"],
    },
    "annual": {
        "train": ["Is it cheaper to pay yearly?", "Do you offer annual billing?",
                  "How much do I save if I pay for a year at once?", "Is there a discount for annual plans?",
                  "Should I pay monthly or yearly?", "What's the benefit of annual billing?",
                  "Can I pay once a year instead of every month?", "Does yearly billing save money?"],
        "heldout": ["Do you give a discount if I pay for twelve months up front?",
                    "What's the difference in price between monthly and annual payment?",
                    "Any savings from switching to yearly payments?"],
    },
    "sync": {
        "train": ["Why did my sync stop?", "Sync paused on its own. What happened?",
                  "My files are not syncing on my phone's mobile data.", "How do I resume sync?",
                  "Nimbus says sync is paused. How do I turn it back on?",
                  "Why does syncing stop when I use my hotspot?",
                  "Sync keeps pausing when I'm on a metered connection.", "Where do I restart a paused sync?",
                  "My uploads stopped while I was tethered to my phone.",
                  "Why isn't Nimbus syncing on my mobile connection?"],
        "heldout": ["Uploads froze when I switched to 4G. How do I get them going again?",
                    "The app shows 'paused' next to sync. Where can I fix that?",
                    "Is there a setting to continue syncing on a metered network?"],
    },
    "password_reset": {
        "train": ["I forgot my password.", "How do I reset my password?",
                  "I can't remember my password. What should I do?", "Where can I change my password?",
                  "How can I set a new password?", "My password isn't working anymore.",
                  "I need to reset my Nimbus password.", "Locked out because I forgot my password. Help?",
                  "What's the link for a password reset?"],
        "heldout": ["I keep typing the wrong password. How do I get a new one?",
                    "Lost my password, how do I choose a fresh one?",
                    "Is there a page where I can recover my password?"],
    },
    "password_staff": {
        "train": ["Can you tell me my password?", "Can you reset my password for me?",
                  "Could support look up my password?", "Please change my password to something new.",
                  "What is my current password?", "Can someone at Nimbus see my password?",
                  "Can you send me my password by e-mail?"],
        "heldout": ["Would a Nimbus employee be able to read my password?",
                    "Can you set my password to summer2024 for me?",
                    "Could you remind me what my password is?"],
    },
    "cancel": {
        "train": ["Can I cancel my subscription?", "Can I cancel my paid plan at any time?",
                  "I want to stop paying for Nimbus.", "Is there a minimum contract?",
                  "Can I cancel in the middle of the month?", "I'd like to cancel my Plus plan.",
                  "Can I end my Family plan whenever I want?", "Is it possible to cancel before the year is over?"],
        "heldout": ["Am I locked in, or can I quit whenever I like?",
                    "Please help me terminate my paid subscription.",
                    "What happens if I cancel my annual plan early?"],
    },
    "refund": {
        "train": ["Do I get money back if I cancel my annual plan?", "How long does a refund take?",
                  "When will I get my refund?", "Will you refund the rest of my yearly plan?",
                  "Is the unused part of an annual plan refunded?",
                  "I cancelled my annual plan. When does the refund arrive?",
                  "How many days until my refund is processed?"],
        "heldout": ["I paid for a full year but cancelled after four months. Do I get anything back?",
                    "How quickly are refunds for annual plans paid out?",
                    "Will the remaining months of my yearly subscription be reimbursed?"],
    },
    "outage": {
        "train": ["Is Nimbus down?", "Is there an outage right now?", "I can't reach Nimbus. Is the service down?",
                  "Where can I check if Nimbus is having problems?", "Are your servers down?",
                  "Nothing is loading. Is it just me?", "Where do you post outages?", "Is there a status page?"],
        "heldout": ["The website won't load for anyone in my office. Is something broken on your side?",
                    "How do I find out about service disruptions?",
                    "Everything timed out this morning. Was there an incident?"],
    },
    "handoff:billing": {
        "train": ["I was charged twice this month and want my money back.",
                  "You billed me $12 but I'm on the Plus plan.", "I dispute a charge on my credit card from Nimbus.",
                  "There's a charge I don't recognise on my bill.", "My invoice is wrong and I want to contest it.",
                  "Why was I charged after I cancelled? I want this fixed."],
        "heldout": ["My bank statement shows three Nimbus payments in one week. I want this investigated.",
                    "The amount you took from my account doesn't match my plan, and I'm disputing it."],
    },
    "handoff:legal": {
        "train": ["I have a court order requesting data from an account.",
                  "Our lawyer needs records of my account for a legal case.",
                  "This is a legal request regarding stored files.",
                  "I want to file a copyright complaint about a shared file.",
                  "The police asked me to get data from Nimbus."],
        "heldout": ["I'm a solicitor and need to submit a formal request for account data.",
                    "We received a subpoena that concerns a Nimbus account."],
    },
    "handoff:access": {
        "train": ["I can't log in and I no longer have access to my recovery e-mail.",
                  "I lost access to my account and there's no recovery e-mail on it.",
                  "My recovery e-mail address was deleted, and now I'm locked out.",
                  "I never set a recovery e-mail and I can't get into my account.",
                  "I'm locked out and the recovery e-mail belongs to an old job I left."],
        "heldout": ["My old e-mail account is closed, so the reset link never reaches me and I can't sign in.",
                    "I can't get into Nimbus and there's no backup e-mail on file."],
    },
}
# examples per fact type; handoff is split over its three reasons
SUPPORT_QUOTA = {
    "train": {"price": 24, "storage": 21, "devices": 14, "trash": 27, "family": 14, "annual": 14, "sync": 18,
              "password_reset": 18, "password_staff": 14, "cancel": 18, "refund": 14, "outage": 16,
              "handoff:billing": 10, "handoff:legal": 9, "handoff:access": 9},
    "heldout": {"price": 3, "storage": 3, "devices": 2, "trash": 4, "family": 2, "annual": 3, "sync": 3,
                "password_reset": 3, "password_staff": 3, "cancel": 3, "refund": 3, "outage": 3,
                "handoff:billing": 2, "handoff:legal": 2, "handoff:access": 1},
}
GREETINGS = {"train": ["", "", "", "Hi! ", "Hello. ", "Hi Ada! ", "Quick question: "],
             "heldout": ["", "", "", "Good morning. ", "Hey Ada! "]}
CLOSINGS = {"train": ["", "", " Thanks!", " Thank you."], "heldout": ["", "", " Cheers."]}
REQUIRED_HELDOUT = ("trash", "Plus", "How long do deleted files stay in the Trash on the Plus plan?")


def spread(pairs: list[tuple], rng: random.Random) -> list[tuple]:
    """Shuffle (phrasing, slot) pairs, then order them so each prefix uses phrasings and slots
    as evenly as possible (three held-out price questions: three phrasings and three plans)."""
    rng.shuffle(pairs)
    used: dict = {}
    out = []
    while pairs:
        best = min(pairs, key=lambda qs: used.get(("q", qs[0]), 0) + used.get(("s", qs[1]), 0))
        pairs.remove(best)
        out.append(best)
        used[("q", best[0])] = used.get(("q", best[0]), 0) + 1
        used[("s", best[1])] = used.get(("s", best[1]), 0) + 1
    return out


def support_answer(fact: str, slot: str | None) -> str:
    if fact in PLAN_ANSWERS:
        return PLAN_ANSWERS[fact][slot]
    if fact.startswith("handoff:"):
        return HANDOFF_ANSWERS[fact.split(":")[1]]
    return PLAIN_ANSWERS[fact]


def make_support() -> None:
    rng = random.Random(SEEDS["support"])
    seen: set[str] = set()
    out = {}
    for split in ("train", "heldout"):
        rows = []
        for fact, quota in SUPPORT_QUOTA[split].items():
            slots = sorted(PLAN_ANSWERS[fact]) if fact in PLAN_ANSWERS else [None]
            base = spread([(q, s) for q in QUESTIONS[fact][split] for s in slots], rng)
            picked = []
            if split == "heldout" and fact == REQUIRED_HELDOUT[0]:
                picked.append((REQUIRED_HELDOUT[2], REQUIRED_HELDOUT[1]))
            i = 0
            while len(picked) < quota:  # cycle through phrasing x slot, dressed with a greeting
                q, s = base[i % len(base)]
                i += 1
                text = q.format(plan=s) if s else q
                if i > len(base) or rng.random() < 0.35:
                    text = rng.choice(GREETINGS[split]) + text + rng.choice(CLOSINGS[split])
                if text not in seen and text not in (t for t, _ in picked):
                    picked.append((text, s))
            for text, s in picked:
                seen.add(text)
                rows.append({"input": text, "output": support_answer(fact, s), "_fact": fact, "_slot": s})
        rng.shuffle(rows)
        out[split] = rows
    for split in ("train", "heldout"):
        counts: dict[str, int] = {}
        for r in out[split]:
            key = r.pop("_fact") + (f"[{r['_slot']}]" if r["_slot"] else "")
            del r["_slot"]
            counts[key] = counts.get(key, 0) + 1
        write(f"support.{split}.jsonl", out[split])
        print("   ", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


def main() -> None:
    make_sentiment()
    make_translate()
    make_support()


if __name__ == "__main__":
    main()
