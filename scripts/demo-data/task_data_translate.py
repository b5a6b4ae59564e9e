"""The `translate` demo data: train and held-out sets (rules: make_task_data.py's docstring)."""

from __future__ import annotations

import random

from task_data_common import SEEDS, cap, write
from task_data_translate_lexicon import (ADJ, EN_BE, NOUNS, NUM_EN, Ctx, a_en, a_fr, adj_fr, en_verb, fr_er,
                                         hour_fr, my_fr, of_the, qty, the, this_fr, to_the)

# ---------------------------------------------------------------------------------------------
# translate: sentence patterns over the lexicon (task_data_translate_lexicon.py);
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
