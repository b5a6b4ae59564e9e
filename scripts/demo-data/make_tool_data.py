"""Write train and held-out data for the demo tool-use task `tool_call` (and a trained twin):
a request → one function call as JSON, `{"name": ..., "arguments": {...}}`.

    python scripts/demo-data/make_tool_data.py   # rewrites data/tool_call.{train,heldout}.jsonl

Functions (the tasks' system prompt and JSON schema spell the same three):
  get_weather(city: string, unit: "C" | "F")     unit "F" only when the request says Fahrenheit
  set_timer(minutes: integer, label: string|null) label: what the timer is for, when said
  order(product: string, quantity: integer)       product singular, as in the demo extractor

Reproducible (seeds 11 and 12), 320 train and 50 held-out lines; held-out cities, products,
labels and phrasings are drawn from pools disjoint from training's, so a model must generalise.
"""

from __future__ import annotations

import json
import random
from task_data_common import DATA

NUM = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
POOLS = {
    "train": {
        "cities": ["Oslo", "Lyon", "Porto", "Leeds", "Brno", "Osaka", "Valencia", "Basel", "Krakow", "Lille",
                   "Dublin", "Turin", "Ghent", "Seville", "Bergen", "Graz"],
        "products": [("mug", "mugs"), ("desk lamp", "desk lamps"), ("notebook", "notebooks"),
                     ("glass jar", "glass jars"), ("candle", "candles"), ("towel", "towels"),
                     ("phone case", "phone cases"), ("water bottle", "water bottles")],
        "labels": ["pasta", "tea", "laundry", "the oven", "a break", "eggs"],
        "weather": ["What's the weather in {c}?", "How is the weather in {c} today?",
                    "Weather for {c} please.", "Is it cold in {c} right now?"],
        "weather_f": ["What's the weather in {c} in Fahrenheit?", "Give me {c}'s temperature in Fahrenheit."],
        "timer": ["Set a timer for {m} minutes.", "Start a {m} minute timer.", "Timer: {m} minutes please."],
        "timer_l": ["Set a timer for {m} minutes for {l}.", "Remind me about {l} in {m} minutes."],
        "order": ["Order {q} {p}.", "Please buy {q} {p} for me.", "I need {q} {p}, order them."],
    },
    "heldout": {
        "cities": ["Tallinn", "Bilbao", "Utrecht", "Aarhus", "Nantes", "Bologna"],
        "products": [("tea towel", "tea towels"), ("plant pot", "plant pots"), ("sketchbook", "sketchbooks"),
                     ("soap dispenser", "soap dispensers")],
        "labels": ["rice", "the bread", "a call"],
        "weather": ["Could you check the weather in {c}?", "What will it be like in {c}?"],
        "weather_f": ["How warm is {c} in Fahrenheit?"],
        "timer": ["Count down {m} minutes.", "I need a timer of {m} minutes."],
        "timer_l": ["Time {l} for {m} minutes."],
        "order": ["Get me {q} {p}.", "Can you order {q} {p}?"],
    },
}


def _call(name: str, **args) -> str:
    return json.dumps({"name": name, "arguments": args}, ensure_ascii=False)


def example(rng: random.Random, pool: dict) -> dict:
    kind = rng.choice(["weather", "weather", "timer", "order"])
    if kind == "weather":
        c = rng.choice(pool["cities"])
        if rng.random() < 0.3:
            return {"input": rng.choice(pool["weather_f"]).format(c=c), "output": _call("get_weather", city=c, unit="F")}
        return {"input": rng.choice(pool["weather"]).format(c=c), "output": _call("get_weather", city=c, unit="C")}
    if kind == "timer":
        m = rng.randint(1, 90)
        if rng.random() < 0.5:
            lab = rng.choice(pool["labels"])
            return {"input": rng.choice(pool["timer_l"]).format(m=m, l=lab),
                    "output": _call("set_timer", minutes=m, label=lab)}
        return {"input": rng.choice(pool["timer"]).format(m=m), "output": _call("set_timer", minutes=m, label=None)}
    q = rng.randint(1, 12)
    one, many = rng.choice(pool["products"])
    word = NUM[q - 1] if rng.random() < 0.5 else str(q)
    return {"input": rng.choice(pool["order"]).format(q=word, p=one if q == 1 else many),
            "output": _call("order", product=one, quantity=q)}


def main() -> None:
    data = DATA
    data.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", 320, 11), ("heldout", 50, 12)):
        rng = random.Random(seed)
        rows, seen = [], set()
        while len(rows) < n:
            ex = example(rng, POOLS[split])
            if ex["input"] not in seen:
                seen.add(ex["input"])
                rows.append(ex)
        (data / f"tool_call.{split}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


if __name__ == "__main__":
    main()
