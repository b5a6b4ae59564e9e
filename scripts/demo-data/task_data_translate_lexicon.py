"""The `translate` demo data's lexicon: English/French nouns (gender, plural, elision, split),
adjectives, numbers and vocabulary per split, the articles and verb forms that agree with them,
and Ctx, which draws a pattern's words for one split (the patterns: task_data_translate.py)."""

from __future__ import annotations

import random

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
