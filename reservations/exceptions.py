"""Errors the reservation services raise."""


class ReservationError(Exception):
    """Base of the product's domain errors."""


class SectionFull(ReservationError):
    def __init__(self, section_id: int, capacity: int):
        super().__init__(f"section {section_id} is full ({capacity} seats)")


class HoldNotFound(ReservationError):
    def __init__(self, hold_id: int):
        super().__init__(f"seat hold {hold_id} does not exist (released or expired)")


class HoldNotRenewable(ReservationError):
    def __init__(self, hold_id: int, status: str):
        super().__init__(f"seat hold {hold_id} is {status} and can no longer change")


class SendingStopped(ReservationError):
    """The mail server refused the sender itself (unreachable, or refusing its From):
    every reminder would fail alike, so the run stops and charges none of them."""

    def __init__(self, cause: str, outcomes: dict[str, int]):
        self.cause, self.outcomes = cause, outcomes
        super().__init__(f"no reminder can be sent now ({cause})")
