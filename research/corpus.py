"""A deterministic generator of drafting documents for training and evaluating Stencil models.

Eight kinds of document (referral letters, discharge summaries, incident reports, NDA
clauses, invoices, job offers, meeting minutes, JSON records under a JSON Schema). Values come
from Faker, prose from the hand-written phrase banks in :mod:`research.phrases`. Every
document records its *spans*: the character ranges of entity mentions, numbers, dates,
choices, JSON values and whole sentences, so training can corrupt hole-shaped spans and the
evaluation can cut holes of a known kind. Entities repeat (a name in the salutation and the
signature, a date in the header and the body, a total that equals the sum of the lines), so
some holes are decided by the text on their right.

Splits: ``train`` and ``val`` draw disjoint seed ranges and only the shared phrase variants;
``test`` draws its own seed range and every variant, including the held-out ones.

``python -m research.corpus --stats`` prints the pattern counts and one document per kind.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import date, timedelta
from typing import Any, Literal

from gpu_worker.engine.tokenizer import (
    document_lead,
    encode_before_word,
    encode_document,
    opens_line_or_value,
)
from research.phrases import BANKS, Bank, is_held_out

Split = Literal["train", "val", "test"]
SpanKind = Literal["entity", "date", "number", "choice", "json_value", "sentence", "field"]

SPLIT_SEED_BASE: dict[str, int] = {"train": 0, "val": 50_000_000, "test": 90_000_000}
SPLIT_SIZE_LIMIT = 40_000_000  # seeds per split; indexes beyond this would overlap the next
DATE_LONG_PATTERN = r"(January|February|March|April|May|June|July|August|September|October|November|December) [1-9][0-9]?, 20[0-9]{2}"
DATE_ISO_PATTERN = r"(19|20)[0-9]{2}-[01][0-9]-[0-3][0-9]"
MONEY_PATTERN = r"\$[0-9]{1,3}(,[0-9]{3})*\.[0-9]{2}"
INTEGER_PATTERN = r"[0-9]{1,4}"
SPACE_PREFIX = " "  # moves from locked text into the next hole (see gpu_worker.engine.canvas)
# The corpus's edition: what a (kind, seed, split) renders to. Edition 1 is the corpus that
# every phase of the models shipped until 2026-12-06 read (and their vocabularies). Edition 2: a
# job offer shows the position and the start date in a header, as an offer letter's subject
# block does (before, the role stood only inside the offer sentence, so a template holing that
# sentence asked the model to invent a job title); meeting minutes close with the date of
# the next meeting (a sentence naming it is decided by the text on its right); an NDA's term is
# 2, 3, 5 or 7 years (edition 1 drew 1 and wrote "1 years"). Other kinds render the same.
# Edition 3: an invoice shows its due date under its date, as invoices do (before, the due
# date stood only inside the payment sentences, so a template holing them asked the model to
# invent one, and with no sense of time it wrote dates years away). Other kinds render as in 2.
# Edition 4: a job offer's subject block also shows the salary and the date to reply by, the
# other two fields an offer form asks for (before, they stood only inside their sentences, so
# the model invented a salary, at times garbled as "$ $,000.00", and a reply date). Other
# kinds render as in 3.
CORPUS_EDITION = 4
CORPUS_EDITIONS = (1, 2, 3, 4)


@dataclass(frozen=True)
class Span:
    """One annotated character range ``text[start:end]`` of a document."""

    start: int
    end: int
    kind: SpanKind
    name: str  # the field or slot name ("patient", "total", "closing", ...)
    group: str | None = None  # mentions of one entity share a group
    pattern: str | None = None  # regex the value must fully match
    choices: tuple[str, ...] | None = None  # the value is one of these
    schema_json: str | None = None  # JSON Schema (as canonical JSON) the value must satisfy

    def constraint(self) -> dict[str, Any] | None:
        """The Canvas-JSON constraint of a hole cut at this span, if any."""
        if self.choices is not None:
            return {"choices": list(self.choices)}
        if self.schema_json is not None:
            return {"schema": json.loads(self.schema_json)}
        if self.pattern is not None:
            return {"pattern": self.pattern}
        return None


@dataclass(frozen=True)
class Document:
    kind: str
    seed: int
    split: str
    text: str
    spans: tuple[Span, ...]
    patterns: tuple[str, ...]  # ids of the phrase variants used ("slot#index")
    # Where each of ``patterns`` was written: (start, end) character offsets, in step with it.
    pattern_spans: tuple[tuple[int, int], ...]

    def span_text(self, span: Span) -> str:
        return self.text[span.start : span.end]

    def pattern_at(self, span: Span) -> str | None:
        """The id of the phrase variant that wrote ``span`` ("slot#index"), or None where the
        span is layout (a header line, a JSON value) rather than part of a phrase."""
        for pattern, (start, end) in zip(self.patterns, self.pattern_spans, strict=True):
            if start <= span.start and span.end <= end:
                return pattern
        return None


def pattern_is_held_out(kind: str, pattern: str) -> bool:
    """Whether a pattern id of ``Document.patterns`` ("slot#index") names a variant held out
    for the test split (``phrases.is_held_out``)."""
    slot, index = pattern.rsplit("#", 1)
    return is_held_out(kind, slot, int(index))


@dataclass(frozen=True)
class Value:
    """A value to place in a document, with what its span should record."""

    text: str
    kind: SpanKind = "field"
    group: str | None = None
    pattern: str | None = None
    choices: tuple[str, ...] | None = None


@dataclass
class Builder:
    """Appends text and records spans; the phrase bank decides sentence variants."""

    kind: str
    split: str
    rng: random.Random
    bank: Bank
    edition: int = CORPUS_EDITION
    parts: list[str] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    patterns: list[str] = field(default_factory=list)
    pattern_spans: list[tuple[int, int]] = field(default_factory=list)
    length: int = 0

    def text(self, s: str) -> None:
        self.parts.append(s)
        self.length += len(s)

    def value(self, name: str, v: Value) -> None:
        start = self.length
        self.text(v.text)
        self.spans.append(
            Span(start, self.length, v.kind, name, v.group, v.pattern, v.choices)
        )

    def say(self, slot: str, values: dict[str, Value], *, sentence: bool = True) -> None:
        """Render one variant of ``slot``; placeholders become value spans."""
        variants = self.bank[slot]
        allowed = [
            i for i in range(len(variants))
            if self.split == "test" or not is_held_out(self.kind, slot, i)
        ]  # fmt: skip
        index = self.rng.choice(allowed)
        self.patterns.append(f"{slot}#{index}")
        start = self.length
        for literal, key, _spec, _conv in string.Formatter().parse(variants[index]):
            if literal:
                self.text(literal)
            if key is not None:
                self.value(key, values[key])
        self.pattern_spans.append((start, self.length))
        if sentence:
            self.spans.append(Span(start, self.length, "sentence", slot))

    def paragraph(self, slots: tuple[str, ...], values: dict[str, Value]) -> None:
        """Sentences of ``slots`` in order, joined by single spaces."""
        for i, slot in enumerate(slots):
            if i:
                self.text(" ")
            self.say(slot, values)

    def build(self, seed: int) -> Document:
        return Document(
            self.kind, seed, self.split, "".join(self.parts), tuple(self.spans),
            tuple(self.patterns), tuple(self.pattern_spans),
        )  # fmt: skip


# -- value helpers ----------------------------------------------------------------------------


def long_date(d: date) -> str:
    return f"{d.strftime('%B')} {d.day}, {d.year}"


def money(x: float) -> str:
    return f"${x:,.2f}"


def ent(text: str, group: str) -> Value:
    return Value(text, "entity", group)


def date_value(d: date, group: str) -> Value:
    return Value(long_date(d), "date", group, DATE_LONG_PATTERN)


def choice(options: tuple[str, ...], rng: random.Random) -> Value:
    return Value(rng.choice(options), "choice", choices=options)


def _random_date(rng: random.Random, start_year: int = 2021, years: int = 5) -> date:
    return date(start_year, 1, 1) + timedelta(days=rng.randrange(365 * years))


def _person(fk: Any) -> tuple[str, str, str]:
    """(first, last, full) of a fresh person."""
    first, last = fk.first_name(), fk.last_name()
    return first, last, f"{first} {last}"


def _patient(fk: Any, rng: random.Random) -> tuple[str, str]:
    """(full name, title + last name) of a patient whose title matches the first name."""
    female = rng.random() < 0.5
    first = fk.first_name_female() if female else fk.first_name_male()
    last = fk.last_name()
    title = rng.choice(["Ms.", "Mrs."]) if female else "Mr."
    return f"{first} {last}", f"{title} {last}"


# -- the eight kinds -----------------------------------------------------------------------


def _referral(b: Builder, fk: Any, rng: random.Random) -> None:
    patient, patient_last = _patient(fk, rng)
    dl = fk.last_name()
    sender = fk.name()
    clinic = f"{fk.last_name()} {rng.choice(['Medical Centre', 'Family Practice', 'Health Clinic', 'Surgery'])}"
    day = _random_date(rng)
    dob = date(1940, 1, 1) + timedelta(days=rng.randrange(365 * 60))
    specialty = rng.choice(["Cardiology", "Neurology", "Dermatology", "Rheumatology", "Gastroenterology", "Endocrinology", "Respiratory Medicine", "Orthopaedics"])  # fmt: skip
    v = {
        "patient": ent(patient, "patient"), "patient_last": ent(patient_last, "patient_title"),
        "doctor": ent(f"Dr. {dl}", "doctor"), "sender": ent(sender, "sender"),
        "clinic": ent(clinic, "clinic"), "date": date_value(day, "date"),
        "dob": Value(dob.isoformat(), "date", "dob", DATE_ISO_PATTERN),
        "specialty": Value(specialty, "choice", choices=("Cardiology", "Neurology", "Dermatology", "Rheumatology", "Gastroenterology", "Endocrinology", "Respiratory Medicine", "Orthopaedics")),
        "priority": choice(("routine", "urgent", "two-week wait"), rng),
        "weeks": Value(str(rng.randint(2, 12)), "number", pattern=INTEGER_PATTERN),
        "symptom": Value(rng.choice(["chest pain on exertion", "intermittent palpitations", "a persistent rash", "recurrent headaches", "joint swelling", "abdominal pain", "shortness of breath", "unexplained weight loss", "dizzy spells", "lower back pain"]), "field"),
    }  # fmt: skip
    b.value("clinic", v["clinic"])
    b.text("\n")
    b.value("date", v["date"])
    b.text("\n\n")
    b.say("salutation", v, sentence=False)
    b.text("\n\n")
    b.say("reline", v, sentence=False)
    b.text("\n\n")
    b.paragraph(("opening", "history", "findings", "request", "priority_line"), v)
    b.text("\n\n")
    b.say("closing", v)
    b.text("\n\n")
    b.say("signoff", v, sentence=False)


def _discharge(b: Builder, fk: Any, rng: random.Random) -> None:
    _pf, _pl, patient = _person(fk)
    _cf, cl, _c = _person(fk)
    admit = _random_date(rng)
    discharge = admit + timedelta(days=rng.randint(1, 14))
    hospital = f"{fk.city()} {rng.choice(['General Hospital', 'Royal Infirmary', 'Memorial Hospital', 'University Hospital'])}"
    diagnosis = rng.choice(["community-acquired pneumonia", "an exacerbation of COPD", "a urinary tract infection", "cellulitis of the left leg", "acute kidney injury", "a non-ST elevation myocardial infarction", "diabetic ketoacidosis", "a fractured neck of femur"])  # fmt: skip
    v = {
        "patient": ent(patient, "patient"), "consultant": ent(f"Dr. {cl}", "consultant"),
        "hospital": ent(hospital, "hospital"), "admit": date_value(admit, "admit"),
        "discharge": date_value(discharge, "discharge"), "diagnosis": ent(diagnosis, "diagnosis"),
        "mrn": Value(f"{rng.randint(100000, 999999)}", "number", "mrn", r"[0-9]{6}"),
        "days": Value(str((discharge - admit).days), "number", pattern=INTEGER_PATTERN),
        "drug": Value(rng.choice(["amoxicillin 500 mg three times daily", "ramipril 2.5 mg once daily", "bisoprolol 5 mg once daily", "paracetamol 1 g four times daily", "prednisolone 30 mg once daily", "apixaban 5 mg twice daily"]), "field"),
        "destination": choice(("home", "home with carers", "a rehabilitation unit", "a nursing home"), rng),
        "followup": choice(("GP in 1 week", "outpatient clinic in 6 weeks", "no routine follow-up"), rng),
    }  # fmt: skip
    b.text("DISCHARGE SUMMARY\n")
    b.value("hospital", v["hospital"])
    b.text("\nPatient: ")
    b.value("patient", v["patient"])
    b.text(" (MRN ")
    b.value("mrn", v["mrn"])
    b.text(")\nAdmitted: ")
    b.value("admit", v["admit"])
    b.text("\nDischarged: ")
    b.value("discharge", v["discharge"])
    b.text("\nConsultant: ")
    b.value("consultant", v["consultant"])
    b.text("\n\n")
    b.paragraph(("presentation", "course", "medication", "discharge_line", "followup_line"), v)
    b.text("\n\nSigned: ")
    b.value("consultant", v["consultant"])
    b.text(", ")
    b.value("hospital", v["hospital"])
    b.text("\n")


def _incident(b: Builder, fk: Any, rng: random.Random) -> None:
    _rf, _rl, reporter = _person(fk)
    _wf, _wl, witness = _person(fk)
    site = f"{fk.company()} {rng.choice(['warehouse', 'plant', 'depot', 'office', 'laboratory'])}"
    when = _random_date(rng)
    v = {
        "reporter": ent(reporter, "reporter"), "witness": ent(witness, "witness"),
        "site": ent(site, "site"), "date": date_value(when, "date"),
        "ref": Value(f"INC-{when.year}-{rng.randint(1000, 9999)}", "number", "ref", r"INC-20[0-9]{2}-[0-9]{4}"),
        "time": Value(f"{rng.randint(6, 22):02d}:{rng.choice(['00', '15', '30', '45'])}", "number", pattern=r"[0-2][0-9]:[0-5][0-9]"),
        "severity": choice(("Low", "Medium", "High", "Critical"), rng),
        "event": Value(rng.choice(["a forklift struck a storage rack", "a worker slipped on a wet floor", "a chemical container leaked", "a ladder collapsed during maintenance", "a fire alarm was triggered by overheated equipment", "a delivery van reversed into a loading bay door"]), "field"),
        "injuries": choice(("no injuries", "a minor injury", "an injury requiring hospital treatment"), rng),
        "action": Value(rng.choice(["the area was cordoned off", "the equipment was isolated", "the spill was contained", "first aid was given", "the building was evacuated"]), "field"),
    }  # fmt: skip
    b.text("INCIDENT REPORT ")
    b.value("ref", v["ref"])
    b.text("\nSite: ")
    b.value("site", v["site"])
    b.text("\nDate: ")
    b.value("date", v["date"])
    b.text("\nReported by: ")
    b.value("reporter", v["reporter"])
    b.text("\nSeverity: ")
    b.value("severity", v["severity"])
    b.text("\n\n")
    b.paragraph(("summary", "witness_line", "response", "outcome", "prevention"), v)
    b.text("\n\nReport ")
    b.value("ref", v["ref"])
    b.text(" submitted by ")
    b.value("reporter", v["reporter"])
    b.text(" on ")
    b.value("date", v["date"])
    b.text(".\n")


def _nda(b: Builder, fk: Any, rng: random.Random) -> None:
    disclosing, receiving = fk.company(), fk.company()
    _sf, _sl, signer_a = _person(fk)
    _tf, _tl, signer_b = _person(fk)
    eff = _random_date(rng)
    states = ("Delaware", "New York", "California", "Texas", "Illinois", "Massachusetts")
    v = {
        "disclosing": ent(disclosing, "disclosing"), "receiving": ent(receiving, "receiving"),
        "signer_a": ent(signer_a, "signer_a"), "signer_b": ent(signer_b, "signer_b"),
        "effective": date_value(eff, "effective"),
        "years": Value(str(rng.choice([1, 2, 3, 5] if b.edition == 1 else [2, 3, 5, 7])), "number",
                       pattern=INTEGER_PATTERN),
        "state": Value(rng.choice(states), "choice", choices=states),
        "purpose": Value(rng.choice(["evaluating a potential business relationship", "negotiating a supply agreement", "assessing a possible acquisition", "developing a joint software product", "conducting a pilot study"]), "field"),
    }  # fmt: skip
    b.text("MUTUAL NON-DISCLOSURE AGREEMENT\n\n")
    b.say("parties", v)
    b.text("\n\n1. ")
    b.say("purpose_clause", v)
    b.text("\n\n2. ")
    b.say("obligations", v)
    b.text("\n\n3. ")
    b.say("exclusions", v)
    b.text("\n\n4. ")
    b.say("term", v)
    b.text("\n\n5. ")
    b.say("law", v)
    b.text("\n\nFor ")
    b.value("disclosing", v["disclosing"])
    b.text(": ")
    b.value("signer_a", v["signer_a"])
    b.text("\nFor ")
    b.value("receiving", v["receiving"])
    b.text(": ")
    b.value("signer_b", v["signer_b"])
    b.text("\nDate: ")
    b.value("effective", v["effective"])
    b.text("\n")


def _invoice(b: Builder, fk: Any, rng: random.Random) -> None:
    seller, buyer = fk.company(), fk.company()
    _cf, _cl, contact = _person(fk)
    issued = _random_date(rng)
    due = issued + timedelta(days=rng.choice([14, 30, 45, 60]))
    number = f"{rng.choice(['INV', 'PO'])}-{rng.randint(10000, 99999)}"
    items = rng.sample(["Consulting services", "Office chairs", "Laptop stands", "Printer toner", "Software licence", "Cloud hosting", "Safety gloves", "Cable kits", "Desk lamps", "Training workshop", "Maintenance visit", "Paper reams"], rng.randint(2, 4))  # fmt: skip
    lines = [(item, rng.randint(1, 20), rng.choice([4.5, 12.0, 19.99, 35.0, 49.5, 120.0, 250.0, 899.0])) for item in items]  # fmt: skip
    subtotal = round(sum(q * p for _i, q, p in lines), 2)
    tax_rate = rng.choice([0, 5, 10, 20])
    tax = round(subtotal * tax_rate / 100, 2)
    total = round(subtotal + tax, 2)
    v = {
        "seller": ent(seller, "seller"), "buyer": ent(buyer, "buyer"), "contact": ent(contact, "contact"),
        "number": Value(number, "number", "number", r"(INV|PO)-[0-9]{5}"),
        "issued": date_value(issued, "issued"), "due": date_value(due, "due"),
        "total": Value(money(total), "number", "total", MONEY_PATTERN),
        "terms": choice(("bank transfer", "credit card", "cheque"), rng),
    }  # fmt: skip
    b.value("seller", v["seller"])
    b.text("\n")
    b.value("number", v["number"])
    b.text("\nDate: ")
    b.value("issued", v["issued"])
    if b.edition >= 3:  # a field the person invoicing types; the payment sentences copy it
        b.text("\nDue date: ")
        b.value("due", v["due"])
    b.text("\nBill to: ")
    b.value("buyer", v["buyer"])
    b.text(", attn. ")
    b.value("contact", v["contact"])
    b.text("\n\n")
    for item, qty, price in lines:
        b.text(f"{item} | {qty} x {money(price)} | ")
        b.value("line_amount", Value(money(qty * price), "number", pattern=MONEY_PATTERN))
        b.text("\n")
    b.text("Subtotal: ")
    b.value("subtotal", Value(money(subtotal), "number", pattern=MONEY_PATTERN))
    b.text(f"\nTax ({tax_rate}%): ")
    b.value("tax", Value(money(tax), "number", pattern=MONEY_PATTERN))
    b.text("\nTotal due: ")
    b.value("total", v["total"])
    b.text("\n\n")
    b.paragraph(("payment", "late", "thanks"), v)
    b.text("\n")


def _offer(b: Builder, fk: Any, rng: random.Random) -> None:
    cf, _cl, candidate = _person(fk)
    _hf, _hl, manager = _person(fk)
    company = fk.company()
    start = _random_date(rng)
    offer_day = start - timedelta(days=rng.randint(14, 45))
    salary = rng.randrange(38000, 150000, 500)
    v = {
        "candidate": ent(candidate, "candidate"), "first": ent(cf, "candidate_first"),
        "manager": ent(manager, "manager"), "company": ent(company, "company"),
        "role": ent(fk.job(), "role"), "start": date_value(start, "start"),
        "offer_day": date_value(offer_day, "offer_day"),
        "salary": Value(money(salary), "number", "salary", MONEY_PATTERN),
        "reply": date_value(offer_day + timedelta(days=7), "reply"),
        "schedule": choice(("full-time", "part-time", "fixed-term"), rng),
        "days": Value(str(rng.choice([20, 22, 25, 28])), "number", pattern=INTEGER_PATTERN),
    }  # fmt: skip
    b.value("company", v["company"])
    b.text("\n")
    b.value("offer_day", v["offer_day"])
    if b.edition >= 2:  # the subject block: what the person making the offer types
        b.text("\n\nPosition: ")
        b.value("role", v["role"])
        b.text("\nStart date: ")
        b.value("start", v["start"])
    if b.edition >= 4:  # the rest of the offer form; the salary and reply sentences copy them
        b.text("\nSalary: ")
        b.value("salary", v["salary"])
        b.text("\nReply by: ")
        b.value("reply", v["reply"])
    b.text("\n\n")
    b.say("greeting", v, sentence=False)
    b.text("\n\n")
    b.paragraph(("offer", "salary_line", "start_line", "benefits", "reply_line", "welcome"), v)
    b.text("\n\n")
    b.say("signoff", v, sentence=False)


def _minutes(b: Builder, fk: Any, rng: random.Random) -> None:
    people = [_person(fk)[2] for _ in range(3)]
    chair, secretary, member = people
    org = fk.company()
    day = _random_date(rng)
    nxt = day + timedelta(days=rng.choice([7, 14, 28]))
    v = {
        "chair": ent(chair, "chair"), "secretary": ent(secretary, "secretary"),
        "member": ent(member, "member"), "org": ent(org, "org"),
        "date": date_value(day, "date"), "next": date_value(nxt, "next"),
        "topic": Value(rng.choice(["the quarterly budget", "the office move", "the hiring plan", "the new supplier contract", "the customer survey results", "the IT security audit"]), "field"),
        "vote": choice(("approved unanimously", "approved by majority", "deferred", "rejected"), rng),
        "count": Value(str(rng.randint(4, 12)), "number", pattern=INTEGER_PATTERN),
    }  # fmt: skip
    b.text("MINUTES OF THE MEETING OF ")
    b.value("org", v["org"])
    b.text("\nDate: ")
    b.value("date", v["date"])
    b.text("\nChair: ")
    b.value("chair", v["chair"])
    b.text("\nMinutes taken by: ")
    b.value("secretary", v["secretary"])
    b.text("\n\n")
    b.paragraph(("attendance", "opening", "discussion", "decision", "action", "next_meeting"), v)
    if b.edition >= 2:  # a field the secretary types; a sentence naming it copies it
        b.text("\n\nDate of next meeting: ")
        b.value("next", v["next"])
    b.text("\n\nSigned: ")
    b.value("chair", v["chair"])
    b.text(" (Chair), ")
    b.value("secretary", v["secretary"])
    b.text(" (Secretary)\n")


JSON_SCHEMAS: dict[str, dict[str, Any]] = {
    "employee": {
        "type": "object",
        "properties": {
            "employee_id": {"type": "string", "pattern": "^E[0-9]{5}$"},
            "name": {"type": "string", "minLength": 3},
            "department": {"type": "string", "enum": ["Finance", "Sales", "Engineering", "Legal", "Operations"]},
            "start_date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
            "manager": {"type": "string", "minLength": 3},
            "email": {"type": "string", "pattern": "^[a-z.]+@[a-z0-9.-]+$"},
            "salary": {"type": "integer", "minimum": 20000, "maximum": 300000},
            "active": {"type": "boolean"},
        },
        "required": ["employee_id", "name", "department", "start_date", "manager", "email", "salary", "active"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "pattern": "^ORD-[0-9]{6}$"},
            "customer": {"type": "string", "minLength": 3},
            "ship_to": {"type": "string", "minLength": 5},
            "status": {"type": "string", "enum": ["pending", "shipped", "delivered", "cancelled"]},
            "quantity": {"type": "integer", "minimum": 1, "maximum": 500},
            "placed_on": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
            "contact": {"type": "string", "minLength": 3},
            "priority": {"type": "boolean"},
        },
        "required": ["order_id", "customer", "ship_to", "status", "quantity", "placed_on", "contact", "priority"],
        "additionalProperties": False,
    },
}  # fmt: skip


def _json_record(b: Builder, fk: Any, rng: random.Random) -> None:
    name = rng.choice(sorted(JSON_SCHEMAS))
    schema = JSON_SCHEMAS[name]
    first, last, full = _person(fk)
    domain = fk.domain_name()
    record: dict[str, Any]
    if name == "employee":
        record = {
            "employee_id": f"E{rng.randint(10000, 99999)}", "name": full,
            "department": rng.choice(schema["properties"]["department"]["enum"]),
            "start_date": _random_date(rng).isoformat(), "manager": fk.name(),
            "email": f"{first.lower()}.{last.lower()}@{domain}",
            "salary": rng.randrange(30000, 160000, 1000), "active": rng.random() < 0.8,
        }  # fmt: skip
        groups = {"name": "person"}
    else:
        record = {
            "order_id": f"ORD-{rng.randint(100000, 999999)}", "customer": fk.company(),
            "ship_to": fk.address().replace("\n", ", "),
            "status": rng.choice(schema["properties"]["status"]["enum"]),
            "quantity": rng.randint(1, 500), "placed_on": _random_date(rng).isoformat(),
            "contact": full, "priority": rng.random() < 0.3,
        }  # fmt: skip
        groups = {"contact": "person"}
    b.say("json_intro", {"person": ent(full, "person")}, sentence=False)
    b.text(f'\n{{"$schema": "stencil/{name}",\n')
    for i, (key, value) in enumerate(record.items()):
        b.text(f'  "{key}": ')
        encoded = json.dumps(value)
        prop_schema = schema["properties"][key]
        inner = encoded[1:-1] if isinstance(value, str) else encoded
        if isinstance(value, str):
            b.text('"')
        start = b.length
        b.text(inner)
        enum = prop_schema.get("enum")
        b.spans.append(
            Span(
                start, b.length, "json_value", key, groups.get(key),
                choices=tuple(enum) if enum else None,
                schema_json=json.dumps(prop_schema, sort_keys=True),
            )
        )
        if isinstance(value, str):
            b.text('"')
        b.text(",\n" if i < len(record) - 1 else "\n")
    b.text("}\n")
    b.say("json_note", {"person": ent(full, "person")})
    b.text("\n")


GENERATORS: dict[str, Callable[[Builder, Any, random.Random], None]] = {
    "referral_letter": _referral,
    "discharge_summary": _discharge,
    "incident_report": _incident,
    "nda_clause": _nda,
    "invoice": _invoice,
    "job_offer": _offer,
    "meeting_minutes": _minutes,
    "json_record": _json_record,
}
KINDS: tuple[str, ...] = tuple(GENERATORS)

_FAKER: Any = None


def email_name_words() -> list[str]:
    """How the corpus's e-mail addresses spell names: every first name Faker draws, lower
    case and spaced (a JSON string value starts with a virtual space under spaced lines:
    " adam.diaz@..."), and every last name lower case after the dot ("diaz"). A vocabulary
    that spells each as one token (``StencilTokenizer.with_words``) lets the copy head copy
    a name into an address as its lower-case twin (``ModelConfig.copy_lower``)."""
    from faker.providers.person.en_US import Provider

    first = sorted(set(Provider.first_names_female) | set(Provider.first_names_male))
    return [" " + name.lower() for name in first] + [name.lower() for name in sorted(set(Provider.last_names))]


def _faker() -> Any:
    global _FAKER
    if _FAKER is None:
        from faker import Faker

        _FAKER = Faker("en_US")
    return _FAKER


def generate(kind: str, seed: int, split: Split, *, edition: int = CORPUS_EDITION) -> Document:
    """One document of ``kind``; the same (kind, seed, split, edition) always gives the same
    document (see ``CORPUS_EDITION``)."""
    if kind not in GENERATORS:
        raise ValueError(f"kind={kind!r} is not one of {KINDS}")
    if split not in SPLIT_SEED_BASE:
        raise ValueError(f"split={split!r} is not one of {tuple(SPLIT_SEED_BASE)}")
    if edition not in CORPUS_EDITIONS:
        raise ValueError(f"edition={edition!r} is not one of {CORPUS_EDITIONS}")
    fk = _faker()
    fk.seed_instance(seed)
    rng = random.Random(f"{kind}:{seed}")
    b = Builder(kind, split, rng, BANKS[kind], edition)
    GENERATORS[kind](b, fk, rng)
    return b.build(seed)


def document_at(split: Split, index: int, *, edition: int = CORPUS_EDITION) -> Document:
    """The index-th document of a split; kinds cycle so every split is balanced."""
    if not 0 <= index < SPLIT_SIZE_LIMIT:
        raise ValueError(f"index={index} is outside 0..{SPLIT_SIZE_LIMIT - 1}")
    kind = KINDS[index % len(KINDS)]
    return generate(kind, SPLIT_SEED_BASE[split] + index, split, edition=edition)


DOCUMENT_SEPARATOR = "\n\n\n"  # between the documents of a joined row (two blank lines)


def join_documents(docs: list[Document]) -> Document:
    """``docs`` as one long document, two blank lines apart: a training row (and an evaluation
    canvas) longer than any one generated document. Spans keep their kinds; mention groups are
    named per document (``"1:patient"``), so a name never links two documents."""
    if not docs:
        raise ValueError("join_documents needs at least one document")
    if len(docs) == 1:
        return docs[0]
    text = ""
    spans: list[Span] = []
    patterns: list[str] = []
    pattern_spans: list[tuple[int, int]] = []
    for i, doc in enumerate(docs):
        if i:
            text += DOCUMENT_SEPARATOR
        at = len(text)
        spans += [replace(s, start=s.start + at, end=s.end + at,
                          group=None if s.group is None else f"{i}:{s.group}") for s in doc.spans]
        patterns += doc.patterns
        pattern_spans += [(a + at, b + at) for a, b in doc.pattern_spans]
        text += doc.text
    first = docs[0]
    return Document("+".join(d.kind for d in docs), first.seed, first.split, text, tuple(spans),
                    tuple(patterns), tuple(pattern_spans))


def iter_split(
    split: Split, count: int, *, offset: int = 0, edition: int = CORPUS_EDITION
) -> Iterator[Document]:
    for index in range(offset, offset + count):
        yield document_at(split, index, edition=edition)


# -- tokenization along span boundaries -------------------------------------------------------


def _cut(text: str, at: int) -> int:
    """Where a boundary at character ``at`` cuts: before a preceding space, if any."""
    return at - 1 if at > 0 and text[at - 1] == SPACE_PREFIX else at


def span_boundaries(doc: Document) -> list[int]:
    cuts = {0, len(doc.text)}
    for span in doc.spans:
        cuts.update((_cut(doc.text, span.start), _cut(doc.text, span.end)))
    return sorted(cuts)


TEMPLATE_HOLE_KINDS = ("sentence", "choice", "json_value")  # holed wherever they occur


def template_cut(
    doc: Document, take: Callable[[], bool] = lambda: True, *, invent: bool = False
) -> list[Span]:
    """The holes of a drafting template, in document order: every sentence, choice and JSON
    value, and every later mention of an entity already visible, where ``take()`` says so.
    Numbers, dates and the first mention of each entity outside every hole stay visible,
    like the fields a person types (a party typed in the signature block is copied into the
    clauses). With ``invent``, a mention of an entity seen so far only inside holes is a hole
    too: nothing shows the name, and the model must invent it. ``take`` is asked once per
    candidate span, in order (training draws it at random; a whole-document request takes
    all)."""
    visible: set[str] = set()  # entity texts with a mention outside every hole so far
    hidden: set[str] = set()  # entity texts seen so far only inside holes
    chosen: list[Span] = []
    for span in sorted(doc.spans, key=lambda s: (s.start, -s.end)):  # enclosing spans first
        text = doc.span_text(span)
        seen = text in visible or (invent and text in hidden)
        wanted = (span.kind == "entity" and seen) or span.kind in TEMPLATE_HOLE_KINDS
        free = all(span.start >= c.end or span.end <= c.start for c in chosen)
        if wanted and free and span.end > span.start and take():
            chosen.append(span)
        elif span.kind == "entity":
            (visible if free else hidden).add(text)
    return chosen


def document_pieces(doc: Document) -> list[str]:
    """The text cut at every span boundary (what the tokenizer is trained on)."""
    cuts = span_boundaries(doc)
    return [doc.text[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def tokenize_with_holes(
    doc: Document,
    holes: list[Span],
    encode: Callable[[str], list[int]],
    *,
    document_boundaries: bool = True,
    virtual_spaces: bool = False,
    spaced_lines: bool = False,
) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of ``doc`` with cuts at the holes' boundaries only, and each hole's token
    range ``[start, end)``, in the order given; holes must not overlap.

    This is how a Canvas tokenizes: each run of locked text in one piece (before a hole, as
    it tokenizes with a word after it, see :func:`encode_before_word`), each hole apart, and a
    space just before a hole moved into it (the Canvas's forced prefix), so a hole's first
    token carries its leading space (" Smith"). With its own text in every hole that is the
    document's own tokenization wherever the holes start and end at word boundaries.
    ``document_boundaries=False`` tokenizes locked text before a hole on its own, as Canvases
    did before (training phases that ran then are reproduced with it). With
    ``virtual_spaces`` a hole that starts the document, a line or a JSON string value is
    tokenized with a leading space, as a Canvas for such a model tokenizes it (see
    ``StencilTokenizer.virtual_prefix``): its first token then carries the space (" Joshua").
    ``spaced_lines``: ``encode`` puts a virtual space at every line start and JSON string
    value (``StencilTokenizer.spaced_lines``); holes there get theirs as ``virtual_spaces``,
    and locked text at the document's start gets one here (``tokenizer.document_lead``).
    """
    virtual_spaces = virtual_spaces or spaced_lines
    order = sorted(range(len(holes)), key=lambda i: holes[i].start)
    ids: list[int] = []
    ranges: dict[int, tuple[int, int]] = {}
    cursor = 0
    for i in order:
        a, b = _cut(doc.text, holes[i].start), _cut(doc.text, holes[i].end)
        if a < cursor:
            raise ValueError(f"hole {holes[i].name!r} overlaps an earlier hole")
        locked = doc.text[cursor:a]
        if locked:
            if cursor == 0:  # the document's start
                locked = document_lead(locked, spaced=spaced_lines) + locked
            ids.extend(encode_before_word(encode, locked, spaced=spaced_lines)
                       if document_boundaries else encode(locked))  # fmt: skip
        first = len(ids)
        virtual = virtual_spaces and a == holes[i].start and (
            a == 0 or (locked != "" and opens_line_or_value(locked))
        )
        ids.extend(encode((" " if virtual else "") + doc.text[a:b]) if b > a else [])
        ranges[i] = (first, len(ids))
        cursor = b
    if cursor < len(doc.text):
        rest = doc.text[cursor:]
        ids.extend(encode_document(encode, rest, spaced=spaced_lines) if cursor == 0 else encode(rest))
    return ids, [ranges[i] for i in range(len(holes))]

def pattern_counts() -> dict[str, dict[str, int]]:
    """Distinct sentence patterns per kind: total, held out for the test split, shared."""
    out: dict[str, dict[str, int]] = {}
    for kind, bank in BANKS.items():
        total = sum(len(v) for v in bank.values())
        held = sum(
            1 for slot, variants in bank.items() for i in range(len(variants))
            if is_held_out(kind, slot, i)
        )  # fmt: skip
        out[kind] = {"patterns": total, "held_out": held, "shared": total - held}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stats", action="store_true", help="pattern counts + one doc per kind")
    parser.add_argument("--split", default="test", choices=sorted(SPLIT_SEED_BASE))
    parser.add_argument("--count", type=int, default=400, help="documents to measure")
    args = parser.parse_args(argv)
    if not args.stats:
        parser.print_help()
        return
    counts = pattern_counts()
    print(f"{'kind':20s} {'patterns':>8s} {'held_out':>8s} {'chars/doc':>9s} {'spans/doc':>9s}")
    docs = list(iter_split(args.split, args.count))
    for kind in KINDS:
        mine = [d for d in docs if d.kind == kind]
        chars = sum(len(d.text) for d in mine) / max(1, len(mine))
        spans = sum(len(d.spans) for d in mine) / max(1, len(mine))
        c = counts[kind]
        print(f"{kind:20s} {c['patterns']:8d} {c['held_out']:8d} {chars:9.0f} {spans:9.1f}")
    print(f"{'total':20s} {sum(c['patterns'] for c in counts.values()):8d}")
    for kind in KINDS:
        doc = next(d for d in docs if d.kind == kind)
        print(f"\n===== {kind} (seed {doc.seed}, {args.split}) =====\n{doc.text}")


if __name__ == "__main__":
    main()
