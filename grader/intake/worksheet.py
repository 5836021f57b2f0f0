"""Moodle's grading worksheet in the language it was downloaded in.

The assignment's "Download grading worksheet" (mod/assign/feedback/offline) heads its columns
with ``get_string()`` in the downloading user's language, and writes each participant as the
string ``hiddenuser`` followed by the participant id ("Participant 5001", German
"Teilnehmer/in5001"). Its "Upload grading worksheet" matches the headings again in the
uploading user's language, so a worksheet is read here in any of the languages below and
written back with the headings it came with. Each heading is known by its English name.
"""

from __future__ import annotations

import re

# English name -> the heading in each language pack read: English, German, French, Spanish,
# Italian, Portuguese, Brazilian Portuguese, Dutch (AMOS exports for Moodle 4.1 to 4.5;
# docs/lms.md names the sources). The worksheet heads its columns with assign's recordid,
# status, maxgrade, gradecanbechanged, lastmodifiedsubmission and lastmodifiedgrade, and core's
# fullname, gradenoun and the identity fields (email, idnumber, username).
HEADINGS: dict[str, tuple[str, ...]] = {
    "Identifier": ("Identifier", "ID", "Identifiant", "Identificador", "Identificativo",
                   "Identificatie"),
    "Full name": ("Full name", "Vollständiger Name", "Nom complet", "Nombre completo", "Nome",
                  "Nome completo", "Volledige naam"),
    "Email address": ("Email address", "E-Mail-Adresse", "Adresse de courriel",
                      "Dirección de correo", "Indirizzo email", "E-mail", "Endereço de e-mail",
                      "E-mailadres"),
    "Status": ("Status", "Statut", "Estado", "Stato"),
    "Grade": ("Grade", "Bewertung", "Note", "Calificación", "Valutazione", "Avaliação", "Nota",
              "Cijfer"),
    # English "Maximum Grade" until 2025, "Maximum grade" since: read without case.
    "Maximum Grade": ("Maximum Grade", "Bestwertung", "Note maximale", "Calificación máxima",
                      "Valutazione massima", "Nota máxima", "Maximaal cijfer"),
    "Grade can be changed": ("Grade can be changed", "Bewertung kann geändert werden",
                             "La note peut être modifiée", "La calificación puede ser cambiada",
                             "La valutazione può essere cambiata", "A nota pode ser alterada.",
                             "Nota pode ser alterada", "Het cijfer kan gewijzigd worden"),
    "Last modified (submission)": ("Last modified (submission)", "Zuletzt geändert (Abgabe)",
                                   "Dernière modification (travail remis)",
                                   "Última modificación (entrega)", "Ultima modifica (consegna)",
                                   "Última atualização (submissão)",
                                   "Última modificação (envio)", "Laatst gewijzigd (inzending)"),
    "Last modified (grade)": ("Last modified (grade)", "Zuletzt geändert (Bewertung)",
                              "Dernière modification (note)",
                              "Última modificación (calificación)",
                              "Ultima modifica (valutazione)", "Última atualização (avaliação)",
                              "Última modificação (nota)", "Laatst gewijzigd (beoordeling)"),
    "ID number": ("ID number", "ID-Nummer", "Numéro d’identification", "Número de ID",
                  "Codice identificativo", "Número de identificação (ID)",
                  "Número de identificação", "Nummer (ID)"),
    "Username": ("Username", "Anmeldename", "Nom d’utilisateur", "Nombre de usuario",
                 "Nome de utilizador", "Identificação de usuário", "Gebruikersnaam"),
}
# assign's hiddenuser, the prefix of each participant's identifier: "Participant " in English,
# the translations trimmed ("Teilnehmer/in5001", "Participant5001").
PARTICIPANT_PREFIXES = ("Participant", "Teilnehmer/in", "Teilnehmer*in", "Participante",
                        "Partecipante", "Deelnemer")
PARTICIPANT = re.compile(r"\s*(?:" + "|".join(map(re.escape, PARTICIPANT_PREFIXES))
                         + r")\s*(\d+)\s*", re.IGNORECASE)
# core's "no", which a worksheet's "Grade can be changed" says of a locked grade.
NO = ("no", "nein", "non", "não", "nee")

# A time as Moodle's userdate() writes it with each language's strftimedaydatetime: English
# "Tuesday, 4 March 2025, 9:05 AM", German "Dienstag, 4. März 2025, 09:05", French
# "mardi 4 mars 2025, 09:05", Spanish and Portuguese "martes, 4 de marzo de 2025, 09:05".
TIME = re.compile(r"(?:[^\W\d_]+,?\s+)?(\d{1,2})\.?\s+(?:de\s+)?([^\W\d_]+)\s+(?:de\s+)?"
                  r"(\d{4}),\s*(\d{1,2}):(\d{2})\s*([AaPp][Mm])?")
MONTHS = {name: number for names in (
    ("january", "february", "march", "april", "may", "june", "july", "august", "september",
     "october", "november", "december"),
    ("januar", "februar", "märz", "april", "mai", "juni", "juli", "august", "september",
     "oktober", "november", "dezember"),
    ("janvier", "février", "mars", "avril", "mai", "juin", "juillet", "août", "septembre",
     "octobre", "novembre", "décembre"),
    ("enero", "febrero", "marzo", "abril", "mayo", "junio", "julio", "agosto", "septiembre",
     "octubre", "noviembre", "diciembre"),
    ("gennaio", "febbraio", "marzo", "aprile", "maggio", "giugno", "luglio", "agosto",
     "settembre", "ottobre", "novembre", "dicembre"),
    ("janeiro", "fevereiro", "março", "abril", "maio", "junho", "julho", "agosto", "setembro",
     "outubro", "novembro", "dezembro"),
    ("januari", "februari", "maart", "april", "mei", "juni", "juli", "augustus", "september",
     "oktober", "november", "december")) for number, name in enumerate(names, 1)}

_BY_HEADING = {heading.casefold(): english for english, headings in HEADINGS.items()
               for heading in headings}


def english(heading: str) -> str | None:
    """The English name of a worksheet heading in any language read, or None."""
    return _BY_HEADING.get(" ".join(heading.split()).casefold())


def columns(header: list[str]) -> dict[str, str]:
    """English name -> the heading as the worksheet writes it, for the headings it has (the
    first of two that read the same). German's "ID" heads the identifiers alone: a column of
    that name in another kind of file is not taken for one."""
    found: dict[str, str] = {}
    for heading in header:
        name = english(heading)
        if name is not None:
            found.setdefault(name, heading)
    return found


def is_worksheet(header: list[str]) -> bool:
    """Whether ``header`` is a grading worksheet's: an identifier and a full-name column."""
    found = columns(header)
    return "Identifier" in found and "Full name" in found


def participant(value: str) -> str | None:
    """The participant id in a worksheet's identifier ("Participant 5001": "5001"), or None."""
    found = PARTICIPANT.fullmatch(value or "")
    return found[1] if found else None


def wall_time(text: str) -> tuple[int, int, int, int, int] | None:
    """(year, month, day, hour, minute) of a worksheet's time in any language read, or None."""
    found = TIME.fullmatch(" ".join(text.split()))
    if found is None:
        return None
    day, month, year, hour, minute, half = found.groups()
    number = MONTHS.get(month.casefold())
    if number is None or (half and not 1 <= int(hour) <= 12) or int(hour) > 23:
        return None
    if half:
        hour = str(int(hour) % 12 + (12 if half.lower() == "pm" else 0))
    return int(year), number, int(day), int(hour), int(minute)


def english_rows(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """A worksheet's rows keyed by the English names of its headings (others kept as they
    are)."""
    return [{english(key) or key: value for key, value in row.items()} for row in rows]
