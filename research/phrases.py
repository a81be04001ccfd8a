"""Hand-written phrase banks for the corpus: per document kind, per slot, sentence variants.

Placeholders (``{patient}``) name values the generator supplies; each becomes an annotated
span. About one variant in five (never the first of a slot) is held out of the train and
validation splits and appears only in the test split, so the evaluation sees phrasing the
models never trained on.
"""

from __future__ import annotations

import zlib

Bank = dict[str, list[str]]
HELD_OUT_MODULUS = 5  # one variant in this many is held out for the test split


def is_held_out(kind: str, slot: str, index: int) -> bool:
    """Whether variant ``index`` of ``slot`` is reserved for the test split."""
    if index == 0:
        return False
    return zlib.crc32(f"{kind}/{slot}/{index}".encode()) % HELD_OUT_MODULUS == 0


REFERRAL: Bank = {
    "salutation": ["Dear {doctor},", "Dear {doctor}", "Dear Colleague ({doctor}),", "To {doctor},"],
    "reline": [
        "Re: {patient}, DOB {dob}",
        "RE: {patient} (date of birth {dob})",
        "Patient: {patient}, born {dob}",
        "Re: referral of {patient}, DOB {dob}",
        "Subject: {patient} - DOB {dob}",
    ],
    "opening": [
        "I would be grateful if you could see {patient}, who presents with {symptom}.",
        "I am writing to refer {patient} to your {specialty} clinic with {symptom}.",
        "Thank you for seeing {patient}, whom I saw today at {clinic} with {symptom}.",
        "Please could you assess {patient} in the {specialty} clinic regarding {symptom}.",
        "I am referring {patient} for a {specialty} opinion about {symptom}.",
        "{patient} attended {clinic} on {date} complaining of {symptom}.",
        "Many thanks for reviewing {patient}, who has had {symptom} for {weeks} weeks.",
    ],
    "history": [
        "{patient_last} reports that the symptoms began {weeks} weeks ago and have slowly worsened.",
        "The problem started about {weeks} weeks ago; {patient_last} has no relevant past history.",
        "Over the last {weeks} weeks {patient_last} has found the symptoms increasingly limiting.",
        "{patient_last} first noticed this {weeks} weeks ago and has tried simple measures without benefit.",
        "According to {patient_last}, the episodes have become more frequent over {weeks} weeks.",
        "There is a family history of similar problems, and {patient_last} is understandably anxious.",
    ],
    "findings": [
        "On examination today {patient_last} was comfortable, with normal observations.",
        "Examination was unremarkable apart from mild tenderness, and blood tests are attached.",
        "Routine bloods on {date} were normal, and an ECG showed sinus rhythm.",
        "I found no alarming signs on examination, but {patient_last} remains symptomatic.",
        "Baseline investigations are enclosed; {patient_last} is otherwise well.",
        "Observations on {date} were within normal limits.",
    ],
    "request": [
        "I would value your advice on further investigation and management of {patient}.",
        "I would appreciate your opinion on whether {patient} needs further tests.",
        "Could you advise on the next steps for {patient_last}?",
        "Please let me know if you would like any further tests before you see {patient_last}.",
        "I would be grateful for your assessment and recommendations for {patient}.",
        "Your specialist view on {patient} would be much appreciated.",
    ],
    "priority_line": [
        "I have marked this referral as {priority}.",
        "This referral is {priority}.",
        "In my view the referral is {priority}.",
        "Please treat this as a {priority} referral.",
        "Priority: {priority}.",
    ],
    "closing": [
        "Thank you, {doctor}, for your help with {patient}.",
        "Many thanks, {doctor}, for seeing {patient}.",
        "Thank you for your help with {patient}; please contact me at {clinic} with any questions.",
        "With thanks for your help, {doctor}, in the care of {patient}.",
        "I look forward to hearing from you, {doctor}, about {patient}.",
    ],
    "signoff": [
        "Yours sincerely,\n{sender}\n{clinic}",
        "Kind regards,\n{sender}\nGeneral Practitioner, {clinic}",
        "Yours faithfully,\n{sender}, {clinic}",
        "With best wishes,\n{sender}\n{clinic}",
        "Sincerely,\n{sender}\n{clinic}",
    ],
}

DISCHARGE: Bank = {
    "presentation": [
        "{patient} was admitted to {hospital} on {admit} with {diagnosis}.",
        "{patient} presented on {admit} and was diagnosed with {diagnosis}.",
        "On {admit}, {patient} was brought in by ambulance and found to have {diagnosis}.",
        "{patient} was referred by the GP on {admit} with suspected {diagnosis}.",
        "Admitted on {admit} under {consultant}, {patient} was treated for {diagnosis}.",
        "The admission on {admit} was for {diagnosis}.",
    ],
    "course": [
        "The inpatient stay lasted {days} days and recovery was uncomplicated.",
        "{patient} responded well to treatment over {days} days on the ward.",
        "Treatment for {diagnosis} was started promptly and {patient} improved steadily.",
        "During {days} days in hospital {patient} remained stable and mobilised well.",
        "There was a slow but steady improvement over {days} days.",
        "Progress was monitored daily by {consultant}, and {patient} improved.",
    ],
    "medication": [
        "New medication on discharge: {drug}.",
        "{patient} was discharged on {drug}.",
        "Please continue {drug} as prescribed.",
        "The following was started during admission: {drug}.",
        "Medication changes: {drug}; all other medicines are unchanged.",
    ],
    "discharge_line": [
        "{patient} was discharged to {destination} on {discharge}.",
        "Discharge to {destination} took place on {discharge}.",
        "On {discharge} {patient} went to {destination} in a stable condition.",
        "{patient} left hospital on {discharge} for {destination}.",
        "Discharged on {discharge} to {destination}.",
    ],
    "followup_line": [
        "Follow-up: {followup}.",
        "Please arrange follow-up with the {followup}.",
        "Planned follow-up is {followup}, as agreed with {consultant}.",
        "{consultant} has asked for {followup}.",
        "Follow-up arrangements: {followup}.",
    ],
}

INCIDENT: Bank = {
    "summary": [
        "On {date} at {time}, {event} at {site}.",
        "At approximately {time} on {date}, {event}.",
        "{reporter} reports that at {time} {event} in the {site}.",
        "The incident occurred at {site} on {date}, when {event}.",
        "Shortly after {time}, {event}; {reporter} was on duty at the time.",
        "At {time} {event}.",
    ],
    "witness_line": [
        "The incident was witnessed by {witness}.",
        "{witness} saw what happened and gave a statement to {reporter}.",
        "A statement was taken from {witness}, who was nearby.",
        "{witness} was present and confirmed the account.",
        "No one else saw the incident apart from {witness}.",
    ],
    "response": [
        "Immediately afterwards {action}.",
        "{reporter} ensured that {action}.",
        "As an immediate response, {action}.",
        "Within minutes {action}, and the supervisor was informed.",
        "Before work resumed, {action}.",
    ],
    "outcome": [
        "Injuries reported: {injuries}.",
        "The incident resulted in {injuries}.",
        "Outcome: {injuries}.",
        "We can confirm {injuries} on {date}.",
        "{witness} confirmed there were {injuries}.",
    ],
    "prevention": [
        "A review of procedures at {site} has been scheduled.",
        "The risk assessment for {site} will be updated.",
        "Staff at {site} will receive refresher training.",
        "The severity has been recorded as {severity} and the case passed to the safety team.",
        "Further checks are planned to prevent a recurrence.",
        "{reporter} will follow up with the safety officer at {site}.",
    ],
}

NDA: Bank = {
    "parties": [
        "This Agreement is made on {effective} between {disclosing} and {receiving}.",
        "This Mutual Non-Disclosure Agreement is entered into as of {effective} by {disclosing} and {receiving}.",
        "{disclosing} and {receiving} (each a Party) enter into this Agreement on {effective}.",
        "Effective {effective}, {disclosing} and {receiving} agree as follows.",
        "This Agreement dated {effective} is between {disclosing} and {receiving} (together, the Parties).",
    ],
    "purpose_clause": [
        "Purpose. The Parties wish to exchange information for the purpose of {purpose}.",
        "Purpose. {disclosing} and {receiving} intend to share Confidential Information solely for {purpose}.",
        "Purpose. Confidential Information may be used only for {purpose}.",
        "Purpose. The disclosures under this Agreement are made for {purpose}.",
        "Purpose. Each Party will use the other's information only in connection with {purpose}.",
    ],
    "obligations": [
        "Obligations. {receiving} shall keep the Confidential Information of {disclosing} in strict confidence.",
        "Obligations. Each Party shall protect the other's Confidential Information with reasonable care.",
        "Obligations. {receiving} shall not disclose any Confidential Information to third parties without consent.",
        "Obligations. The receiving Party shall limit access to employees who need to know.",
        "Obligations. Neither {disclosing} nor {receiving} shall copy Confidential Information except as needed.",
    ],
    "exclusions": [
        "Exclusions. Information that is public or already known to the recipient is not Confidential Information.",
        "Exclusions. These obligations do not apply to information that becomes public through no fault of the recipient.",
        "Exclusions. Information independently developed by {receiving} is excluded.",
        "Exclusions. Disclosure required by law is permitted after notice to {disclosing}.",
        "Exclusions. Nothing here restricts information lawfully received from a third party.",
    ],
    "term": [
        "Term. This Agreement remains in force for {years} years from {effective}.",
        "Term. The obligations of confidentiality last {years} years after {effective}.",
        "Term. This Agreement expires {years} years after the effective date of {effective}.",
        "Term. Either Party may end this Agreement on notice, but confidentiality survives for {years} years.",
        "Term. The duties under this Agreement continue for {years} years.",
    ],
    "law": [
        "Governing Law. This Agreement is governed by the laws of the State of {state}.",
        "Governing Law. The laws of {state} govern this Agreement.",
        "Governing Law. Any dispute shall be resolved in the courts of {state}.",
        "Governing Law. This Agreement shall be construed under the law of {state}.",
        "Governing Law. {disclosing} and {receiving} submit to the jurisdiction of {state}.",
    ],
}

INVOICE: Bank = {
    "payment": [
        "Please pay {total} by {terms} no later than {due}.",
        "Payment of {total} is due on {due} by {terms}.",
        "The amount of {total} should be paid by {terms} before {due}.",
        "Kindly settle invoice {number} for {total} by {due}.",
        "{buyer} agrees to pay {total} by {terms} on or before {due}.",
        "Payment terms: {terms}, due {due}.",
        "Please quote {number} when paying {total} by {terms}.",
    ],
    "thanks": [
        "Thank you for your business, {contact}.",
        "Questions about {number} can be sent to {seller}.",
        "We appreciate your order, {contact}.",
        "Thank you for choosing {seller}.",
        "Please contact {seller} if anything on {number} is incorrect.",
        "With thanks from all of us at {seller}.",
        "Thank you, {contact}, for your continued custom.",
    ],
    "late": [
        "Late payments may incur interest at 2% per month.",
        "Invoices unpaid after {due} are subject to a late fee.",
        "Please note that {seller} charges interest on overdue balances.",
        "If {total} is not received by {due}, a reminder will be sent to {contact}.",
        "Overdue amounts will be referred to our accounts team.",
        "{buyer} will be notified if payment is late.",
    ],
}

OFFER: Bank = {
    "greeting": ["Dear {first},", "Dear {candidate},", "Hello {first},", "Dear {first}"],
    "offer": [
        "We are delighted to offer you the position of {role} at {company}.",
        "Following your interview, {company} is pleased to offer you the {schedule} role of {role}.",
        "I am happy to confirm our offer of the position of {role}, {first}.",
        "On behalf of {company}, I am pleased to offer you the role of {role}.",
        "It is a pleasure to offer you a {schedule} position as {role} with {company}.",
        "Congratulations, {first}: {company} would like you to join us as {role}.",
    ],
    "salary_line": [
        "The starting salary is {salary} per year.",
        "Your annual salary will be {salary}, paid monthly.",
        "This {schedule} role carries a salary of {salary} a year.",
        "We are offering a base salary of {salary}.",
        "Your gross pay will be {salary} per annum.",
    ],
    "start_line": [
        "Your first day will be {start}.",
        "We would like you to start on {start}.",
        "Your employment will begin on {start}, reporting to {manager}.",
        "The proposed start date is {start}.",
        "You will join the team on {start} and report to {manager}.",
    ],
    "benefits": [
        "You will receive {days} days of paid holiday each year.",
        "The role includes {days} days of annual leave and a pension scheme.",
        "Benefits include health insurance and {days} days of holiday.",
        "You are entitled to {days} days of leave plus public holidays.",
        "{company} also offers flexible working and {days} days of holiday.",
    ],
    "reply_line": [
        "Please confirm your acceptance by {reply}.",
        "We would be grateful for your reply by {reply}.",
        "Kindly sign and return this letter by {reply}.",
        "Please let {manager} know your decision by {reply}.",
        "This offer remains open until {reply}.",
    ],
    "welcome": [
        "We look forward to welcoming you, {first}.",
        "Everyone at {company} is looking forward to working with you.",
        "We are excited to have you on board, {first}.",
        "Welcome to {company}, {first}.",
        "I look forward to working with you, {first}.",
    ],
    "signoff": [
        "Yours sincerely,\n{manager}\n{company}",
        "Kind regards,\n{manager}, Hiring Manager, {company}",
        "Best wishes,\n{manager}\n{company}",
        "Sincerely,\n{manager}\nOn behalf of {company}",
    ],
}

MINUTES: Bank = {
    "attendance": [
        "Present: {chair} (Chair), {secretary}, {member} and {count} other members.",
        "{count} members attended, including {chair}, {member} and {secretary}.",
        "Attendance: {chair}, {secretary}, {member}; {count} members in total.",
        "The meeting was quorate with {count} members, among them {member}.",
        "{chair}, {secretary} and {member} attended, with {count} others.",
    ],
    "opening": [
        "{chair} opened the meeting on {date} and welcomed everyone.",
        "The Chair, {chair}, called the meeting to order.",
        "{chair} welcomed members and confirmed the agenda.",
        "The meeting began with a welcome from {chair}.",
        "Opening the meeting, {chair} thanked {secretary} for preparing the papers.",
    ],
    "discussion": [
        "{member} presented a report on {topic}.",
        "The main item was {topic}, introduced by {member}.",
        "Members discussed {topic} at length.",
        "{member} raised concerns about {topic}.",
        "A paper on {topic} was tabled by {secretary}.",
        "Discussion focused on {topic}; {member} answered questions.",
    ],
    "decision": [
        "The proposal on {topic} was {vote}.",
        "After discussion the motion was {vote}.",
        "The recommendation was {vote}.",
        "On a vote, the proposal from {member} was {vote}.",
        "The item was {vote} by the members present.",
    ],
    "action": [
        "Action: {member} to circulate a revised plan.",
        "{secretary} will circulate these minutes to all members.",
        "Action: {member} to report back at the next meeting.",
        "{member} agreed to prepare a cost estimate.",
        "Action: {secretary} to update the register.",
    ],
    "next_meeting": [
        "The next meeting will be held on {next}.",
        "Next meeting: {next}.",
        "Members agreed to meet again on {next}.",
        "{chair} closed the meeting; the next one is on {next}.",
        "The meeting closed, and {org} will meet again on {next}.",
    ],
}

JSON_NOTE: Bank = {
    "json_intro": [
        "Record for {person}:",
        "The following record describes {person}.",
        "Data entry for {person}",
        "Exported record ({person}):",
        "System record of {person}:",
        "Structured data for {person} follows.",
    ],
    "json_note": [
        "Record reviewed for {person}.",
        "Entry created for {person}.",
        "This record concerns {person}.",
        "Checked against source documents for {person}.",
        "Updated record for {person}.",
        "Validated against the schema; contact {person} with corrections.",
        "Owner of this record: {person}.",
        "Last edited on behalf of {person}.",
    ],
}

BANKS: dict[str, Bank] = {
    "referral_letter": REFERRAL,
    "discharge_summary": DISCHARGE,
    "incident_report": INCIDENT,
    "nda_clause": NDA,
    "invoice": INVOICE,
    "job_offer": OFFER,
    "meeting_minutes": MINUTES,
    "json_record": JSON_NOTE,
}
