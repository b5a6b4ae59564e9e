"""Write the demo dataset for the trained `order_json` task: short customer order messages
turned into one line of JSON with exactly the keys name, product, quantity, city.

    python scripts/demo-data/make_data.py      # rewrites data/order_json.train.jsonl and data/order_json.heldout.jsonl

Rules the model has to learn (the answer is always this shape, keys in this order):
  name      the customer's name as written ("Maria Lopez", "Tom"), or null
  product   the item, singular, lower case, without the quantity ("3 blue mugs" -> "blue mug")
  quantity  an integer: digits or number words ("ten" -> 10), "a"/"an"/"one" -> 1;
            null when no amount is given ("some coffee filters")
  city      the delivery city, or null

Reproducible: a fixed seed. The held-out set is disjoint from the training set in its values:
its names, products and cities come from separate pools, so the model must copy them from the
message rather than recall them, and a third of it uses phrasings that never occur in training.
"""

from __future__ import annotations

import json
import random
from task_data_common import DATA

SEED = 20261
N_TRAIN, N_HELDOUT = 320, 50

FIRST = {
    "train": ["Maria", "Tom", "Jan", "Aisha", "Lukas", "Sofia", "Kenji", "Olivia", "Mateo", "Priya",
              "Noah", "Elena", "Omar", "Hannah", "Diego", "Chloe", "Ivan", "Amara", "Felix", "Yuki",
              "Grace", "Samir", "Nina", "Pablo", "Freya", "Leo", "Zara", "Hugo", "Mila", "Arjun",
              "Carmen", "Emil", "Anya", "Bruno", "Selin", "Oscar", "Lena", "Tariq", "Ruth", "Mikael",
              "Ines", "Jonas", "Keiko", "Nadia", "Paolo", "Greta", "Hamid", "Lucy", "Stefan", "Wanda",
              "Yusuf", "Clara", "Dmitri", "Eva", "Gustavo", "Helga", "Imran", "Julia", "Karl", "Rosa"],
    "heldout": ["Beatriz", "Kwame", "Ingrid", "Rafael", "Sunita", "Tobias", "Leila", "Marco",
                "Astrid", "Daniel", "Fatima", "Viktor"],
}
LAST = {
    "train": ["Lopez", "Novak", "Schmidt", "Rossi", "Tanaka", "Khan", "Dubois", "Silva", "Jensen",
              "Kowalski", "Murphy", "Okafor", "Petrov", "Haddad", "Moreau", "Nguyen", "Fischer", "Costa",
              "Garcia", "Weber", "Ivanova", "Suzuki", "Obi", "Lindqvist", "Horvat", "Ferreira", "Kim",
              "Walsh", "Romano", "Yilmaz", "Berg", "Dvorak", "Mendes", "Popescu", "Singh", "Vogel"],
    "heldout": ["Almeida", "Mensah", "Larsen", "Ortega", "Sharma", "Becker", "Nasser", "Bianchi"],
}
CITIES = {
    "train": ["Valencia", "Leeds", "Osaka", "Brno", "Lyon", "Porto", "Graz", "Austin", "Denver",
              "Krakow", "Turin", "Bergen", "Ghent", "Seville", "Dublin", "Malmo", "Nantes", "Leipzig",
              "Boston", "Toronto", "Perth", "Cork", "Bilbao", "Utrecht", "Zagreb", "Kyoto", "Oslo",
              "Geneva", "Antwerp", "Lille", "Bremen", "Verona", "Gdansk", "Tallinn", "Riga", "Vilnius",
              "Bordeaux", "Toulouse", "Marseille", "Naples", "Palermo", "Granada", "Malaga", "Coimbra",
              "Basel", "Lucerne", "Innsbruck", "Linz", "Dresden", "Hamburg", "Cologne", "Aachen",
              "Eindhoven", "Groningen", "Uppsala", "Odense", "Tromso", "Galway", "Belfast", "Glasgow",
              "Aberdeen", "Halifax", "Calgary", "Ottawa", "Seattle", "Portland", "Phoenix", "Tucson",
              "Nagoya", "Sendai", "Busan", "Hobart", "Auckland", "Nelson"],
    "heldout": ["Lisbon", "Aarhus", "Bologna", "Quebec", "Tampere", "Salzburg", "Cardiff",
                "Adelaide", "Rennes", "Ljubljana"],
}
# (singular, plural)
PRODUCTS = {
    "train": [("blue mug", "blue mugs"), ("desk lamp", "desk lamps"), ("notebook", "notebooks"),
              ("coffee filter", "coffee filters"), ("phone charger", "phone chargers"),
              ("yoga mat", "yoga mats"), ("water bottle", "water bottles"), ("wine glass", "wine glasses"),
              ("paintbrush", "paintbrushes"), ("phone battery", "phone batteries"), ("backpack", "backpacks"),
              ("wool scarf", "wool scarves"), ("steel pan", "steel pans"), ("pillow", "pillows"),
              ("garden hose", "garden hoses"), ("usb cable", "usb cables"), ("teapot", "teapots"),
              ("bath towel", "bath towels"), ("bike helmet", "bike helmets"), ("candle", "candles"),
              ("picture frame", "picture frames"), ("lunch box", "lunch boxes"), ("office chair", "office chairs"),
              ("flower pot", "flower pots"), ("rain jacket", "rain jackets"), ("keyboard", "keyboards"),
              ("cutting board", "cutting boards"), ("sketchbook", "sketchbooks"), ("alarm clock", "alarm clocks"),
              ("soap dispenser", "soap dispensers"), ("baby blanket", "baby blankets"), ("red pen", "red pens"),
              ("linen shirt", "linen shirts"), ("glass jar", "glass jars"), ("bamboo spoon", "bamboo spoons"),
              ("leather wallet", "leather wallets"), ("copper pot", "copper pots"), ("silk tie", "silk ties"),
              ("oak shelf", "oak shelves"), ("porcelain plate", "porcelain plates"), ("denim jacket", "denim jackets"),
              ("marble coaster", "marble coasters"), ("enamel cup", "enamel cups"), ("wicker basket", "wicker baskets"),
              ("velvet cushion", "velvet cushions"), ("tin box", "tin boxes"), ("clay vase", "clay vases"),
              ("brass key", "brass keys"), ("paper lantern", "paper lanterns"), ("rubber duck", "rubber ducks"),
              ("tennis racket", "tennis rackets"), ("chess set", "chess sets"), ("jigsaw puzzle", "jigsaw puzzles"),
              ("screwdriver", "screwdrivers"), ("stapler", "staplers"), ("umbrella", "umbrellas"),
              ("headlamp", "headlamps"), ("thermos", "thermoses"), ("doormat", "doormats"),
              ("ice tray", "ice trays"), ("dish rack", "dish racks"), ("spice grinder", "spice grinders"),
              ("tote bag", "tote bags"), ("sun hat", "sun hats"), ("bird feeder", "bird feeders"),
              ("plant stand", "plant stands"), ("wooden tray", "wooden trays"), ("pizza stone", "pizza stones")],
    "heldout": [("green kettle", "green kettles"), ("laptop stand", "laptop stands"), ("tea towel", "tea towels"),
                ("mouse pad", "mouse pads"), ("ceramic bowl", "ceramic bowls"), ("hair brush", "hair brushes"),
                ("step ladder", "step ladders"), ("travel pillow", "travel pillows"), ("table lamp", "table lamps"),
                ("cotton apron", "cotton aprons"), ("storage box", "storage boxes"), ("wall clock", "wall clocks")],
}
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve"]

# {n} name, {q} quantity + product, {c} city. A phrasing without {n} or {c} gives null there.
PHRASINGS = {
    "train": [
        "Hi, this is {n}. Please send {q} to {c}.",
        "{n} here - {q} please, to my office in {c}.",
        "Can I order {q}? Ship it to {c}.",
        "I'd like {q} delivered to {c}. Thanks, {n}",
        "Order for {n}: {q}, deliver to {c}.",
        "Please ship {q} to {c}.",
        "Hello! {n} from {c} would like {q}.",
        "We need {q} at our {c} store. Regards, {n}",
        "Could you send {q} to {n} in {c}?",
        "{q} for {n}, please.",
        "My name is {n} and I want {q}.",
        "Send {q} to {c} asap.",
        "Hey, it's {n}. Can you get {q} to {c} by Friday?",
        "New order: {q}. Name: {n}. City: {c}.",
        "Deliver {q} to the {c} warehouse.",
        "{n} ({c}) wants {q}.",
        "Good morning, I would like to buy {q}. I live in {c}. {n}",
        "Please add {q} to my order. - {n}",
        "Is it possible to ship {q} to {c}? Best, {n}",
        "Requesting {q} for delivery in {c}.",
        "I want to order {q}.",
        "This is {n} in {c}: {q}, thanks!",
    ],
    "heldout": [
        "Put me down for {q}, shipping to {c}. Cheers, {n}",
        "{c} address, {q}, name on the order is {n}.",
        "Could {q} be sent over? {n}",
        "Need {q} in {c} next week.",
    ],
}


def quantity_phrase(rng: random.Random, singular: str, plural: str) -> tuple[str, int | None]:
    r = rng.random()
    if r < 0.15:
        return ("an " if singular[0] in "aeiou" else "a ") + singular, 1
    if r < 0.22:
        return "one " + singular, 1
    if r < 0.33:
        return "some " + plural, None
    k = rng.randint(2, 12) if r < 0.58 else rng.randint(2, 40)
    return (WORDS[k] if r < 0.58 else str(k)) + " " + plural, k


def example(rng: random.Random, split: str, phrasing: str) -> dict:
    singular, plural = rng.choice(PRODUCTS[split])
    q, qty = quantity_phrase(rng, singular, plural)
    if phrasing.startswith("{q}"):
        q = q[0].upper() + q[1:]
    first = rng.choice(FIRST[split])
    name = f"{first} {rng.choice(LAST[split])}" if rng.random() < 0.5 else first
    city = rng.choice(CITIES[split])
    text = phrasing.format(n=name, q=q, c=city)
    out = {"name": name if "{n}" in phrasing else None, "product": singular, "quantity": qty,
           "city": city if "{c}" in phrasing else None}
    return {"input": text, "output": json.dumps(out)}


def main() -> None:
    rng = random.Random(SEED)
    train, seen = [], set()
    while len(train) < N_TRAIN:
        ex = example(rng, "train", rng.choice(PHRASINGS["train"]))
        if ex["input"] not in seen:
            seen.add(ex["input"])
            train.append(ex)
    heldout = []
    while len(heldout) < N_HELDOUT:  # a third with unseen phrasings, all with unseen values
        pool = PHRASINGS["heldout"] if len(heldout) % 3 == 2 else PHRASINGS["train"]
        ex = example(rng, "heldout", rng.choice(pool))
        if ex["input"] not in seen:
            seen.add(ex["input"])
            heldout.append(ex)
    for name, rows in (("order_json.train.jsonl", train), ("order_json.heldout.jsonl", heldout)):
        DATA.mkdir(parents=True, exist_ok=True)
        with open(DATA / name, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"{name}: {len(rows)} examples")


if __name__ == "__main__":
    main()
