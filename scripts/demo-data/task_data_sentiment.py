"""The `sentiment` demo data: train and held-out sets (rules: make_task_data.py's docstring)."""

from __future__ import annotations

import random

from task_data_common import write
from task_data_sentiment_heldout import (H_OPENERS, H_PRODUCTS, H_SENTENCES, H_SLOTS, LABELS, fits,
                                         make_sentiment_heldout)

# ---------------------------------------------------------------------------------------------
# sentiment: the held-out set is frozen (task_data_sentiment_heldout.py); the training set has
# its own seed and its own, much larger pools (T_*), so growing them never moves a byte of the
# held-out file.

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
