"""Write train and held-out data for the three demo text tasks of tasks.toml (`sentiment`,
`translate`, `support`), so `prefix-edge eval` can score each task and `prefix-edge train` can
train a prefix for each. Every line is {"input": str, "output": str}; the input is what fills the
task's template, the output is the one correct answer.

    python scripts/demo-data/make_task_data.py   # rewrites data/<task>.{train,heldout}.jsonl

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

from task_data_sentiment import make_sentiment
from task_data_support import make_support
from task_data_translate import make_translate


def main() -> None:
    make_sentiment()
    make_translate()
    make_support()


if __name__ == "__main__":
    main()
