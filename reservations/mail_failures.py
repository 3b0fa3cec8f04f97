"""What a failed send means: can the reminder never be sent, may a later run succeed, or
can no reminder be sent at all; and its reason, one line for the console."""

from __future__ import annotations

import smtplib

from reservations.models import Reminder

# How a send is judged when it raised, besides the permanent Reminder.Failure kinds.
TEMPORARY = "temporary"
STOP = "stop"
REASON_LENGTH = 500


def judge(exc: BaseException) -> tuple[str, str]:
    """How a failed send counts, and its reason: a Reminder.Failure when it can never
    succeed, TEMPORARY when a later run may, STOP when no reminder could be sent."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        code, reply = next(iter(exc.recipients.values()))  # one recipient per mail
        return _by_code(code), _reply(code, reply)
    if isinstance(exc, (smtplib.SMTPSenderRefused, smtplib.SMTPHeloError)):
        return STOP, _reply(exc.smtp_code, exc.smtp_error)  # our From, our greeting
    if isinstance(exc, smtplib.SMTPResponseException):
        return _by_code(exc.smtp_code), _reply(exc.smtp_code, exc.smtp_error)
    if isinstance(exc, smtplib.SMTPNotSupportedError):  # e.g. an address needing SMTPUTF8
        return Reminder.Failure.REFUSED, line(exc)
    if isinstance(exc, ValueError):  # the message cannot be made (BadHeaderError too)
        return Reminder.Failure.BAD_ADDRESS, line(exc)
    # Dropped connections, time-outs, and whatever else a backend raises: a later run
    # may succeed, and the attempts bound how often it tries.
    return TEMPORARY, line(exc)


def _by_code(code: int) -> str:
    return Reminder.Failure.REFUSED if 500 <= code < 600 else TEMPORARY


def _reply(code: int, text: bytes | str) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return " ".join(f"{code} {text}".split())[:REASON_LENGTH]


def line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:REASON_LENGTH]
