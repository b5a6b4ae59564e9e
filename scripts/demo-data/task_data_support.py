"""The `support` demo data: train and held-out sets (rules: make_task_data.py's docstring)."""

from __future__ import annotations

import random

from task_data_common import SEEDS, write

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
